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
                   "fastckpt/nets/network.py", "fastckpt/parallel/pipeline/stage.py", "fastckpt/data/__init__.py",
                   "fastckpt/data/mnist_5k.csv.gz",
                   "fastckpt/data/LICENSE-mnist_5k.txt"):
        assert needed in names
    assert not any(n.startswith("kernels/") for n in names)   # no top-level 'kernels' to clash


@pytest.mark.slow
def test_kernel_cache_stays_out_of_the_package(tmp_path):
    """Numba cache files beside the kernels would survive `pip uninstall` and shadow a later install."""
    env = dict(__import__("os").environ, FASTCKPT_CACHE_DIR=str(tmp_path))
    code = ("import numpy as np, fastckpt, fastckpt.kernels as k, os;"
            "fastckpt.Network([3, 2]).backprop(np.zeros((1, 3)), np.zeros((1, 2)));"
            "print(os.path.dirname(k.__file__))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    kernel_dir = proc.stdout.strip().splitlines()[-1]
    cached = list(tmp_path.rglob("*.nbi"))
    assert cached, "kernels were not cached in FASTCKPT_CACHE_DIR"
    beside = __import__("pathlib").Path(kernel_dir, "__pycache__")
    assert not beside.exists() or not list(beside.glob("*.nbi"))
