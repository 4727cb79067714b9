"""Data parallelism around a pipeline: ``D`` replicas of its ``P`` stages on ``D * P`` ranks.

World rank ``r`` is stage ``r % P`` of replica ``r // P``.  Every rank is given the same whole
minibatch; replica ``d`` takes its rows ``[B d / D, B (d + 1) / D)`` through its own pipeline (its
micro-batches, its stage-to-stage messages on the replica's communicator), scaling its gradients by
``1 / B`` of the whole minibatch.  Then each stage sums its gradient over the replicas with one
in-place ``Allreduce`` on the stage's communicator (the same stage of every replica) and steps: the
update of one process on the whole minibatch, up to the order of summation, with every replica's
stage holding the same parameters.  The L2 term of the gradient, and the penalty of the loss, are
counted by replica 0 alone, so the sum counts them once.
"""
import numpy as np

from fastckpt.core.checks import check_positive_int

from ..mpi import Group


def check_replicas(data_parallel, ranks):
    """``data_parallel`` checked against the job's ``ranks``: the number of replicas."""
    count = check_positive_int(data_parallel, "data_parallel")
    if ranks % count:
        raise ValueError(f"data_parallel={count} replicas need a multiple of {count} ranks (D replicas of "
                         f"the same number of ranks each), got {ranks}")
    return count


def place(rank, ranks, count):
    """``(replica, position, positions)`` of world rank ``rank`` of ``ranks`` in ``count`` replicas: rank ``r``
    is position ``r % P`` of replica ``r // P``, ``P = ranks / count`` (a stage, or a tensor shard)."""
    positions = ranks // count
    return (*divmod(rank, positions), positions)


class Replicas:
    """This rank's stage and replica on ``world`` (a :class:`~fastckpt.parallel.mpi.Group`), and the two
    communicators: ``pipe`` (a Group: this replica's stages, ranked by stage) and ``data`` (this
    stage's replicas).  Made on every rank after the settings are agreed (the splits are collectives)."""

    def __init__(self, world, count):
        self.count = count
        self.index, self.stage, self.stages = place(world.rank, world.size, count)
        if count == 1:
            self.pipe, self.data = world, None
        else:
            self.pipe = Group(world.comm.Split(self.index, self.stage))
            self.data = world.comm.Split(self.stage, self.index)

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
