import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))   # the lab baseline lives there
sys.path.insert(0, str(ROOT / "tests"))


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(autouse=True)
def _isolated_global_seed():
    """Networks draw from np.random like the lab; keep that state from leaking between tests."""
    state = np.random.get_state()
    np.random.seed(0)
    yield
    np.random.set_state(state)


@pytest.fixture(scope="session")
def mnist():
    from fastckpt import load_mnist
    return load_mnist()
