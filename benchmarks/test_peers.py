"""fastckpt against its peers on the same training step: the lab's NumPy code (lab net only),
PyTorch CPU plain and with ``checkpoint_sequential`` (when torch is installed), JAX's jitted
step plain and with ``jax.checkpoint`` around fastckpt's segments (when jax is installed),
and the step's GEMMs alone through numpy's and PyTorch's BLAS (the hardware limit).

One group per case: net x dtype x plain/checkpointed.  ``extra_info`` per benchmark:
memray's peak over building the net and 3 steps (after a warm-up, outside the timed
rounds), the plan's predicted peak, the step's GEMM FLOPs and the achieved GFLOP/s.
``--benchmark-disable`` (CI) runs every case once on small nets; ``--flamegraphs DIR``
also writes a memray flamegraph per case.
"""
import time

import gemm_limit
import jax_peer
import lab_numpy
import numpy as np
import pytest
import torch_peer
from fastckpt.kernels import blas_threads

from fastckpt import NetworkWithCheckpointing
from fastckpt.planner.costs import forward_flops, step_flops

NETS = {  # name: (full sizes, full batch, small sizes, small batch, checkpointed: (fastckpt, torch segments))
    "lab": ([784, 40, 30, 10], 100, [784, 40, 30, 10], 100, ("every_nth(2)", 2)),
    "deep-narrow": ([784] + [256] * 64 + [10], 2048, [784] + [256] * 8 + [10], 64, ("segments(8)", 8)),
    "shallow-wide": ([784, 4096, 4096, 10], 512, [784, 256, 256, 10], 32, ("every_nth(2)", 2)),
}
PEERS = ["fastckpt", "torch", "jax", "gemm-only numpy", "gemm-only torch", "lab-numpy"]
ETA = 1e-3


def _cases():
    for net in NETS:
        for dtype in ("float64", "float32"):
            for mode in ("plain", "checkpointed"):
                for peer in PEERS:
                    if peer == "lab-numpy" and (net != "lab" or dtype != "float64"):
                        continue                     # the lab code is float64 and far too slow beyond the lab net
                    if peer.startswith("gemm-only") and mode == "checkpointed":
                        continue
                    yield pytest.param(net, dtype, mode, peer, id=f"{net}-{dtype}-{mode}-{peer}")


def _build(peer, sizes, batch, dtype, mode, strategy, segments):
    if peer == "fastckpt":
        return NetworkWithCheckpointing(sizes, strategy="plain" if mode == "plain" else strategy, dtype=dtype)
    if peer == "torch":                                      # from the same weights as fastckpt (the lab's draw)
        return torch_peer.TorchNet(sizes, dtype=dtype, segments=0 if mode == "plain" else segments,
                                   threads=blas_threads(), like=NetworkWithCheckpointing(sizes, dtype=dtype))
    if peer == "jax":                                        # the same weights; jax.checkpoint per fastckpt segment
        return _jax_like(sizes, dtype, mode, strategy)[1]
    if peer == "gemm-only numpy":
        return gemm_limit.NumpyGemms(sizes, batch, dtype)
    if peer == "gemm-only torch":
        return gemm_limit.TorchGemms(sizes, batch, dtype, blas_threads())
    return lab_numpy.Network(sizes) if mode == "plain" else lab_numpy.NetworkWithCheckpointing(sizes, 2)


def _jax_like(sizes, dtype, mode, strategy):
    """A fastckpt net and a JAX net from its weights, recomputing the segments between its checkpoints."""
    like = NetworkWithCheckpointing(sizes, strategy="plain" if mode == "plain" else strategy, dtype=dtype)
    kept = None if mode == "plain" else like.checkpoints_layer_idx
    return like, jax_peer.JaxNet(sizes, dtype=dtype, kept=kept, like=like)


def _assert_jax_step_matches(net, mode):
    """JAX's step (the same code path, on the net's small sizes in float64) updates as fastckpt's does."""
    _, _, sizes, batch, (strategy, _) = NETS[net]
    rng = np.random.default_rng(1)
    x, y = rng.random((batch, sizes[0])), rng.random((batch, sizes[-1]))
    np.random.seed(0)
    ref, model = _jax_like(sizes, np.float64, mode, strategy)
    start = [p.copy() for p in ref.weights + ref.biases]
    model.update_mini_batch(x, y, ETA)
    ref.update_mini_batch(x, y, ETA)
    for got, want, p0 in zip(model.weights + model.biases, ref.weights + ref.biases, start):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=0)
        step = want - p0                                     # the update itself, not drowned by the weights
        np.testing.assert_allclose(got - p0, step, rtol=1e-9, atol=1e-9 * np.abs(step).max())


@pytest.mark.parametrize("net,dtype,mode,peer", list(_cases()))
def test_step(benchmark, memray_case, net, dtype, mode, peer):
    full_sizes, full_batch, small_sizes, small_batch, (strategy, segments) = NETS[net]
    sizes, batch = (small_sizes, small_batch) if benchmark.disabled else (full_sizes, full_batch)
    if peer.endswith("torch") and not torch_peer.available():
        pytest.skip("torch is not installed (pip install torch==2.13.0)")
    if peer == "jax" and not jax_peer.available():
        pytest.skip("jax is not installed (pip install jax)")
    shown = sizes if len(sizes) < 6 else f"[{sizes[0]}]+[{sizes[1]}]*{len(sizes) - 2}+[{sizes[-1]}]"
    benchmark.group = f"{net} {shown}, batch {batch}, {dtype}, {mode}"
    rng = np.random.default_rng(0)
    x = rng.random((batch, sizes[0])).astype(dtype)
    y = rng.random((batch, sizes[-1])).astype(dtype)

    def build():
        np.random.seed(0)
        return _build(peer, sizes, batch, dtype, mode, strategy, segments)
    model = build()
    model.update_mini_batch(x, y, ETA)                       # warm-up: kernels, thread pools, pages
    if not peer.startswith("gemm-only"):
        memray_case(benchmark, f"{net}-{dtype}-{mode}-{peer}", build, x, y, ETA)
    fwd = forward_flops(sizes, batch)
    flops = step_flops(sizes, batch)
    if peer == "fastckpt":
        plan = model.plan(batch)
        flops += float(np.dot(plan.forward_counts - 1, fwd))
        benchmark.extra_info.update(predicted_bytes=plan.bytes()["total"], strategy=plan.strategy,
                                    recompute_factor=plan.recompute_factor,
                                    extra_flop_fraction=plan.extra_flop_fraction)
    time.sleep(0.3)                                          # let the last case's spinning BLAS threads sleep
    rounds = 3 if sum(fwd) * 3 > 2e10 else 7 if sum(fwd) > 1e9 else 50
    benchmark.pedantic(model.update_mini_batch, args=(x, y, ETA), rounds=rounds, iterations=1, warmup_rounds=1)
    benchmark.extra_info["gemm_flops"] = flops
    if not benchmark.disabled:
        benchmark.extra_info["gflops_per_s"] = flops / benchmark.stats.stats.median / 1e9
    if peer == "jax":                                        # after timing: the same update as fastckpt's
        _assert_jax_step_matches(net, mode)
    if peer == "fastckpt":                                   # after timing: still the right gradients
        import naive
        rows = min(batch, 16)
        nabla_b, nabla_w = model.backprop(x[:rows], y[:rows])
        # Through many layers of randn weights the forward is chaotic: a float64 twin's own forward
        # drifts from float32's.  So the twin back-propagates from fastckpt's own activations.
        acts = [a.astype(np.float64) for a in model.forward_between_checkpoints(x[:rows], 0, len(sizes) - 1)]
        ref_b, ref_w = naive.backward([w.astype(np.float64) for w in model.weights], acts, y[:rows])
        tol = 1e-9 if dtype == "float64" else 1e-3
        for g, r in zip(nabla_b + nabla_w, ref_b + ref_w):
            np.testing.assert_allclose(g.reshape(r.shape), r, rtol=tol, atol=tol * np.abs(r).max() + 1e-30)
