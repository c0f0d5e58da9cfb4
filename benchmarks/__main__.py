"""``python -m benchmarks``: the CLI of :mod:`benchmarks.cli`."""
import sys

from benchmarks.cli import main

sys.exit(main())
