"""Faults: a job whose process died, raised or went another way must end, not hang.

NOTE [a job ends when one process fails]
A collective waits for every process of its group, so one process that stops taking part
leaves the others waiting forever: MPI has no timeout of its own, and a process that
raises does not even exit (its ``MPI_Finalize`` at exit waits for the others too). Three
guards end such a job with a non-zero status and a message that says why:

- a process killed by a signal, or one that calls ``os._exit`` with a non-zero status:
  the launcher (MPICH's Hydra, Open MPI's mpirun) kills the rest and exits non-zero;
- an uncaught exception: :func:`install_excepthook` prints it as Python would, says that
  the job is being aborted, and calls ``MPI_Abort`` (the launcher then ends every process);
- ``sys.exit(n)`` with ``n != 0``: ``SystemExit`` never reaches ``sys.excepthook``, and the
  process would wait in ``MPI_Finalize`` for the others, which wait in their collective.
  :func:`install_exit_hooks` remembers the status of the main thread's last ``sys.exit``
  and, at exit, aborts the job with it at once (as ``python -m mpi4py`` does);
- a process that ends its program (returns, or ``sys.exit(0)``) while another waits in a
  collective: at exit each process takes part in one last exchange of the collective
  check, "the end of the program" (NOTE [the collective check] in
  :mod:`cuvmap.distributed.check`). Where every process ends, it returns at once; where
  another waits in a collective, both sides see the mismatch at once: the waiting one
  raises :class:`~cuvmap.distributed.check.CollectiveMismatchError` naming the process
  that ended, and the ending one prints the same and aborts the job with status 1. (With
  the check turned off, the watchdog below ends such a job.) A ``raise SystemExit(n)``
  that bypasses ``sys.exit`` is taken for a normal end;
- anything else — a process that took another branch, waits for a collective the others
  never reach, or computes for too long while the others wait: every collective is timed by a :class:`Watchdog`
  thread, and one that has waited longer than the group's timeout (600 s unless
  ``CUVMAP_COLLECTIVE_TIMEOUT`` or ``initialize(timeout=...)`` says otherwise) prints which
  collective it was and aborts the job. A blocking MPI call is timed from entry to return;
  a NCCL collective, which only enqueues work on a CUDA stream, is timed until an event
  recorded after it completes.

The timeout must exceed the longest time one process may legitimately spend between two
collectives while the others wait in one (an evaluation on one process only, a slow first
``jit`` trace).
"""
import atexit
import collections
import os
import sys
import threading
import time

from cuvmap import config

DEFAULT_TIMEOUT = 600.0


def default_timeout():
    """``CUVMAP_COLLECTIVE_TIMEOUT`` in seconds, else :data:`DEFAULT_TIMEOUT`."""
    text = config.from_environment("CUVMAP_COLLECTIVE_TIMEOUT", None)
    if text is None:  # (unset or empty: the default)
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"CUVMAP_COLLECTIVE_TIMEOUT={text!r} is not a number of seconds") from None
    if not value > 0:
        raise ValueError(f"CUVMAP_COLLECTIVE_TIMEOUT={text!r} must be positive")
    return value


class Watchdog:
    """Times the collectives of one process (NOTE [a job ends when one process fails]).

    ``begin(what)``/``end()`` bracket a blocking call; ``enqueued(what, event)`` registers
    a GPU collective whose completion ``event`` (``.done``) tells. ``what`` is
    ``(label, dtype, shape)`` (``dtype`` None for a call without an operand), made into text
    only when it is reported: formatting a dtype costs more than the bookkeeping. When one
    has waited more than ``timeout`` seconds, ``on_timeout(message)`` runs in the
    watchdog's thread (it aborts the job). The thread wakes a few times per timeout, at
    most once a second."""

    def __init__(self, timeout, on_timeout, describe=""):
        if not timeout > 0:
            raise ValueError(f"Watchdog: timeout must be positive, got {timeout!r}")
        self.timeout = float(timeout)
        self.on_timeout = on_timeout
        self.describe = describe
        self.context = None  # what the group is doing (its collective, as text on demand)
        self._blocking = None  # (start, what, context) of the blocking call in progress
        self._pending = collections.deque()  # (start, what, event) of enqueued GPU collectives
        self._fired = False
        self._thread = threading.Thread(target=self._run, name="cuvmap-collective-watchdog", daemon=True)
        self._thread.start()

    def begin(self, what):
        self._blocking = (time.monotonic(), what, self.context)

    def end(self):
        self._blocking = None

    def enqueued(self, what, event):
        self._pending.append((time.monotonic(), what, event, self.context))

    def _overdue(self, now):
        blocking = self._blocking
        if blocking is not None and now - blocking[0] > self.timeout:
            return blocking
        pending = self._pending
        while pending:
            start, what, event, context = pending[0]
            if event.done:
                pending.popleft()
                continue
            return (start, what, context) if now - start > self.timeout else None
        return None

    def _run(self):
        poll = min(1.0, self.timeout / 4)
        while not self._fired:
            time.sleep(poll)
            overdue = self._overdue(time.monotonic())
            if overdue is not None:
                self._fired = True
                start, what, context = overdue
                during = "" if context is None else f" ({context})"
                self.on_timeout(
                    f"cuvmap.distributed: {self.describe}{describe(what)}{during} has waited "
                    f"{time.monotonic() - start:.0f} s for the "
                    f"other processes (the timeout is {self.timeout:g} s: CUVMAP_COLLECTIVE_TIMEOUT or "
                    "cuvmap.distributed.initialize(timeout=...)); another process has died, raised, or taken "
                    "another path; aborting the job")


def describe(what):
    """The text of a collective ``(label, dtype, shape)``: ``"all-reduce (sum) of float32[3]"``."""
    label, dtype, shape = what
    return label if dtype is None else f"{label} of {dtype}{list(shape)}"


def install_excepthook(describe, abort):
    """Makes an uncaught exception abort the job (NOTE [a job ends when one process
    fails]): Python's report first, then a line saying so, then ``abort()``."""
    previous = sys.excepthook

    def hook(kind, value, traceback):
        try:
            previous(kind, value, traceback)
            sys.stderr.write(f"cuvmap.distributed: {describe} raised {kind.__name__}; aborting the job so that "
                             "the other processes do not wait for it\n")
            sys.stderr.flush()
        finally:
            abort()

    sys.excepthook = hook
    return hook


def exit_status(status):
    """The exit status Python gives ``sys.exit(status)``: 0 for None, the int itself, and 1
    for anything else (which Python prints)."""
    if status is None:
        return 0
    if isinstance(status, int):
        return status % 256
    return 1


class _ExitState:
    status = None  # the argument of the main thread's last sys.exit


def install_exit_hooks(describe, abort, end):
    """Makes the end of this process's program end the job as NOTE [a job ends when one
    process fails] says: ``sys.exit(n)`` with ``n != 0`` calls ``abort(n)`` at exit; any
    other end calls ``end()`` (the collective check's last exchange, which raises
    :class:`~cuvmap.distributed.check.CollectiveMismatchError` when another process waits
    in a collective) and, when it raises, reports and calls ``abort(1)``. Returns the
    :class:`_ExitState`, whose ``status`` is the last ``sys.exit``'s argument."""
    state = _ExitState()
    original = sys.exit
    main = threading.main_thread()

    def exit(status=None):  # noqa: A001 - stands in for sys.exit
        if threading.current_thread() is main:
            state.status = status
        original(status)

    exit.__doc__ = original.__doc__
    exit.__wrapped__ = original
    sys.exit = exit

    def at_exit():
        code = exit_status(state.status)
        try:
            if code != 0:
                sys.stderr.write(f"cuvmap.distributed: {describe} exited with status {code} (sys.exit); aborting the "
                                 "job so that the other processes do not wait for it\n")
                sys.stderr.flush()
            else:
                end()
                return
        except BaseException as err:  # noqa: BLE001 - any failure of the last exchange ends the job
            code = 1
            sys.stderr.write(f"cuvmap.distributed: {describe} ended its program while another process did not: "
                             f"{err}; aborting the job\n")
            sys.stderr.flush()
        abort(code)

    atexit.register(at_exit)
    return state
