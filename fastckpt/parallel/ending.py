"""How a rank ends the whole MPI job: a failure this rank alone has, or an exception that nothing caught.

NOTE [ No rank waits forever ] in :mod:`fastckpt.parallel.mpi` says when a rank
aborts; this module does it and says why, on stderr, where mpiexec shows it.
"""
import os
import sys
import time

from fastckpt.core.checks import check_bool

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


def abort_job(comm, exc, prefix="fastckpt"):
    """Print ``<prefix>: rank R of N failed: <exc>`` on stderr and end every rank with ``MPI_Abort``."""
    what = "interrupted (KeyboardInterrupt)" if isinstance(exc, KeyboardInterrupt) else \
        f"{type(exc).__name__}: {exc}"
    code = 130 if isinstance(exc, KeyboardInterrupt) else 2 if isinstance(exc, (ValueError, TypeError, OSError)) else 1
    say(f"{prefix}: rank {comm.Get_rank()} of {comm.Get_size()} failed: {what}; ending the job")
    comm.Abort(code)
    os._exit(code)                 # mpich's MPI_Abort may return before mpiexec kills this process


def say(line):
    """``line`` on stderr, given time to reach mpiexec: its proxy drops output still in flight at an abort."""
    if sys.stdout is not None:
        sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)
    time.sleep(0.2)
