import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))


def pytest_addoption(parser):
    parser.addoption("--flamegraphs", default=None, metavar="DIR",
                     help="write a memray flamegraph (HTML, and PNG and SVG that open offline) of each case's "
                          "build-and-train into DIR")


@pytest.fixture
def memray_case(request):
    """``measure(benchmark, name, build, x, y, eta)``: memray's peak of building and 3 steps, into extra_info."""
    import subprocess

    import memray

    from fastckpt.engine.sharing import threads_held
    from fastckpt.report.flame import write_peak_picture
    out = request.config.getoption("--flamegraphs")

    def measure(benchmark, name, build, x, y, eta):
        def build_and_train():
            model = build()
            for _ in range(3):
                model.update_mini_batch(x, y, eta)
        capture = pathlib.Path(request.config.cache.mkdir("memray")) / f"{name}.bin"
        capture.unlink(missing_ok=True)
        tracker = memray.Tracker(capture, native_traces=bool(out), trace_python_allocators=True)  # as memray_peak
        with threads_held(), tracker:                                 # the BLAS threads planned
            build_and_train()
        benchmark.extra_info["memray_peak_bytes"] = memray.FileReader(capture).metadata.peak_memory
        if out:
            os.makedirs(out, exist_ok=True)
            subprocess.run([sys.executable, "-m", "memray", "flamegraph", "-f", "-o",
                            os.path.join(out, f"{name}.html"), str(capture)], check=True, capture_output=True)
            write_peak_picture(capture, os.path.join(out, name), title=name)     # the same, offline: PNG, SVG
        capture.unlink()
    return measure
