"""Choices settled by measuring, kept per key for the process: which convolution kernels
run a shape (NOTE [conv strategy] in :mod:`cuvmap.lax.conv_strategy`) and whether ghost
clipping takes a layer's ghost norm or its per-example gradient (NOTE [ghost clipping] in
:mod:`cuvmap.dp.ghost`). Both time candidates on the first call of a key and keep the
faster; :class:`MeasuredChoices` is the one table, lock and single flight they share.

Under ``cuvmap.config.deterministic`` neither measures: each takes its fixed rule instead
(NOTE [reproducible runs]).

A table holds at most ``config.measured_choices`` keys (``CUVMAP_MEASURED_CHOICES``,
4096), the least recently used forgotten first (measured again if they come back). The
processes of a job share process 0's choices (NOTE [one choice for every process]).
"""
import collections
import pickle
import threading

from cuvmap import config

# NOTE [one choice for every process]
# Each process of a data-parallel job measures the keys it meets, under its own load, and
# two processes can time different kernels fastest for the same key; the candidates round
# float32 differently, so a run on 2 processes would then differ from itself run again
# (2e-4 after training under load). So the named tables (the convolution strategy's and
# ghost clipping's) log the choices this process measured, and the collective check
# carries how many process 0 has logged (one more int64 in its all-reduce: nothing when
# no choice is new). When that number grows, every process, at the same check, takes
# process 0's new choices (a second, rare exchange: their bytes) in place of its own
# (shared_since, adopt). What remains: a key's first call on another process runs that
# process's own choice (process 0's arrives at the next collective), and a choice read
# while tracing (ghost clipping's, under jit) stays in the program traced with it; with the
# collective check off nothing is shared. Under config.deterministic nothing is measured
# and every process takes the same fixed rule.
_TABLES = {}           # name -> the table whose choices a job's processes share
_log = []              # (table name, key): the choices this process measured, in order
_log_lock = threading.Lock()


def measured_count():
    """How many choices this process has measured into the shared tables."""
    return len(_log)


def shared_since(start, stop=None):
    """``bytes``: the choices measured from the ``start``-th to before the ``stop``-th (those
    still in their tables), to hand to :func:`adopt` on the other processes."""
    with _log_lock:
        items = list(_log[start:stop])
    entries = []
    for name, key in items:
        value = _TABLES[name].get(key)
        if value is not None:
            entries.append((name, key, value))
    return pickle.dumps(entries)


def adopt(data):
    """Records another process's choices (:func:`shared_since`'s bytes) in place of this
    process's own; returns how many."""
    entries = pickle.loads(data)
    for name, key, value in entries:
        table = _TABLES.get(name)
        if table is not None:
            table.record(key, value, log=False)
    return len(entries)


# NOTE [measuring once per key]
# Two threads that meet a new key together must not both time it: each would measure
# while the other's run shares the cores (timings of nothing in particular), and the later
# record would overwrite the earlier one. measure_once lets one thread claim the key (an
# Event in _measuring, under the lock) and measure; the others wait for that Event and then
# read its choice. If the measuring thread raises (a MemoryError in a candidate, say), its
# claim is dropped and a waiting thread claims the key in turn. Only the bookkeeping holds
# the lock, never a measurement, so other keys are measured meanwhile.
class MeasuredChoices:
    """A thread-safe table ``{key: value}`` of measured choices (the value is the caller's:
    conv and ghost keep ``(choice, {candidate: milliseconds})``), with a single flight per
    key (NOTE [measuring once per key]), at most ``config.measured_choices`` keys (the least
    recently used forgotten first). ``name``: the table's name among those a job's
    processes share (NOTE [one choice for every process]); None for a table of this
    process alone."""

    def __init__(self, name=None):
        self._lock = threading.Lock()
        self._values = collections.OrderedDict()
        self._measuring = {}     # key -> threading.Event set when its measurement ends
        self.name = name
        self.evicted = 0
        if name is not None:
            _TABLES[name] = self

    def get(self, key, default=None):
        """The value recorded for ``key``, or ``default``."""
        with self._lock:
            value = self._values.get(key, default)
            if key in self._values:
                self._values.move_to_end(key)
            return value

    def __contains__(self, key):
        with self._lock:
            return key in self._values

    def __len__(self):
        with self._lock:
            return len(self._values)

    def record(self, key, value, log=True):
        """Records ``value`` for ``key``; True when the key was new. ``log``: a choice this
        process measured (shared with the job's other processes when the table is named)."""
        with self._lock:
            new = key not in self._values
            self._values[key] = value
            self._values.move_to_end(key)
            bound = max(config.read("measured_choices"), 1)
            while len(self._values) > bound:
                self._values.popitem(last=False)
                self.evicted += 1
        if log and self.name is not None:
            with _log_lock:
                _log.append((self.name, key))
        return new

    def snapshot(self):
        """A copy of the table, ``{key: value}``."""
        with self._lock:
            return dict(self._values)

    def clear(self):
        """Forgets every recorded value (the next call of each key measures again)."""
        with self._lock:
            self._values.clear()

    def in_flight(self):
        """The keys being measured now (empty when no measurement runs)."""
        with self._lock:
            return list(self._measuring)

    def measure_once(self, key, measure):
        """``(value, result)``: the value recorded for ``key``, measuring it here with
        ``measure()`` (which returns ``(value, result)``; the value is recorded) unless
        another thread is measuring it already, in which case this one waits for that value
        and ``result`` is None (NOTE [measuring once per key])."""
        while True:
            with self._lock:
                if key in self._values:
                    return self._values[key], None
                event = self._measuring.get(key)
                mine = event is None
                if mine:
                    event = self._measuring[key] = threading.Event()
            if not mine:
                event.wait()
                continue
            try:
                value, result = measure()
                self.record(key, value)
                return value, result
            finally:
                with self._lock:
                    self._measuring.pop(key, None)
                event.set()
