"""memray's measured peak: the number every memory prediction of fastckpt is held to."""
import os
import tempfile

from fastckpt.engine.sharing import threads_held


def memray_peak(run):
    """memray's peak bytes (all native allocations) while ``run()`` executes."""
    import memray
    with tempfile.TemporaryDirectory() as tmp, threads_held():      # the BLAS threads its plan counts
        path = os.path.join(tmp, "peak.bin")
        with memray.Tracker(path):
            run()
        return memray.FileReader(path).metadata.peak_memory
