"""Run under ``mpiexec -n 2``: process 1 fails after the first collective, in the way
``sys.argv[1]`` says, while process 0 goes on to a psum:

- ``raise``: an uncaught exception;
- ``kill``: SIGKILL;
- ``exit3``: ``sys.exit(3)``;
- ``exit0``: ``sys.exit(0)``;
- ``return``: its program ends (it skips the rest);
- ``skip``: it skips one of six steps' psum, so that its steps pair with process 0's
  next ones and it ends one step early.

The job must end with a non-zero status, within the collective timeout
(CUVMAP_COLLECTIVE_TIMEOUT), and, for the exits, within 2 s of process 1's exit (it
prints the time as ``exit at T``)."""
import os
import signal
import sys
import time

import numpy as np

from cuvmap import distributed, lax

group = distributed.initialize()
mode = sys.argv[1]
step = distributed.data_parallel(lambda x: lax.psum(x, "batch"))
step(np.ones(3))


def say_exit():
    print(f"exit at {time.time():.6f}", flush=True)


if group.rank == 1:
    if mode == "raise":
        raise RuntimeError("process 1 gives up")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "exit3":
        say_exit()
        sys.exit(3)
    if mode == "exit0":
        say_exit()
        sys.exit(0)
    if mode == "skip":
        for k in range(6):
            if k != 2:  # (a branch on this process's own data, say)
                step(np.full(3, float(k)))
        say_exit()
if group.rank == 0 or mode not in ("return", "skip"):
    for k in range(6):
        step(np.full(3, float(k)))
    print(f"process {group.rank} was not stopped", flush=True)
elif mode == "return":
    say_exit()
