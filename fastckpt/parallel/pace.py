"""How many of DataParallel's threads an update runs on: all of them, unless one was measured faster.

NOTE [ One thread when it is faster ]
Threads pay only while each has a core and the cores hand data to each other
quickly.  Beside a busy loop on one of 2 cores, two threads took an update of
8 minibatches of 10 on the lab net 1.4x one thread's time; and in some
stretches of minutes this virtual machine's two cores passed the gradient sum
and the GIL's state so slowly that two threads took 1.1x one thread's time
(two minibatches per update: 1.5x) with nothing else running.  So, by default,
an update times itself per minibatch.  The first :data:`WARM` updates run on
every thread untimed, then a few on every thread and a few on one; from then
on the count whose recent median is lower, and every :data:`LOOK` updates a
short run on the other count (4 times more rarely when one is :data:`FAR`
faster), so that a change of the machine is seen.  The first update after a
change of count is not timed: it pays for waking threads and warming their
caches.  Bits do not depend on the count: one worker adds the minibatches in
the same order, its BLAS on one thread as every worker's is (NOTE
[ Deterministic reduction ]).  ``DataParallel(..., adapt=False)`` always runs on
every thread.
"""
from collections import deque
from statistics import median

KEEP = 7            # the recent per-minibatch times kept for each count
FIRST = 3           # times kept for a count before its median is trusted
LOOK = 64           # updates between two runs on the count not in use, while the two are close
FAR = 1.25          # when one count is this much faster, LOOK is 4 times longer
PROBE = 3           # updates in a run on the other count; the first is not timed (its threads were idle)
WARM = 5            # first updates, on every thread, not timed: a new process's first steps run slow


class Pace:
    """Chooses between ``most`` workers and one from the times :meth:`record` is given.  Only an update
    that follows one on the same count is timed: the first after a change pays for waking threads and
    warming their caches, which says nothing of the next ones."""

    def __init__(self, most):
        self.most = most
        self.times = {most: deque(maxlen=KEEP), 1: deque(maxlen=KEEP)}
        self.current = most
        self._last = None              # the workers of the last update
        self._since = 0                # updates on the current count since the other was looked at
        self._look = LOOK
        self._probe = 0                # updates left in a run on the other count
        self._warm = WARM              # first updates left untimed

    def workers(self, minibatches):
        """The workers for an update of ``minibatches``."""
        most = min(self.most, minibatches)
        if most < self.most or self.most == 1:
            return most                                   # a short update: not timed against the others
        if self._warm > 0:
            return self.most
        for count in (self.most, 1):
            if len(self.times[count]) < FIRST:
                return count
        if self._probe == 0 and self._since >= self._look:
            self._probe = PROBE
        if self._probe > 0:
            return 1 if self.current == self.most else self.most
        return self.current

    def record(self, workers, seconds, minibatches):
        """An update of ``minibatches`` on ``workers`` took ``seconds``."""
        if workers not in self.times or min(self.most, minibatches) < self.most:
            self._last = None
            return
        if self._warm > 0:
            self._warm -= 1
            self._last = None
            return
        if workers == self._last:
            self.times[workers].append(seconds / minibatches)
        self._last = workers
        if self._probe > 0 and workers != self.current:
            self._probe -= 1
            if self._probe == 0:
                self._since = 0
                self._decide()
        elif workers == self.current:
            self._since += 1
        if self._since % KEEP == 0:              # _decide waits until both counts have FIRST times
            self._decide()

    def _decide(self):
        if not all(len(kept) >= FIRST for kept in self.times.values()):
            return
        medians = {count: median(kept) for count, kept in self.times.items()}
        self.current = min(medians, key=lambda count: (medians[count], -count))
        slow, fast = max(medians.values()), min(medians.values())
        self._look = LOOK * 4 if slow > FAR * fast else LOOK
        self._since = min(self._since, self._look)
