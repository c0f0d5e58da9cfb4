"""What a benchmark ran on: the settings printed with the figures (versions, the threading
environment as given, BLAS, the device) and the machine's record in the JSON files.

The benchmarks never change the threading environment (``OPENBLAS_CORETYPE``,
``OMP_NUM_THREADS``, ...): it is set or unset in the command, and the values in force are
printed with the figures and kept in the JSON.
"""
import importlib.metadata
import os
import platform
import shlex
import subprocess

import numpy as np

import cuvmap
from cuvmap.cpu import threads as cpu_threads

# the libraries a run is compared with; their versions go into every JSON file
PEERS = ("torch", "opacus", "jax", "jaxlib", "dp-accounting", "mpi4py", "threadpoolctl")
# the variables some machines' environments set (older OpenBLAS builds need them) and that
# slow a current NumPy's GEMM: a run for the docs unsets them, and its command says so
UNSET_FOR_DOCS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


THREAD_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
              "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS", "CUVMAP_CONV_STRATEGY",
              "CUVMAP_ONEDNN_LIBRARY", "CUVMAP_ONEDNN_THREADING")


def blas_info():
    """NumPy's BLAS libraries through threadpoolctl: a list of dicts (``None`` when
    threadpoolctl is not installed)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    return [dict(api=i.get("internal_api"), version=i.get("version"), kernel=i.get("architecture"),
                 threads=i.get("num_threads"), threading_layer=i.get("threading_layer"),
                 path=i.get("filepath"))
            for i in threadpool_info() if i.get("user_api") == "blas"]


def blas_threads():
    """The threads NumPy's BLAS uses (threadpoolctl), or the core count when unknown."""
    info = blas_info()
    if info:
        for lib in info:
            if "openblas" in (lib.get("path") or "").lower() or lib["api"] in ("openblas", "mkl", "blis"):
                if lib.get("threads"):
                    return int(lib["threads"]), "threadpoolctl"
    return os.cpu_count() or 1, "os.cpu_count() (threadpoolctl not installed)"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit():
    """The commit of the tree the benchmarks run from: ``dict(commit, short, dirty)`` (dirty:
    tracked files changed since it), or None outside a git checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return dict(commit=rev, short=rev[:7], dirty=bool(dirty)) if rev else None


def git_revision():
    """The commit as text: the short hash, ``+dirty`` when tracked files changed."""
    git = git_commit()
    return (git["short"] + ("+dirty" if git["dirty"] else "")) if git else None


def device_description(device):
    if device == "gpu":
        from cuvmap.cuda import device as cuda_device

        return cuda_device.describe()
    return f"CPU: {cpu_model()}, {os.cpu_count()} logical cores"


def settings(device):
    """An ordered dict of the settings in force: versions, the threading environment as
    given by the user (never changed here), BLAS, device."""
    rev = git_revision()
    s = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cuvmap": cuvmap.__version__ + (f" (git {rev})" if rev else ""),
        "platform": platform.platform(),
    }
    for var in THREAD_ENV:
        s[var] = os.environ.get(var, "(unset)")
    info = blas_info()
    if info is None:
        s["BLAS"] = "(threadpoolctl not installed: pip install threadpoolctl to report it)"
    elif not info:
        s["BLAS"] = "(threadpoolctl found no BLAS library)"
    else:
        s["BLAS"] = "; ".join(f"{i['api']} {i['version']}, kernel {i['kernel']}, {i['threads']} threads"
                              + (f", {i['threading_layer']}" if i.get("threading_layer") else "")
                              for i in info)
    s["device"] = device_description(device)
    if device == "cpu":
        s["oneDNN"] = onednn_description()
    return s


def libgomp_paths():
    """The GNU OpenMP libraries in this process (Linux; torch's copy or the system's)."""
    try:
        with open("/proc/self/maps") as fh:
            return sorted({line.split()[-1] for line in fh if "libgomp" in line and "/" in line})
    except OSError:
        return []


def onednn_description():
    """cuvmap's CPU vendor kernels: the version and OpenMP wait policy, or why absent.
    Never the first to load libdnnl: which libgomp.so.1 it gets, and with which wait
    policy, depends on what loaded first (torch brings its own), so a suite describes it
    again after its run."""
    from cuvmap.cpu import onednn

    if not onednn.loaded():
        return "(loads at the first convolution; described after the run)"
    return onednn.describe()


def versions():
    """The versions of Python, NumPy, cuvmap and of every peer installed (None: not installed)."""
    out = dict(python=platform.python_version(), numpy=np.__version__, cuvmap=cuvmap.__version__)
    for name in PEERS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def thread_environment():
    """The threading variables as the command gave them (None: unset)."""
    return {var: os.environ.get(var) for var in THREAD_ENV}


def command_line(argv, environment):
    """The command that reproduces a run: ``env`` with the threading variables the command
    set and the ones of :data:`UNSET_FOR_DOCS` it unset, then ``python -m benchmarks ARGV``."""
    env = [f"-u {var}" for var in UNSET_FOR_DOCS if environment.get(var) is None]
    env += [f"{var}={shlex.quote(value)}" for var, value in environment.items() if value is not None]
    prefix = "env " + " ".join(env) + " " if env else ""
    return prefix + "python -m benchmarks " + shlex.join(argv)


def machine_record(device):
    """The machine as the JSON files keep it: CPU model, cores, platform, BLAS libraries
    (threadpoolctl's view), cuvmap's CPU threads, the device. (The threading environment
    and the load during the run are beside it in the JSON: ``environment``,
    ``machine_load``.)"""
    info = blas_info()
    return dict(cpu=cpu_model(), cores=os.cpu_count(), platform=platform.platform(),
                blas=[{k: v for k, v in lib.items() if k != "path"} for lib in info] if info else None,
                cuvmap_cpu_threads=cpu_threads.describe(),
                device=device_description(device))

