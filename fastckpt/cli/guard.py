"""The command line's side of an MPI job: a rank that leaves before training ended ends the whole job.

:class:`RankGuard` covers the time before and after a trainer's own calls: a
rank that exits before training ended on every rank (``--data`` missing on one
node while the others wait in their first collective) aborts the job, with the
command line's one line naming the rank (:func:`leave_job`).  A process that
mpiexec started beside others but that fails before it reaches MPI (its
arguments refused, or ``train`` without ``--mpi``) does the same.  A shared
error (NOTE [ No rank waits forever ] in :mod:`fastckpt.parallel.mpi`) is
reported by rank 0 alone; the other ranks exit 0 quietly, since mpiexec's exit
status is the OR of the ranks'.
"""
import atexit
import os

from fastckpt.parallel.mpi import Group, launched_ranks, mpi_world, say

_GUARD = None    # this process's RankGuard, once the command line has made one


def leave_job(line, code):
    """Called by the command line as it fails: if other ranks may still wait for this one, say ``line``
    naming this rank and end the whole job with ``code``; else return False (the caller says ``line``).

    Other ranks may wait when this rank fails before its :class:`RankGuard` has seen training end on
    every rank, or when it was started by mpiexec beside others and never reached MPI at all (bad
    arguments on one rank, a rank started without ``--mpi``).  A shared error, which every rank raised
    at once, needs nothing: the ranks are leaving together.
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
    say(f"{line} (rank {comm.Get_rank()} of {comm.Get_size()}; ending the job)")
    comm.Abort(code)
    os._exit(code)


class RankGuard:
    """The command line's side of one rank: until :meth:`run` ends, this rank leaving ends the job.

    A rank that exits before training ended on every rank (``--data`` missing on
    one node, Ctrl-C while it loads) would leave the others waiting in a
    collective: at exit the guard names the rank and calls ``MPI_Abort`` (exit
    1).  The command line has printed the rank's error just before.
    """

    def __init__(self, comm=None):
        global _GUARD
        group = Group(comm)
        self.comm, self.rank, self.ranks = group.comm, group.rank, group.size
        self.pending = True
        atexit.register(self._at_exit)
        _GUARD = self

    def run(self, train, *args, **kwargs):
        """``train(*args, **kwargs)``, a call of a trainer, which raises only errors that every rank raises at once
        (:meth:`MPITrainer.SGD <fastckpt.parallel.data_parallel.MPITrainer.SGD>`): rank 0 raises it for
        the command line to report, the others exit 0 quietly.  mpiexec's exit status is the OR of the
        ranks', so the job's is rank 0's."""
        try:
            return train(*args, **kwargs)
        except Exception:
            self.pending = False
            if self.rank == 0:
                raise
            raise SystemExit(0) from None

    def agree(self, settings):
        """The command line's own settings (``--save`` given or not, ...) the same on every rank, or a ValueError
        on every rank naming each difference, reported by rank 0 alone."""
        self.run(Group(self.comm).agree, settings, "the command lines")

    def lead_does(self, action):
        """``action()`` on rank 0 alone (a save), its failure raised on every rank together: a rank that
        failed alone would leave the others waiting in their next collective."""
        error = None
        if self.rank == 0:
            try:
                action()
            except Exception as exc:                  # any failure: the other ranks must hear of it
                error = str(exc) if isinstance(exc, (ValueError, OSError)) else f"{type(exc).__name__}: {exc}"
        error = self.comm.bcast(error, root=0)
        if error is not None:
            raise ValueError(error)

    def finish(self):
        """Training ended on every rank: from here this rank may leave on its own."""
        self.pending = False

    def _at_exit(self):
        if self.pending and self.ranks > 1:
            say(f"fastckpt train: rank {self.rank} of {self.ranks} stopped before training ended on every "
                "rank (its error is above); ending the job")
            self.comm.Abort(1)
            os._exit(1)
