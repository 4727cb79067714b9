"""Data parallelism over threads: the gradients of several minibatches at once, one averaged update.

This is the scheme of the course's ThreadPool exercise (``threads_in_pool``,
``parallel_batches``) on fastckpt's kernels, which release the GIL, so the
threads really run at once.  Each worker has its own engine (workspace and
gradients) and runs the network's own plan, so checkpointing works unchanged.
The workers are a :class:`~fastckpt.parallel.crew.Crew`, started once and
waiting on flags between updates (NOTE [ Waking workers ]).

NOTE [ Deterministic reduction ]
Minibatch ``k`` goes to worker ``k % workers``, which computes its gradient in
its own engine and then waits for its turn: the gradient of minibatch ``k``
is added to the one sum after that of ``k - 1``.  So the sum is
``((g_0 + g_1) + g_2) + ...`` whatever the threads' timing and whatever their
number: two threads or eight give the same update, bit for bit (and a resumed
run may use another number of threads).  One thread gives the same bits when
its BLAS runs on one thread too, as every worker's does with more
(``FASTCKPT_BLAS_THREADS=1``): OpenBLAS rounds some GEMMs differently on one
thread and on two (``(100 x 784) @ (784 x 40)`` does, in its last bit).  With
same-size minibatches it equals one step on their concatenation, up to the
rounding of that order.

NOTE [ Memory of the threads ]
The parameters, the optimizer's state (``S`` buffers their size: none for SGD)
and the one gradient sum are shared; each worker holds its own step (its plan's
workspace, deltas and gradients, BLAS on one thread).  So ``fit(bytes)`` bounds
all of it: each worker plans ``fit`` of its share, ``P + (bytes - (2 + S) P) /
threads`` with ``P`` the parameters' bytes, and :meth:`DataParallel.predicted_bytes`
adds the parts up.
"""
import math
import time

import numpy as np

from fastckpt.core.checks import check_bool, check_eta, check_positive_int
from fastckpt.core.resources import check_fits, shown_bytes, thread_address_space
from fastckpt.engine import Engine
from fastckpt.engine.loop import batch_starts, check_training, run_epochs
from fastckpt.kernels import blas_threads, set_blas_threads
from fastckpt.nets import Network
from fastckpt.planner import InfeasiblePlan
from fastckpt.planner import plan as make_plan
from fastckpt.planner.strategies import Fit

from .crew import Crew
from .pace import Pace

THREAD_BYTES = 256 * 1024           # what a worker thread costs besides its step (Python and stack pages), at least


class DataParallel:
    """Train ``net`` with the gradients of several minibatches computed on ``threads`` threads.

    Parameters
    ----------
    net : Network or NetworkWithCheckpointing
        Trained in place; its strategy and dtype are used by every worker.
    threads : int, optional
        Worker threads.  With more than one, BLAS runs single-threaded while
        they work, so the threads do not oversubscribe the cores.
    adapt : bool, optional
        Run an update on one thread while that was measured faster, as beside
        a program that holds a core (NOTE [ One thread when it is faster ] in
        :mod:`fastckpt.parallel.pace`); the numbers are the same either way.
        ``False``: always on ``threads`` threads.
    """

    def __init__(self, net, threads=2, adapt=True):
        if not isinstance(net, Network):
            raise TypeError(f"net must be a fastckpt Network, got {type(net).__name__}")
        self.net = net
        self.threads = check_positive_int(threads, "threads")
        check_fits(self.threads * (THREAD_BYTES + net.params.flat.nbytes) + (self.threads - 1) * thread_address_space(),
                   f"{self.threads} worker threads", "threads")
        adapt = check_bool(adapt, "adapt")
        self._crew = Crew(self.threads)               # NOTE [ Waking workers ]
        self._pace = Pace(self.threads) if adapt else None
        self.last_workers = None                      # the threads the last update ran on
        self._engines = {}
        self._sum = net.params.new_buffer()
        self.last_loss = None

    def __reduce__(self):
        raise TypeError("a DataParallel holds worker threads and cannot be pickled or copied; pickle its net")

    def close(self):
        """Stop the worker threads."""
        self._crew.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def worker_plan(self, batch):
        """The plan each worker runs for minibatches of ``batch`` (NOTE [ Memory of the threads ])."""
        net, threads = self.net, self.threads
        strategy = net.strategy
        if isinstance(strategy, Fit) and threads > 1:
            shared = (2 + net.optimizer.slots) * net.params.flat.nbytes   # parameters, state and the gradient sum
            share = net.params.flat.nbytes + (strategy.nbytes - shared) // threads
            try:
                if share <= net.params.flat.nbytes:
                    raise InfeasiblePlan("", shared + threads)
                return self._plan(batch, Fit(share), 1)
            except InfeasiblePlan as exc:
                least = shared + threads * (exc.minimum_bytes - net.params.flat.nbytes)
                state = ", the optimizer's state" if net.optimizer.slots else ""
                raise InfeasiblePlan(f"{strategy.shown()} with {threads} threads: the parameters{state}, the "
                                     f"gradient sum and {threads} workers' steps need at least {least} bytes "
                                     f"({shown_bytes(least)}); got {strategy.nbytes}", least) from None
        if threads == 1 and net.optimizer.slots:                          # the one worker's plan holds the state
            return net.plan(batch, optimizer_in_backward=False)
        return self._plan(batch, strategy, 1 if threads > 1 else None)

    def _plan(self, batch, strategy, blas_threads):
        """A worker's plan: gradients only (the net, not a worker, holds the optimizer's state)."""
        net = self.net
        return make_plan(net.sizes, batch, net.dtype, strategy, blas_threads=blas_threads)

    def predicted_bytes(self, batch):
        """Bytes by part of training with minibatches of ``batch`` samples (NOTE [ Memory of the threads ])."""
        step = self.worker_plan(batch).bytes()
        params = self.net.params.flat.nbytes
        state = self.net.optimizer.slots * params
        parts = {"parameters": params, "optimizer_state": state, "gradient_sum": params,
                 "workers": self.threads * (step["total"] - params - step["optimizer_state"])}
        parts["total"] = sum(parts.values())
        return parts

    def _engine(self, worker, batch):
        """Worker ``worker``'s engine for ``batch`` samples: one per worker, made anew (the old one freed
        first) when the batch size changes, so the workers hold one step each, as the bound counts."""
        made = self._engines.get(worker)
        if made is None or made[0] != batch:
            net = self.net
            made = None                                 # the old engine is freed here, before the new one is made
            self._engines.pop(worker, None)
            if worker == 0:
                check_fits(self.predicted_bytes(batch)["total"], f"training on {self.threads} threads", "threads")
            self._engines[worker] = made = (batch, Engine(self.worker_plan(batch), net.loss, net.l2, net.activation))
        return made[1]

    def update_mini_batches(self, x_batches, y_batches, eta):
        """One step of the net's optimizer (the lab's SGD by default) on the mean gradient of the minibatches
        (a sequence, or a 3-D array).

        Every minibatch must have the same number of samples.  The update is
        applied only if no parameter would become NaN or inf.
        """
        eta = check_eta(eta)
        xs, ys, batch = _minibatches(x_batches, y_batches)
        params = self.net.params

        def work(worker):
            losses = []
            try:
                engine = self._engine(worker, batch)
                engine.gate, engine.me = self._crew.gate, worker   # NOTE [ Turns at the GIL ]; a forked
                                                                # child's crew makes its gate anew in run()
                for k in range(worker, len(xs), workers):
                    losses.append((k, engine.gradients(params, xs[k], ys[k],
                                                       names=(f"x_batches[{k}]", f"y_batches[{k}]"))))
                    turns.add(self._sum, k, engine.grad, params.blocks, worker)
            except BaseException:
                turns.fail()
                raise
            return losses

        with params.lock:                                       # the workers only read the parameters
            params.layers()                                     # pending assignments written here, not by a worker
            turns = self._crew.turns()                          # under the lock: one update's sum at a time
            workers = min(self.threads, len(xs)) if self._pace is None else self._pace.workers(len(xs))
            start = time.perf_counter()
            results = self._run(work, workers, turns.fail)
            if self._pace is not None:
                self._pace.record(workers, time.perf_counter() - start, len(xs))
            self.last_workers = workers
            losses = sorted(loss for part in results for loss in part)
            self.last_loss = math.fsum(loss for _, loss in losses) / len(losses)
            self.net.optimizer_state.apply_mean(params, self._sum, len(xs), eta)

    def _run(self, work, workers, stop):
        """``work(w)`` for every worker, this thread as worker 0, BLAS on one thread meanwhile; their results
        (:meth:`Crew.run <fastckpt.parallel.crew.Crew.run>`)."""
        threads = blas_threads()
        single = self.threads > 1 and threads > 1
        if single:
            set_blas_threads(1)
        try:
            return self._crew.run(work, workers, stop)
        finally:
            if single:
                set_blas_threads(threads)

    def SGD(self, training_data, epochs, mini_batch_size, eta, test_data=None, *, parallel_batches=None,
            verbose=True, progress="auto", on_epoch=None, first_epoch=0, lr_schedule=None):
        """The lab's loop, ``parallel_batches`` minibatches per update; returns (memusage, updatetime).

        Minibatches are taken in order, as the lab does, and samples that do not
        fill the last minibatch are skipped (with a warning).  The last update of
        an epoch averages the minibatches left when fewer than ``parallel_batches``
        remain.  ``parallel_batches`` defaults to ``threads``.  ``progress``, ``on_epoch`` and
        ``first_epoch`` and ``lr_schedule`` are :meth:`Network.SGD <fastckpt.nets.network.Network.SGD>`'s.
        """
        x_train, y_train, epochs, mini_batch_size, eta = check_training(
            self.net, training_data, epochs, mini_batch_size, eta)
        per_update = self.threads if parallel_batches is None else check_positive_int(parallel_batches,
                                                                                        "parallel_batches")
        starts = batch_starts(len(x_train), mini_batch_size, hint=False)
        groups = [starts[i:i + per_update] for i in range(0, len(starts), per_update)]

        def update(group, rate):
            self.update_mini_batches([x_train[s:s + mini_batch_size] for s in group],
                                     [y_train[s:s + mini_batch_size] for s in group], rate)
        return run_epochs(self.net, epochs, groups, update, test_data, verbose, progress=progress,
                          on_epoch=on_epoch, first_epoch=first_epoch, eta=eta, lr_schedule=lr_schedule)


def _minibatches(x_batches, y_batches):
    """``(xs, ys, batch)``: the minibatches as lists, checked to be non-empty, paired and of one size."""
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
    if batch == 0:
        raise ValueError(f"x_batches hold minibatches of no samples, shape {np.shape(xs[0])}")
    return xs, ys, batch
