"""Command-line helpers shared by the examples: an argument parser whose ``--help`` shows
the defaults, argument types that reject non-positive sizes with an argparse error (exit
status 2, no traceback), and a progress bar that follows the benchmarks' rule for
terminals and logs (``benchmarks/report/progress.py``'s ``Progress``).

The examples import it with their own directory on ``sys.path``::

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cli import Progress, example_parser, positive_int  # noqa: E402
"""
import argparse
import sys
import time

import cuvmap as cv


def example_parser(doc):
    """An ``ArgumentParser`` described by the first line of ``doc``, whose ``--help``
    shows every option's default (options need a ``help`` string for that), with the
    ``--device`` option every example has.

    Args:
      doc: the example's module docstring.
    Returns:
      the parser.
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "gpu"], default="gpu" if cv.gpu_available() else "cpu",
                        help="where the arrays live (the GPU when CuPy sees one)")
    return parser


def add_progress_option(parser):
    """``--progress auto|on|off``, as in the benchmarks."""
    parser.add_argument("--progress", choices=["auto", "on", "off"], default="auto",
                        help="progress bar on stderr: auto (on a terminal only), on (also a few plain lines "
                             "when stderr is a log or a pipe), off")


def _number(kind, text, convert, ok, what):
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
    return value


def positive_int(text):
    """An argparse ``type``: an int ≥ 1 (sizes, counts, steps)."""
    return _number("an integer", text, int, lambda v: v >= 1, "a positive integer")


def positive_float(text):
    """An argparse ``type``: a float > 0 (learning rates, norms, epochs)."""
    return _number("a number", text, float, lambda v: v > 0 and v != float("inf"), "a positive number")


def open_unit_interval(text):
    """An argparse ``type``: a float in (0, 1) (a δ of differential privacy)."""
    return _number("a number", text, float, lambda v: 0 < v < 1, "between 0 and 1 (exclusive)")


class Progress:
    """``with Progress(total, "train", mode) as bar: bar.update(info="loss 0.3")``, on stderr.

    ``mode`` is the benchmarks' (``benchmarks/report/progress.py``): ``"auto"`` draws a bar that
    redraws itself with carriage returns on a terminal and writes nothing otherwise;
    ``"on"`` draws on a terminal and, when stderr is a file or a pipe, writes plain lines
    instead (at most about 20, never a ``\\r``); ``"off"`` writes nothing.
    """

    LINES = 20

    def __init__(self, total, label, mode="auto", width=30, stream=None):
        if mode not in ("auto", "on", "off"):
            raise ValueError(f"Progress: mode must be 'auto', 'on' or 'off', got {mode!r}")
        self.total, self.label, self.width, self.done = max(1, total), label, width, 0
        self.stream = stream or sys.stderr
        tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.mode = "off" if mode == "off" else ("tty" if tty else ("lines" if mode == "on" else "off"))
        self.start = time.perf_counter()

    def update(self, n=1, info=""):
        """Marks ``n`` more steps done; ``info`` is shown after the count."""
        before, self.done = self.done, min(self.total, self.done + n)
        elapsed = time.perf_counter() - self.start
        if self.mode == "tty":
            filled = int(self.width * self.done / self.total)
            self.stream.write(f"\r\033[K{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                              f"{self.done}/{self.total} {elapsed:5.1f}s {info}")
            self.stream.flush()
        elif self.mode == "lines":
            # a line each time another 1/LINES of the steps is done, and at the end
            step = self.done * self.LINES // self.total > before * self.LINES // self.total
            if self.done > before and (step or self.done == self.total):
                self.stream.write(f"{self.label} {self.done}/{self.total} {elapsed:.1f}s {info}".rstrip() + "\n")
                self.stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.mode == "tty":
            self.stream.write("\n")
            self.stream.flush()
