"""Data parallelism over threads: the gradients of several minibatches at once, one averaged update.

This is the scheme of the course's ThreadPool exercise (``threads_in_pool``,
``parallel_batches``) on fastckpt's kernels, which release the GIL, so the
threads really run at once.  Each worker has its own engine (workspace and
gradients) and runs the network's own plan, so checkpointing works unchanged.

NOTE [ Deterministic reduction ]
Minibatch ``k`` always goes to worker ``k % threads``.  Each worker adds its
minibatches' gradients in the order of ``k``, and the workers' sums are added
in worker order.  So the update is the same, bit for bit, whatever the
threads' timing.  With same-size minibatches it equals one step on their
concatenation, up to the rounding of that summation order.
"""
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

from fastckpt.core.checks import check_eta, check_positive_int
from fastckpt.engine import Engine
from fastckpt.engine.loop import batch_starts, check_training, run_epochs
from fastckpt.kernels import blas_threads, set_blas_threads
from fastckpt.nets import Network


class DataParallel:
    """Train ``net`` with the gradients of several minibatches computed on ``threads`` threads.

    Parameters
    ----------
    net : Network or NetworkWithCheckpointing
        Trained in place; its strategy and dtype are used by every worker.
    threads : int, optional
        Worker threads.  With more than one, BLAS runs single-threaded while
        they work, so the threads do not oversubscribe the cores.
    """

    def __init__(self, net, threads=2):
        if not isinstance(net, Network):
            raise TypeError(f"net must be a fastckpt Network, got {type(net).__name__}")
        self.net = net
        self.threads = check_positive_int(threads, "threads")
        self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="fastckpt") if self.threads > 1 else None
        self._engines = {}
        self._sums = [net.params.new_buffer() for _ in range(self.threads)]
        self.last_loss = None

    def close(self):
        """Stop the worker threads."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _engine(self, worker, batch):
        key = (worker, batch)
        if key not in self._engines:
            net = self.net
            self._engines[key] = Engine(net.plan(batch, optimizer_in_backward=False), net.loss, net.l2)
        return self._engines[key]

    def update_mini_batches(self, x_batches, y_batches, eta):
        """One SGD step on the mean gradient of the minibatches (a sequence, or a 3-D array).

        Every minibatch must have the same number of samples.  The update is
        applied only if no parameter would become NaN or inf.
        """
        eta = check_eta(eta)
        xs, ys = list(x_batches), list(y_batches)
        if not xs or len(xs) != len(ys):
            raise ValueError("x_batches and y_batches must be non-empty and of one length, "
                             f"got {len(xs)} and {len(ys)}")
        if any(np.ndim(x) < 2 for x in xs) or any(np.ndim(y) < 1 for y in ys):
            raise ValueError("x_batches and y_batches must hold minibatches of samples, (batch, n) arrays each "
                             "(or (batch,) integer labels in y_batches), "
                             f"got shapes {sorted({np.shape(a) for a in xs + ys})}")
        sizes = {np.shape(x)[0] for x in xs}
        if len(sizes) != 1:
            raise ValueError(f"every minibatch must have the same number of samples, got sizes {sorted(sizes)}")
        batch = sizes.pop()
        params = self.net.params

        def work(worker):
            total = self._sums[worker]
            losses = []
            engine = self._engine(worker, batch)
            for k in range(worker, len(xs), self.threads):
                loss = engine.gradients(params, xs[k], ys[k], out=total, add=k >= self.threads,
                                        names=(f"x_batches[{k}]", f"y_batches[{k}]"))
                losses.append((k, loss))
            return losses

        if self.threads > 1 and self._pool is None:
            raise RuntimeError("this DataParallel is closed; make a new one")
        threads = blas_threads()
        with params.lock:                                       # the workers only read the parameters
            params.layers()                                     # pending assignments written here, not by a worker
            if self._pool is not None and threads > 1:
                set_blas_threads(1)
            try:
                if self._pool is None:
                    results = [work(0)]
                else:                        # this thread is worker 0: one thread wake-up fewer per update
                    futures = [self._pool.submit(work, w) for w in range(1, min(self.threads, len(xs)))]
                    try:
                        first = work(0)
                    finally:                                    # every worker ends before anything is raised
                        wait(futures)
                    results = [first] + [f.result() for f in futures]
            finally:
                if self._pool is not None and threads > 1:
                    set_blas_threads(threads)
            total = self._sums[0]
            for worker in range(1, len(results)):               # fixed order: NOTE [ Deterministic reduction ]
                total += self._sums[worker]
            losses = sorted(loss for part in results for loss in part)
            self.last_loss = float(np.mean([loss for _, loss in losses]))
            params.update(total, eta / len(xs))

    def SGD(self, training_data, epochs, mini_batch_size, eta, test_data=None, *, parallel_batches=None,
            verbose=True, on_epoch=None, first_epoch=0):
        """The lab's loop, ``parallel_batches`` minibatches per update; returns (memusage, updatetime).

        Minibatches are taken in order, as the lab does, and samples that do not
        fill the last minibatch are skipped (with a warning).  The last update of
        an epoch averages the minibatches left when fewer than ``parallel_batches``
        remain.  ``parallel_batches`` defaults to ``threads``.  ``on_epoch`` and
        ``first_epoch`` are :meth:`Network.SGD <fastckpt.nets.network.Network.SGD>`'s.
        """
        x_train, y_train, epochs, mini_batch_size, eta = check_training(
            self.net, training_data, epochs, mini_batch_size, eta)
        per_update = check_positive_int(parallel_batches or self.threads, "parallel_batches")
        starts = batch_starts(len(x_train), mini_batch_size, hint=False)
        groups = [starts[i:i + per_update] for i in range(0, len(starts), per_update)]

        def update(group):
            self.update_mini_batches([x_train[s:s + mini_batch_size] for s in group],
                                     [y_train[s:s + mini_batch_size] for s in group], eta)
        return run_epochs(self.net, epochs, groups, update, test_data, verbose, on_epoch=on_epoch,
                          first_epoch=first_epoch)
