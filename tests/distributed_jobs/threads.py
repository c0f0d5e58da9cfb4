"""A job's process reports how many BLAS threads it has after initialize() (the test
starts it without OMP_NUM_THREADS/OPENBLAS_NUM_THREADS)."""
import numpy as np

from cuvmap import distributed
from cuvmap.distributed import threads

np.ones((64, 64)) @ np.ones((64, 64))  # NumPy's BLAS loaded and started before the job splits the cores
group = distributed.initialize()
print(f"rank {group.rank} blas {threads.blas_threads()} omp {__import__('os').environ.get('OMP_NUM_THREADS')} "
      f"[{threads.setting()}]", flush=True)
