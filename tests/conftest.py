import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# which test first compiles a kind of kernel depends on the order tests run in: no compile notice on the stderr
# they check, here or in the processes they start (tests/test_cache.py checks the notice itself)
os.environ["FASTCKPT_COMPILE_NOTICE"] = "0"
sys.path.insert(0, str(ROOT / "benchmarks"))   # the lab baseline lives there
sys.path.insert(0, str(ROOT / "tests"))


def pytest_collection_modifyitems(config, items):
    """Tests that state facts about AVX-512 (``-m avx512``) are skipped on a CPU without it (:mod:`cpu`); a plain
    ``pytest`` (no ``-m``) leaves out the ``slow`` ones, which ``pytest -m slow`` runs (:func:`mark_sweeps`).

    Under MKL (FASTCKPT_BLAS=mkl) the memray-against-plan tests (``-m memory``) and those training under a
    whole-run bound (``-m bounds``, refused under MKL) are skipped: MKL keeps GEMM
    buffers of its own that no plan counts (NOTE [ MKL's own buffers ] in fastckpt/planner/run.py).  What holds
    under MKL is checked by tests/test_blas_backends.py from an OpenBLAS process."""
    from cpu import skip_avx512_tests
    skip_avx512_tests(items)
    named = any("::" in arg for arg in config.args)   # a test asked for by name runs, slow or not
    mark_sweeps(items, check=not named)
    if not config.getoption("markexpr") and not named:   # plain ``pytest``: the long matrices wait for ``-m slow``
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("slow") is None]
    from fastckpt.kernels import blas_core
    if blas_core() != "mkl":
        return
    skip = pytest.mark.skip(reason="memray against the plan, and whole-run bounds, hold with OpenBLAS; MKL keeps "
                                   "buffers no plan counts (NOTE [ MKL's own buffers ])")
    for item in items:
        if "memory" in item.keywords or "bounds" in item.keywords:
            item.add_marker(skip)


def mark_sweeps(items, check=True):
    """``@pytest.mark.sweep("id", ..., first=N)`` on a parametrized test: the cases with those ids, and the first
    ``N`` in collection order, run by default, the others only under ``-m slow`` (the long matrices: every
    mode, strategy, dtype or core type).  With ``check``, a named id that no case has is an error, so renaming
    a parameter cannot quietly drop a case from the default run."""
    seen = {}
    for item in items:
        marker = item.get_closest_marker("sweep")
        if marker is None:
            continue
        case = item.callspec.id if hasattr(item, "callspec") else ""
        kept = seen.setdefault((item.path, item.originalname), (set(marker.args), set(), [0]))
        kept[2][0] += 1
        if case in kept[0]:
            kept[1].add(case)
        elif kept[2][0] > marker.kwargs.get("first", 0):
            item.add_marker(pytest.mark.slow)
    for (path, name), (named, found, _) in seen.items():
        if check and named - found:
            raise pytest.UsageError(f"{path.name}::{name}: sweep names cases it does not have: "
                                    f"{', '.join(sorted(named - found))}")


@pytest.fixture(scope="session", autouse=True)
def _fixed_blas_threads():
    """BLAS on the library's own thread count for the whole session, as FASTCKPT_BLAS_THREADS=N would set it:
    the memory tests compare memray with plans for that many threads, and whatever else the machine runs
    meanwhile must not change the count between a plan and its measurement (tests/test_sharing.py tests
    the threads that follow the free cores on an instance of its own)."""
    from fastckpt.kernels import blas_threads

    from fastckpt.engine import sharing
    auto = sharing.SHARING.auto
    if auto:
        sharing.fix_threads(blas_threads())
    yield
    if auto:
        sharing.fix_threads(None)


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


@pytest.fixture
def jit_twins():
    """``run(script)`` runs a script that prints JSON last, compiled and with NUMBA_DISABLE_JIT=1;
    returns the (compiled, python) results."""
    def run(script):
        results = []
        for disable in (False, True):
            env = dict(os.environ, NUMBA_DISABLE_JIT="1" if disable else "0")
            proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                                  timeout=600)
            assert proc.returncode == 0, proc.stderr
            results.append(json.loads(proc.stdout.splitlines()[-1]))
        return results
    return run


@pytest.fixture
def wrap_run_kernels(monkeypatch):
    """``wrap_run_kernels(around)``: from then on each run kernel the engine calls runs as ``around(kernel,
    *args)`` (the engine asks ``fastckpt.engine.engine.runner`` for its kernels at every step);
    ``wrap_run_kernels(None)`` undoes it."""
    import fastckpt.engine.engine as engine_module
    real = engine_module.runner

    def wrap(around):
        if around is None:
            monkeypatch.setattr(engine_module, "runner", real)
            return

        def runner(*a, **k):
            kernel = real(*a, **k)
            return lambda *args: around(kernel, *args)
        monkeypatch.setattr(engine_module, "runner", runner)
    return wrap
