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
threads, since more would only spin against the other ranks.
"""
import os

import numpy as np

from fastckpt.kernels import blas_threads, set_blas_threads

from ._checks import check_eta, check_positive_int
from .network import Network
from .training import check_training, run_epochs


def mpi_world():
    """mpi4py's ``MPI.COMM_WORLD``, or a clear error when mpi4py is not installed."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise RuntimeError("MPI needs mpi4py and an MPI library: pip install mpi4py mpich "
                           f"(import failed: {exc})") from None
    return MPI, MPI.COMM_WORLD


class MPITrainer:
    """Train ``net`` with one minibatch per rank and an all-reduced gradient per update.

    Parameters
    ----------
    net : Network or NetworkWithCheckpointing
        Must start from the same weights on every rank (the same seed).
    comm : mpi4py communicator, optional
        ``MPI.COMM_WORLD`` by default.
    """

    def __init__(self, net, comm=None):
        if not isinstance(net, Network):
            raise TypeError(f"net must be a fastckpt Network, got {type(net).__name__}")
        self.MPI, world = mpi_world()
        self.comm = world if comm is None else comm
        self.rank, self.ranks = self.comm.Get_rank(), self.comm.Get_size()
        # ranks sharing a machine share its cores: BLAS threads beyond its share only spin
        local = self.comm.Split_type(self.MPI.COMM_TYPE_SHARED).Get_size()
        self.blas_threads = max(1, (os.cpu_count() or 1) // local)
        if blas_threads() > self.blas_threads:
            set_blas_threads(self.blas_threads)
        self.net = net
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
        summed locally, in order, before the reduce.
        """
        eta = check_eta(eta)
        net, local = self.net, self._local
        with net.params.lock:
            for k, (x, y) in enumerate(zip(xs, ys)):
                engine = net.engine(np.shape(x)[0])
                self.last_loss = engine.gradients(net.params, x, y, out=local, add=k > 0)   # this rank's last
            self.comm.Reduce(local, self._total, op=self.MPI.SUM, root=0)
            if self.rank == 0:
                local[...] = self._total
            self.comm.Bcast(local, root=0)
            net.params.update(local, eta / (self.ranks * len(xs)))

    def SGD(self, training_data, epochs, mini_batch_size, eta, test_data=None, *, parallel_batches=None,
            verbose=True):
        """The lab's loop with ``parallel_batches`` minibatches per update (default: one per rank).

        ``parallel_batches`` must be a multiple of the ranks; rank ``r`` takes
        minibatches ``r, r + ranks, ...`` of each group.  Returns (memusage,
        updatetime) of this rank.  Only rank 0 prints.
        """
        x_train, y_train, epochs, mini_batch_size, eta = check_training(
            self.net, training_data, epochs, mini_batch_size, eta)
        per_update = check_positive_int(parallel_batches or self.ranks, "parallel_batches")
        if per_update % self.ranks:
            raise ValueError(f"parallel_batches must be a multiple of the {self.ranks} ranks, got {per_update}")
        n = len(x_train)
        batches = n // mini_batch_size
        if batches < per_update:
            raise ValueError(f"{n} training samples make {batches} mini-batches of {mini_batch_size}, "
                             f"fewer than the {per_update} each update needs ({self.ranks} ranks)")
        groups = [[(u * per_update + k) * mini_batch_size for k in range(self.rank, per_update, self.ranks)]
                  for u in range(batches // per_update)]      # whole groups only: every rank takes part

        def update(group):
            self.update_many([x_train[s:s + mini_batch_size] for s in group],
                             [y_train[s:s + mini_batch_size] for s in group], eta)
        return run_epochs(self.net, epochs, groups, update, test_data, verbose and self.rank == 0)
