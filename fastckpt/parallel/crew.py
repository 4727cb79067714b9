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
condition variable; whoever raises a flag notifies it when someone sleeps.
Spinning pays only while every thread has a core: beside a busy loop a
spinning worker took the core its caller needed (a step 7x slower).  So the
crew spins only while the process may run on at least as many CPUs as it has
workers and the rest of the machine leaves them free, looked up every
``WINDOW`` seconds as NOTE [ Threads on a shared machine ] does for BLAS; else
its threads sleep at once, as a pool's would.

A thread that comes back from a kernel while another runs Python sleeps on
the GIL and pays the same wake-up, so during a job the crew's threads also
take turns at a gate before they take the GIL (NOTE [ Turns at the GIL ] in
:mod:`kernels.sync`); the caller holds it as the job starts, as it runs Python
then.  On minibatches of 10 this took the two threads' update from 1.17x to
1.51x one thread's speed with OpenBLAS's SkylakeX kernels (medians of 5
alternating runs, 2-core AMD EPYC Zen 5).

Threads hold the crew's shared state, not the crew: a crew that is dropped
without :meth:`Crew.close` still stops its threads when it is collected.
"""
import functools
import os
import threading
import time
import weakref

import numpy as np

from fastckpt.engine.sharing import WINDOW, Sharing, threads_for
from fastckpt.kernels import add_in_turn, new_gate, raise_flag, wait_flag

SPIN_SECONDS = 250e-6        # how long a waiting thread spins before it sleeps


@functools.cache
def spins():
    """The turns of :func:`~fastckpt.kernels.wait_flag` that take :data:`SPIN_SECONDS` on this CPU (measured
    once per process)."""
    flags, turns, gate = np.zeros(1, dtype=np.int64), 4096, new_gate()
    wait_flag(flags, 0, 1, 1, gate, 0)              # compiled before it is timed
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        wait_flag(flags, 0, 1, turns, gate, 0)
        best = min(best, time.perf_counter() - start)
    return max(1, int(SPIN_SECONDS / max(best / turns, 1e-9)))


class _Room:
    """A condition to sleep on, and how many sleep there."""

    def __init__(self):
        self.cond = threading.Condition()
        self.sleepers = 0


class _Shared:
    """What the crew's threads share: the flags, the rooms they sleep in, the job and the results.  Worker
    ``w > 0`` waits for a job in room ``w``, so a job wakes only its own workers; every other wait (turns,
    the caller's wait for its workers) is in room 0."""

    def __init__(self, workers):
        self.flags = np.zeros(1 + workers, dtype=np.int64)
        self.gate = new_gate()                # NOTE [ Turns at the GIL ]: spins only during a job
        self.rooms = [_Room() for _ in range(workers)]
        self.spins = spins()
        self.call = None                      # (generation, work, workers) of the job being run
        self.results = [None] * workers

    def wait(self, i, value, room=0, me=0):
        """Until ``flags[i] >= value`` or the flags are stopped (negative), for worker ``me``; returns the
        flag seen."""
        seen = wait_flag(self.flags, i, value, self.spins, self.gate, me)
        if 0 <= seen < value:
            place = self.rooms[room]
            with place.cond:
                place.sleepers += 1
                try:
                    while 0 <= self.flags[i] < value:
                        place.cond.wait(1.0)
                finally:
                    place.sleepers -= 1
            seen = int(self.flags[i])
        return seen

    def wake(self, room=0):
        """Wake the sleepers of ``room``, if any, after a flag was raised."""
        place = self.rooms[room]
        if place.sleepers:
            with place.cond:
                place.cond.notify_all()


class Stopped(Exception):
    """Another worker failed, so this one's turn never comes."""


class Turns:
    """Adds minibatch ``k``'s gradient to the sum after ``k - 1``'s (NOTE [ Deterministic reduction ] in
    :mod:`fastckpt.parallel.threads`), through the crew's flags."""

    def __init__(self, shared):
        self.shared = shared

    def add(self, total, k, grad, blocks, me=0):
        """Worker ``me`` adds minibatch ``k``'s ``grad`` to ``total`` in its turn."""
        shared = self.shared
        while True:
            seen = add_in_turn(shared.flags, k, total, grad, blocks, shared.spins, shared.gate, me)
            if seen == k + 1:
                shared.wake()
                return
            if seen < 0 or shared.wait(0, k, 0, me) < 0 or shared.flags[0] > k:
                raise Stopped(f"minibatch {k}: another worker failed first")

    def fail(self):
        self.shared.flags[0] = -1
        self.shared.wake()


def _serve(shared, w):
    """Worker ``w``'s loop: run each job it is part of, then say it is done."""
    done = 0
    while True:
        seen = shared.wait(1, done + 1, w, w)
        if seen < 0:
            return
        done = seen
        call = shared.call
        if call is None or call[0] != seen or w >= call[2]:     # not part of that job, or it has ended
            continue
        try:
            shared.results[w] = (call[1](w), None)
        except BaseException as exc:                # handed to the caller, who raises it
            shared.results[w] = (None, exc)
        call = None                                 # holds no job (nor what it refers to) while it waits
        raise_flag(shared.flags, 1 + w, seen)
        shared.wake()                               # the caller waits for its workers in room 0


def _outwait(shared, workers, generation):
    """Wait for every worker of a stopped job, through further interrupts: a worker left running would add
    its gradient to the next job's sum."""
    w = 1
    while w < workers:
        try:
            shared.wait(1 + w, generation)
            w += 1
        except BaseException:                          # a second Ctrl-C: the turns are stopped, they end soon
            continue


def _runs(thread, within=1.0):
    """Whether ``thread``, whose start() was interrupted, runs (it says so within a second if it does)."""
    deadline = time.monotonic() + within
    while not thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.001)
    return thread.is_alive()


def _close(shared, threads, pid):
    if os.getpid() != pid:                          # a forked child: these threads and locks are the parent's
        return
    raise_flag(shared.flags, 1, -1)
    shared.flags[0] = -1
    for place in shared.rooms:
        with place.cond:
            place.cond.notify_all()
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join()


class Crew:
    """``workers - 1`` threads that run ``work(w)`` beside the caller (worker 0), started on first use."""

    def __init__(self, workers):
        self.workers = workers
        self._running = threading.Lock()              # one job at a time; close() waits for it
        self._load, self._looked, self._free = Sharing(), 0.0, None
        self._begin()

    def _begin(self):
        self._pid, self._owner = os.getpid(), None
        self._shared = _Shared(self.workers)
        self._threads = []
        self._finalizer = weakref.finalize(self, _close, self._shared, self._threads, self._pid)

    @property
    def gate(self):
        """The gate of the crew's threads (NOTE [ Turns at the GIL ]): a kernel called by worker ``w`` during
        a job passes it with ``me = w``."""
        return self._shared.gate

    @property
    def closed(self):
        return not self._finalizer.alive

    def close(self):
        """Stop the threads, after the job running in another thread, if any, has ended."""
        if self._owner == threading.get_ident():
            raise RuntimeError("a DataParallel cannot be closed from inside its own update")
        if self._pid != os.getpid():                   # a forked child: no thread of its own yet, and the
            self._finalizer()                          # parent's job may hold _running here for good
            return
        with self._running:
            self._finalizer()

    def _start(self):
        while len(self._threads) < self.workers - 1:
            w = len(self._threads) + 1
            thread = threading.Thread(target=_serve, args=(self._shared, w), name=f"fastckpt-{w}", daemon=True)
            self._threads.append(thread)               # before start(): an interrupt there may leave it running
            try:
                thread.start()
            except RuntimeError as exc:                # "can't start new thread"
                self._threads.pop()
                raise RuntimeError(f"threads: could not start worker thread {w + 1} of {self.workers} "
                                   f"({exc}); use fewer threads") from None
            except BaseException:                      # interrupted: keep it only if it runs
                if not _runs(thread):
                    self._threads.pop()
                raise

    def _spins(self, workers):
        """The spin of this job's waits: :func:`spins`, or none when the workers would not each have a core."""
        now = time.monotonic()
        if now - self._looked >= WINDOW:
            self._looked = now
            others = self._load.look()
            if others is not None:
                self._free = threads_for(others, self._load.cores, workers)
        free = self._load.cores if self._free is None else self._free
        return spins() if min(free, self._load.cores) >= workers else 0

    def turns(self):
        """The turns of a new sum: ``add(total, k, grad, blocks)`` in order of ``k`` (NOTE [ Deterministic
        reduction ]).  Made by the caller of :meth:`run` while it holds what keeps updates one at a time."""
        self._shared.flags[0] = 0
        return Turns(self._shared)

    def run(self, work, workers, stop):
        """``work(w)`` for ``w < workers``, this thread as worker 0; their results.  Every worker ends
        before anything is raised; a worker's own error wins over a :class:`Stopped` turn.  ``stop()``
        ends the turns when this thread is interrupted while the workers run."""
        with self._running:
            if self.closed:
                raise RuntimeError("this DataParallel is closed; make a new one")
            if self._pid != os.getpid():               # a forked child: the parent's threads are not here
                self._finalizer.detach()
                self._begin()
            self._owner = threading.get_ident()
            try:
                if workers == 1:
                    return [work(0)]
                self._start()
                return self._run(work, workers, stop)
            finally:
                self._owner = None

    def _run(self, work, workers, stop):
        shared = self._shared
        shared.spins = self._spins(workers)
        shared.gate[:] = (0, shared.spins)             # this thread (worker 0) runs Python now
        generation = int(shared.flags[1]) + 1
        shared.results = [None] * self.workers
        shared.call = (generation, work, workers)
        try:
            raise_flag(shared.flags, 1, generation)
            for w in range(1, workers):
                shared.wake(w)
            try:
                shared.results[0] = (work(0), None)
            except BaseException as exc:               # raised below, once every worker has ended
                shared.results[0] = (None, exc)
            for w in range(1, workers):
                shared.wait(1 + w, generation)
        except BaseException:                          # interrupted: end the turns, let the workers end, raise
            stop()
            raise_flag(shared.flags, 1, generation)
            for w in range(1, workers):
                shared.wake(w)
            _outwait(shared, workers, generation)
            raise
        finally:
            shared.call = None
            shared.gate[:] = (-1, 0)
        results, shared.results = shared.results[:workers], [None] * self.workers
        errors = sorted((error for _, error in results if error is not None), key=lambda e: isinstance(e, Stopped))
        if errors:
            raise errors[0]
        return [result for result, _ in results]
