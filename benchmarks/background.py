"""Background load for the benchmarks: ``--background-load N`` starts N busy-loop processes
before a suite runs and stops them when it ends (issue 27: speed that survives a busy
machine).

Each process is a Python loop of additions that never sleeps — one core's worth of demand,
as a data loader or another job on a shared machine — started in this process's session
(the scheduler shares the cores between its threads and the loops as it would with any
other process of the user). A loop checks every few milliseconds that the benchmark that
started it is still its parent, and exits when it is not, so no loop outlives a benchmark
that was killed; :class:`BackgroundLoad` stops them at its exit and at interpreter exit.
"""
import atexit
import os
import subprocess
import sys
import time

# the loop: about 1e5 additions (a few ms) between two looks at the parent
LOOP = ("import os\n"
        "parent = {ppid}\n"
        "x = 0\n"
        "while os.getppid() == parent:\n"
        "    for _ in range(100000):\n"
        "        x += 1\n")


def _cpu_seconds(pid):
    """User + system CPU seconds of process ``pid`` (/proc/PID/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class BackgroundLoad:
    """``with BackgroundLoad(n) as load:`` runs ``n`` busy loops in child processes for the
    body; ``load.pids`` while they run, ``load.stop()`` (idempotent) stops and reaps them
    and returns ``dict(processes, cores_used, wall_s)``: the CPU the loops used, in cores on
    average over their lifetime (None where /proc is unavailable)."""

    def __init__(self, n):
        if n < 0:
            raise ValueError(f"--background-load must be 0 or more, not {n}")
        self.n = int(n)
        self.procs = []
        self.started = None
        self.result = None

    @property
    def pids(self):
        return [p.pid for p in self.procs]

    def start(self):
        code = LOOP.format(ppid=os.getpid())
        self.started = time.perf_counter()
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if self.procs:
            atexit.register(self.stop)
            time.sleep(0.2)   # let the loops start before the first measurement
        return self

    def stop(self):
        if self.result is not None:
            return self.result
        wall = time.perf_counter() - self.started if self.started is not None else 0.0
        cpu = [_cpu_seconds(p.pid) for p in self.procs]
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        used = None if any(c is None for c in cpu) or wall <= 0 else sum(cpu) / wall
        self.result = dict(processes=self.n, cores_used=used, wall_s=wall)
        return self.result

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def describe(self):
        """The setting, for the settings table."""
        if self.n == 0:
            return "none (--background-load 0)"
        return (f"{self.n} busy-loop process(es) started by the benchmark (pids {', '.join(map(str, self.pids))}), "
                "stopped at its end")

    @staticmethod
    def describe_result(result):
        if not result or not result["processes"]:
            return None
        used = "" if result["cores_used"] is None else f": they used {result['cores_used']:.2f} cores on average"
        return f"background load {result['processes']} busy-loop process(es) over {result['wall_s']:.0f} s{used}"
