import os
import pathlib
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))


def memray_peak(run):
    """memray's peak bytes over ``run()`` (called outside any timed round)."""
    memray = pytest.importorskip("memray")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "peak.bin")
        with memray.Tracker(path):
            run()
        return memray.FileReader(path).metadata.peak_memory
