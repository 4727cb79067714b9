"""The public face of fastckpt over MPI: one import for every trainer that spans processes.

``from fastckpt.distributed import MPITrainer, PipelineTrainer, TensorParallelTrainer``; they live in
:mod:`fastckpt.parallel`, on the one MPI layer of :mod:`fastckpt.parallel.mpi`.
"""
from .parallel import MPITrainer, PipelineTrainer, TensorParallelTrainer
from .parallel.ending import abort_on_uncaught
from .parallel.mpi import Group, mpi_world

__all__ = ["Group", "abort_on_uncaught", "MPITrainer", "PipelineTrainer", "TensorParallelTrainer", "mpi_world"]
