"""The JSON files of the runs: where they go, and how a results dict is written.

A run writes ``benchmarks/results/SUITE-DEVICE-TIME.json`` (git-ignored) unless told
otherwise; with ``--save-to-docs`` it writes ``docs/performance/data/SUITE-DEVICE.json``,
the committed file that ``python -m benchmarks report`` turns into the pages of
``docs/performance/`` (a later run of the same suite on the same device replaces it).
"""
import json
import math
import os
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS_DIR = os.path.join(ROOT, "benchmarks", "results")
DOCS_DIR = os.path.join(ROOT, "docs", "performance")
DOCS_DATA_DIR = os.path.join(DOCS_DIR, "data")


def default_json_path(suite, device):
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join(RESULTS_DIR, f"{suite}-{device}-{stamp}.json")


def jsonable(x):
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_json(path, results):
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    with open(path, "w") as fh:
        json.dump(jsonable(results), fh, indent=2, ensure_ascii=False)
        fh.write("\n")
    return path


def docs_json_path(suite, device, data_dir=None, variant=None):
    """The committed JSON of a suite on a device (in ``data_dir``, by default
    :data:`DOCS_DATA_DIR`), which ``report`` reads; a ``variant`` of the run (``torch-first``:
    torch imported before cuvmap) has a file of its own beside the suite's main run."""
    return os.path.join(data_dir or DOCS_DATA_DIR, f"{suite}-{device}{'-' + variant if variant else ''}.json")


def load(path):
    with open(path) as fh:
        return json.load(fh)
