"""Parallel training: threads (:class:`DataParallel`) and, over the one MPI layer of :mod:`fastckpt.parallel.mpi`,
data, pipeline and tensor parallelism in one :class:`Trainer` over a :class:`Grid`.  Imports the nets and
everything below them; never the reports."""
from .grid import Grid
from .threads import DataParallel
from .trainer import MPITrainer, PipelineTrainer, TensorParallelTrainer, Trainer

__all__ = ["DataParallel", "Grid", "MPITrainer", "PipelineTrainer", "TensorParallelTrainer", "Trainer"]
