"""How busy the machine was with other work while a benchmark ran."""
import os
import time


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

