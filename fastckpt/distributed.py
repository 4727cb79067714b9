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

NOTE [ No rank waits forever ]
Once one rank stops taking part in the collectives the others wait in them
forever, and mpiexec ends a job only when a rank dies or calls ``MPI_Abort``.
So every error here is one of two kinds:

* Shared: raised on every rank at the same point, so the ranks leave together
  and the caller sees the same exception everywhere.  These are the settings
  check (one ``allgather`` at the start of :meth:`MPITrainer.SGD`: net, dtype,
  strategy, loss, epochs, batch size, eta, the data's shapes and digest and
  the initial weights' digest; a mismatch is the same ValueError on every
  rank), the argument checks after it (every rank checks the same values), and
  a refused update (every rank applies the same reduced gradient to the same
  weights, so the update is refused on all of them or on none).
* This rank's alone: anything else (a non-finite loss on one rank's
  minibatch, MemoryError, SIGINT to one rank, ...).  The rank prints
  ``fastckpt: rank R of N failed: <error>`` and calls ``MPI_Abort``, which ends
  every rank within a second.  The job exits 2 for bad input (ValueError,
  TypeError, OSError), 130 for KeyboardInterrupt and 1 otherwise.

Abort, not an error flag agreed before each collective: the flag costs an
``Allreduce`` per update (9 us with 2 ranks on one machine, 1-2% of an update
of the lab's [784, 40, 30, 10] net at batch 10), and it cannot see an error
that comes between the flag and the collective (SIGINT lands anywhere), so the
abort would be needed anyway.

The command line adds :class:`RankGuard`, for the time before the trainer
exists: a rank that exits before training ended on every rank (``--data``
missing on one node while the others wait in their first collective) aborts the
job, with the command line's one line naming the rank (:func:`leave_job`).  A
process that mpiexec started beside others but that fails before it reaches
MPI (its arguments refused, or ``train`` without ``--mpi``) does the same.
A shared error is reported by rank 0 alone; the other ranks exit 0 quietly,
since mpiexec's exit status is the OR of the ranks'.
"""
import atexit
import hashlib
import os
import sys
import time

import numpy as np

from fastckpt.kernels import blas_threads, set_blas_threads

from ._checks import check_eta, check_positive_int
from .network import Network
from .training import batch_starts, check_training, pair, run_epochs

_GUARD = None    # this process's RankGuard, once the command line has made one


def launched_ranks():
    """How many processes mpiexec started with this one (1 when not started by mpiexec)."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 1


def leave_job(line, code):
    """Called by the command line as it fails: if other ranks may still wait for this one, say ``line``
    naming this rank and end the whole job with ``code``; else return False (the caller says ``line``).

    Other ranks may wait when this rank fails before its :class:`RankGuard` has seen training end on
    every rank, or when it was started by mpiexec beside others and never reached MPI at all (bad
    arguments on one rank, a rank started without ``--mpi``).  A shared error, which every rank raised
    at once (NOTE [ No rank waits forever ]), needs nothing: the ranks are leaving together.
    """
    if _GUARD is not None:
        if not _GUARD.pending or _GUARD.ranks < 2:
            return False
        comm = _GUARD.comm
    elif launched_ranks() > 1:
        try:
            comm = mpi_world()[1]
        except RuntimeError:
            return False            # no mpi4py: nothing can end the others, and they cannot be in MPI either
    else:
        return False
    _say(f"{line} (rank {comm.Get_rank()} of {comm.Get_size()}; ending the job)")
    comm.Abort(code)
    os._exit(code)


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
        Must start from the same weights on every rank (the same seed);
        :meth:`SGD` checks this and the other settings first.
    comm : mpi4py communicator, optional
        ``MPI.COMM_WORLD`` by default.
    """

    def __init__(self, net, comm=None):
        if not isinstance(net, Network):
            raise TypeError(f"net must be a fastckpt Network, got {type(net).__name__}")
        self.MPI, world = mpi_world()
        self.comm = world if comm is None else comm
        self.rank, self.ranks = self.comm.Get_rank(), self.comm.Get_size()
        self.blas_threads = share_cores(self.comm, self.MPI)
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
        summed locally, in order, before the reduce.  A refused update raises
        FloatingPointError on every rank; any other error ends the job.
        """
        net, local = self.net, self._local
        shared = ()                                   # see NOTE [ No rank waits forever ]
        try:
            eta = check_eta(eta)
            with net.params.lock:
                for k, (x, y) in enumerate(zip(xs, ys)):
                    engine = net.engine(np.shape(x)[0])
                    self.last_loss = engine.gradients(net.params, x, y, out=local, add=k > 0)   # this rank's last
                self.comm.Reduce(local, self._total, op=self.MPI.SUM, root=0)
                if self.rank == 0:
                    local[...] = self._total
                self.comm.Bcast(local, root=0)
                shared = FloatingPointError           # same gradient and weights everywhere: refused on all or none
                net.params.update(local, eta / (self.ranks * len(xs)))
        except shared:
            raise
        except BaseException as exc:
            self._abort(exc)
            raise

    def SGD(self, training_data, epochs, mini_batch_size, eta, test_data=None, *, parallel_batches=None,
            verbose=True):
        """The lab's loop with ``parallel_batches`` minibatches per update (default: one per rank).

        ``parallel_batches`` must be a multiple of the ranks; rank ``r`` takes
        minibatches ``r, r + ranks, ...`` of each group.  Returns (memusage,
        updatetime) of this rank.  Only rank 0 prints.  First checks that every
        rank has the same settings, data and initial weights (a ValueError on
        every rank if not); an error on one rank alone ends the job.
        """
        shared = ()                                   # see NOTE [ No rank waits forever ]
        try:
            mine = self._settings(training_data, test_data, epochs, mini_batch_size, eta, parallel_batches)
            everyone = self.comm.allgather(mine)
            shared = (ValueError, TypeError)          # same values on every rank: checks fail on all alike
            check_same_settings(everyone)
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
            shared = FloatingPointError               # a refused update; update_many ends the job on the rest
            return run_epochs(self.net, epochs, groups, update, test_data, verbose and self.rank == 0)
        except shared:
            raise
        except BaseException as exc:
            self._abort(exc)
            raise

    def _settings(self, training_data, test_data, epochs, mini_batch_size, eta, parallel_batches):
        """What must be the same on every rank, as text: the net, the loop's arguments, the data, the weights."""
        net = self.net
        settings = {"sizes": net.sizes, "dtype": net.dtype.name, "strategy": net.strategy, "loss": net.loss,
                    "l2": list(net.l2), "optimizer_in_backward": net.optimizer_in_backward, "epochs": epochs,
                    "batch size": mini_batch_size, "eta": eta, "parallel_batches": parallel_batches or self.ranks,
                    "training data": _describe(training_data, "training_data"),
                    "test data": None if test_data is None else _describe(test_data, "test_data"),
                    "initial weights": "sha256 " + hashlib.sha256(net.params.flat).hexdigest()[:16]}
        return {key: str(value) for key, value in settings.items()}

    def _abort(self, exc):
        """End every rank of the job, naming this rank and ``exc``; returns only when this rank is alone."""
        if self.ranks > 1:
            abort_job(self.comm, exc)


def check_same_minibatch(comm, x, y, eta):
    """One small ``allgather`` so that a minibatch of other shapes or another eta on some rank is the
    same ValueError on every rank (model parallelism: every rank takes the whole minibatch)."""
    mine = {"minibatch shapes and eta": f"x {np.shape(x)}, y {np.shape(y)}, eta {eta!r}"}
    check_same_settings(comm.allgather(mine))


def lab_loop(trainer, training_data, epochs, mini_batch_size, eta, test_data, verbose, lock):
    """The lab's SGD loop for a model-parallel trainer (every rank passes the same data): the data
    and settings compared across ranks first, then ``trainer.update_mini_batch`` per minibatch and
    ``trainer.evaluate`` per epoch, holding ``lock``.  Returns (memusage, updatetime); rank 0 prints."""
    shared = ()                                       # see NOTE [ No rank waits forever ]
    try:
        mine = {"training data": _describe(training_data, "training_data"),
                "test data": None if test_data is None else _describe(test_data, "test_data"),
                "epochs": epochs, "batch size": mini_batch_size, "eta": eta}
        everyone = trainer.comm.allgather({k: str(v) for k, v in mine.items()})
        shared = (ValueError, TypeError)
        check_same_settings(everyone)
        x_train, y_train, epochs, mini_batch_size, eta = check_training(trainer, training_data, epochs,
                                                                        mini_batch_size, eta)
        starts = batch_starts(len(x_train), mini_batch_size)
        shared = (FloatingPointError, ValueError, TypeError)   # update_mini_batch ends the job on the rest

        def update(group):
            s = group[0]
            trainer.update_mini_batch(x_train[s:s + mini_batch_size], y_train[s:s + mini_batch_size], eta)
        return run_epochs(trainer, epochs, [[s] for s in starts], update, test_data,
                          verbose and trainer.rank == 0, lock=lock)
    except shared:
        raise
    except BaseException as exc:
        if trainer.ranks > 1:
            abort_job(trainer.comm, exc)
        raise


def share_cores(comm, MPI):
    """Limit BLAS to this rank's share of its machine's cores (more threads would only spin against
    the other ranks there); returns the threads.  The communicator of the machine's ranks is freed
    at once: mpich keeps 2 MiB of shared memory for it on one of them."""
    machine = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local = machine.Get_size()
    machine.Free()
    threads = max(1, (os.cpu_count() or 1) // local)
    if blas_threads() > threads:
        set_blas_threads(threads)
    return threads


def abort_job(comm, exc, prefix="fastckpt"):
    """Print ``<prefix>: rank R of N failed: <exc>`` on stderr and end every rank with ``MPI_Abort``."""
    what = "interrupted (KeyboardInterrupt)" if isinstance(exc, KeyboardInterrupt) else \
        f"{type(exc).__name__}: {exc}"
    code = 130 if isinstance(exc, KeyboardInterrupt) else 2 if isinstance(exc, (ValueError, TypeError, OSError)) else 1
    _say(f"{prefix}: rank {comm.Get_rank()} of {comm.Get_size()} failed: {what}; ending the job")
    comm.Abort(code)
    os._exit(code)                 # mpich's MPI_Abort may return before mpiexec kills this process


def _say(line):
    """``line`` on stderr, given time to reach mpiexec: its proxy drops output still in flight at an abort."""
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)
    time.sleep(0.2)


def _describe(data, name):
    """Shapes, dtypes and a digest of an (x, y) pair: equal on two ranks when they hold the same data."""
    digest = hashlib.sha256()
    parts = []
    for a in pair(data, name):
        a = np.ascontiguousarray(a)
        digest.update(a)
        parts.append(f"{a.shape} {a.dtype}")
    return f"{' and '.join(parts)}, sha256 {digest.hexdigest()[:16]}"


def check_same_settings(settings):
    """Raise ValueError naming each setting whose value differs between ranks; ``settings[r]`` is rank r's dict."""
    keys = list(dict.fromkeys(key for mine in settings for key in mine))
    differ = []
    for key in keys:
        ranks_of = {}
        for rank, mine in enumerate(settings):
            ranks_of.setdefault(mine.get(key, "missing"), []).append(rank)
        if len(ranks_of) > 1:
            differ.append(f"{key} " + ", ".join(f"{value} on {_ranks(ranks)}" for value, ranks in ranks_of.items()))
    if differ:
        raise ValueError(f"the {len(settings)} ranks were started with different settings: " + "; ".join(differ))


def _ranks(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


class RankGuard:
    """The command line's side of one rank: until :meth:`run` ends, this rank leaving ends the job.

    A rank that exits before training ended on every rank (``--data`` missing on
    one node, Ctrl-C while it loads) would leave the others waiting in a
    collective: at exit the guard names the rank and calls ``MPI_Abort`` (exit
    1).  The command line has printed the rank's error just before.
    """

    def __init__(self, comm=None):
        global _GUARD
        self.MPI, world = mpi_world()
        self.comm = world if comm is None else comm
        self.rank, self.ranks = self.comm.Get_rank(), self.comm.Get_size()
        self.pending = True
        atexit.register(self._at_exit)
        _GUARD = self

    def run(self, train, *args, **kwargs):
        """``train(*args, **kwargs)``, which raises only errors that every rank raises at once
        (:meth:`MPITrainer.SGD`): rank 0 raises it for the command line to report, the others exit 0
        quietly.  mpiexec's exit status is the OR of the ranks', so the job's is rank 0's."""
        try:
            result = train(*args, **kwargs)
        except Exception:
            self.pending = False
            if self.rank == 0:
                raise
            raise SystemExit(0) from None
        self.pending = False
        return result

    def _at_exit(self):
        if self.pending and self.ranks > 1:
            _say(f"fastckpt train: rank {self.rank} of {self.ranks} stopped before training ended on every "
                 "rank (its error is above); ending the job")
            self.comm.Abort(1)
            os._exit(1)


def __getattr__(name):
    """``fastckpt.distributed.PipelineTrainer`` and ``TensorParallelTrainer``: the model-parallel
    trainers live in their own modules, which import this one."""
    if name == "PipelineTrainer":
        from .pipeline import PipelineTrainer
        return PipelineTrainer
    if name == "TensorParallelTrainer":
        from .tensor_parallel import TensorParallelTrainer
        return TensorParallelTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
