"""BLAS threads on a shared machine: as many as the cores other programs leave free, never more than asked.

NOTE [ Threads on a shared machine ]
OpenBLAS's threads spin while they wait for each other.  When another program
(another training job, PyTorch, a busy loop) holds a core, a GEMM split over
every core waits for the thread that has to share one, and two jobs' spinning
pools each wait for the other: on 2 cores a step of [784, 512, 512, 512, 10]
at batch 256 took 19x its time alone with 2 threads per job and 1.7x with one
(a 2-core Intel Xeon, 2026-11-23; docs/speed.md has this machine's numbers).
So, by default, every step asks :func:`tick` whether it is time to look again
(every ``WINDOW`` seconds of training); it then reads how much CPU time the
machine spent outside this process since the last look (``/proc/stat`` less
this process's own time, through psutil) and runs BLAS on the cores left:

    threads = clamp(floor(cores - others + MARGIN), 1, blas_threads())

where ``cores`` are the CPUs this process may run on and ``others`` the cores'
worth of time the rest of the machine used.  Fewer threads are taken at once (a
collapse costs most); more only after two looks in a row agree, so a short
burst elsewhere does not make the count flap.  The count never exceeds
:func:`~fastckpt.kernels.blas_threads` (``set_blas_threads``, the
``--blas-threads`` flag, or the library's default), and plans count BLAS
buffers for that many, so memray's peak can only be lower than a plan, never
higher.  Only the main thread looks: worker threads (``DataParallel``) run
BLAS on one thread already, and MPI ranks on their share of the cores.

``FASTCKPT_BLAS_THREADS=N`` (or :func:`fix_threads`) turns this off and runs BLAS
on exactly ``N`` threads; ``auto`` (the default) keeps it on.  Fix the count for
a run that must repeat bit for bit on a busy machine: OpenBLAS rounds some
GEMMs differently on one thread and on two (``(100 x 784) @ (784 x 40)`` does,
in the last bit), so under ``auto`` the load can change a weight's last bits.
"""
import contextlib
import operator
import os
import threading
import time
import warnings

import numpy as np
import psutil

from fastckpt.kernels import blas_threads, blas_threads_running, run_blas_threads, set_blas_threads

WINDOW = 0.5                 # seconds of training between two looks
MARGIN = 0.35                # a core counts as free while the others use at most MARGIN of one
BUSY = ("user", "nice", "system", "irq", "softirq", "steal")


class Sharing:
    """Looks at the CPU time the rest of the machine used since the last look (:meth:`look`)."""

    def __init__(self):
        self.auto = True
        self.last = None              # (wall, machine busy seconds, this process's seconds) at the last look
        self.want_more = 0            # looks in a row that found more free cores than threads running
        self.process = psutil.Process(os.getpid())
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def sample(self):
        if self.process.pid != os.getpid():          # a forked child: its own CPU time, and a new start (it
            self.process, self.last = psutil.Process(os.getpid()), None   # raised once the parent had exited)
        machine = psutil.cpu_times()
        mine = self.process.cpu_times()
        return time.monotonic(), sum(getattr(machine, f, 0.0) for f in BUSY), mine.user + mine.system

    def look(self):
        now = self.sample()
        last, self.last = self.last, now
        if last is None or not 0 < now[0] - last[0] <= 4 * WINDOW:     # none yet, or stale: a new start
            return None
        others = max(0.0, (now[1] - last[1]) - (now[2] - last[2])) / (now[0] - last[0])
        return others


SHARING = Sharing()
LIBRARY_THREADS = blas_threads()          # the library's own count (OPENBLAS_NUM_THREADS, else its cores)


def threads_for(others, cores, ceiling):
    """The BLAS threads for a machine whose other programs use ``others`` of its ``cores`` (NOTE above)."""
    return max(1, min(int(ceiling), int(cores - others + MARGIN)))


def tick():
    """Called before each training step: every ``WINDOW`` seconds, BLAS threads set to the cores left free."""
    s = SHARING
    if not s.auto or threading.current_thread() is not threading.main_thread():
        return
    ceiling = blas_threads()
    if ceiling <= 1:
        return
    if s.last is not None and time.monotonic() - s.last[0] < WINDOW:
        return
    others = s.look()
    if others is None:
        return
    running = blas_threads_running()
    target = threads_for(others, s.cores, ceiling)
    if target < running:
        run_blas_threads(target)
        s.want_more = 0
    elif target > running:
        s.want_more += 1
        if s.want_more >= 2:
            run_blas_threads(target)
            s.want_more = 0
    else:
        s.want_more = 0


def fix_threads(n):
    """Run BLAS on exactly ``n`` threads from now on, whatever else the machine runs (``n`` None: back to the
    default, threads that follow the free cores)."""
    if n is None:
        SHARING.auto, SHARING.last = True, None
        set_blas_threads(LIBRARY_THREADS)
        return
    try:
        if isinstance(n, (bool, np.bool_)):
            raise TypeError
        n = operator.index(n)
    except TypeError:
        raise ValueError(f"BLAS threads must be a whole number >= 1, got {n!r}") from None
    if n < 1:
        raise ValueError(f"BLAS threads must be a whole number >= 1, got {n!r}")
    before = blas_threads()
    set_blas_threads(min(n, 2**31 - 1))                      # a C int: a larger count would wrap around
    if blas_threads_running() not in (0, n):                 # the library ran its most instead: not n
        most = blas_threads_running()
        set_blas_threads(before)
        raise ValueError(f"BLAS threads must be at most {most}, the most the BLAS library runs, got {n}")
    SHARING.auto = False


def fixed_threads():
    """The BLAS threads :func:`fix_threads` fixed, or None when they follow the free cores (``auto``)."""
    return None if SHARING.auto else blas_threads()


@contextlib.contextmanager
def threads_held():
    """BLAS on all :func:`~fastckpt.kernels.blas_threads` threads, unchanged, for the ``with`` block: a memory
    measurement then sees the BLAS buffers its plan counts, whatever else the machine runs."""
    auto, SHARING.auto = SHARING.auto, False
    running = blas_threads_running()
    run_blas_threads(blas_threads())
    try:
        yield
    finally:
        SHARING.auto, SHARING.last = auto, None
        if auto:
            run_blas_threads(running)


def _from_environment():
    value = os.environ.get("FASTCKPT_BLAS_THREADS", "auto").strip().lower()
    if value in ("", "auto"):
        return
    if not value.isascii() or not value.isdigit() or int(value) < 1:
        warnings.warn(f"FASTCKPT_BLAS_THREADS must be 'auto' or a whole number >= 1, got {value!r}; "
                      "using auto", RuntimeWarning, stacklevel=2)
        return
    try:
        fix_threads(int(value))
    except ValueError as exc:
        warnings.warn(f"FASTCKPT_BLAS_THREADS: {exc}; using auto", RuntimeWarning, stacklevel=2)


_from_environment()
