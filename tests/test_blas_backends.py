"""FASTCKPT_BLAS (NOTE [ BLAS backends ]): a bad name is refused in one line; ``auto`` takes MKL on Intel CPUs
when it is installed; under MKL (when its wheel is installed) training matches a slow NumPy step, checkpointed
gradients stay bit-identical to plain ones, and memray's peak after a warm-up of the same step is the plan's."""
import glob
import json
import os
import subprocess
import sys

import pytest

HAS_MKL = any(glob.glob(os.path.join(p, "lib", "libmkl_rt.so*")) for p in (sys.prefix, sys.base_prefix))
needs_mkl = pytest.mark.skipif(not HAS_MKL, reason='needs MKL (pip install "fastckpt[mkl]")')


def _run(code, backend):
    env = dict(os.environ, FASTCKPT_BLAS=backend)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_an_unknown_backend_is_refused_naming_it():
    proc = _run("import fastckpt", "openblsa")
    assert proc.returncode != 0
    assert "FASTCKPT_BLAS='openblsa': give openblas, mkl or auto" in proc.stderr.strip().splitlines()[-1]


def test_auto_takes_mkl_on_intel_cpus_when_installed_else_openblas():
    from fastckpt.kernels.blas import _intel_cpu
    proc = _run("from fastckpt.kernels import blas_core; print(blas_core())", "auto")
    assert proc.returncode == 0, proc.stderr
    assert (proc.stdout.strip() == "mkl") == (_intel_cpu() and HAS_MKL), proc.stdout


_UNDER_MKL = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import fastckpt
from fastckpt.kernels import blas_core
from fastckpt.report.measure import memray_peak
from naive import backprop
out = {"blas": blas_core()}
rng = np.random.default_rng(0)
sizes, batch = [784, 256, 256, 256, 256, 10], 512
x, y = rng.random((batch, sizes[0])), rng.random((batch, sizes[-1]))
nets = {}
for strategy in ("plain", "sqrt", "revolve(1)"):
    np.random.seed(0)
    nets[strategy] = fastckpt.NetworkWithCheckpointing(sizes, strategy=strategy)
    for _ in range(2):
        nets[strategy].update_mini_batch(x, y, 0.5)
plain = nets["plain"]
out["bit_identical"] = all(np.array_equal(a, b) for s in ("sqrt", "revolve(1)")
                           for a, b in zip(nets[s].weights + nets[s].biases, plain.weights + plain.biases))
np.random.seed(0)
ref = fastckpt.Network(sizes)
w, b = [v.copy() for v in ref.weights], [v.copy() for v in ref.biases]
for _ in range(2):
    nabla_b, nabla_w = backprop(w, b, x, y)
    w = [v - 0.5 * g for v, g in zip(w, nabla_w)]
    b = [v - 0.5 * g for v, g in zip(b, nabla_b)]
out["max_error"] = max(float(np.max(np.abs(p - q) / (1 + np.abs(q))))
                       for p, q in zip(plain.weights + plain.biases, w + b))
def build_and_train():
    np.random.seed(0)
    net = fastckpt.NetworkWithCheckpointing(sizes, strategy="sqrt")
    for _ in range(3):
        net.update_mini_batch(x, y, 0.01)
build_and_train()                        # MKL keeps its buffers for the process once a shape has run
out["peak"] = memray_peak(build_and_train)
out["plan"] = fastckpt.plan(sizes, batch, np.float64, "sqrt").bytes()
print(json.dumps(out))
"""


@needs_mkl
def test_under_mkl_training_is_right_bit_identical_across_strategies_and_memray_is_the_plan():
    proc = _run(_UNDER_MKL.replace("sys.argv[1]", repr(os.path.dirname(__file__))), "mkl")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["blas"] == "mkl" and got["bit_identical"], got
    assert got["max_error"] < 1e-10, got
    assert got["plan"]["blas"] == 0, got["plan"]
    assert abs(got["peak"] - got["plan"]["total"]) <= 256 * 1024, (got["peak"], got["plan"])


_BOUNDS_UNDER_MKL = r"""
import json
import numpy as np
import fastckpt
from fastckpt.cli import app
x, y = np.zeros((64, 20)), np.zeros((64, 3))
try:
    fastckpt.Network([20, 8, 3]).SGD((x, y), 1, 8, 0.1, verbose=False, max_memory="64MiB")
    print(json.dumps("trained"))
except ValueError as exc:
    print(json.dumps(str(exc)))
"""


@needs_mkl
@pytest.mark.parametrize("mode", [[], ["--threads", "2"]])
def test_under_mkl_a_fit_strategy_is_refused_as_max_memory_is(mode):
    env = dict(os.environ, FASTCKPT_BLAS="mkl")
    proc = subprocess.run([sys.executable, "-m", "fastckpt", "train", "--epochs", "1", *mode, "--strategy",
                           "fit(20MiB)"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--strategy fit(20MiB): a bound on a step's bytes holds with OpenBLAS only" \
        in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr


@needs_mkl
@pytest.mark.parametrize("how", ["python", "train", "max-batch"])
def test_under_mkl_a_bound_on_the_whole_run_is_refused_naming_it(how):
    """NOTE [ MKL's own buffers ]: MKL's GEMM buffers are outside any plan, so a whole-run bound is refused, not
    broken in silence."""
    if how == "python":
        proc = _run(_BOUNDS_UNDER_MKL, "mkl")
        assert proc.returncode == 0, proc.stderr
        said = json.loads(proc.stdout.splitlines()[-1])
        assert said.startswith("max_memory 64MiB: a bound on the whole run holds with OpenBLAS only; MKL"), said
        return
    args = ["train", "--epochs", "1"] if how == "train" else ["plan", "--max-batch"]
    env = dict(os.environ, FASTCKPT_BLAS="mkl")
    proc = subprocess.run([sys.executable, "-m", "fastckpt", *args, "--max-memory", "64MiB"], env=env,
                          capture_output=True, text=True, timeout=300)
    said = f"fastckpt {args[0]}: error: --max-memory 64MiB: a bound on the whole run holds with OpenBLAS only"
    assert proc.returncode == 2 and proc.stderr.startswith(said), proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "FASTCKPT_BLAS=openblas" in proc.stderr, proc.stderr


@needs_mkl
def test_under_mkl_a_resume_of_a_bounded_run_is_refused(tmp_path):
    """The --resume file's --max-memory is the run's bound too: MKL cannot keep it, so the resume is refused."""
    saved = tmp_path / "g.npz"
    first = subprocess.run([sys.executable, "-m", "fastckpt", "train", "--sizes", "784,32,10", "--epochs", "1",
                            "--max-memory", "30MiB", "--save", str(saved)], capture_output=True, text=True,
                           timeout=300, env=dict(os.environ, FASTCKPT_BLAS="openblas"))
    assert first.returncode == 0, first.stderr
    proc = subprocess.run([sys.executable, "-m", "fastckpt", "train", "--epochs", "2", "--resume", str(saved),
                           "--save", str(saved)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, FASTCKPT_BLAS="mkl"))
    assert proc.returncode == 2 and "was trained with --max-memory 30MiB: a bound on the whole run holds with " \
        "OpenBLAS only" in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("entry", [["-m", "fastckpt", "plan"], ["-c", "import sys; from fastckpt.cli import main; "
                                                                      "sys.exit(main(['--version']))"]])
def test_the_command_line_says_a_bad_backend_in_one_line(entry):
    env = dict(os.environ, FASTCKPT_BLAS="openblsa")
    proc = subprocess.run([sys.executable, *entry], env=env, capture_output=True, text=True, timeout=120)
    if entry[0] == "-m":
        assert proc.returncode == 2 and proc.stderr == "fastckpt: error: FASTCKPT_BLAS='openblsa': give openblas, " \
                                                       "mkl or auto\n", proc.stderr
    else:                                              # a script importing fastckpt: Python's ImportError
        assert proc.returncode == 1 and "BlasChoiceError: FASTCKPT_BLAS='openblsa'" in proc.stderr
