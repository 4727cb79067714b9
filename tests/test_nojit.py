"""NUMBA_DISABLE_JIT=1 runs every kernel as Python, the GEMM included, and gives the compiled numbers."""
import os

import numpy as np
import pytest

SCRIPT = r"""
import itertools, json, sys
import numpy as np
import numba
from fastckpt import Network, NetworkWithCheckpointing
from fastckpt.kernels import bias_sigmoid
out = {"jit_disabled": bool(numba.config.DISABLE_JIT), "python_kernel": not hasattr(bias_sigmoid, "signatures")}
rng = np.random.default_rng(7)
x, y = rng.standard_normal((6, 9)), rng.random((6, 4))
for dtype in ("float64", "float32"):
    for loss, activation in itertools.product(("quadratic", "cross_entropy"), ("sigmoid", ("tanh", "relu"))):
        np.random.seed(2)
        net = NetworkWithCheckpointing([9, 7, 5, 4], strategy="revolve(1)", dtype=dtype, loss=loss, l2=0.01,
                                       activation=activation)
        ff = net.feedforward(x)
        nb, nw = net.backprop(x, y)
        for _ in range(5):
            net.update_mini_batch(x, y, 0.7)
        out[f"{dtype}-{loss}-{'-'.join(net.activation)}"] = {
            "ff": ff.tolist(), "grads": [g.ravel().tolist() for g in nb + nw],
            "after": [p.ravel().tolist() for p in net.weights + net.biases]}
from fastckpt.optimizers import Momentum
for dtype in ("float64", "float32"):
    for optimizer in (Momentum(0.8, nesterov=True), "adam", "adamw"):
        np.random.seed(3)
        net = NetworkWithCheckpointing([9, 7, 5, 4], strategy="sqrt", dtype=dtype, optimizer=optimizer, init="he",
                                       activation="relu")
        for _ in range(5):
            net.update_mini_batch(x, y, 0.01)
        out[f"{dtype}-{net.optimizer.name}-{optimizer}"] = {
            "ff": [], "grads": [], "after": [p.ravel().tolist() for p in net.weights + net.biases]
            + [b.tolist() for b in net.optimizer_state.buffers]}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_the_kernels_as_python_give_the_compiled_numbers(jit_twins):
    compiled, python = jit_twins(SCRIPT)
    assert python["jit_disabled"] and python["python_kernel"] and not compiled["jit_disabled"]
    assert len([k for k in compiled if "-" in k]) == 14
    for case in (k for k in compiled if "-" in k):             # the same libm and BLAS: the very same numbers
        for part in ("ff", "grads", "after"):
            for got, ref in zip(python[case][part], compiled[case][part]):
                np.testing.assert_array_equal(got, ref, err_msg=f"{case} {part}")


@pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") != "1", reason="checks the suite's own JIT-off run")
def test_this_run_really_has_the_jit_off():
    from fastckpt.kernels import dense_forward
    assert not hasattr(dense_forward, "signatures")          # a plain Python function, not a dispatcher
