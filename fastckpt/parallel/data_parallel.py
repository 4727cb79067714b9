"""Data parallelism across processes and machines over MPI (mpi4py).

Every rank holds the whole network, starts from the same weights and takes
its own minibatch of each update: update ``u`` uses minibatches
``u * ranks + r`` for rank ``r``.  The gradients are summed to rank 0, in
rank order, and broadcast back, so every rank applies the very same update and
the weights stay identical everywhere.  With same-size minibatches an update
equals one step on their concatenation, up to rounding.  Checkpointing runs
unchanged on each rank: each uses the network's own plan.

Start it with ``mpiexec -n N fastckpt train --mpi ...`` or from Python with
:class:`MPITrainer`.  Each rank sends and receives one flat gradient per update
(the parameters' bytes) through the reduce and the broadcast.  Ranks on one
machine split its cores: each runs BLAS on ``cores // ranks_on_the_machine``
threads, since more would only spin against the other ranks.  Errors follow
NOTE [ No rank waits forever ] (:mod:`fastckpt.parallel.mpi`).
"""
import hashlib

import numpy as np

from fastckpt.core.checks import check_eta, check_positive_int
from fastckpt.nets import Network

from .mpi import Group, lab_loop

MODE = "data parallel (--mpi)"


class MPITrainer:
    """Train ``net`` with one minibatch per rank and an all-reduced gradient per update.

    Parameters
    ----------
    net : Network or NetworkWithCheckpointing
        Must start from the same weights on every rank (the same seed);
        :meth:`SGD` checks this and the other settings first.
    comm : mpi4py communicator, optional
        ``MPI.COMM_WORLD`` by default.
    """

    def __init__(self, net, comm=None):
        if not isinstance(net, Network):
            raise TypeError(f"net must be a fastckpt Network, got {type(net).__name__}")
        self.group = Group(comm)
        self.MPI, self.comm = self.group.MPI, self.group.comm
        self.rank, self.ranks = self.group.rank, self.group.size
        self.net = net
        self.group.agree(dict(self._net_settings(), mode=MODE))      # the first collective of every trainer
        self.blas_threads = self.group.share_cores()
        self.bytes_per_update = 2 * net.params.flat.nbytes    # one reduce and one broadcast of the gradient
        self._total = net.params.new_buffer() if self.rank == 0 else None
        self._local = net.params.new_buffer()
        self.last_loss = None

    def update(self, x, y, eta):
        """One SGD step on the mean of every rank's minibatch gradient (same size on every rank)."""
        self.update_many([x], [y], eta)

    def update_many(self, xs, ys, eta):
        """One SGD step on the mean gradient of all ranks' minibatches, ``len(xs)`` on each rank.

        Several minibatches per rank share one exchange: their gradients are
        summed locally, in order, before the reduce.  A refused update raises
        FloatingPointError on every rank; any other error ends the job.
        """
        net, local = self.net, self._local
        with self.group.errors() as errors:
            eta = check_eta(eta)
            with net.params.lock:
                for k, (x, y) in enumerate(zip(xs, ys)):
                    engine = net.engine(np.shape(x)[0])
                    self.last_loss = engine.gradients(net.params, x, y, out=local, add=k > 0)   # this rank's last
                self.comm.Reduce(local, self._total, op=self.MPI.SUM, root=0)
                if self.rank == 0:
                    local[...] = self._total
                self.comm.Bcast(local, root=0)
                errors.shared = FloatingPointError    # same gradient and weights everywhere: refused on all or none
                net.params.update(local, eta / (self.ranks * len(xs)))

    def _net_settings(self):
        """What must be the same on every rank: the net and its weights (a digest)."""
        net = self.net
        return {"sizes": net.sizes, "dtype": net.dtype.name, "strategy": net.strategy, "loss": net.loss,
                "l2": list(net.l2), "optimizer_in_backward": net.optimizer_in_backward,
                "initial weights": "sha256 " + hashlib.sha256(net.params.flat).hexdigest()[:16]}

    def SGD(self, training_data, epochs, mini_batch_size, eta, test_data=None, *, parallel_batches=None,
            verbose=True):
        """The lab's loop with ``parallel_batches`` minibatches per update (default: one per rank).

        ``parallel_batches`` must be a multiple of the ranks; rank ``r`` takes
        minibatches ``r, r + ranks, ...`` of each group.  Returns (memusage,
        updatetime) of this rank.  Only rank 0 prints.  First checks that every
        rank has the same settings, data and initial weights (a ValueError on
        every rank if not); an error on one rank alone ends the job.
        """
        net = self.net

        def groups(n, mini_batch_size):
            per_update = check_positive_int(parallel_batches or self.ranks, "parallel_batches")
            if per_update % self.ranks:
                raise ValueError(f"parallel_batches must be a multiple of the {self.ranks} ranks, got {per_update}")
            batches = n // mini_batch_size
            if batches < per_update:
                raise ValueError(f"{n} training samples make {batches} mini-batches of {mini_batch_size}, "
                                 f"fewer than the {per_update} each update needs ({self.ranks} ranks)")
            return [[(u * per_update + k) * mini_batch_size for k in range(self.rank, per_update, self.ranks)]
                    for u in range(batches // per_update)]       # whole groups only: every rank takes part

        settings = dict(self._net_settings(), parallel_batches=parallel_batches or self.ranks)
        return lab_loop(self, training_data, epochs, mini_batch_size, eta, test_data, verbose, net.params.lock,
                        groups=groups, settings=settings, model=net)
