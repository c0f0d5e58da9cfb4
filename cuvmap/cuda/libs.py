"""The CUDA libraries of NVIDIA's pip wheels, found and loaded before the libraries that
need them (as torch's ``_preload_cuda_deps`` does).

cuDNN 9 loads cuBLASLt (``libcublasLt.so.12``, or ``.so.13`` for CUDA 13) when its first
handle is created, and its runtime-compiled engines load NVRTC; jit's GPU fusion compiles
its kernels with NVRTC through CuPy. The wheels (``nvidia-cublas-cu12``,
``nvidia-cuda-nvrtc-cu12``, or ``nvidia-cublas`` and ``nvidia-cuda-nvrtc`` 13.x for CUDA
13, which the ``gpu`` / ``gpu-cuda13`` extras install) put those files in
``site-packages/nvidia/<folder>/lib`` (``nvidia/cu13/lib`` for the CUDA 13 ones), which no
loader searches. So, before ``libcudnn.so.9`` loads (and before the first fused kernel is
compiled), :func:`preload` loads each of them from the first ``sys.path`` entry that has it,
with ``RTLD_GLOBAL`` — cuBLASLt before cuBLAS, so that cuBLAS never picks up a system-wide
cuBLASLt of another version — and a later ``dlopen("libcublasLt.so.12")`` by cuDNN finds
the loaded library by its soname (NOTE [preloading the CUDA wheels]).

:class:`WheelLibrary` is the loader the cuBLAS and cuDNN bindings share: once per process,
the wheel libraries it needs preloaded, then the first of its candidates that loads and
binds, or an error naming every path tried and what the preload missed.

This module never imports CuPy itself, the transforms or the primitives.
"""
import ctypes
import os
import sys
import threading

# NOTE [preloading the CUDA wheels]
# Without the preload, cudnnCreate fails where the wheels are the only CUDA libraries
# (CUDNN_STATUS_NOT_INITIALIZED: libcublasLt.so.12 not found), cudnn.available() is False
# and every GPU convolution runs the unfold kernels instead. The paths are those torch
# searches, in its order: <entry>/nvidia/<folder>/lib/<name>, <entry>/nvidia/cu<major>/lib/
# <name>, <entry>/<folder>/lib/<name>, for each sys.path entry. The CUDA major version is
# CuPy's (its runtime's, when CuPy is imported) or, before that, both 12 and 13: each
# major's libraries have their own sonames, so loading those of the other one (when both
# wheels are installed) changes nothing. A library that is not found is left to the
# system loader (LD_LIBRARY_PATH, a CUDA toolkit); one that is found but fails to load is
# reported by preload()'s records, and cudnn.load_error() names it when cuDNN then fails.

# (wheel folder under nvidia/, file name) in load order, per CUDA major version
WHEEL_LIBRARIES = {
    12: (("cublas", "libcublasLt.so.12"), ("cublas", "libcublas.so.12"), ("cuda_nvrtc", "libnvrtc.so.12")),
    13: (("cublas", "libcublasLt.so.13"), ("cublas", "libcublas.so.13"), ("cuda_nvrtc", "libnvrtc.so.13")),
}
CUBLAS = ("libcublasLt", "libcublas")
NVRTC = ("libnvrtc",)

_lock = threading.Lock()
_done = {}          # file name -> record (a dict), once per process


def candidate_paths(folder, name, major, search_path=None):
    """Where a wheel may hold ``name`` (NOTE [preloading the CUDA wheels]), in the order
    they are tried; ``search_path`` defaults to ``sys.path``."""
    found = []
    for entry in (sys.path if search_path is None else search_path):
        if not entry:
            entry = os.getcwd()
        found += [os.path.join(entry, "nvidia", folder, "lib", name),
                  os.path.join(entry, "nvidia", f"cu{major}", "lib", name),
                  os.path.join(entry, folder, "lib", name)]
    return found


def find(folder, name, major, search_path=None):
    """The first existing path of :func:`candidate_paths`, or None."""
    for path in candidate_paths(folder, name, major, search_path):
        if os.path.isfile(path):
            return path
    return None


def cuda_majors():
    """The CUDA major versions whose wheels to load: CuPy's runtime's when CuPy is already
    imported, else 12 and 13."""
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            return (int(cupy.cuda.runtime.runtimeGetVersion()) // 1000,)
        except Exception:  # noqa: BLE001 - no driver, a stand-in: try both
            pass
    return (12, 13)


def _dlopen_global(path):
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def preload(prefixes, *, majors=None, search_path=None, loader=None):
    """Loads the wheel libraries whose names start with one of ``prefixes`` (e.g.
    :data:`CUBLAS`, :data:`NVRTC`), for the CUDA ``majors`` (default :func:`cuda_majors`),
    in :data:`WHEEL_LIBRARIES`' order, each from the first place :func:`find` finds it,
    with ``RTLD_GLOBAL``; once per file name and process.

    Args:
      prefixes: library name prefixes, matched against the file names before ``.so``.
      majors: CUDA major versions.
      search_path: the directories to search instead of ``sys.path`` (tests).
      loader: ``loader(path)`` loads one library (default ``ctypes.CDLL(path,
        RTLD_GLOBAL)``); it raises OSError on failure.
    Returns:
      One record per library considered: ``{"name", "path", "loaded", "error"}`` (``path``
      None when no wheel has it).
    """
    loader = _dlopen_global if loader is None else loader
    records = []
    with _lock:
        for major in (cuda_majors() if majors is None else majors):
            for folder, name in WHEEL_LIBRARIES.get(major, ()):
                if name.split(".so", 1)[0] not in prefixes:
                    continue
                record = _done.get(name)
                if record is None:
                    path = find(folder, name, major, search_path)
                    record = dict(name=name, path=path, loaded=False, error=None)
                    if path is not None:
                        try:
                            loader(path)
                            record["loaded"] = True
                        except OSError as err:
                            record["error"] = str(err)
                    if search_path is None and loader is _dlopen_global:
                        _done[name] = record     # only the real loads are remembered
                records.append(record)
    return records


def preload_note(records):
    """`` (CUDA wheels: ...)`` naming what :func:`preload` missed, to append to a load
    error, or the empty string when nothing was missed."""
    text = describe(records)
    return f" (CUDA wheels: {text})" if text else ""


def describe(records):
    """A short text of :func:`preload`'s records that did not load (for error messages)."""
    missing = [r["name"] for r in records if r["path"] is None]
    failed = [f"{r['name']} ({r['path']}: {r['error']})" for r in records if r["error"]]
    parts = []
    if failed:
        parts.append("failed to load " + "; ".join(failed))
    if missing:
        parts.append("not in any NVIDIA wheel on sys.path: " + ", ".join(missing))
    return "; ".join(parts)


class WheelLibrary:
    """A CUDA library bound through ctypes (cuBLAS, cuDNN), loaded once per process by
    :meth:`load`: the wheel libraries named by ``preload`` (prefixes, as :func:`preload`
    takes them) first, then each path of ``candidates()`` in turn, opened by ``opener``
    (default ``ctypes.CDLL(path, RTLD_GLOBAL)``), its C functions typed: those of
    ``signatures`` (``{name: argtypes}``, returning a C ``int`` status), then whatever
    ``bind(lib)`` sets. A missing function (``AttributeError``), as a file that does not
    load (``OSError``), moves on to the next path. ``lib`` is the library loaded,
    ``error`` why none did (``"<name> did not load: <path>: <error>; ..."`` and what the
    preload missed), ``preloaded`` :func:`preload`'s records."""

    def __init__(self, name, candidates, signatures, *, bind=None, preload=(), opener=None):
        self.name, self.candidates, self.signatures, self.prefixes = name, candidates, signatures, tuple(preload)
        self.bind = bind
        self.opener = opener
        self.lib = None
        self.error = None
        self.preloaded = []
        self._lock = threading.Lock()

    def load(self):
        """The library, loaded on the first call; None when no candidate loads (:attr:`error`)."""
        if self.lib is not None or self.error is not None:
            return self.lib
        with self._lock:
            if self.lib is not None or self.error is not None:
                return self.lib
            if self.prefixes:
                # the wheels first: the library loads them by soname (NOTE [preloading the CUDA wheels])
                self.preloaded[:] = preload(self.prefixes)
            errors = []
            for path in self.candidates():
                try:
                    lib = (self.opener or _dlopen_global)(path)
                    for name, argtypes in self.signatures.items():
                        fn = getattr(lib, name)
                        fn.argtypes = argtypes
                        fn.restype = ctypes.c_int
                    if self.bind is not None:
                        self.bind(lib)
                except (OSError, AttributeError) as err:
                    errors.append(f"{path}: {err}")
                    continue
                self.lib = lib
                return lib
            self.error = f"{self.name} did not load: " + "; ".join(errors) + self.preload_note()
            return None

    def preload_note(self):
        """What the wheel preload missed, for error messages (empty when nothing)."""
        return preload_note(self.preloaded)

    def use(self, lib):
        """Replaces the library by ``lib`` (an object with the same C functions); None loads
        the real one again at the next :meth:`load`."""
        with self._lock:
            self.lib, self.error = lib, None
