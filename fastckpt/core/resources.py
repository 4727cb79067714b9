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


def check_fits(nbytes, what, flag):
    """Refuse (ValueError naming ``flag``) something that needs ``nbytes``, more than half of :func:`free_bytes`."""
    free = free_bytes()
    if nbytes > free // 2:
        raise ValueError(f"{flag}: {what} needs {nbytes / 2**30:.2f} GiB, more than half the {free / 2**30:.2f} GiB "
                         "this process can still allocate")
