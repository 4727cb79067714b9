"""The public face of fastckpt over MPI: one trainer, over a grid of ranks.

``from fastckpt.distributed import Trainer, Grid``; ``Trainer(sizes, grid=Grid(data=D, pipeline=P, tensor=T))``
trains one net over ``D x P x T`` ranks (:mod:`fastckpt.parallel.trainer`).  ``MPITrainer``,
``PipelineTrainer`` and ``TensorParallelTrainer`` are the names of 0.3, kept as functions that make a
:class:`Trainer`.
"""
from .parallel import MPITrainer, PipelineTrainer, TensorParallelTrainer, Trainer
from .parallel.grid import Grid
from .parallel.mpi import Group, abort_on_uncaught, mpi_world

__all__ = ["Grid", "Group", "MPITrainer", "PipelineTrainer", "TensorParallelTrainer", "Trainer", "abort_on_uncaught",
           "mpi_world"]
