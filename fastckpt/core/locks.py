"""The lock of a net's parameters, which a forked child does not wait on forever.

NOTE [ A fork inside a step ]
Every step, training run, save and prediction holds its net's parameters'
lock (NOTE [ One owner ]).  ``os.fork()`` copies the lock's state but only the
forking thread: if another thread held the lock then, it stays held in the
child for good, and the parameters may be half-updated.  A plain lock makes
the child's next use of the net hang.

So the lock stays a plain ``threading.RLock`` (its ``with`` block is taken and
left in C, where a Ctrl-C cannot leave it half-taken), made by
:func:`params_lock`, which also remembers its holder.  Right after a fork, in
the child, every such lock is tried: one that another thread of the parent
held is replaced by :class:`Refused`, whose every use raises RuntimeError
(the net cannot be trusted in the child); one that is free, or held by the
forking thread itself (a fork from ``on_epoch``), stays, and the child goes
on.  The try is made by the forking thread, the child's only thread then: a
thread the child starts later may get the ident of the parent's holder (the C
library reuses its stack), so asking it would pass it for the holder.  Reads
of a refused net's parameters (``weights[i]``, ``params.flat``) are refused
too.

A fork also waits for a Numba compilation (or a load from the kernel cache)
in another thread to end: Numba's compiler lock would otherwise stay held in
the child, and the child's first kernel call, of a net built anew there too,
would wait for it forever.
"""
import os
import threading
import weakref

from numba.core.compiler_lock import global_compiler_lock

_HOLDERS = weakref.WeakSet()      # objects whose ``lock`` came from params_lock


def params_lock(holder):
    """A new re-entrant lock for ``holder.lock``, tried in a forked child (NOTE [ A fork inside a step ])."""
    _HOLDERS.add(holder)
    return threading.RLock()


class Refused:
    """The lock of parameters that another thread of the parent held when this process was forked."""

    def __enter__(self):
        raise RuntimeError("this process was forked while another thread held this net's parameters (inside a "
                           "step, a training run, a save or a prediction): that lock stays held in the child and "
                           "the parameters may be half-updated; fork between steps (e.g. from on_epoch), or build "
                           "or load the net anew in the child")

    def __exit__(self, *exc):
        return False

    acquire = __enter__


def _before_fork():
    global_compiler_lock.acquire()                     # waits for a compilation in another thread to end


def _after_fork_in_parent():
    global_compiler_lock.release()


def _after_fork_in_child():
    global_compiler_lock.release()
    for holder in list(_HOLDERS):
        lock = holder.lock
        if isinstance(lock, Refused):
            continue
        if lock.acquire(blocking=False):               # free, or held by this (the forking) thread
            lock.release()
        else:
            holder.lock = Refused()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
