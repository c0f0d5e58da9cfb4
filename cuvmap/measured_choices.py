"""Choices settled by measuring, kept per key for the process: which convolution kernels
run a shape (NOTE [conv strategy] in :mod:`cuvmap.lax.conv_strategy`) and whether ghost
clipping takes a layer's ghost norm or its per-example gradient (NOTE [ghost clipping] in
:mod:`cuvmap.dp.ghost`). Both time candidates on the first call of a key and keep the
faster; :class:`MeasuredChoices` is the one table, lock and single flight they share.

Under ``cuvmap.config.deterministic`` neither measures: each takes its fixed rule instead
(NOTE [reproducible runs]).
"""
import threading


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
    key (NOTE [measuring once per key])."""

    def __init__(self):
        self._lock = threading.Lock()
        self._values = {}
        self._measuring = {}     # key -> threading.Event set when its measurement ends

    def get(self, key, default=None):
        """The value recorded for ``key``, or ``default``."""
        with self._lock:
            return self._values.get(key, default)

    def __contains__(self, key):
        with self._lock:
            return key in self._values

    def __len__(self):
        with self._lock:
            return len(self._values)

    def record(self, key, value):
        """Records ``value`` for ``key``; True when the key was new."""
        with self._lock:
            new = key not in self._values
            self._values[key] = value
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
