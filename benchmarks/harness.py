"""The benchmark harness: settings, machine load, markdown tables, JSON, plots and a
progress bar, with the timers and the runner of :mod:`benchmarks.timing` (re-exported
here) and the statistics of :mod:`benchmarks.stats`. No dependency beyond NumPy;
threadpoolctl, matplotlib and tqdm are used when installed and skipped with a note when
not.

How a case is timed — first call alone, warm-up, interleaved rounds, adaptive repeats,
CUDA events with an L2 flush — is :mod:`benchmarks.timing`'s docstring; how two cases'
times become a ratio with a confidence interval and a verdict (FAST, SLOW, SAME) is
:mod:`benchmarks.stats`'s; ``python -m benchmarks compare BASE.json HEAD.json`` compares
two runs (:mod:`benchmarks.compare`).
"""
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np

from benchmarks import stats as bstats
from benchmarks import timing
from benchmarks.timing import (Case, Policy, Stats, Timer, as_timer, cpu_timer, cupy_event_timer,  # noqa: F401
                               cupy_pool_peak, measure, run_cases, spread_text, timed_rounds, timer_for,
                               torch_cuda_peak, torch_event_timer, warm_up)

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


# ---------------------------------------------------------------------------------------
# Frameworks, the GEMM rate, ratios between cases
# ---------------------------------------------------------------------------------------


def setup_torch(args, notes, fw, what):
    """Imports torch and sets it up like NumPy: the same thread count, no TF32. Returns the
    module, or None with the reason in ``notes`` (``what`` names the rows skipped);
    ``args`` has ``no_torch`` and ``device``; ``fw["torch"]`` says how torch runs."""
    if args.no_torch:
        notes.append(f"{what}: skipped (--no-torch)")
        return None
    try:
        import torch
        import torch.func  # noqa: F401
    except ImportError:
        notes.append(f"{what}: skipped (torch is not installed)")
        return None
    if args.device == "gpu" and not torch.cuda.is_available():
        notes.append(f"{what}: skipped (torch {torch.__version__} sees no CUDA device)")
        return None
    threads, source = blas_threads()
    torch.set_num_threads(threads)
    # cuvmap computes in strict float32; so must the comparison (TF32 is on by default for
    # torch's cuDNN convolutions on Ampere and later)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    fw["torch"] = (f"{torch.__version__}; torch.set_num_threads({threads}) = NumPy's BLAS threads "
                   f"(from {source}); TF32 off")
    return torch


def gemm_rate(xp, n=1024, repeats=5, warmup=1, dtype=np.float32, timer=None):
    """The float32 GEMM rate of ``xp.matmul`` on ``n × n`` matrices, in FLOP/s (median),
    with the :class:`Stats`."""
    rng = np.random.default_rng(0)
    a = xp.asarray(rng.standard_normal((n, n)).astype(dtype))
    b = xp.asarray(rng.standard_normal((n, n)).astype(dtype))
    stats = measure(lambda: xp.matmul(a, b), repeats=repeats, warmup=warmup, timer=timer or timer_for(xp))
    return 2.0 * n ** 3 / stats.median, stats


def policy_of(args):
    """The timing policy of a run: the CLI's (``args.policy``), or one from ``args``."""
    policy = getattr(args, "policy", None)
    return policy if policy is not None else Policy.from_args(args)


def compare_rows(num, den, args=None, paired=True):
    """``num / den`` of two rows' per-call times (``times_ms``), as a
    :class:`benchmarks.stats.Comparison`: paired by round (the rows were timed in the same
    interleaved rounds) or not; ``args`` gives ``--factor`` and ``--confidence``."""
    return bstats.compare_samples(num["times_ms"], den["times_ms"], paired=paired,
                                  confidence=getattr(args, "confidence", bstats.DEFAULT_CONFIDENCE),
                                  factor=getattr(args, "factor", bstats.DEFAULT_FACTOR))


def verdict_text(comparison):
    """The verdict for a table (FAST and SLOW in bold), with ``?`` when unresolved."""
    v = comparison.verdict
    return (f"**{v}**" if v != bstats.SAME else v) + ("" if comparison.resolved else " ?")


def noisy_lines(rows, name, target=None):
    """Markdown lines (none or one) naming the rows flagged noisy (``row["noisy"]``) with
    their IQR / median; ``name(row)`` names a row. torch.utils.benchmark's IQR warning, in
    the harness's words."""
    noisy = [f"{name(r)} {100 * r['spread']:.0f}%" for r in rows if r.get("noisy") and r.get("spread") is not None]
    if not noisy:
        return []
    return [f"- ⚠ **noisy** (IQR / median above {100 * (target or timing.DEFAULT_MAX_SPREAD):g}% after the rounds "
            f"allowed: the machine's load moved them, their intervals are wide): " + "; ".join(noisy)]


def timing_lines(rows, name, args):
    """The lines a suite prints after its table of times: the noisy rows
    (:func:`noisy_lines`) and each row's timing notes, ``name(row)`` naming a row."""
    lines = noisy_lines(rows, name, policy_of(args).max_spread)
    return lines + [f"- {name(r)}: {n}" for r in rows for n in r["timing_notes"]]


# ---------------------------------------------------------------------------------------
# Settings printed with the figures
# ---------------------------------------------------------------------------------------

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


def git_revision():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (rev + ("+dirty" if dirty else "")) if rev else None


def device_description(device):
    if device == "gpu":
        from cuvmap.cuda import device as cuda_device

        return cuda_device.describe()
    return f"CPU: {cpu_model()}, {os.cpu_count()} logical cores"


def settings(device):
    """An ordered dict of the settings in force: versions, the threading environment as
    given by the user (never changed here), BLAS, device."""
    import cuvmap

    s = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cuvmap": cuvmap.__version__ + (f" (git {git_revision()})" if git_revision() else ""),
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


def settings_line(settings_dict):
    """The settings on one line (for headers of narrow outputs)."""
    return "; ".join(f"{k} {v}" for k, v in settings_dict.items())


class LoadMonitor:
    """How busy the machine was with other work while a benchmark ran (Linux: from
    ``/proc/stat`` and the CPU times of this process and of the children it waited for;
    elsewhere only the load average).

    ``others_cores`` is the CPU time that other processes used during the run over its
    wall time, in cores: on a quiet machine it is near 0, and figures measured while it is
    a sizeable part of the cores are slower and noisier than the machine can do.
    """

    def __init__(self):
        self.start = self._snapshot()

    @staticmethod
    def _snapshot():
        # this process's CPU time and its finished children's (a suite's jobs under mpiexec)
        snap = dict(wall=time.perf_counter(), own=sum(os.times()[:4]))
        try:
            with open("/proc/stat") as fh:
                fields = [int(v) for v in fh.readline().split()[1:]]
            hz = os.sysconf("SC_CLK_TCK")
            # user nice system idle iowait irq softirq steal ...
            snap["busy"] = (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / hz
            snap["steal"] = (fields[7] if len(fields) > 7 else 0) / hz
        except (OSError, ValueError, IndexError, AttributeError):
            pass
        try:
            snap["loadavg"] = os.getloadavg()[0]
        except (OSError, AttributeError):
            snap["loadavg"] = None
        return snap

    def stop(self):
        """A dict: ``others_cores``, ``steal_cores`` (None where unknown), ``loadavg_start``,
        ``loadavg_end``, ``cores``, ``wall_s``, and ``warning`` (a sentence, or None)."""
        end = self._snapshot()
        start = self.start
        wall = max(1e-9, end["wall"] - start["wall"])
        cores = os.cpu_count() or 1
        out = dict(cores=cores, wall_s=wall, loadavg_start=start["loadavg"], loadavg_end=end["loadavg"],
                   others_cores=None, steal_cores=None, warning=None)
        if "busy" in start and "busy" in end:
            others = (end["busy"] - start["busy"]) - (end["own"] - start["own"])
            out["others_cores"] = max(0.0, others / wall)
            out["steal_cores"] = max(0.0, (end["steal"] - start["steal"]) / wall)
        busy = (out["others_cores"] or 0.0) + (out["steal_cores"] or 0.0)
        if busy > 0.1 * cores:
            out["warning"] = (f"other processes used {busy:.2f} of the {cores} cores on average during this run "
                              "(steal time included): the figures are slower and noisier than this machine can "
                              "do; rerun on a quiet machine")
        elif out["others_cores"] is None and (start["loadavg"] or 0) > 0.5 * cores:
            out["warning"] = f"the load average was {start['loadavg']:.2f} on {cores} cores when the run started"
        return out

    @staticmethod
    def describe(load):
        parts = []
        if load["others_cores"] is not None:
            parts.append(f"other processes {load['others_cores']:.2f} cores, steal {load['steal_cores']:.2f} cores "
                         f"(of {load['cores']}) on average over {load['wall_s']:.0f} s")
        if load["loadavg_start"] is not None:
            parts.append(f"load average {load['loadavg_start']:.2f} at the start, {load['loadavg_end']:.2f} at the end")
        return "; ".join(parts) or "unknown"


# ---------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------


def fmt(x, digits=3):
    """A number for a table: ``digits`` significant figures, thousands kept whole."""
    if x is None:
        return "–"
    if isinstance(x, str):
        return x
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return str(int(x))
    x = float(x)
    if math.isnan(x):
        return "nan"
    if x == 0:
        return "0"
    if abs(x) >= 10 ** (digits - 1) and abs(x) < 1e7:
        return f"{x:.0f}"
    if abs(x) < 1e-3 or abs(x) >= 1e7:
        return f"{x:.{max(0, digits - 1)}e}"
    return f"{x:.{digits}g}"


def markdown_table(headers, rows, align=None):
    """A markdown table; ``align`` is a string of ``l``/``r`` per column (numbers right)."""
    align = align or "l" + "r" * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(c) for c in row) + " |")
    return "\n".join(lines)


def time_per_scope(label, fn, args, rounds=10, policy=None):
    """``--scopes``: the median time per call of each named scope of ``fn(*args)``, staged
    as ``jit`` stages it (``cuvmap.profiler.time_by_scope``, NOTE [time per scope] in
    cuvmap/profiler.py), with the background loops of ``--alternate-load`` (``policy.load``)
    paused. Prints a table; returns it as a dict for the JSON."""
    import cuvmap as cv

    load = getattr(policy, "load", None)
    if load is not None:
        load.set_running(False)
        label += ", the background loops paused"
    times = cv.profiler.time_by_scope(fn, *args, rounds=rounds)
    total = sum(times.seconds.values()) or 1.0
    rows = [dict(scope=k, steps=times.steps[k], ms=t * 1e3, share=t / total) for k, t in times.seconds.items()]
    print(f"\n## Time per named scope: {label} ({times.rounds} rounds, medians; cuvmap.profiler)\n")
    print(markdown_table(["scope", "steps", "ms", "share"],
                         [(r["scope"], r["steps"], r["ms"], f"{r['share']:.1%}") for r in rows], "lrrr"))
    print(f"\nthe steps take {times.total * 1e3:.3g} ms together, the untimed call {times.call * 1e3:.3g} ms "
          "(the difference: the clock reads around every step)")
    return dict(label=label, rows=rows, total_ms=times.total * 1e3, call_ms=times.call * 1e3)


def settings_table(settings_dict):
    return markdown_table(["setting", "value"], [(k, str(v)) for k, v in settings_dict.items()], "ll")


# ---------------------------------------------------------------------------------------
# Output files
# ---------------------------------------------------------------------------------------


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
        json.dump(jsonable(results), fh, indent=2)
    return path


def plot_lines(path, series, *, title, xlabel="batch size", ylabel="ms per example", hlines=None,
               logy=True, dashed=()):
    """A PNG of ``series`` (``{label: [(x, y), ...]}``), one line per label, log-2 x axis;
    the labels in ``dashed`` are drawn dashed, and ``hlines`` (``{label: y}``) as grey
    dashed horizontal lines. Returns ``(path, None)``, or ``(None, note)`` when matplotlib
    is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "no plot: matplotlib is not installed (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(11, 5.5))
    for label, points in series.items():
        points = sorted(p for p in points if p[1] is not None)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label,
                    linestyle="--" if label in dashed else "-")
    for label, y in (hlines or {}).items():
        ax.axhline(y, linestyle="--", color="grey", linewidth=1)
        ax.annotate(label, (0.01, y), xycoords=("axes fraction", "data"), fontsize=8, color="grey",
                    va="bottom")
    ax.set_xscale("log", base=2)
    xs = sorted({p[0] for points in series.values() for p in points})
    if xs:
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
    if logy:
        ax.set_yscale("log")
        from matplotlib.ticker import FuncFormatter

        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, None


# ---------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------


class Progress:
    """A minimal progress bar on stderr: ``[#####.....] 5/10 0:12 label``.

    ``mode``: ``"auto"`` draws on a terminal and stays silent otherwise; ``"on"`` draws on
    a terminal and writes one line per step elsewhere (logs); ``"off"`` is silent. Uses
    tqdm when it is installed and stderr is a terminal.
    """

    def __init__(self, total, mode="auto", width=24, stream=None):
        self.total = max(1, total)
        self.done = 0
        self.width = width
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.mode = "off" if mode == "off" else ("tty" if tty else ("lines" if mode == "on" else "off"))
        self._tqdm = None
        if self.mode == "tty":
            try:
                from tqdm import tqdm

                self._tqdm = tqdm(total=self.total, file=self.stream, leave=False, dynamic_ncols=True)
            except ImportError:
                pass

    def _elapsed(self):
        s = int(time.perf_counter() - self.start)
        return f"{s // 60}:{s % 60:02d}"

    def set(self, label):
        """Shows ``label`` as the step now running."""
        if self._tqdm is not None:
            self._tqdm.set_description_str(label)
        elif self.mode == "tty":
            filled = int(self.width * self.done / self.total)
            bar = "#" * filled + "." * (self.width - filled)
            self.stream.write(f"\r\033[K[{bar}] {self.done}/{self.total} {self._elapsed()} {label}")
            self.stream.flush()

    def step(self, label=""):
        """Marks one step done (``label``: what finished)."""
        self.done = min(self.total, self.done + 1)
        if self._tqdm is not None:
            self._tqdm.update(1)
        elif self.mode == "lines":
            self.stream.write(f"[{self.done}/{self.total} {self._elapsed()}] {label}\n")
            self.stream.flush()
        elif self.mode == "tty":
            self.set(label)

    def close(self):
        if self._tqdm is not None:
            self._tqdm.close()
        elif self.mode == "tty":
            self.stream.write("\r\033[K")
            self.stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
