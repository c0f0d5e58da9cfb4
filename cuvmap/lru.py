"""A bounded, thread-safe least-recently-used cache, shared by the vendor bindings' plan
caches (:mod:`cuvmap.cpu.onednn`, :mod:`cuvmap.cuda.cudnn`).

An :class:`LRU` of bound ``n`` holds at most ``n`` entries; a lookup that finds its key
makes that entry the most recently used, and an insertion beyond the bound drops the least
recently used one (its value is released when the last reference to it goes, so a plan
that another thread is running lives until that call returns). Neither lookups nor
insertions call user code under the lock: a value is made outside it, and two threads
that miss the same key at once may both make one (the later insertion wins; both are
correct). This module imports nothing from cuvmap.
"""
import collections
import threading


class LRU:
    """A mapping of at most ``bound`` entries that evicts the least recently used.

    Args:
      bound: the number of entries kept (at least 1); :attr:`bound` may be changed later,
        and the next insertion trims the cache to it.

    Counters: :attr:`hits` (lookups that found their key), :attr:`misses` (those that did
    not) and :attr:`evicted` (entries dropped for the bound).

    Example::

        plans = LRU(256)
        plan = plans.get(key)
        if plan is None:
            plan = plans.put(key, make_plan())
    """

    def __init__(self, bound):
        if not isinstance(bound, int) or isinstance(bound, bool) or bound < 1:
            raise ValueError(f"LRU: the bound must be a positive int, got {bound!r}")
        self.bound = bound
        self.hits = 0
        self.misses = 0
        self.evicted = 0
        self._data = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, default=None):
        """The value of ``key`` (now the most recently used), or ``default``."""
        with self._lock:
            try:
                value = self._data[key]
            except KeyError:
                self.misses += 1
                return default
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key, value):
        """Stores ``value`` under ``key`` as the most recently used entry, drops the least
        recently used ones beyond the bound, and returns ``value``."""
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            dropped = []
            while len(self._data) > max(1, self.bound):
                dropped.append(self._data.popitem(last=False)[1])
                self.evicted += 1
        del dropped     # released outside the lock (a value's finaliser may be slow)
        return value

    def clear(self):
        """Drops every entry (the counters stay)."""
        with self._lock:
            values = list(self._data.values())
            self._data.clear()
        del values

    def __len__(self):
        return len(self._data)

    def __contains__(self, key):
        return key in self._data

    def keys(self):
        """The keys, least recently used first (a snapshot)."""
        with self._lock:
            return list(self._data)

    def items(self):
        """``(key, value)`` pairs, least recently used first (a snapshot)."""
        with self._lock:
            return list(self._data.items())

    def __iter__(self):
        return iter(self.keys())

    def info(self):
        """``{"size", "bound", "hits", "misses", "evicted"}``."""
        with self._lock:
            return dict(size=len(self._data), bound=self.bound, hits=self.hits, misses=self.misses,
                        evicted=self.evicted)
