"""memray's measured peak: the number every memory prediction of fastckpt is held to."""
import gc
import os
import tempfile

from fastckpt.engine.sharing import threads_held


def memray_peak(run):
    """memray's peak bytes (all native allocations) while ``run()`` executes.

    Python's own objects are counted one by one (``trace_python_allocators``),
    not as the 1 MiB arenas its small-object allocator maps: whether a run needs
    a new arena depends on what the interpreter freed before it, so counting
    arenas made the same run's peak differ by 1 MiB from one process to the next.
    Garbage left by earlier code is collected first, so the collector's next
    pass does not fall inside ``run()`` at a point set by what ran before."""
    import memray
    gc.collect()
    with tempfile.TemporaryDirectory() as tmp, threads_held():      # the BLAS threads its plan counts
        path = os.path.join(tmp, "peak.bin")
        with memray.Tracker(path, trace_python_allocators=True):
            run()
        return memray.FileReader(path).metadata.peak_memory
