"""The built wheel ships the kernels as fastckpt.kernels and the embedded MNIST."""
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT


def test_wheel_contains_kernels_and_data(tmp_path):
    pytest.importorskip("setuptools")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = next(tmp_path.glob("fastckpt-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("fastckpt/kernels/__init__.py", "fastckpt/kernels/dense.py", "fastckpt/kernels/blas.py",
                   "fastckpt/network.py", "fastckpt/data/mnist_5k.csv.gz",
                   "fastckpt/data/LICENSE-mnist_5k.txt"):
        assert needed in names
    assert not any(n.startswith("kernels/") for n in names)   # no top-level 'kernels' to clash
