"""Run under ``mpiexec -n 2``: process 1 fails before the first collective, in the way
``sys.argv[1]`` says (``raise``: an uncaught exception; ``leave``: it returns early and
exits normally; ``kill``: SIGKILL), while process 0 waits in a psum. The job must end
with a non-zero status, within the collective timeout (CUVMAP_COLLECTIVE_TIMEOUT)."""
import os
import signal
import sys

import numpy as np

from cuvmap import distributed, lax

group = distributed.initialize()
mode = sys.argv[1]
if group.rank == 1:
    if mode == "raise":
        raise RuntimeError("process 1 gives up")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "leave":
        sys.exit(0)
distributed.data_parallel(lambda x: lax.psum(x, "batch"))(np.ones(3))
print("process 0 was not stopped", flush=True)
