"""The process grid of a run over MPI: ``data x pipeline x tensor`` ranks, given to a trainer as ``grid=``.

``Grid(data=D, pipeline=P)`` is ``D`` replicas of a ``P``-stage pipeline, ``Grid(data=D, tensor=T)`` ``D``
replicas of a net split over ``T`` ranks, ``Grid(data=D)`` plain data parallelism; the communicator
(``MPI.COMM_WORLD`` by default) must have exactly ``D x P x T`` ranks.  World rank ``r`` is position
``r % (P T)`` (its stage, or its shard) of replica ``r // (P T)``, as
:func:`fastckpt.parallel.pipeline.replicas.place` numbers them, and each position sums its gradient over
its ``D`` replicas.  ``Grid(data=D, pipeline=P, tensor=T)`` with ``P > 1`` and ``T > 1`` is a pipeline whose
stages are each split over ``T`` ranks, for the PipelineTrainer: position ``p`` is shard ``p % T`` of stage
``p // T`` (NOTE [ Tensor-parallel stages ] in :mod:`fastckpt.parallel.pipeline.tensor_stage`).
"""
from fastckpt.core.checks import check_positive_int


class Grid:
    """``data x pipeline x tensor`` ranks of ``comm`` (see the module docstring).

    Parameters
    ----------
    data, pipeline, tensor : int, optional
        Replicas, pipeline stages and tensor shards; 1 by default.
    comm : mpi4py communicator, optional
        ``MPI.COMM_WORLD`` by default.
    """

    def __init__(self, data=1, pipeline=1, tensor=1, comm=None):
        self.data = check_positive_int(data, "data")
        self.pipeline = check_positive_int(pipeline, "pipeline")
        self.tensor = check_positive_int(tensor, "tensor")
        from .mpi import check_comm, mpi_world
        MPI, world = mpi_world()
        self.comm = world if comm is None else check_comm(comm, MPI)
        comm = self.comm
        if comm.Get_size() != self.size:
            raise ValueError(f"{self!r} needs data x pipeline x tensor = {self.size} ranks; this communicator "
                             f"has {comm.Get_size()}")

    @property
    def size(self):
        """The ranks of the grid: ``data * pipeline * tensor``."""
        return self.data * self.pipeline * self.tensor

    def coords(self, rank=None):
        """``(replica, stage, shard)`` of ``rank`` (default: this process's)."""
        rank = self.comm.Get_rank() if rank is None else check_positive_int(rank, "rank", minimum=0)
        if rank >= self.size:
            raise ValueError(f"rank must be below the grid's {self.size} ranks, got {rank}")
        replica, position = divmod(rank, self.pipeline * self.tensor)
        return (replica, *divmod(position, self.tensor))

    def __repr__(self):
        return f"Grid(data={self.data}, pipeline={self.pipeline}, tensor={self.tensor})"


def grid_args(grid, kind, comm, data_parallel):
    """:func:`from_grid`, its error returned, not raised: ``(comm, data_parallel, error or None)``, so that
    a trainer refuses it on every rank through its settings' agreement (raised at once when no other rank
    could wait)."""
    try:
        return (*from_grid(grid, kind, comm, data_parallel), None)
    except (ValueError, TypeError) as exc:
        from .mpi import launched_ranks
        if launched_ranks() == 1:
            raise
        return comm, data_parallel, exc


def from_grid(grid, kind, comm, data_parallel):
    """``(comm, data_parallel)`` a trainer of ``kind`` ("data", "pipeline" or "tensor") runs on: its own
    arguments, or ``grid``'s when one is given (then without ``comm`` or ``data_parallel``)."""
    if grid is None:
        return comm, data_parallel
    if not isinstance(grid, Grid):
        raise TypeError(f"grid must be a fastckpt.distributed.Grid, got {type(grid).__name__}")
    if comm is not None or data_parallel != 1:
        others = "comm" if kind == "data" else "comm and data_parallel"
        raise ValueError(f"give grid={grid!r} or {others}, not both")
    other = {"data": ("pipeline", "tensor"), "pipeline": (), "tensor": ("pipeline",)}[kind]
    for axis in other:
        if getattr(grid, axis) > 1:
            raise ValueError(f"{grid!r} has {axis}={getattr(grid, axis)}: it is a grid for the "
                             f"{'PipelineTrainer' if axis == 'pipeline' else 'TensorParallelTrainer'}")
    return grid.comm, grid.data
