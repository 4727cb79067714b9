"""What the machine can hold: the memory free to this process, for checks made before anything is allocated."""
import os
import resource

import psutil

from fastckpt.kernels import blas_core


def free_bytes():
    """Bytes this process may still allocate: the machine's available memory, or less under ``ulimit -v``."""
    free = psutil.virtual_memory().available
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        free = min(free, max(0, soft - psutil.Process().memory_info().vms))
    return free


def machine_bytes():
    """The machine's physical memory: an array larger than it cannot be trained on here."""
    return psutil.virtual_memory().total


OPENBLAS_THREAD_BUFFER = 32 * 2**20   # OpenBLAS maps a buffer of BUFFER_SIZE (32 MiB) for each thread calling it


def thread_address_space():
    """The address space one more thread calling BLAS reserves under ``ulimit -v``: its stack (``ulimit -s``,
    8 MiB when unlimited, glibc's default) and OpenBLAS's buffer for a calling thread (mapped on its first
    call: where the address space runs out there, OpenBLAS ends the process); 0 without an address-space
    limit, where untouched pages cost nothing."""
    if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
        return 0
    stack, _ = resource.getrlimit(resource.RLIMIT_STACK)
    blas = 0 if blas_core() == "mkl" else OPENBLAS_THREAD_BUFFER
    return (8 * 2**20 if stack == resource.RLIM_INFINITY else stack) + blas


def shown_bytes(n):
    """``n`` bytes for people, in the largest unit that holds at least one: ``"512 bytes"``, ``"10.97 KiB"``,
    ``"68.10 MiB"``, ``"238.57 GiB"``, never ``"0.00 MiB"``."""
    n = int(n)
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} byte{'' if abs(n) == 1 else 's'}"


def check_fits(nbytes, what, flag):
    """Refuse (ValueError naming ``flag``) something that needs ``nbytes``, more than half of :func:`free_bytes`."""
    free = free_bytes()
    if nbytes > free // 2:
        raise ValueError(f"{flag}: {what} needs {shown_bytes(nbytes)}, more than half the {shown_bytes(free)} "
                         "this process can still allocate")


class ResidentBytes:
    """This process's resident set size in bytes, psutil's ``memory_info().rss``, read each call.

    On Linux it is read from ``/proc/<pid>/statm`` through a descriptor kept open, which takes about a
    tenth of psutil's 9 us (training records it before every update, as the lab does); elsewhere, and in a
    forked child, through psutil.  :meth:`close` (or a ``with`` block) closes the descriptor.
    """

    def __init__(self):
        self._pid = os.getpid()
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
        try:
            self._fd = os.open(f"/proc/{self._pid}/statm", os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self):
        if self._fd is not None and os.getpid() == self._pid:
            return int(os.pread(self._fd, 256, 0).split()[1]) * self._page
        return psutil.Process().memory_info().rss

    def __reduce__(self):
        raise TypeError("a ResidentBytes holds an open descriptor of this process and cannot be copied; make one")

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
