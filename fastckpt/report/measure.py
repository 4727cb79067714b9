"""memray's measured peak: the number every memory prediction of fastckpt is held to."""
import os
import tempfile


def memray_peak(run):
    """memray's peak bytes (all native allocations) while ``run()`` executes."""
    import memray
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "peak.bin")
        with memray.Tracker(path):
            run()
        return memray.FileReader(path).metadata.peak_memory
