"""Runs a script as a task of ``srun`` would see itself, inside a job that mpiexec started:
MPI joins the job first (through mpiexec's PMI variables), then mpiexec's variables give
way to the ones srun sets (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
SLURM_TASKS_PER_NODE, SLURM_NODEID), so that cuvmap.distributed.initialize takes the
job's place from Slurm's. Usage: mpiexec -n P python as_srun.py SCRIPT ARGS..."""
import os
import runpy
import sys

from mpi4py import MPI  # noqa: F401 - joins mpiexec's job before its variables go

rank, size = os.environ["PMI_RANK"], os.environ["PMI_SIZE"]
local = os.environ.get("MPI_LOCALRANKID", rank)
for name in [k for k in os.environ if k.startswith(("PMI_", "OMPI_", "MPI_LOCAL"))]:
    del os.environ[name]
os.environ.update(SLURM_PROCID=rank, SLURM_NTASKS=size, SLURM_LOCALID=local, SLURM_TASKS_PER_NODE=f"{size}",
                  SLURM_NODEID="0", SLURM_JOB_ID="4242")

from cuvmap import distributed  # noqa: E402

info = distributed.detect()
assert info.launcher == distributed.launcher.SLURM and (info.rank, info.size) == (int(rank), int(size)), info
print(f"task {rank}: {info!r}", flush=True)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
