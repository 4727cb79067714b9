"""A step that Ctrl-C cannot cut in half.

NOTE [ A whole step ]
With the optimizer in the backward pass a step updates each layer as soon as
its gradient is final, in one kernel call per run of the plan's ops.  A
KeyboardInterrupt between two of those calls would leave the layers above
stepped, the layers below not, and the step count behind them: a retried step
then updates the top layers twice, and Adam's bias corrections no longer match
its moments.  Nothing would say so.

So such a step runs inside :func:`whole`.  In the main thread, the only one
where Python runs signal handlers, a SIGINT that arrives during the block is
held and handed to the handler that was installed before (Python's default
raises KeyboardInterrupt) as soon as the block ends: Ctrl-C waits for at most
one step (with SIGINT left to the system, the signal is raised again then).
Outside the main thread, or when SIGINT is ignored or has a handler installed
from C, nothing changes.  A step that computes its
gradients first and then applies them in one kernel call needs none of this.
"""
import signal
import threading


class whole:
    """A block that a SIGINT does not cut short: it is delivered when the block ends (NOTE [ A whole step ])."""

    __slots__ = ("frame", "pending", "old")

    def __enter__(self):
        self.pending, self.old = False, None
        if threading.current_thread() is threading.main_thread():
            old = signal.getsignal(signal.SIGINT)
            if callable(old) or old == signal.SIG_DFL:        # not SIG_IGN, nor None (a handler installed from C)
                self.old = old
                signal.signal(signal.SIGINT, self._hold)
        return self

    def _hold(self, signum, frame):
        self.frame, self.pending = frame, True

    def __exit__(self, *exc):
        if self.old is None:
            return False
        signal.signal(signal.SIGINT, self.old)
        if self.pending:
            if callable(self.old):
                self.old(signal.SIGINT, self.frame)
            elif self.old == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)
        return False
