"""The executor keeps freed host memory mapped (NOTE [keeping freed host memory] in
cuvmap/transforms/executor/host_memory.py): a jitted program whose temporaries come and go in every
call stops faulting their pages in once it has run, unless the user chose glibc's
thresholds, whose choice is kept.

Each case runs in a fresh interpreter, since the setting is process-wide and read once.
The reference is the same program under glibc's default fixed thresholds
(``MALLOC_MMAP_THRESHOLD_=MALLOC_TRIM_THRESHOLD_=131072``), where every call faults the
temporaries in again. Minor page faults are counted with getrusage, which is exact."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]  # tests/<area>/this file

# Three 4 MiB temporaries from a non-elementwise primitive (cumsum allocates its output,
# so the plan's pool cannot hold it), alive together, freed by the end of each call.
PROGRAM = r"""
import resource
import numpy as np
import cuvmap as cv
import cuvmap.numpy as cnp
from cuvmap.transforms import executor

@cv.jit
def f(x):
    a = cnp.cumsum(x)
    b = cnp.cumsum(a)
    c = cnp.cumsum(b)
    return cnp.sum(a) + cnp.sum(b) + cnp.sum(c)

x = np.ones(1 << 19)
for _ in range(3):
    f(x)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    f(x)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 5)
print(executor.host_memory_setting())
"""


def _run(env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env.update(env_extra, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    faults, setting = result.stdout.strip().split("\n")
    return int(faults), setting


def _glibc():
    try:
        import ctypes

        ctypes.CDLL(None).gnu_get_libc_version
        return sys.platform.startswith("linux")
    except (OSError, AttributeError):
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _glibc(), reason="the setting is glibc's malloc's (Linux)")
def test_jitted_program_stops_faulting_in_its_temporaries():
    faults, setting = _run({})
    assert "set by cuvmap's jit" in setting and "trim threshold 64 MiB" in setting
    # the three temporaries are 3 × 1024 pages (fewer where they get huge pages): almost none
    # of them fault once the program ran
    assert faults < 300, (faults, setting)


@pytest.mark.slow
@pytest.mark.skipif(not _glibc(), reason="the setting is glibc's malloc's (Linux)")
def test_the_users_malloc_settings_win():
    faults, setting = _run({"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"})
    assert setting == "the user's (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ set)"
    # ... and with glibc's default thresholds the same program faults every temporary in again
    assert faults > 1000, (faults, setting)
