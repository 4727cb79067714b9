"""The lock of a net's parameters, which a forked child does not wait on forever.

NOTE [ A fork inside a step ]
Every step, training run, save and prediction holds its net's parameters'
lock (NOTE [ One owner ]).  ``os.fork()`` copies the lock's state but only the
forking thread: if another thread held the lock then, it stays held in the
child for good, and the parameters may be half-updated.  A plain
``threading.RLock`` makes the child's next use of the net hang.

:class:`ParamsLock` is a re-entrant lock that also records the thread that
holds it.  Its first use in a new process looks at that record: held by
another thread of the parent, it raises RuntimeError (now and at every later
use: the net cannot be trusted in the child); free, or held by the forking
thread itself (a fork from ``on_epoch``), the child goes on.  "The forking
thread" is recorded at the fork: a thread the child starts later may get the
ident of the parent's holder (the C library reuses its stack), and must not
pass for it.  A thread
caught between taking the lock and recording it had not started to change
anything, so the child gets a fresh lock then.
"""
import os
import threading

_FORKS = [0, None]            # forks this process descends from (cheaper than getpid), and the thread that forked


def _after_fork_in_child():
    _FORKS[0] += 1
    _FORKS[1] = threading.get_ident()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def forking_thread():
    """The ident of the thread that forked this process (its only thread then), or None if it was not forked.

    A thread that the child starts later may get the ident of one of the parent's threads (the C library
    reuses the stack), so "held by this thread" in a child means held by this one."""
    return _FORKS[1]


class ParamsLock:
    """A re-entrant lock for ``with`` blocks; in a forked child, refuses if another thread held it at the fork."""

    __slots__ = ("_lock", "_forks", "_owner", "_depth")

    def __init__(self):
        self._lock, self._forks, self._owner, self._depth = threading.RLock(), _FORKS[0], None, 0

    def __enter__(self):
        if self._forks != _FORKS[0]:
            self._forked()
        self._lock.acquire()
        self._owner = threading.get_ident()
        self._depth += 1
        return self

    def __exit__(self, *exc):
        self._depth -= 1
        if not self._depth:
            self._owner = None
        self._lock.release()
        return False

    def _forked(self):
        if self._owner is not None and self._owner != forking_thread():
            raise RuntimeError("this process was forked while another thread held this net's parameters (inside "
                               "a step, a training run, a save or a prediction): that lock stays held in the child "
                               "and the parameters may be half-updated; fork between steps (e.g. from on_epoch), or "
                               "build or load the net anew in the child")
        if self._owner is None:
            self._lock, self._depth = threading.RLock(), 0   # no thread of the child holds it
        self._forks = _FORKS[0]
