"""Parallel training: threads (:class:`DataParallel`) and, over the one MPI layer of
:mod:`fastckpt.parallel.mpi`, data (:class:`MPITrainer`), pipeline (:class:`PipelineTrainer`) and tensor
(:class:`TensorParallelTrainer`) parallelism.  Imports the nets and everything below them; never the reports."""
from .data_parallel import MPITrainer
from .pipeline import PipelineTrainer
from .tensor import TensorParallelTrainer
from .threads import DataParallel

__all__ = ["DataParallel", "MPITrainer", "PipelineTrainer", "TensorParallelTrainer"]
