"""What the machine can hold: the memory free to this process, for checks made before anything is allocated."""
import resource

import psutil


def free_bytes():
    """Bytes this process may still allocate: the machine's available memory, or less under ``ulimit -v``."""
    free = psutil.virtual_memory().available
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        free = min(free, max(0, soft - psutil.Process().memory_info().vms))
    return free


def thread_address_space():
    """The address space one more thread reserves under ``ulimit -v``: its stack (``ulimit -s``, 8 MiB when
    unlimited, glibc's default); 0 without an address-space limit, where an untouched stack costs nothing."""
    if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
        return 0
    stack, _ = resource.getrlimit(resource.RLIMIT_STACK)
    return 8 * 2**20 if stack == resource.RLIM_INFINITY else stack


def check_fits(nbytes, what, flag):
    """Refuse (ValueError naming ``flag``) something that needs ``nbytes``, more than half of :func:`free_bytes`."""
    free = free_bytes()
    if nbytes > free // 2:
        raise ValueError(f"{flag}: {what} needs {nbytes / 2**30:.2f} GiB, more than half the {free / 2**30:.2f} GiB "
                         "this process can still allocate")
