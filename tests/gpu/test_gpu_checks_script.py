"""tools/gpu_checks.sh (issue 34, item 14): the first device check is one call, under
``timeout``, that writes its summary and logs as it goes and its archive on exit however
it ends; it keeps pytest's status, lists every skip, gives each test a time limit where
pytest-timeout is there, and runs the smoke test with the bounds check on the device and
on the host. Run here on the strict CuPy stand-in (``CUVMAP_STRICT_CUPY=1``), as CI
checks it without a GPU."""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import time

import pytest

from cuvmap.cuda import cudnn

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu_checks.sh"

_PROBE = """
import os
import time
import pytest

@pytest.mark.gpu
def test_passes():
    assert os.environ["CUVMAP_STRICT_CUPY"] == "{strict}"

@pytest.mark.gpu
def test_skips():
    pytest.skip("the reason this skips")
{extra}
"""


def _run(tmp_path, *argv, strict="1", extra="", timeout=300, **env):
    tests = tmp_path / "test_probe.py"
    tests.write_text(_PROBE.format(strict=strict, extra=extra))
    out = tmp_path / "out"
    full = dict(os.environ, OUT=str(out), GPU_CHECKS_TESTS=str(tests), CUVMAP_STRICT_CUPY=strict,
                PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    full.pop("GPU_CHECKS_TIMED", None)
    full.update(env)
    start = time.monotonic()
    proc = subprocess.run(["bash", str(SCRIPT), *argv], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=timeout)
    return proc, out, time.monotonic() - start


def _archive(out, part="tests"):
    with tarfile.open(out / f"gpu_{part}.tar.gz") as tar:
        return {pathlib.PurePath(m.name).as_posix().lstrip("./"): (tar.extractfile(m).read().decode()
                                                                   if m.isfile() else None)
                for m in tar.getmembers()}


@pytest.mark.slow
@pytest.mark.parametrize("failing", [True, False], ids=["a-test-fails", "tests-pass"])
def test_the_script_keeps_pytests_status_and_lists_skips(tmp_path, failing):
    """The passing run is the script without an argument (the first check, ``tests``); where
    pytest-timeout is not installed its summary says so."""
    argv = ("tests",) if failing else ()
    proc, out, _ = _run(tmp_path, *argv, extra="\n@pytest.mark.gpu\ndef test_fails():\n    assert 1 == 2\n"
                        if failing else "")
    text = proc.stdout
    assert "SKIPPED [1] " in text and "the reason this skips" in text
    assert ("FAILED " in text and "test_fails" in text) is failing
    assert ("!! FAILED: gpu_tests (exit status 1)" in text) is failing
    cudnn_missing = not cudnn.available()
    assert ("!! FAILED: preflight (exit status" in text) is cudnn_missing
    assert proc.returncode == (1 if failing or cudnn_missing else 0), text + proc.stderr
    # what comes back: the summary, the step logs (written as they ran) and the archive
    assert sorted(p.name for p in out.iterdir()) == ["gpu_tests.tar.gz", "logs", "summary_tests.txt"]
    logs = sorted(p.name for p in (out / "logs").iterdir())
    assert logs == ["gpu_tests.txt", "preflight.txt", "smoke_device_check.txt", "smoke_host_check.txt"]
    assert len(logs) + 2 <= 8                      # (a device call brings back at most 8 files)
    summary = (out / "summary_tests.txt").read_text()
    assert re.search(r"^\[\d\d:\d\d:\d\d\] start gpu_tests \(limit 240s\)", summary, re.M)
    assert ("1 failed, 1 passed, 1 skipped" if failing else "1 passed, 1 skipped") in summary, summary
    archived = _archive(out)
    assert archived["summary_tests.txt"] == summary
    assert {"logs/gpu_tests.txt", "logs/preflight.txt"} <= set(archived)
    assert "start gpu_tests" in proc.stdout
    if not failing and importlib.util.find_spec("pytest_timeout") is None:
        assert "!! pytest-timeout is missing: no per-test time limit" in summary


def test_an_unknown_part_is_refused():
    proc = subprocess.run(["bash", str(SCRIPT), "everything"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage: bash tools/gpu_checks.sh [tests|bench]" in proc.stderr


@pytest.mark.slow
def test_the_whole_script_runs_under_timeout_and_its_archive_survives(tmp_path):
    """A test that hangs: the script's own limit (GPU_CHECKS_LIMIT, 540 s by default; 25 s
    here) stops it; the trap names the step, stops it, and writes the archive; the exit
    status is timeout's 124."""
    proc, out, elapsed = _run(tmp_path, "tests", extra="\n@pytest.mark.gpu\ndef test_hangs():\n    time.sleep(600)\n",
                              GPU_CHECKS_LIMIT="25", timeout=120)
    assert proc.returncode == 124, proc.stdout + proc.stderr
    assert elapsed < 60
    summary = (out / "summary_tests.txt").read_text()
    assert "stopped by a signal during gpu_tests: the steps after it did not run" in summary
    assert "!! FAILED: gpu_tests (stopped: the script's time limit of 25s was reached)" in summary
    archived = _archive(out)
    assert "stopped by a signal during gpu_tests" in archived["summary_tests.txt"]
    assert "logs/gpu_tests.txt" in archived
    # the hanging pytest was stopped with the step (no orphan left sleeping)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "test_probe.py") not in ps


@pytest.mark.slow
def test_each_test_gets_a_time_limit_where_pytest_timeout_is_there(tmp_path):
    """The script passes --timeout (GPU_CHECKS_TEST_TIMEOUT) when pytest-timeout imports;
    here a plugin in its place records what it was given (this venv has none: the real one
    travels in .whl/ from tools/gpu_wheels.sh). Without it the summary says so
    (test_the_script_keeps_pytests_status_and_lists_skips[tests-pass])."""
    plugin = tmp_path / "plugin"
    (plugin / "pytest_timeout_recorder-0.dist-info").mkdir(parents=True)
    (plugin / "pytest_timeout_recorder-0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: pytest-timeout-recorder\nVersion: 0\n")
    (plugin / "pytest_timeout_recorder-0.dist-info" / "entry_points.txt").write_text(
        "[pytest11]\ntimeout = pytest_timeout\n")
    record = tmp_path / "timeout.txt"
    (plugin / "pytest_timeout.py").write_text(
        "def pytest_addoption(parser):\n    parser.addoption('--timeout', default=None)\n\n"
        f"def pytest_configure(config):\n    open({str(record)!r}, 'w').write(str(config.getoption('timeout')))\n")
    path = os.pathsep.join([str(plugin)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    proc, out, _ = _run(tmp_path, PYTHONPATH=path, GPU_CHECKS_TEST_TIMEOUT="77")
    assert record.read_text() == "77", proc.stdout
    assert "per-test time limit: 77s (pytest-timeout)" in (out / "summary_tests.txt").read_text()


@pytest.mark.slow
def test_the_first_check_runs_end_to_end_on_the_strict_stand_in(tmp_path):
    """``CUVMAP_STRICT_CUPY=1 bash tools/gpu_checks.sh`` in one call: the smoke test passes
    with the bounds check on the device (a CUDA graph captured, the bad label found at the
    synchronisation) and on the host (no graph, the IndexError at the gather); the gpu tests
    of a real file run on the stand-in."""
    proc, out, elapsed = _run(tmp_path, strict="1",
                              GPU_CHECKS_TESTS=f"{ROOT / 'tests' / 'gpu' / 'test_device_checks.py'} "
                                               f"{tmp_path / 'test_probe.py'}")
    summary = (out / "summary_tests.txt").read_text()
    for check, graphs in (("device", 1), ("host", 0)):
        log = (out / "logs" / f"smoke_{check}_check.txt").read_text()
        assert f"bounds check on the {check}" in log and f"CUDA graphs captured: {graphs} (want {graphs})" in log
        assert "raised IndexError" in log and log.rstrip().endswith("smoke: ok"), log
        assert f"end smoke_{check}_check: exit status 0" in summary
    assert "end gpu_tests: exit status 0" in summary, summary
    assert re.search(r"\d+ passed", (out / "logs" / "gpu_tests.txt").read_text())
    assert elapsed < 420
