"""SIGINT, SIGTERM and SIGHUP as an exception, so ``compare`` can end its children and keep what is done.

NOTE [ Stopping compare ]
The first signal raises :class:`Stopped` in the main thread; the code it
unwinds through ends the running child's process group (SIGTERM, then SIGKILL
after a grace period) and the command exits ``128 + signum`` as a shell would.
Later signals are swallowed, so they cannot cut that cleanup short and leave
an orphan.  Inside :meth:`Stopper.deferred` (writing the report) a signal only
marks the stop, which is raised when the block ends, so a report is never
half-written.  A SIGKILL to the parent cannot be caught: its child then runs
on until its run ends.
"""
import contextlib
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
WHAT = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}


class Stopped(BaseException):
    """A signal asked the command to stop; ``exit_code`` is ``128 + signum``."""

    def __init__(self, signum):
        self.signum = signal.Signals(signum)
        super().__init__(f"{WHAT.get(self.signum, 'stopped')} ({self.signum.name})")

    @property
    def exit_code(self):
        return 128 + self.signum


class Stopper:
    """Context manager: while inside, SIGNALS raise :class:`Stopped` (once); the old handlers come back after.

    Outside the main thread, where Python cannot install handlers, it changes nothing.
    """

    def __init__(self):
        self.signum, self._depth, self._old = None, 0, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)
        return False

    def _handle(self, signum, frame):
        if self.signum is not None:
            return                                                 # already stopping
        self.signum = signum
        if self._depth == 0:
            raise Stopped(signum)

    @contextlib.contextmanager
    def deferred(self):
        """A block a signal does not cut short; the stop is raised when it ends."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._depth == 0 and self.signum is not None:
            raise Stopped(self.signum)
