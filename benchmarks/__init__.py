"""cuvmap's benchmarks: every figure a ratio between methods measured side by side in one run.

    python -m benchmarks SUITE [options]     one suite (SUITE --help lists its options)
    python -m benchmarks compare BASE.json HEAD.json
    python -m benchmarks report              docs/performance/ from the runs saved with --save-to-docs

The parts (``benchmarks/cli.py``'s docstring says what a run prints and keeps):

- ``suites/``: one file per suite — what it measures, its options, its cases and targets,
  its ``run`` and the tables of its docs page; ``suites/__init__.py`` lists them;
- ``methods/``: the rows a suite times (:class:`benchmarks.methods.Method`) and the
  adapters that make them for cuvmap and its peers (torch.func, Opacus, JAX,
  dp_accounting), each peer optional;
- ``rounds/``: how a case is timed (timers, interleaved rounds, adaptive repeats, an
  injected slowdown) and how two cases' times become a ratio with an interval and a
  verdict; peak memory;
- ``machine/``: what a run ran on — versions, BLAS, the threading environment, the commit
  — the load of other processes during it, and ``--background-load``;
- ``report/``: tables, plots, the progress bar, the JSON files, ``compare`` and the docs
  pages;
- ``models.py``: the networks, written once per framework on the same parameters;
- ``cli.py`` and ``run.py``: the command line, and what wraps every suite's run.
"""
