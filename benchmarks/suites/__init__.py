"""The suites, one file each: what it measures (its docstring), its options
(``add_arguments``), its defaults (``DEFAULTS``), its targets, its ``run(args, settings)``
that prints its tables and returns its figures, and the tables of its docs page
(``DOC_TABLES``, :mod:`benchmarks.report.pages`).

``python -m benchmarks SUITE`` runs one (:mod:`benchmarks.run`).
"""

SUITES = {
    "per_example": "benchmarks.suites.per_example",
    "conv": "benchmarks.suites.conv",
    "dispatch": "benchmarks.suites.dispatch",
    "eager": "benchmarks.suites.eager",
    "distributed": "benchmarks.suites.distributed",
    "control_flow": "benchmarks.suites.control_flow",
    "dp": "benchmarks.suites.dp",
    "accounting": "benchmarks.suites.accounting",
    "memory": "benchmarks.suites.memory",
    "selfcheck": "benchmarks.suites.selfcheck",
    "fashion_mnist": "benchmarks.suites.fashion_mnist",
}
# suites that time their cases in their own way (rounds under mpiexec, the accountants'
# single calls): the rounds' options (--max-spread, --inject-slowdown, ...) do not reach them
OWN_ROUNDS = {"distributed", "accounting", "fashion_mnist"}
