"""The collective check: the processes of a group agree on every collective, or all raise.

NOTE [the collective check]
A collective pairs the ``k``-th call of every process of a group, whatever each one
asked for: MPI and NCCL see only buffers. Two processes that disagree — one calls
``psum`` where the other calls ``pmax``, or passes float32[8] where the other passes
float64[4], or skipped a collective and is one behind — get a wrong result, garbage, a
"message truncated" on one process only, or a wait until the watchdog's timeout. So
before each collective over an axis of processes the group checks, in one all-reduce of
eight int64 on the host, that every process is at the same collective of the same step:

    [c, -c, k, -k, d, -d, s, -s]  reduced with max  →  [max c, -min c, max k, -min k, ...]

where ``c`` is a 62-bit digest of the collective (primitive, axis name, dtype, shape and,
for ``ppermute``, the permutation; for a bucket, the shapes of its leaves, NOTE [buckets]
in :mod:`cuvmap.lax.parallel`: the buffer alone would let leaves ``(f64[2], f64[3])`` on
one process meet ``(f64[3], f64[2])`` on another), ``k`` its sequence number in the
group, ``d`` the number of ``data_parallel`` calls the process has begun and ``s`` the
step it last marked with :func:`cuvmap.distributed.step` (-1 before any). Every process
gets the same eight numbers, so all of them see at once whether the minimum and maximum
of each agree. (A ninth carries process 0's count of measured choices: NOTE [one choice
for every process] in :mod:`cuvmap.measured_choices`.) When they do not, every process gathers every process's
description (a second, rare exchange) and raises :class:`CollectiveMismatchError`
naming the processes and their collectives; no process has started the collective
itself, so nothing was exchanged wrongly and the processes are still in step (a
program that catches the error can go on).

A process that skips a collective pairs its next one with the others' current one, and
when the two look alike (the same psum of the next step) the digest and the sequence
number agree (both processes are at their k-th collective). The step numbers tell them
apart: a process that skipped its collectives inside a step (an early return from the
function ``data_parallel`` wraps) is one ``data_parallel`` call ahead at its next
collective, and one that skipped a whole step (a ``continue`` before the call) has marked
a later step with ``distributed.step(i)``; either is named at that next collective, with
both step numbers, instead of at the end of the program. Without ``distributed.step`` a
step skipped before the call still shows only at the end of the program (below). The
sequence number catches a collective one process made without the check. So every
process calls a ``data_parallel`` function as often as the others (a call that only
process 0 makes, evaluation say, goes outside ``data_parallel``).

The check rides on the group's ``"cpu"`` engine (MPI) for operands of every kind: on a
GPU it is a host exchange that waits for no GPU work. Its cost is one small all-reduce
per collective (3–5 µs of work in one process; 6–7 µs more per small psum on 2 processes
of the 2-core machine, more when other work shares the cores), and the processes wait
there instead of in the collective that follows. Buckets keep the collectives of a step
few (NOTE [buckets] in :mod:`cuvmap.lax.parallel`): on the main job's data-parallel step,
one checked all-reduce, the check measured +0.9–1.1% (+3.5% in one run on a busier
machine); ``python -m benchmarks distributed --check-steps N`` measures it. It is on by
default; ``cuvmap.config.update("collective_check", False)`` or
``CUVMAP_COLLECTIVE_CHECK=0`` turns it off (on every process alike: a process that
checks pairs its check with the other's collective).

The end of a program is a collective too: at exit each process of a job reports "the end"
in the same exchange (:func:`cuvmap.distributed.watchdog.install_exit_hooks`), so a
process that returns while another waits in a collective is named at once, on both sides,
instead of after the watchdog's timeout.
"""
import hashlib

import numpy as np

from cuvmap import config, measured_choices
from cuvmap.distributed.engine import DistributedError

END = "end"  # the primitive of the end of a program


class CollectiveMismatchError(DistributedError):
    """The processes of a group called different collectives at the same point of their
    programs (NOTE [the collective check]); raised on every process of the group."""


def enabled():
    """Whether collectives are checked (``cuvmap.config.collective_check``)."""
    return config.read("collective_check")


_BUCKETED = ("psum", "pmax", "pmin")
_SHAPES_SHOWN = 12


def describe_collective(primitive, axis_name, dtype, shape, extra=None):
    """``"psum over 'batch' of float32[3]"``; a bucket's ``extra`` is the shapes of its
    leaves (NOTE [buckets] in :mod:`cuvmap.lax.parallel`): ``"psum over 'batch' of
    float64[5] (a bucket of 2 leaves: float64[2], float64[3])"``."""
    if primitive == END:
        return "the end of its program"
    text = primitive if axis_name is None else f"{primitive} over {axis_name!r}"
    if dtype is not None:
        text += f" of {np.dtype(dtype).name}{list(shape)}"
    if extra is None:
        return text
    if primitive == "ppermute":
        return text + f" with perm={list(extra)}"
    if primitive in _BUCKETED and dtype is not None:
        name = np.dtype(dtype).name
        shown = ", ".join(f"{name}{list(s)}" for s in extra[:_SHAPES_SHOWN])
        more = f", ... ({len(extra) - _SHAPES_SHOWN} more)" if len(extra) > _SHAPES_SHOWN else ""
        return text + f" (a bucket of {len(extra)} leaves: {shown}{more})"
    return text + f" ({extra})"


def _digest(key):
    """A 62-bit digest of a collective's description, the same in every process (Python's
    ``hash`` of a string differs between processes)."""
    primitive, axis_name, dtype, shape, extra = key
    text = repr((primitive, None if axis_name is None else str(axis_name),
                 None if dtype is None else np.dtype(dtype).str,
                 None if shape is None else tuple(int(d) for d in shape), extra))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 2


class _Current:
    """What a process is doing in its group's collectives, for the watchdog's message."""

    __slots__ = ("key", "seq", "checking")

    def __init__(self, key, seq, checking):
        self.key, self.seq, self.checking = key, seq, checking

    def __str__(self):
        what = f"collective #{self.seq} of the group, {describe_collective(*self.key)}"
        return f"the check before {what}" if self.checking else what


class CollectiveCheck:
    """The check of one group (NOTE [the collective check]): ``engine`` is the group's
    host engine (an :class:`~cuvmap.distributed.engine.Engine` on NumPy arrays), ``who``
    describes this process (``"process 1 of 2"``), ``watchdog`` (or None) is told which
    collective is in progress. ``count`` is the number of collectives so far, ``calls``
    the number of ``data_parallel`` calls begun, ``marker`` the step last marked by
    :func:`cuvmap.distributed.step` (-1: none)."""

    _MAX_DIGESTS = 4096  # distinct collectives remembered (a digest costs ~2 µs to remake)

    def __init__(self, engine, rank, size, who="", watchdog=None, shared=0):
        self.engine = engine
        self.rank, self.size = rank, size
        self.who = who
        self.watchdog = watchdog
        self.count = 0
        self.calls = 0
        self.marker = -1
        self.shared = shared  # process 0's measured choices shared so far (the same on every process)
        self._digests = {}
        self._buffer = np.zeros(9, np.int64)

    def __call__(self, primitive, axis_name=None, dtype=None, shape=None, extra=None):
        """Checks that every process of the group is at this collective (and counts it);
        raises :class:`CollectiveMismatchError` on every process when one is not."""
        key = (primitive, axis_name, dtype, shape, extra)
        seq = self.count
        self.count = seq + 1
        self._agree(key, seq, self.calls, self.marker)

    def note(self, primitive, axis_name=None, dtype=None, shape=None, extra=None):
        """Counts a collective without checking it (the check is off), so that the
        watchdog can still say which one waits."""
        seq = self.count
        self.count = seq + 1
        if self.watchdog is not None:
            self.watchdog.context = _Current((primitive, axis_name, dtype, shape, extra), seq, False)

    def end(self):
        """The end of this process's program: returns when every process of the group has
        ended too; raises :class:`CollectiveMismatchError` (on this process and on the
        others, in their collective) when another process waits in a collective instead.
        (The step numbers are not compared there: a last ``data_parallel`` call without
        collectives on one process is harmless.)"""
        self._agree((END, None, None, None, None), self.count, 0, -1)

    def _agree(self, key, seq, calls, marker):
        digests = self._digests
        code = digests.get(key)
        if code is None:
            if len(digests) >= self._MAX_DIGESTS:
                digests.clear()
            code = digests[key] = _digest(key)
        watchdog = self.watchdog
        if watchdog is not None:
            current = watchdog.context = _Current(key, seq, True)
        want = [code, -code, seq, -seq, calls, -calls, marker, -marker]
        buf = self._buffer
        buf[:8] = want
        # process 0's count of measured choices (NOTE [one choice for every process])
        buf[8] = measured_choices.measured_count() if self.rank == 0 and key[0] != END else 0
        out = self.engine.allreduce(buf, "max", in_place=True).tolist()
        if watchdog is not None:
            current.checking = False
        if out[:8] != want:
            raise self.mismatch(key, seq, calls, marker)
        if out[8] > self.shared:
            self._share_choices(out[8])

    def _share_choices(self, upto):
        """Every process takes process 0's measured choices ``self.shared .. upto`` (each
        process calls this at the same check; NOTE [one choice for every process] in
        :mod:`cuvmap.measured_choices`)."""
        data = measured_choices.shared_since(self.shared, upto) if self.rank == 0 else b""
        length = np.array([len(data)], np.int64)
        width = int(self.engine.allreduce(length, "max", in_place=True)[0])
        row = np.zeros(width, np.uint8)
        row[:len(data)] = np.frombuffer(data, np.uint8)
        rows = self.engine.allgather(row)
        if self.rank != 0:
            measured_choices.adopt(bytes(rows[0]))
        self.shared = upto

    def mismatch(self, key, seq, calls=0, marker=-1):
        """Every process's collective, gathered (each process calls this at once, after an
        exchange whose minimum and maximum disagreed), as the error to raise."""
        mine = f"{seq}\x00{calls}\x00{marker}\x00{describe_collective(*key)}".encode()
        length = np.array([len(mine)], np.int64)
        width = int(self.engine.allreduce(length, "max", in_place=True)[0])
        row = np.zeros(width, np.uint8)
        row[:len(mine)] = np.frombuffer(mine, np.uint8)
        rows = self.engine.allgather(row)
        found = []
        for rank in range(self.size):
            text = bytes(rows[rank]).rstrip(b"\x00").decode(errors="replace")
            number, calls, marker, what = text.split("\x00", 3)
            found.append((int(number), what, int(calls), int(marker)))
        return CollectiveMismatchError(_message(found, self.rank))


def _message(found, rank):
    """The text of a mismatch: ``found[r] = (sequence number, description, data_parallel
    calls, step marker)`` of process r."""
    end = describe_collective(END, None, None, None)
    ended = any(what == end for _, what, _, _ in found)
    seqs = {seq for seq, _, _, _ in found}
    calls_differ = not ended and len({c for _, _, c, _ in found}) > 1
    markers_differ = not ended and len({m for _, _, _, m in found}) > 1
    groups = {}
    for r, (seq, what, calls, marker) in enumerate(found):
        groups.setdefault((seq, what, calls, marker), []).append(r)
    parts = []
    for (seq, what, calls, marker), ranks in groups.items():
        who = f"process{'es' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        if what == end:
            parts.append(f"{who} reached the end of {'their' if len(ranks) > 1 else 'its'} program after {seq} "
                         f"collective{'s' * (seq != 1)}")
            continue
        text = f"{who} called {what}" + (f" as collective #{seq}" if len(seqs) > 1 else "")
        if markers_differ:
            text += f" at step {marker}" if marker >= 0 else " before any distributed.step"
        if calls_differ:
            text += f" in data_parallel call #{calls}"
        parts.append(text)
    about = f"collective #{seqs.pop()}" if len(seqs) == 1 else "their next collective"
    if markers_differ or calls_differ:
        why = ("a process skipped or added a step's collectives (a branch on its own data, a continue or an early "
               "return): every process must call a data_parallel function, and mark each step with "
               "distributed.step(i), as the others do")
    elif len(seqs) > 1 or ended:
        why = "a process skipped or added a collective (a branch on its own data, an early return or exit)"
    else:
        why = ("every process must call the same collectives (primitive, axis name, dtype, shape; the leaves of a "
               "pytree) in the same order")
    return (f"the {len(found)} processes of the group disagree about {about}: {', '.join(parts)}; no data was "
            f"exchanged. {why[0].upper()}{why[1:]}. [This is process {rank}. The check costs one small all-reduce "
            "per collective; cuvmap.config.update('collective_check', False) or CUVMAP_COLLECTIVE_CHECK=0 turns it "
            "off.]")
