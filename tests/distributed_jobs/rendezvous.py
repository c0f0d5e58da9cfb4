"""A torchrun-style process (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in its environment):
meets the others through the TCP store (cuvmap.distributed.rendezvous.StoreBootstrap on
the CuPy stand-in's cupyx.distributed store) and broadcasts process 0's values, one like
NCCL's 128-byte unique id and one larger than the store's messages."""
import time

import numpy as np

from cuvmap import distributed
from cuvmap.distributed import rendezvous

info = distributed.detect()
assert info.launcher == distributed.launcher.TORCHRUN, info
boot = rendezvous.StoreBootstrap(info.rank, info.size, *info.rendezvous)
uid = boot.broadcast(tuple(range(-64, 64)) if info.rank == 0 else None)
big = boot.broadcast({"weights": np.arange(500.0), "name": "process 0's"} if info.rank == 0 else None)
third = boot.broadcast(f"from {info.rank}", root=info.size - 1)
assert uid == tuple(range(-64, 64)) and big["name"] == "process 0's", (uid, big)
np.testing.assert_array_equal(big["weights"], np.arange(500.0))
assert third == f"from {info.size - 1}", third
print(f"rank {info.rank} of {info.size}: rendezvous ok", flush=True)
if info.rank == 0:
    time.sleep(1.0)   # the store's last replies reach the others before process 0 (its server) ends
boot.close()
