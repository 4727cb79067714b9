"""Data parallelism around a pipeline: ``D`` replicas of its ``P`` stages on ``D * P`` ranks.

World rank ``r`` is stage ``r % P`` of replica ``r // P``.  Every rank is given the same whole
minibatch; replica ``d`` takes its rows ``[B d / D, B (d + 1) / D)`` through its own pipeline (its
micro-batches, its stage-to-stage messages on the replica's communicator), scaling its gradients by
``1 / B`` of the whole minibatch.  Then each stage sums its gradient over the replicas with one
in-place ``Allreduce`` on the stage's communicator (the same stage of every replica) and steps: the
update of one process on the whole minibatch, up to the order of summation, with every replica's
stage holding the same parameters.  The L2 term of the gradient, and the penalty of the loss, are
counted by replica 0 alone, so the sum counts them once.

With ``tensor=T`` shards per stage (NOTE [ Tensor-parallel stages ] in :mod:`.tensor_stage`), position
``r % (P T)`` is shard ``% T`` of stage ``// T``: ``pipe`` links the stages of one shard index, ``tensor``
the shards of one stage, and ``data`` the same shard of the same stage over the replicas.
"""
import numpy as np

from fastckpt.core.checks import check_positive_int

from ..mpi import Group


def check_replicas(data_parallel, ranks, tensor=1):
    """``data_parallel`` checked against the job's ``ranks`` (and ``tensor`` shards per position): the number
    of replicas."""
    count = check_positive_int(data_parallel, "data_parallel")
    if ranks % (count * tensor):
        each = f" x tensor_parallel={tensor}" if tensor > 1 else ""
        raise ValueError(f"data_parallel={count}{each} needs a multiple of {count * tensor} ranks (D replicas of "
                         f"the same number of ranks each), got {ranks}")
    return count


def place(rank, ranks, count):
    """``(replica, position, positions)`` of world rank ``rank`` of ``ranks`` in ``count`` replicas: rank ``r``
    is position ``r % P`` of replica ``r // P``, ``P = ranks / count`` (a stage, or a tensor shard)."""
    positions = ranks // count
    return (*divmod(rank, positions), positions)


class Replicas:
    """This rank's stage, shard and replica on ``world`` (a :class:`~fastckpt.parallel.mpi.Group`), and the
    communicators: ``pipe`` (a Group: this replica's stages of this shard index, ranked by stage), ``data``
    (this position's replicas, or None) and ``tensor`` (this stage's shards, or None).  Made on every rank
    after the settings are agreed (the splits are collectives)."""

    def __init__(self, world, count, tensor=1):
        self.count, self.shards = count, tensor
        self.index, position, positions = place(world.rank, world.size, count)
        (self.stage, self.shard), self.stages = divmod(position, tensor), positions // tensor
        self.pipe, self.data, self.tensor = world, None, None
        if count > 1:
            self.data = world.comm.Split(position, self.index)
        if tensor > 1:
            self.pipe = Group(world.comm.Split(self.index * tensor + self.shard, self.stage))
            self.tensor = world.comm.Split(self.index * self.stages + self.stage, self.shard)
        elif count > 1:
            self.pipe = Group(world.comm.Split(self.index, self.stage))

    def rows(self, batch):
        """This replica's rows ``(r0, r1)`` of a minibatch of ``batch`` samples."""
        return batch * self.index // self.count, batch * (self.index + 1) // self.count

    def largest(self, batch):
        """The most rows a replica takes of a minibatch of ``batch`` samples."""
        return -(-batch // self.count)

    def own_l2(self, l2):
        """The L2 coefficients this replica applies: all of them on replica 0, none on the others."""
        return l2 if self.index == 0 else np.zeros_like(l2)

    def sum(self, buf, MPI):
        """``buf`` summed over this stage's replicas, in place, on each of them."""
        if self.data is not None:
            self.data.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
