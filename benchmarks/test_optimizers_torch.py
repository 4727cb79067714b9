"""Each optimizer beside ``torch.optim`` (when torch is installed): the same parameters and the same
20 gradients, float64, then the parameters and the state compared; and the time of one step on the
deep net of issue 22's benchmark (``[784] + [512]*16 + [10]``, float32) under pytest-benchmark.

The correctness reference is the NumPy twin of each documented formula (``tests/test_optimizers.py``);
this peer shows that the formulas are PyTorch's, rounding aside.
"""
import numpy as np
import pytest

from fastckpt.core.layout import layer_views
from fastckpt.core.optimizers import OptimizerState
from fastckpt.core.params import Parameters
from fastckpt.optimizers import SGD, Adam, AdamW, Momentum

torch = pytest.importorskip("torch")

CASES = {  # name: (fastckpt optimizer, torch optimizer class, its keyword arguments)
    "sgd": (SGD(), "SGD", {}),
    "momentum": (Momentum(0.9), "SGD", {"momentum": 0.9}),
    "nesterov": (Momentum(0.8, nesterov=True), "SGD", {"momentum": 0.8, "nesterov": True}),
    "adam": (Adam(), "Adam", {}),
    "adam-decay": (Adam(betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05), "Adam",
                   {"betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.05}),
    "adamw": (AdamW(), "AdamW", {}),
}
SIZES, STEPS, LR = [7, 6, 5, 3], 20, 0.01
STATE = {"SGD": ["momentum_buffer"], "Adam": ["exp_avg", "exp_avg_sq"], "AdamW": ["exp_avg", "exp_avg_sq"]}


def _tensors(flat):
    """The net's parameters as torch leaf tensors, weight then bias per layer (copies)."""
    weights, biases = layer_views(flat, SIZES)
    out = []
    for w, b in zip(weights, biases):
        out += [torch.tensor(w.copy(), requires_grad=True), torch.tensor(b.copy(), requires_grad=True)]
    return out


def _blocks(flat):
    """The weights and biases of a flat buffer, concatenated (the layout's alignment gaps left out)."""
    weights, biases = layer_views(flat, SIZES)
    return np.concatenate([a.ravel() for pair in zip(weights, biases) for a in pair])


def _joined(tensors):
    return np.concatenate([t.detach().numpy().ravel() for t in tensors])


@pytest.mark.parametrize("name", list(CASES))
def test_twenty_steps_equal_torch_optim(name):
    optimizer, cls, kwargs = CASES[name]
    rng = np.random.default_rng(3)
    params = Parameters(SIZES, np.float64)
    params.flat[...] = rng.standard_normal(params.flat.size)
    state = OptimizerState(optimizer, params)
    tensors = _tensors(params.flat)
    peer = getattr(torch.optim, cls)(tensors, lr=LR, **kwargs)
    for _ in range(STEPS):
        grad = rng.standard_normal(params.flat.size)
        state.apply(params, grad, LR)
        for t, g in zip(tensors, _tensors(grad)):
            t.grad = g.detach()
        peer.step()
    np.testing.assert_allclose(_blocks(params.flat), _joined(tensors), rtol=1e-12, atol=1e-14)
    for key, buf in zip(STATE[cls] if optimizer.slots else [], state.buffers):
        theirs = _joined([peer.state[t][key] for t in tensors])
        np.testing.assert_allclose(_blocks(buf), theirs, rtol=1e-12, atol=1e-14, err_msg=key)
    assert state.steps == (STEPS if optimizer.slots else 0)      # SGD keeps no state, no count


@pytest.mark.parametrize("peer", ["fastckpt", "torch"])
@pytest.mark.parametrize("name", ["momentum", "adam"])
def test_one_step_on_the_deep_net(benchmark, peer, name):
    sizes = [784] + [512] * 16 + [10]
    params = Parameters(sizes, np.float32)
    params.flat[...] = 0.01
    grad = np.full_like(params.flat, 1e-3)
    optimizer, cls, kwargs = CASES[name]
    if peer == "fastckpt":
        state = OptimizerState(optimizer, params)
        benchmark(state.apply, params, grad, 1e-4)
        weights, biases = layer_views(params.flat, sizes)
        assert all(np.all(a < 0.01) for a in weights + biases)
    else:
        torch.set_num_threads(2)
        tensors = [torch.tensor(w, requires_grad=True) for w in np.split(params.flat, 8)]
        for t in tensors:
            t.grad = torch.full_like(t, 1e-3)
        opt = getattr(torch.optim, cls)(tensors, lr=1e-4, **kwargs)
        benchmark(opt.step)
        assert all(bool((t < 0.01).all()) for t in tensors)
    benchmark.extra_info["parameters"] = int(params.flat.size)
