"""Data parallelism across processes and machines over MPI (mpi4py).

Every rank holds the whole network, starts from the same weights and takes
its own minibatch of each update: update ``u`` uses minibatches
``u * ranks + r`` for rank ``r``.  The gradients are summed to rank 0, in
rank order, and broadcast back (on 2 ranks one ``Allreduce``, the same bits:
``a + b == b + a``), so every rank applies the very same update and the weights
stay identical everywhere.  With same-size minibatches an update
equals one step on their concatenation, up to rounding.  Checkpointing runs
unchanged on each rank: each uses the network's own plan.

Start it with ``mpiexec -n N fastckpt train --mpi ...`` or from Python with
:class:`MPITrainer`.  Each rank sends and receives one flat gradient per update
(the parameters' bytes) through the reduce and the broadcast.  Ranks on one
machine split its cores: each runs BLAS on ``cores // ranks_on_the_machine``
threads, since more would only spin against the other ranks.  Errors follow
NOTE [ No rank waits forever ] (:mod:`fastckpt.parallel.mpi`).
"""

import numpy as np

from fastckpt.core.checks import check_eta, check_positive_int
from fastckpt.core.resources import shown_bytes
from fastckpt.engine import Engine
from fastckpt.nets import Network
from fastckpt.planner import InfeasiblePlan
from fastckpt.planner.run import staged
from fastckpt.planner.strategies import Fit

from .buckets import Buckets
from .grid import from_grid
from .mpi import Group, lab_loop, launched_ranks
from .rank_trainer import RankTrainer, digest

MODE = "data parallel (--mpi)"
EXCHANGE_BUFFERS = 3               # gradient-sized buffers of an update's exchange (send, sum, MPI's), per rank


class MPITrainer(RankTrainer):
    """Train ``net`` with one minibatch per rank and an all-reduced gradient per update.

    Parameters
    ----------
    net : Network or NetworkWithCheckpointing
        Must start from the same weights on every rank (the same seed);
        :meth:`SGD` checks this and the other settings first.
    comm : mpi4py communicator, optional
        ``MPI.COMM_WORLD`` by default.
    bucket_bytes : int, optional
        Sum the gradient in buckets of about this many bytes, each started
        while the backward pass goes on (NOTE [ Overlapped buckets ] in
        :mod:`fastckpt.parallel.buckets`; PyTorch DDP's default is 25 MiB).
        By default the gradient is summed to rank 0 in rank order after the
        backward pass and broadcast.
    grid : Grid, optional
        ``Grid(data=N)`` (:class:`~fastckpt.parallel.grid.Grid`), instead of ``comm``.
    """

    def __init__(self, net, comm=None, bucket_bytes=None, *, grid=None):
        if not isinstance(net, Network):
            raise TypeError(f"net must be a fastckpt Network, got {type(net).__name__}")
        self.net = net
        try:                                         # an error here is every rank's, through the agreement below
            self.bucket_bytes = None if bucket_bytes is None else check_positive_int(bucket_bytes, "bucket_bytes")
            comm, _ = from_grid(grid, "data", comm, 1)
            mine = dict(self._net_settings(), mode=MODE, bucket_bytes=self.bucket_bytes)
        except (ValueError, TypeError) as exc:
            if launched_ranks() == 1:                # no other rank to tell
                raise
            mine = exc
        self.group = Group(comm)
        self.MPI, self.comm = self.group.MPI, self.group.comm
        self.rank, self.ranks = self.group.rank, self.group.size
        self.group.agree(mine)                                        # the first collective of every trainer
        self.blas_threads = self.group.share_cores()
        self.bytes_per_update = 2 * net.params.flat.nbytes    # one reduce and one broadcast of the gradient
        self._total = net.params.new_buffer() if self.rank == 0 or bucket_bytes or self.ranks == 2 else None
        self._local = net.params.new_buffer()
        self._staged = (True, True)       # whether minibatches are converted into staging rows: until seen, yes
        self._buckets = None if self.bucket_bytes is None else Buckets(
            self.comm, self.MPI, net.sizes, net.dtype.itemsize, self.bucket_bytes, self._local, self._total)
        self._engine = None
        self.last_loss = None

    def plan(self, batch):
        """The plan of each rank's step: the net's, with ``fit(bytes)`` leaving room for the exchange (so the
        bound holds for what each rank holds): this rank's gradient sum, rank 0's reduced one and MPI's own
        temporary for the reduce, each the parameters' size (measured with memray on mpich), and the rows a
        minibatch not given as C-contiguous rows of the net's dtype (or integer labels) is converted into."""
        net = self.net
        buffers = EXCHANGE_BUFFERS * net.params.flat.nbytes + self._staging_bytes(batch, (True, True))
        if not isinstance(net.strategy, Fit):        # the ranks' gradients are summed before any step: no
            return net.plan(batch, optimizer_in_backward=False)     # optimizer in the backward pass here
        try:
            if net.strategy.nbytes <= buffers:
                raise InfeasiblePlan("", buffers + 1)
            return net.plan(batch, strategy=Fit(net.strategy.nbytes - buffers), optimizer_in_backward=False)
        except InfeasiblePlan as exc:
            least = exc.minimum_bytes + buffers
            raise InfeasiblePlan(f"{net.strategy} with --mpi: a rank's step, the gradient buffers of the "
                                 f"exchange and the rows a minibatch may be converted into need at least {least} "
                                 f"bytes ({shown_bytes(least)}); got {net.strategy.nbytes}", least) from None

    def predicted_bytes(self, batch):
        """Bytes by part that one rank holds, training on minibatches of ``batch`` samples; ``staging``: the
        rows the last minibatch's x and y were converted into (before any, as if they are)."""
        parts = dict(self.plan(batch).bytes())
        parts.pop("activation_memory", None)
        parts["exchange_buffers"] = EXCHANGE_BUFFERS * self.net.params.flat.nbytes
        parts["staging"] = self._staging_bytes(batch, self._staged)
        parts["total"] += parts["exchange_buffers"] + parts["staging"]
        return parts

    def _staging_bytes(self, batch, staged):
        sizes = self.net.sizes
        return batch * (sizes[0] * staged[0] + sizes[-1] * staged[1]) * self.net.dtype.itemsize

    def _engine_for(self, batch):
        if self._engine is None or self._engine.plan.batch_size < batch:
            self._engine = None
            self._engine = Engine(self.plan(batch), self.net.loss, self.net.l2, self.net.activation)
        return self._engine

    def _sum(self, xs, ys):
        """This rank's gradient sum over ``xs``, summed over the ranks; returns the buffer holding it."""
        net, local, buckets = self.net, self._local, self._buckets
        if xs:
            self._staged = (any(staged(x, net.dtype) for x in xs), any(staged(y, net.dtype) for y in ys))
        if not xs:
            local[...] = 0.0
            if buckets is not None:
                buckets.start_zeros()
        for k, (x, y) in enumerate(zip(xs, ys)):
            engine = self._engine_for(np.shape(x)[0])
            if buckets is not None and k == len(xs) - 1:           # the last overlaps the sum
                after = buckets.start(engine.plan, engine.grad, add=k > 0)
                self.last_loss = engine.gradients(net.params, x, y, cuts=buckets.cuts(engine.plan), after=after)
            else:
                self.last_loss = engine.gradients(net.params, x, y, out=local, add=k > 0)   # this rank's last
        if buckets is not None:
            buckets.wait()
            return self._total
        if self.ranks == 2:                                        # one Allreduce: the ordered sum's bits
            self.comm.Allreduce(local, self._total, op=self.MPI.SUM)   # (a + b == b + a), in fewer steps
            return self._total
        self.comm.Reduce(local, self._total, op=self.MPI.SUM, root=0)
        if self.rank == 0:
            local[...] = self._total
        self.comm.Bcast(local, root=0)
        return local

    def update(self, x, y, eta):
        """One step of the net's optimizer on the mean of every rank's minibatch gradient (same size on every
        rank)."""
        self.update_many([x], [y], eta)

    def update_many(self, xs, ys, eta, count=None):
        """One step of the net's optimizer (the lab's SGD by default) on the mean gradient of all ranks'
        minibatches, ``len(xs)`` on each rank.

        Several minibatches per rank share one exchange: their gradients are
        summed locally, in order, before the reduce.  ``count`` is the number
        of minibatches of all ranks together (default ``len(xs)`` times the
        ranks); a rank with none (the last update of an epoch) adds zeros.  A
        refused update raises FloatingPointError on every rank; any other
        error ends the job.
        """
        net = self.net
        with self.group.errors() as errors:
            try:
                eta = check_eta(eta)
                count = self.ranks * len(xs) if count is None else check_positive_int(count, "count")
                if count < len(xs):
                    raise ValueError(f"count={count} minibatches in all, but this rank alone has {len(xs)}")
                mine = {"eta and minibatches per update": f"eta {eta!r}, {count} minibatches in all"}
            except (ValueError, TypeError) as exc:
                mine = exc
            errors.shared = (ValueError, TypeError)        # agreed: raised on every rank alike
            self.group.agree(mine, "the update")
            errors.shared = ()
            with net.params.lock:
                total = self._sum(xs, ys)
                errors.shared = FloatingPointError    # same gradient and weights everywhere: refused on all or none
                if net.optimizer.slots == 0:
                    net.params.update(total, eta / count)
                else:                                 # the mean gradient, then the optimizer's step, on every rank
                    total *= 1.0 / count
                    net.optimizer_state.apply(net.params, total, eta)

    def _net_settings(self):
        """What must be the same on every rank: the net and its weights (a digest)."""
        net = self.net
        return {"sizes": net.sizes, "dtype": net.dtype.name, "strategy": net.strategy, "loss": net.loss,
                "l2": list(net.l2), "activation": list(net.activation),
                "optimizer_in_backward": net.optimizer_in_backward, "optimizer": net.optimizer,
                "optimizer state": f"{net.optimizer_state.steps} steps, sha256 " + digest(net.optimizer_state.buffers),
                "initial weights": "sha256 " + digest([net.params.flat])}

    def SGD(self, training_data, epochs, mini_batch_size, eta, test_data=None, *, parallel_batches=None,
            verbose=True, progress=None, on_epoch=None, lr_schedule=None, first_epoch=0):
        """The lab's loop with ``parallel_batches`` minibatches per update (default: one per rank); ``lr_schedule``
        and ``first_epoch`` as in :meth:`Network.SGD <fastckpt.nets.network.Network.SGD>`.

        ``parallel_batches`` must be a multiple of the ranks; rank ``r`` takes
        minibatches ``r, r + ranks, ...`` of each group, and the last group of
        an epoch averages the minibatches left (as threads do).  Returns
        (memusage, updatetime) of this rank.  Only rank 0 prints.  First checks that every
        rank has the same settings, data and initial weights (a ValueError on
        every rank if not); an error on one rank alone ends the job.
        """
        net = self.net

        def groups(n, mini_batch_size):
            per_update = check_positive_int(parallel_batches or self.ranks, "parallel_batches")
            if per_update % self.ranks:
                raise ValueError(f"parallel_batches must be a multiple of the {self.ranks} ranks, got {per_update}")
            batches = n // mini_batch_size
            self.plan(mini_batch_size)                # a bound that cannot hold is refused here, on every rank
            return [(min(per_update, batches - first), [k * mini_batch_size for k in
                                                         range(first + self.rank, min(first + per_update, batches),
                                                               self.ranks)])
                    for first in range(0, batches, per_update)]  # every rank takes part, some with no minibatch

        settings = dict(self._net_settings(), parallel_batches=parallel_batches or self.ranks)
        return lab_loop(self, training_data, epochs, mini_batch_size, eta, test_data, verbose, net.params.lock,
                        groups=groups, settings=settings, model=net, on_epoch=on_epoch,
                        progress=progress, lr_schedule=lr_schedule, first_epoch=first_epoch)
