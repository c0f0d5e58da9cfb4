"""Timing and statistics: how the benchmarks time a case and judge a ratio.

- :mod:`~benchmarks.rounds.timers`: the timer of one call (wall clock, CUDA events after an
  L2 flush, graph replays) and the waits of an injected slowdown;
- :mod:`~benchmarks.rounds.runner`: first calls, warm-up, interleaved rounds, adaptive
  repeats (:class:`~benchmarks.rounds.runner.Policy`), the statistics of one case
  (:class:`~benchmarks.rounds.runner.Stats`);
- :mod:`~benchmarks.rounds.stats`: ratios with distribution-free intervals, and the
  verdicts FAST, SLOW, SAME;
- :mod:`~benchmarks.rounds.ratios`: ratios between two rows of a run, against targets;
- :mod:`~benchmarks.rounds.peaks`: the peak memory of one call.
"""
