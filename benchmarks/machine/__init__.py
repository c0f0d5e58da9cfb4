"""The machine a benchmark runs on: its settings and record
(:mod:`~benchmarks.machine.settings`), the load other processes put on it during a run
(:mod:`~benchmarks.machine.load`), the load a benchmark adds on purpose
(:mod:`~benchmarks.machine.background`), and its GEMM rate (:mod:`~benchmarks.machine.gemm`).
"""
