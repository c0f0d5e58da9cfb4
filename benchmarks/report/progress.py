"""The progress bar the suites draw on stderr."""
import sys
import time


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
