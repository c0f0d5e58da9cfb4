"""The PNG plot of a suite with a batch-size axis (matplotlib, when installed)."""
import os


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
