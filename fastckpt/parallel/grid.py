"""The process grid of a run over MPI, ``data x pipeline x tensor`` ranks, and the one owner of its communicators.

``Grid(data=D, pipeline=P, tensor=T)`` is ``D`` replicas of a net cut into ``P`` pipeline stages, each stage's
layers split over ``T`` tensor shards; any of them alone is plain data, pipeline or tensor parallelism.  The
communicator (``MPI.COMM_WORLD`` by default) must have exactly ``D x P x T`` ranks.  World rank ``r`` is
replica ``r // (P T)``; its position ``r % (P T)`` is shard ``% T`` of stage ``// T``.  :meth:`Grid.places`
splits the communicators once, as Megatron-LM's ``parallel_state`` does, and every part of a trainer asks
it for them: ``pipe`` links the stages of one replica and shard index, ``tensor`` the shards of one stage,
``data`` the same shard of the same stage over the replicas.

NOTE [ One meaning of data parallelism ]
Each replica trains on mini-batches of its own, as PyTorch's DistributedDataParallel does: an update
takes ``D`` mini-batches of ``--batch-size`` samples (replica ``d`` the ``d``-th of each group), sums
their batch-mean gradients over the replicas and steps on the mean, so an epoch makes ``D`` times fewer
updates than one process at the same ``--batch-size`` and ``eta`` (a larger ``eta`` makes up for it).
With same-size mini-batches an update equals one process's step on their concatenation, up to the
order of summation.  Threads (:class:`~fastckpt.parallel.threads.DataParallel`) mean the same, with
``parallel_batches`` mini-batches per update, the course exercise's.  So ``--data-parallel 2`` on 2 ranks
and ``--data-parallel 2 --pipeline 2`` on 4 train the same net, to rounding.
"""
from fastckpt.core.checks import check_positive_int

from .mpi import Group, communicator


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
        self.comm = communicator(comm)[1]
        if self.comm.Get_size() != self.size:
            raise ValueError(f"{self!r} needs data x pipeline x tensor = {self.size} ranks; this communicator "
                             f"has {self.comm.Get_size()}")
        self._places = None

    @classmethod
    def fill(cls, data=None, pipeline=None, tensor=None, comm=None):
        """The grid of ``comm`` whose one axis left as None takes the ranks the others leave."""
        ranks = communicator(comm)[1].Get_size()
        given = {axis: check_positive_int(n, axis) for axis, n in (("data", data), ("pipeline", pipeline),
                                                                    ("tensor", tensor)) if n is not None}
        left = [axis for axis in ("data", "pipeline", "tensor") if axis not in given]
        others = given.get("data", 1) * given.get("pipeline", 1) * given.get("tensor", 1)
        if left and ranks % others:
            shown = " x ".join(f"{axis}={n}" for axis, n in given.items())
            raise ValueError(f"{shown} needs a multiple of {others} ranks ({others} x {left[0]}), got {ranks}")
        filled = dict({axis: 1 for axis in left}, **({left[0]: ranks // others} if left else {}), **given)
        return cls(**filled, comm=comm)

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

    def places(self):
        """This rank's :class:`Places`, its communicators split on first need (a collective: every rank of the
        grid calls it at the same point)."""
        if self._places is None:
            self._places = Places(self)
        return self._places

    def __repr__(self):
        return f"Grid(data={self.data}, pipeline={self.pipeline}, tensor={self.tensor})"

    def __reduce__(self):
        raise TypeError("a Grid holds an MPI communicator and cannot be pickled or copied")


class Places:
    """This rank's ``replica``, ``stage`` and ``shard`` in a :class:`Grid`, and the communicators of its axes:
    ``pipe`` (a :class:`~fastckpt.parallel.mpi.Group`: this replica's stages of this shard index, ranked by
    stage), ``tensor`` (this stage's shards), ``data`` (this position's replicas) and ``replica_comm`` (every
    rank of this replica); None where it would have one rank."""

    def __init__(self, grid):
        world = grid.comm
        self.replica, self.stage, self.shard = grid.coords()
        self.replicas, self.stages, self.shards = grid.data, grid.pipeline, grid.tensor
        position = self.stage * self.shards + self.shard
        self.data = self._axis(world, self.replicas, position, self.replica)
        self.tensor = self._axis(world, self.shards, self.replica * self.stages + self.stage, self.shard)
        pipe = self._axis(world, self.stages, self.replica * self.shards + self.shard, self.stage)
        self.pipe = None if pipe is None else Group(pipe)
        self.replica_comm = self._axis(world, self.stages * self.shards, self.replica, position)   # a replica's

    @staticmethod
    def _axis(world, ranks, color, key):
        """The communicator of an axis of ``ranks`` ranks: None for one, the world itself for all of them (a
        split would cost mpich 2 MiB of shared memory on one rank for a communicator the world already is),
        else the world split by ``color``, ranked by ``key``."""
        if ranks == 1:
            return None
        return world if ranks == world.Get_size() else world.Split(color, key)

    def sum_replicas(self, buf, MPI):
        """``buf`` summed over this position's replicas, in place, on each of them."""
        if self.data is not None:
            self.data.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
