"""The public face of fastckpt over MPI: one import for every trainer that spans processes.

``from fastckpt.distributed import MPITrainer, PipelineTrainer, TensorParallelTrainer, Grid``; they live in
:mod:`fastckpt.parallel`, on the one MPI layer of :mod:`fastckpt.parallel.mpi`.  A :class:`Grid` names the
ranks' roles (``Grid(data=2, pipeline=2)``) and any trainer takes it as ``grid=``.
"""
from .parallel import MPITrainer, PipelineTrainer, TensorParallelTrainer
from .parallel.ending import abort_on_uncaught
from .parallel.grid import Grid
from .parallel.mpi import Group, mpi_world

__all__ = ["Grid", "Group", "abort_on_uncaught", "MPITrainer", "PipelineTrainer", "TensorParallelTrainer",
           "mpi_world"]
