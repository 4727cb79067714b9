"""The worker threads of :class:`~fastckpt.parallel.threads.DataParallel`: started once, awake between updates.

NOTE [ Waking workers ]
An update of the lab net on minibatches of 10 takes a few hundred
microseconds, and its threads meet often: the workers start, each gradient
waits for its turn in the sum (NOTE [ Deterministic reduction ]), and the
caller waits for the workers.  Sleeping on a lock for each of those costs a
wake-up of 10-25 us on a virtual machine, so a pool of threads that sleep
(``concurrent.futures``) took 1.34x one thread's time away where 1.6x was the goal.

So the crew's threads wait on int64 flags in a compiled loop without the GIL
(:mod:`kernels.sync`): ``flags[0]`` is the turn of the sum, ``flags[1]`` the
generation of the job (negative: the crew is closed), ``flags[1 + w]`` the last
generation worker ``w`` finished.  A wait spins for at most :data:`SPIN_SECONDS`
(calibrated in turns of the loop once per process), then sleeps on one
condition variable; whoever raises a flag notifies it when someone sleeps.  So
a thread burns at most that long of a core after its work, whatever the
machine runs beside it.

Threads hold the crew's shared state, not the crew: a crew that is dropped
without :meth:`Crew.close` still stops its threads when it is collected.
"""
import os
import threading
import time
import weakref

import numpy as np

from fastckpt.kernels import add_in_turn, raise_flag, wait_flag

SPIN_SECONDS = 250e-6        # how long a waiting thread spins before it sleeps
_spins = None


def spins():
    """The turns of :func:`~fastckpt.kernels.wait_flag` that take :data:`SPIN_SECONDS` on this CPU."""
    global _spins
    if _spins is None:
        flags, turns = np.zeros(1, dtype=np.int64), 4096
        wait_flag(flags, 0, 1, 1)                       # compiled before it is timed
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            wait_flag(flags, 0, 1, turns)
            best = min(best, time.perf_counter() - start)
        _spins = max(1, int(SPIN_SECONDS / max(best / turns, 1e-9)))
    return _spins


class Stopped(Exception):
    """Another worker failed, so this one's turn never comes."""


class _Shared:
    """What the crew's threads share: the flags, one condition to sleep on, the job and the results."""

    def __init__(self, workers):
        self.flags = np.zeros(1 + workers, dtype=np.int64)
        self.cond = threading.Condition()
        self.sleepers = 0
        self.spins = spins()
        self.call = None                      # (generation, work, workers) of the job being run
        self.results = [None] * workers

    def wait(self, i, value):
        """Until ``flags[i] >= value`` or the flags are stopped (negative); returns the flag seen."""
        seen = wait_flag(self.flags, i, value, self.spins)
        if 0 <= seen < value:
            with self.cond:
                self.sleepers += 1
                try:
                    while 0 <= self.flags[i] < value:
                        self.cond.wait(1.0)
                finally:
                    self.sleepers -= 1
            seen = int(self.flags[i])
        return seen

    def wake(self):
        """Wake the sleepers, if any, after a flag was raised."""
        if self.sleepers:
            with self.cond:
                self.cond.notify_all()

    def signal(self, i, value):
        raise_flag(self.flags, i, value)
        self.wake()


def _serve(shared, w):
    """Worker ``w``'s loop: run each job of a new generation, then say it is done."""
    done = 0
    while True:
        seen = shared.wait(1, done + 1)
        if seen < 0:
            return
        call = shared.call
        if call is None:                               # that job ended without this worker
            done = seen
            continue
        generation, work, workers = call
        if w < workers:
            try:
                shared.results[w] = (work(w), None)
            except BaseException as exc:            # handed to the caller, who raises it
                shared.results[w] = (None, exc)
        del work
        done = generation
        shared.signal(1 + w, generation)


def _close(shared, threads):
    raise_flag(shared.flags, 1, -1)
    shared.flags[0] = -1
    with shared.cond:
        shared.cond.notify_all()
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join()


class Crew:
    """``workers - 1`` threads that run ``work(w)`` beside the caller (worker 0), started on first use."""

    def __init__(self, workers):
        self.workers = workers
        self._begin()

    def _begin(self):
        self._pid = os.getpid()
        self._shared = _Shared(self.workers)
        self._threads = []
        self._finalizer = weakref.finalize(self, _close, self._shared, self._threads)

    @property
    def closed(self):
        return not self._finalizer.alive

    def close(self):
        """Stop the threads (each after its current job)."""
        self._finalizer()

    def _start(self):
        while len(self._threads) < self.workers - 1:
            w = len(self._threads) + 1
            thread = threading.Thread(target=_serve, args=(self._shared, w), name=f"fastckpt-{w}", daemon=True)
            try:
                thread.start()
            except RuntimeError as exc:                # "can't start new thread"
                raise RuntimeError(f"threads: could not start worker thread {w + 1} of {self.workers} "
                                   f"({exc}); use fewer threads") from None
            self._threads.append(thread)

    def turns(self):
        """The turns of a new sum: ``add(k, grad)`` in order of ``k`` (NOTE [ Deterministic reduction ])."""
        self._shared.flags[0] = 0
        return _Turns(self._shared)

    def run(self, work, workers, stop):
        """``work(w)`` for ``w < workers``, this thread as worker 0; their results.  Every worker ends
        before anything is raised; a worker's own error wins over a :class:`Stopped` turn.  ``stop()``
        ends the turns when this thread is interrupted while it waits."""
        if self.closed:
            raise RuntimeError("this DataParallel is closed; make a new one")
        if self._pid != os.getpid():                   # a forked child: the parent's threads are not here
            self._finalizer.detach()
            self._begin()
        shared = self._shared
        if workers > 1:
            self._start()
        generation = int(shared.flags[1]) + 1
        shared.call = (generation, work, workers)
        shared.results = [None] * self.workers
        if workers > 1:
            shared.signal(1, generation)
        try:
            shared.results[0] = (work(0), None)
        except BaseException as exc:                   # raised below, once every worker has ended
            shared.results[0] = (None, exc)
        try:
            for w in range(1, workers):
                shared.wait(1 + w, generation)
        except BaseException:                          # interrupted: end the turns, then wait for the workers
            stop()
            for w in range(1, workers):
                shared.wait(1 + w, generation)
            raise
        finally:
            shared.call = None
        results = shared.results[:workers]
        errors = sorted((error for _, error in results if error is not None), key=lambda e: isinstance(e, Stopped))
        if errors:
            raise errors[0]
        return [result for result, _ in results]


class _Turns:
    """Adds minibatch ``k``'s gradient to the sum after ``k - 1``'s (NOTE [ Deterministic reduction ])."""

    def __init__(self, shared):
        self.shared = shared

    def add(self, total, k, grad, blocks):
        shared = self.shared
        while True:
            seen = add_in_turn(shared.flags, k, total, grad, blocks, shared.spins)
            if seen == k + 1:
                shared.wake()
                return
            if seen < 0 or shared.wait(0, k) < 0 or shared.flags[0] > k:
                raise Stopped(f"minibatch {k}: another worker failed first")

    def fail(self):
        self.shared.flags[0] = -1
        self.shared.wake()
