"""The one MPI layer of every parallel mode: the ranks, agreeing across them, and errors that end the job.

The trainer holds its communicator as a :class:`Group` and uses nothing of MPI but it and the grid's axes:
:meth:`Group.agree` compares settings (or refuses one rank's error on every rank), :meth:`Group.errors` is
the one "raise it everywhere or end the job" context, and :meth:`Group.gather_net` gathers the lab's
weights from the ranks' pieces.  A rank ends the job through :func:`abort_job`, which says why on stderr,
where mpiexec shows it; :func:`abort_on_uncaught` says whether an exception nothing caught does too.

NOTE [ No rank waits forever ]
Once one rank stops taking part in the collectives the others wait in them
forever, and mpiexec ends a job only when a rank dies or calls ``MPI_Abort``.
So every error in a trainer is one of two kinds:

* Shared: raised on every rank at the same point, so the ranks leave together
  and the caller sees the same exception everywhere.  These are the settings
  check (:meth:`Group.agree`: one ``allgather`` in which each rank brings its
  settings or its own argument error; a mismatch or any rank's error is the same
  ValueError on every rank), the checks that follow it on values every rank
  has alike, and a refused update where every rank decides from the same
  numbers (the reduced gradient, an ``Allreduce`` of a flag).
* This rank's alone: anything else (a non-finite loss on one rank's
  minibatch, MemoryError, SIGINT to one rank, ...).  The rank prints
  ``fastckpt: rank R of N failed: <error>`` and calls ``MPI_Abort``, which ends
  every rank within a second.  The job exits 2 for bad input (ValueError,
  TypeError, OSError), 130 for KeyboardInterrupt and 1 otherwise.

Abort, not an error flag agreed before each collective: the flag costs an
``Allreduce`` per update (9 us with 2 ranks on one machine, 1-2% of an update
of the lab's [784, 40, 30, 10] net at batch 10), and it cannot see an error
that comes between the flag and the collective (SIGINT lands anywhere), so the
abort would be needed anyway.  :meth:`Group.errors` marks which errors are
shared at each point of a trainer's call; everything else aborts.
"""
import contextlib
import hashlib
import os
import sys
import time
import types

import numpy as np

from fastckpt.core.checks import check_bool
from fastckpt.data.images import Images
from fastckpt.engine.loop import pair
from fastckpt.kernels import blas_threads, set_blas_threads

UNCAUGHT = {"abort": os.environ.get("FASTCKPT_ABORT_ON_UNCAUGHT", "1").strip() != "0"}


def abort_on_uncaught(on=True):
    """Whether an exception that nothing catches ends the whole MPI job (the default) or only this rank.

    NOTE [ An uncaught exception ends the job ]
    Once fastckpt has touched MPI on a rank of a job of several (a ``Grid``, a
    ``Group``, any trainer, ``mpi_world()``), Python's
    ``sys.excepthook`` prints the traceback as usual and then calls ``MPI_Abort``
    on ``MPI.COMM_WORLD`` (as ``python -m mpi4py`` does), so a user's script that
    raises on one rank between two updates (a bad minibatch only that rank read),
    or before the first trainer (a ``Grid`` that does not fit the job, made on
    one rank), ends every rank within seconds instead of leaving the others in
    their next collective forever.  An error every rank raised at the same point (settings or
    a minibatch refused on every rank, NOTE [ No rank waits forever ]) ends each
    rank on its own, as without MPI.  Exceptions a script catches are untouched.  Pass
    ``on=False`` (or set ``FASTCKPT_ABORT_ON_UNCAUGHT=0`` before fastckpt is
    imported) when the script handles rank failures itself.
    """
    UNCAUGHT["abort"] = check_bool(on, "on")


def hook_uncaught(world):
    """Chain :func:`abort_on_uncaught`'s hook in front of ``sys.excepthook``, once per process."""
    previous = sys.excepthook
    if getattr(previous, "fastckpt_world", None) is not None:
        return

    def hook(kind, exc, tb):
        previous(kind, exc, tb)                 # the traceback, as without MPI
        if UNCAUGHT["abort"] and not getattr(exc, "raised_on_every_rank", False):
            abort_job(world, exc)

    hook.fastckpt_world = world
    sys.excepthook = hook


def everywhere(exc):
    """Mark ``exc`` as raised by every rank at the same point (an agreed error): the hook of
    :func:`abort_on_uncaught` lets each rank end on its own then, with its traceback and no abort."""
    try:
        exc.raised_on_every_rank = True
    except AttributeError:                      # an exception type without a __dict__
        pass
    return exc


def abort_job(comm, exc):
    """Print ``fastckpt: rank R of N failed: <exc>`` on stderr and end every rank with ``MPI_Abort``."""
    what = "interrupted (KeyboardInterrupt)" if isinstance(exc, KeyboardInterrupt) else \
        f"{type(exc).__name__}: {exc}"
    code = 130 if isinstance(exc, KeyboardInterrupt) else 2 if isinstance(exc, (ValueError, TypeError, OSError)) else 1
    say(f"fastckpt: rank {comm.Get_rank()} of {comm.Get_size()} failed: {what}; ending the job")
    comm.Abort(code)
    os._exit(code)                 # mpich's MPI_Abort may return before mpiexec kills this process


def say(line):
    """``line`` on stderr, given time to reach mpiexec: its proxy drops output still in flight at an abort."""
    if sys.stdout is not None:
        sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)
    time.sleep(0.2)


def mpi_world():
    """mpi4py's ``MPI`` and ``MPI.COMM_WORLD``, or a clear error when mpi4py is not installed.

    In a job of several ranks it arms the hook that ends the job on an uncaught exception (NOTE [ An
    uncaught exception ends the job ]): everything of fastckpt that touches MPI comes here first (a
    ``Grid``, a ``Group``, every trainer), so a rank that fails there alone, before any trainer exists
    (a ``Grid`` that does not fit the job), ends the job instead of leaving the others in their first
    collective."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise RuntimeError("MPI needs mpi4py and an MPI library: pip install mpi4py mpich "
                           f"(import failed: {exc})") from None
    if MPI.COMM_WORLD.Get_size() > 1:
        hook_uncaught(MPI.COMM_WORLD)
    return MPI, MPI.COMM_WORLD


def launched_ranks():
    """How many processes mpiexec started with this one (1 when not started by mpiexec)."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 1


def communicator(comm=None):
    """``(MPI, comm)``: mpi4py's ``MPI`` and ``comm``, ``MPI.COMM_WORLD`` when None; a TypeError naming what
    ``comm`` is unless it is an mpi4py intra-communicator."""
    MPI, world = mpi_world()
    if comm is None:
        return MPI, world
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"comm must be an mpi4py communicator (MPI.COMM_WORLD or one split from it), got "
                        f"{type(comm).__name__} {comm!r}"[:200])
    return MPI, comm


_LOCAL_RANKS = {}                      # the world's ranks on this machine, once known


class Group:
    """The ranks of one communicator (``MPI.COMM_WORLD`` by default) and the collectives every mode shares.

    ``rank`` is this process's place in it and ``size`` the number of ranks.
    """

    def __init__(self, comm=None):
        self.MPI, self.comm = communicator(comm)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def agree(self, mine, what="settings", differ="were started with different settings"):
        """One ``allgather``: ``mine`` is this rank's dict of settings (values shown as text), or the
        exception its own checks raised.  Then on every rank alike: the first rank's error raised
        (this rank's own, as it was, where it failed), or a ValueError naming every setting that
        differs between ranks."""
        error = mine if isinstance(mine, BaseException) else None
        sent = f"{type(mine).__name__}: {mine}" if error is not None else {k: str(v) for k, v in mine.items()}
        everyone = self.comm.allgather(sent)
        if error is not None:
            raise everywhere(error)
        failed = [f"rank {r}: {e}" for r, e in enumerate(everyone) if isinstance(e, str)]
        if failed:
            raise everywhere(ValueError(f"{what} refused on " + "; ".join(failed)))
        try:
            check_same_settings(everyone, differ)
        except ValueError as exc:
            raise everywhere(exc) from None

    @contextlib.contextmanager
    def errors(self):
        """The context of one trainer call: an exception leaving it ends the job (:meth:`abort`) unless
        it is an instance of the context's ``shared`` classes (set as the call goes on), which every
        rank raises at the same point (NOTE [ No rank waits forever ])."""
        context = types.SimpleNamespace(shared=())
        try:
            yield context
        except BaseException as exc:
            if not isinstance(exc, context.shared):
                self.abort(exc)
            everywhere(exc)
            raise

    def abort(self, exc):
        """End every rank of the job, naming this rank and ``exc``; returns only when this rank is alone."""
        if self.size > 1:
            abort_job(self.comm, exc)

    def share_cores(self):
        """Limit BLAS to this rank's share of its machine's cores (more threads would only spin against
        the other ranks there); returns the threads.  The communicator of the machine's ranks is freed
        at once, and its count kept for the world's ranks: mpich keeps 2 MiB of shared memory for it on
        one of them, until its next such split."""
        world = self.comm.Compare(self.MPI.COMM_WORLD) in (self.MPI.IDENT, self.MPI.CONGRUENT)
        local = _LOCAL_RANKS.get("world") if world else None
        if local is None:
            machine = self.comm.Split_type(self.MPI.COMM_TYPE_SHARED)
            local = machine.Get_size()
            machine.Free()
            if world:
                _LOCAL_RANKS["world"] = local
        threads = max(1, (os.cpu_count() or 1) // local)
        if blas_threads() > threads:
            set_blas_threads(threads)
        return threads

    def gather_net(self, sizes, pieces):
        """The whole net's ``(weights, biases)`` in the lab's shapes, on every rank (a collective).

        ``pieces`` are this rank's parts: ``(layer, rows, cols, w, b)`` with
        ``w = W[rows[0]:rows[1], cols[0]:cols[1]]`` and ``b = b[rows[0]:rows[1]]``
        (or None when another rank gives that bias).
        """
        weights = [None] * (len(sizes) - 1)
        biases = [None] * (len(sizes) - 1)
        for part in self.comm.allgather(pieces):
            for layer, (r0, r1), (c0, c1), w, b in part:
                if weights[layer] is None:
                    weights[layer] = np.empty((sizes[layer + 1], sizes[layer]), dtype=w.dtype)
                    biases[layer] = np.empty((sizes[layer + 1], 1), dtype=w.dtype)
                weights[layer][r0:r1, c0:c1] = w
                if b is not None:
                    biases[layer][r0:r1, 0] = b
        return weights, biases


def describe_data(data, name):
    """Shapes, dtypes and a digest of an (x, y) pair: equal on two ranks when they hold the same data."""
    digest = hashlib.sha256()
    parts = []
    for a in pair(data, name):
        if isinstance(a, Images):                              # its bytes: no float copy of the data
            digest.update(a.raw)
            parts.append(f"{a.shape} uint8 / {a.divisor:g}")
            continue
        a = np.ascontiguousarray(a)
        digest.update(a)
        parts.append(f"{a.shape} {a.dtype}")
    return f"{' and '.join(parts)}, sha256 {digest.hexdigest()[:16]}"


def random_state():
    """A digest of ``numpy.random``'s state: equal on every rank seeded alike (the initial draws need it)."""
    state = np.random.get_state()
    return "sha256 " + hashlib.sha256(state[1].tobytes() + repr(state[2:]).encode()).hexdigest()[:16]


def check_same_settings(settings, differ="were started with different settings"):
    """Raise ValueError naming each setting whose value differs between ranks; ``settings[r]`` is rank r's dict.

    When the ranks run different parallel modes (their ``mode`` settings differ) only that is said: the
    other settings of two modes are not comparable."""
    modes = {mine.get("mode") for mine in settings}
    keys = ["mode"] if len(modes) > 1 else list(dict.fromkeys(key for mine in settings for key in mine))
    said, differ = differ, []
    for key in keys:
        ranks_of = {}
        for rank, mine in enumerate(settings):
            ranks_of.setdefault(mine.get(key, "missing"), []).append(rank)
        if len(ranks_of) > 1:
            differ.append(f"{key} " + ", ".join(f"{value} on {_ranks(ranks)}" for value, ranks in ranks_of.items()))
    if differ:
        raise ValueError(f"the {len(settings)} ranks {said}: " + "; ".join(differ))


def _ranks(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
