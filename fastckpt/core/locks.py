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
thread itself (a fork from ``on_epoch``), the child goes on.  A thread
caught between taking the lock and recording it had not started to change
anything, so the child gets a fresh lock then.
"""
import os
import threading

_FORKS = [0]                  # forks this process descends from; a child counts one more (cheaper than getpid)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _FORKS.__setitem__(0, _FORKS[0] + 1))


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
        me = threading.get_ident()
        if self._owner is not None and self._owner != me:
            raise RuntimeError("this process was forked while another thread held this net's parameters (inside "
                               "a step, a training run, a save or a prediction): that lock stays held in the child "
                               "and the parameters may be half-updated; fork between steps (e.g. from on_epoch), or "
                               "build or load the net anew in the child")
        if self._owner is None:
            self._lock, self._depth = threading.RLock(), 0   # no thread of the child holds it
        self._forks = _FORKS[0]
