"""One training step of the lab net [784, 40, 30, 10] at batch 100, float64: fastckpt against the lab's NumPy code.

Run with ``pytest benchmarks/ --benchmark-json=out.json`` and summarise with
``python benchmarks/summarize.py out.json``.
"""
import lab_numpy
import naive
import numpy as np
import pytest

from fastckpt import Network, NetworkWithCheckpointing, load_mnist
from fastckpt.report.measure import memray_peak

SIZES = [784, 40, 30, 10]
BATCH = 100

IMPLEMENTATIONS = {
    "lab-numpy": lambda: lab_numpy.Network(SIZES),
    "lab-numpy-every2": lambda: lab_numpy.NetworkWithCheckpointing(SIZES, 2),
    "fastckpt": lambda: Network(SIZES),
    "fastckpt-every2": lambda: NetworkWithCheckpointing(SIZES, checkpoint_every_nth_layer=2),
}


@pytest.fixture(scope="module")
def batch():
    (x, y), _ = load_mnist()
    return x[:BATCH].copy(), y[:BATCH].copy()


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS), ids=list(IMPLEMENTATIONS))
def test_lab_net_step(benchmark, batch, impl):
    x, y = batch
    benchmark.group = "lab net [784, 40, 30, 10], batch 100, float64"
    np.random.seed(0)
    net = IMPLEMENTATIONS[impl]()
    for _ in range(20):                                    # burn-in: compile, BLAS threads, caches
        net.update_mini_batch(x, y, 0.0)

    def build_and_train():
        np.random.seed(0)
        fresh = IMPLEMENTATIONS[impl]()
        for _ in range(3):
            fresh.update_mini_batch(x, y, 0.0)
    benchmark.extra_info["memray_peak_bytes"] = memray_peak(build_and_train)
    if impl.startswith("fastckpt"):
        benchmark.extra_info["predicted_bytes"] = net.plan(BATCH).bytes()["total"]
        benchmark.extra_info["recompute_factor"] = net.plan(BATCH).recompute_factor
        benchmark.extra_info["extra_flop_fraction"] = net.plan(BATCH).extra_flop_fraction
    benchmark.pedantic(net.update_mini_batch, args=(x, y, 0.0), rounds=200, iterations=5, warmup_rounds=5)
    # after timing, the step still computes the right gradient (eta=0 left the weights alone)
    nabla_b, nabla_w = net.backprop(x[:, :, None], y[:, :, None])
    ref_b, ref_w = naive.backprop(net.weights, net.biases, x, y)
    for got, ref in zip(nabla_b + nabla_w, ref_b + ref_w):
        np.testing.assert_allclose(np.reshape(got, ref.shape), ref, rtol=1e-10, atol=1e-13)
