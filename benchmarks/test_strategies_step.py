"""Checkpoint strategies on the deep-narrow net [784] + [256]*64 + [10], batch 2048, float64,
against PyTorch's plain step and ``checkpoint_sequential(8)`` when torch is installed.

Per case, ``extra_info`` holds memray's peak over building the net and three
training steps (measured after a warm-up, outside the timed rounds), the plan's
predicted peak, its recompute factor and extra-FLOP fraction.  With
``--benchmark-disable`` (CI) every case runs once on a small net instead.
"""
import naive
import numpy as np
import pytest
import torch_peer

from fastckpt import InfeasiblePlan, NetworkWithCheckpointing, plan
from fastckpt.report.measure import memray_peak

SHAPES = {"full": ([784] + [256] * 64 + [10], 2048), "small": ([784] + [256] * 8 + [10], 64)}
CASES = {
    "plain": ("plain", False),
    "plain, sgd-in-backward": ("plain", True),
    "segments(8)": ("segments(8)", False),
    "sqrt": ("sqrt", False),
    "sqrt, sgd-in-backward": ("sqrt", True),
    "revolve(4)": ("revolve(4)", False),
    "budget(24MiB)": ("budget(24MiB)", False),
    "budget(24MiB), sgd-in-backward": ("budget(24MiB)", True),
}
TORCH = {"torch plain": 0, "torch checkpoint_sequential(8)": 8}


def _shape(benchmark, data):
    """Sizes, batch and the batch's (x, y): the full net when timing, the small one in CI."""
    name = "small" if benchmark.disabled else "full"
    return (*SHAPES[name], *data[name])


def _fit(strategy, sizes, batch):
    """The strategy, with a budget that does not fit the small CI net raised to 1.3x its least."""
    try:
        plan(sizes, batch, np.float64, strategy)
    except InfeasiblePlan as exc:
        return f"budget({int(exc.minimum_bytes * 1.3)})"
    return strategy


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return {name: (rng.random((batch, 784)), rng.random((batch, 10))) for name, (_, batch) in SHAPES.items()}


ETA = 1e-3  # not 0: BLAS skips a GEMM whose alpha is 0, which would flatter the fused update


def _run(benchmark, build, x, y, rounds):
    net = build()
    net.update_mini_batch(x, y, ETA)                          # warm-up: kernels, BLAS threads, pages

    def build_and_train():
        fresh = build()
        for _ in range(3):
            fresh.update_mini_batch(x, y, ETA)
    benchmark.extra_info["memray_peak_bytes"] = memray_peak(build_and_train)
    benchmark.pedantic(net.update_mini_batch, args=(x, y, ETA), rounds=rounds, iterations=1, warmup_rounds=1)
    return net


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_strategy_step(benchmark, data, case):
    sizes, batch, x, y = _shape(benchmark, data)
    strategy, fused = CASES[case]
    strategy = _fit(strategy, sizes, batch)
    benchmark.group = f"{len(sizes) - 2} hidden layers of 256, batch {batch}, float64"

    def build():
        np.random.seed(0)
        return NetworkWithCheckpointing(sizes, strategy=strategy, optimizer_in_backward=fused)
    net = _run(benchmark, build, x, y, rounds=7)
    p = net.plan(batch)
    benchmark.extra_info.update(predicted_bytes=p.bytes()["total"], recompute_factor=p.recompute_factor,
                                extra_flop_fraction=p.extra_flop_fraction, strategy=str(p.strategy))
    # after timing: the plan was followed, and the trained net's gradients are still right
    assert net.engine(1).forward_counts == list(p.forward_counts)
    nabla_b, nabla_w = net.backprop(x[:16], y[:16])
    ref_b, ref_w = naive.backprop(net.weights, net.biases, x[:16], y[:16])
    for got, ref in zip(nabla_b + nabla_w, ref_b + ref_w):
        # 65 sigmoid layers amplify rounding where a sum cancels: compare to the array's scale
        np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-7, atol=1e-9 * np.abs(ref).max())


@pytest.mark.parametrize("case", list(TORCH), ids=list(TORCH))
@pytest.mark.parametrize("grads", ["freed", "kept"])
def test_torch_step(benchmark, data, case, grads):
    if not torch_peer.available():
        pytest.skip("torch is not installed (pip install torch==2.13.0)")
    sizes, batch, x, y = _shape(benchmark, data)
    benchmark.group = f"{len(sizes) - 2} hidden layers of 256, batch {batch}, float64"
    from fastckpt.kernels import blas_threads

    def build():
        return torch_peer.TorchNet(sizes, segments=TORCH[case], threads=blas_threads(),
                                   keep_grads=grads == "kept")
    net = _run(benchmark, build, x, y, rounds=7)
    benchmark.extra_info["grads"] = grads
    assert np.isfinite(net.update_mini_batch(x, y, ETA))
