"""What the benchmarks show: the markdown tables (:mod:`~benchmarks.report.tables`), the
plots (:mod:`~benchmarks.report.plots`), the progress bar
(:mod:`~benchmarks.report.progress`), the JSON files (:mod:`~benchmarks.report.results`),
the comparison of two runs (:mod:`~benchmarks.report.compare`) and the docs' performance
pages (:mod:`~benchmarks.report.pages`).
"""
