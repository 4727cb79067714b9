"""How many of DataParallel's threads an update runs on: all of them, unless one was measured faster.

NOTE [ One thread when it is faster ]
Threads pay only while each has a core and the cores hand data to each other
quickly.  Beside a busy loop on one of 2 cores, two threads took an update of
8 minibatches of 10 on the lab net 1.33x one thread's time; and some hours the
virtual machine's two cores passed the gradient sum and the GIL's state so
slowly that two threads took 1.1x one thread's time with both cores idle
otherwise.  So, by default, the update times itself, per minibatch: the first
updates run on every thread, the next few on one, and from then on the count
whose recent median is lower; every :data:`LOOK` updates the other count runs
once, so a change of the machine is seen.  Bits do not depend on it: one worker
adds the minibatches in the same order, its BLAS on one thread as every worker's
is (NOTE [ Deterministic reduction ]).  ``DataParallel(..., adapt=False)`` always
runs on every thread.
"""
from collections import deque

KEEP = 7            # the recent per-minibatch times kept for each count
FIRST = 3           # updates timed on a count before its median is trusted
LOOK = 64           # updates between two runs on the count not in use


class Pace:
    """Chooses between ``most`` workers and one from the times :meth:`record` is given."""

    def __init__(self, most):
        self.most = most
        self.times = {most: deque(maxlen=KEEP), 1: deque(maxlen=KEEP)}
        self.current = most
        self._since = 0

    def workers(self, minibatches):
        """The workers for an update of ``minibatches``."""
        most = min(self.most, minibatches)
        if most < self.most or self.most == 1:
            return most                                   # a short update: not timed against the others
        for count in (self.most, 1):
            if len(self.times[count]) < FIRST:
                return count
        if self._since >= LOOK:
            return 1 if self.current == self.most else self.most
        return self.current

    def record(self, workers, seconds, minibatches):
        """An update of ``minibatches`` on ``workers`` took ``seconds``."""
        if workers not in self.times or min(self.most, minibatches) < self.most:
            return
        self.times[workers].append(seconds / minibatches)
        probe = workers != self.current
        self._since = 0 if probe else self._since + 1
        if (probe or self._since % KEEP == 0) and all(len(kept) >= FIRST for kept in self.times.values()):
            self.current = min(self.times, key=lambda count: (_median(self.times[count]), -count))


def _median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
