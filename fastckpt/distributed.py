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
import time

import numpy as np

from fastckpt.kernels import blas_threads, set_blas_threads, sgd_step

from ._checks import check_eta, check_positive_int
from .network import Network, _pair


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
        self.bytes_per_update = 2 * net._flat.nbytes          # one reduce and one broadcast of the gradient
        self._total = np.empty_like(net._flat) if self.rank == 0 else None
        self.last_loss = None

    def update(self, x, y, eta):
        """One SGD step on the mean of every rank's minibatch gradient (same size on every rank)."""
        eta = check_eta(eta)
        net = self.net
        net._gradients(x, y, "x", "y")
        grads = net._grad_buffers()[2]
        self.comm.Reduce(grads, self._total, op=self.MPI.SUM, root=0)
        if self.rank == 0:
            grads[...] = self._total
        self.comm.Bcast(grads, root=0)
        self.last_loss = net.last_loss                         # this rank's minibatch (no extra round trip)
        if not sgd_step(net._flat, grads, eta / self.ranks, net._blocks):
            raise FloatingPointError("the update would make a parameter NaN or inf; weights left unchanged")

    def SGD(self, training_data, epochs, mini_batch_size, eta, test_data=None, *, verbose=True):
        """The lab's loop with ``ranks`` minibatches per update, rank ``r`` taking every r-th one.

        Returns (memusage, updatetime) of this rank.  Only rank 0 prints.
        """
        import psutil
        net = self.net
        x_train, y_train = _pair(training_data, "training_data")
        epochs = check_positive_int(epochs, "epochs", minimum=0)
        mini_batch_size = check_positive_int(mini_batch_size, "mini_batch_size")
        eta = check_eta(eta)
        n = len(x_train)
        batches = n // mini_batch_size
        if batches < self.ranks:
            raise ValueError(f"{n} training samples make {batches} mini-batches of {mini_batch_size}, "
                             f"fewer than the {self.ranks} ranks: every rank needs one per update")
        updates = batches // self.ranks                      # whole rounds of one mini-batch per rank
        if test_data is not None:
            x_test, y_test = _pair(test_data, "test_data")
        process = psutil.Process(os.getpid())
        memusage, updatetime = [], []
        net.accuracies = []
        for epoch in range(epochs):
            for u in range(updates):
                start = (u * self.ranks + self.rank) * mini_batch_size
                t0 = time.perf_counter()
                memusage.append(process.memory_info().rss)
                self.update(x_train[start:start + mini_batch_size], y_train[start:start + mini_batch_size], eta)
                updatetime.append(time.perf_counter() - t0)
            if test_data is not None:
                net.accuracies.append(net.evaluate(x_test, y_test))
                if verbose and self.rank == 0:
                    print(f"Epoch: {epoch}, Accuracy: {net.accuracies[-1]}", flush=True)
        return memusage, updatetime
