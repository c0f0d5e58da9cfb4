"""Settings and what cuvmap keeps (issue 34, item 13): an empty ``CUVMAP_*`` variable means
the default for every variable; jit keeps a bounded number of programs per function; the
measured-choices tables are bounded. (The processes of a job agreeing on measured choices:
tests/test_collective_digest.py.)"""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# every variable cuvmap reads, and what reading it gives (a value to compare unset against empty)
READERS = {
    "CUVMAP_DEFAULT_FLOAT": "str(config.read('default_float'))",
    "CUVMAP_JIT_GPU_FUSION": "config.read('jit_gpu_fusion')",
    "CUVMAP_JIT_CUDA_GRAPHS": "config.read('jit_cuda_graphs')",
    "CUVMAP_JIT_POOL_SIGNATURES": "config.read('jit_pool_signatures')",
    "CUVMAP_JIT_POOL_BYTES": "config.read('jit_pool_bytes')",
    "CUVMAP_DETERMINISTIC": "config.read('deterministic')",
    "CUVMAP_COLLECTIVE_CHECK": "config.read('collective_check')",
    "CUVMAP_COLLECTIVE_TIMEOUT": "watchdog.default_timeout()",
    "CUVMAP_CONV_STRATEGY": "convolution.get_strategy()",
    "CUVMAP_CPU_THREADS": "str(cpu_threads._why_fixed())",
    "CUVMAP_CUDNN_MAX_WORKSPACE_BYTES": "cudnn.max_workspace_bytes()",
    "CUVMAP_DISABLE_CUDNN": "cudnn._settings['enabled']",
    "CUVMAP_DISABLE_ONEDNN": "onednn._settings['enabled']",
    "CUVMAP_ONEDNN_LIBRARY": "onednn._library_candidates()",
    "CUVMAP_ONEDNN_THREADING": "(onednn._default_threading('openmp'), onednn._settings['threading'])[1]",
}
_PROBE = """
import json, sys
from cuvmap import config
from cuvmap.cpu import onednn, threads as cpu_threads
from cuvmap.cuda import cudnn
from cuvmap.distributed import watchdog
from cuvmap.lax import convolution
readers = json.loads(sys.argv[1])
print(json.dumps({name: repr(eval(code)) for name, code in readers.items()}))
"""


def _variables_in_the_source():
    found = set()
    for path in (ROOT / "cuvmap").rglob("*.py"):
        found.update(re.findall(r"\\b(CUVMAP_[A-Z0-9_]+)\\b", path.read_text()))
    return found


def _read(env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("CUVMAP_")}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(READERS)], env=dict(base, **env),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_variable_has_a_reader_here():
    """(A new CUVMAP_* variable gets its line in READERS, so the next test covers it.)"""
    assert _variables_in_the_source() <= set(READERS), _variables_in_the_source() - set(READERS)


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_variable_means_the_default_for_every_variable(empty):
    """Before: CUVMAP_DEFAULT_FLOAT= (and the other settings of cuvmap.config) refused the
    import, CUVMAP_COLLECTIVE_TIMEOUT= refused initialize, CUVMAP_CONV_STRATEGY= the first
    convolution, while CUVMAP_CPU_THREADS= meant the default."""
    unset = _read({})
    empty_all = _read({name: empty for name in READERS})
    assert empty_all == unset
