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

ROOT = pathlib.Path(__file__).resolve().parents[2]

# every variable cuvmap reads, and what reading it gives (a value to compare unset against empty)
READERS = {
    "CUVMAP_DEFAULT_FLOAT": "str(config.read('default_float'))",
    "CUVMAP_JIT_GPU_FUSION": "config.read('jit_gpu_fusion')",
    "CUVMAP_JIT_CUDA_GRAPHS": "config.read('jit_cuda_graphs')",
    "CUVMAP_JIT_POOL_SIGNATURES": "config.read('jit_pool_signatures')",
    "CUVMAP_JIT_POOL_BYTES": "config.read('jit_pool_bytes')",
    "CUVMAP_JIT_CACHE_SIGNATURES": "config.read('jit_cache_signatures')",
    "CUVMAP_MEASURED_CHOICES": "config.read('measured_choices')",
    "CUVMAP_DEVICE_BOUNDS_CHECK": "config.read('device_bounds_check')",
    "CUVMAP_DETERMINISTIC": "config.read('deterministic')",
    "CUVMAP_COLLECTIVE_CHECK": "config.read('collective_check')",
    "CUVMAP_COLLECTIVE_TIMEOUT": "watchdog.default_timeout()",
    "CUVMAP_CONV_STRATEGY": "convolution.get_strategy()",
    "CUVMAP_CPU_THREADS": "str(cpu_threads._why_fixed())",
    "CUVMAP_CUDNN_MAX_WORKSPACE_BYTES": "cudnn.max_workspace_bytes()",
    "CUVMAP_DISABLE_CUDNN": "cudnn._settings['enabled']",
    "CUVMAP_DISABLE_ONEDNN": "libdnnl._settings['enabled']",
    "CUVMAP_ONEDNN_LIBRARY": "libdnnl._library_candidates()",
    "CUVMAP_ONEDNN_THREADING": "(openmp._default_threading('openmp'), openmp._settings['threading'])[1]",
}
_PROBE = """
import json, sys
from cuvmap import config
from cuvmap.cpu import libdnnl, openmp, threads as cpu_threads
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


@pytest.mark.slow
@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_variable_means_the_default_for_every_variable(empty):
    """Before: CUVMAP_DEFAULT_FLOAT= (and the other settings of cuvmap.config) refused the
    import, CUVMAP_COLLECTIVE_TIMEOUT= refused initialize, CUVMAP_CONV_STRATEGY= the first
    convolution, while CUVMAP_CPU_THREADS= meant the default."""
    unset = _read({})
    empty_all = _read({name: empty for name in READERS})
    assert empty_all == unset



# ---------------------------------------------------------------------------------------
# jit keeps a bounded number of programs
# ---------------------------------------------------------------------------------------

import warnings  # noqa: E402

import numpy as np  # noqa: E402

import cuvmap as cv  # noqa: E402
from cuvmap import config  # noqa: E402


def _shapes(f, sizes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cv.RetraceWarning)
        for n in sizes:
            np.testing.assert_array_equal(f(np.ones(n)), 2 * np.ones(n) + 1)


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "full lookup"])
def test_jit_keeps_the_programs_of_its_most_recent_signatures(fast):
    """(Before: every program ever traced, ~15 KB each: 30 MB after 2,000 signatures.)"""
    with config.override(jit_cache_signatures=4):
        if fast:
            jitted = cv.jit(lambda x: 2 * x + 1)
            f = jitted
        else:  # (a static argument takes the full lookup)
            jitted = cv.jit(lambda x, k: 2 * x + k, static_argnums=1)
            f = lambda x: jitted(x, 1)  # noqa: E731
        _shapes(f, range(1, 11))                       # 10 signatures
        assert jitted.trace_count == 10
        assert jitted.kept_programs() == {"signatures": 4, "bound": 4, "evicted": 6}
        _shapes(f, [7, 8, 9, 10])                      # the 4 most recent: kept
        assert jitted.trace_count == 10
        _shapes(f, [7, 11])                            # 7 is now more recent than 8: 11 drops 8
        _shapes(f, [7, 9, 10, 11])
        assert jitted.trace_count == 11
        _shapes(f, [8])
        assert jitted.trace_count == 12 and jitted.kept_programs()["signatures"] == 4


def test_the_program_bound_is_a_setting():
    assert config.read("jit_cache_signatures") == 512
    with pytest.raises(ValueError, match="jit_cache_signatures must be a non-negative int"):
        config.update("jit_cache_signatures", -1)



# ---------------------------------------------------------------------------------------
# the measured-choices tables are bounded
# ---------------------------------------------------------------------------------------

from cuvmap import lax  # noqa: E402
from cuvmap.lax import convolution  # noqa: E402
from cuvmap.measured_choices import MeasuredChoices  # noqa: E402


def test_a_table_of_measured_choices_keeps_its_most_recent_keys():
    table = MeasuredChoices()
    with config.override(measured_choices=3):
        for k in range(5):
            table.record(k, ("choice", {}))
        assert sorted(table.snapshot()) == [2, 3, 4] and table.evicted == 2
        table.get(2)                                  # 2 is now the most recent: 5 drops 3
        table.record(5, ("choice", {}))
        assert sorted(table.snapshot()) == [2, 4, 5]
        value, result = table.measure_once(3, lambda: (("again", {}), "measured"))   # forgotten: measured again
        assert value == ("again", {}) and result == "measured"
    assert config.read("measured_choices") == 4096


def test_the_convolution_strategy_keeps_at_most_the_bound():
    """(Before: one entry per shape bucket for the life of the process.)"""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    convolution.clear_measured_choices()
    try:
        with config.override(measured_choices=2, deterministic=False):
            for size in (6, 7, 8, 9, 10):
                x = rng.standard_normal((2, 3, size, size)).astype(np.float32)
                lax.conv(x, w, padding=1)
            assert len(convolution.measured_choices()) <= 2
    finally:
        convolution.clear_measured_choices()
