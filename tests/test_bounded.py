"""The bounded search (fastckpt/planner/bounded.py) against the slow twin (tests/twin.py: every sub-chain's
whole front) and exhaustive search: the same least FLOPs at every budget, a tree whose walked peak fits."""
import math

import exhaustive
import numpy as np
import pytest
import twin

import fastckpt
from fastckpt.planner.bounded import least_flops
from fastckpt.planner.costs import forward_flops, state_bytes
from fastckpt.planner.trees import walk


def _chain(rng, low, high, widths=(1, 300)):
    """Random widths, runs of equal ones among them (ties), a random batch and itemsize."""
    n_layers = int(rng.integers(low, high + 1))
    sizes = [int(s) for s in rng.integers(*widths, size=n_layers + 1)]
    for j in rng.integers(0, n_layers, size=n_layers // 3):
        sizes[j + 1] = sizes[j]
    batch, item = int(rng.integers(1, 65)), int(rng.choice([4, 8]))
    return sizes, list(forward_flops(sizes, batch)), state_bytes(sizes, batch, item)


def _limits(peaks, points):
    """The least feasible peak, one byte under it, plain's, and ``points`` breakpoints of the front between."""
    chosen = {peaks[0] - 1, peaks[0], peaks[-1]}
    chosen |= {peaks[int(k)] + d for k in np.linspace(0, len(peaks) - 1, points) for d in (0, 1)}
    return sorted(chosen)


def _check(flops, w, limit, best, grads=None):
    found = least_flops(flops, w, limit, grads)
    if best == math.inf:
        assert found is None
        return
    assert found is not None and found.cost == pytest.approx(best, rel=1e-12, abs=0), (limit, found.cost, best)
    assert found.lower == found.cost                       # exact: no certificate needed
    walked = walk(found.tree, len(flops), list(w), None if grads is None else list(grads))
    assert (walked[5] if grads is not None else walked[4]) == found.peak <= limit


def _best(front, limit):
    peaks, costs, _ = front
    fits = [c for p, c in zip(peaks, costs) if p <= limit]
    return min(fits, default=math.inf)


@pytest.mark.parametrize("grads", [False, True], ids=["activations", "with-gradients"])
def test_the_bounded_search_is_the_twins_optimum_on_random_chains(rng, grads):
    checked = 0
    for _ in range(40):
        sizes, flops, w = _chain(rng, 3, 40)
        g = [int(a) * int(b) * 8 for a, b in zip(sizes[:-1], sizes[1:])] if grads else None
        whole = twin.multi_front(flops, w, None, g)
        for limit in _limits(whole[0], 6):
            _check(flops, w, limit, _best(whole, limit), g)
            checked += 1
    assert checked > 100


@pytest.mark.slow
def test_the_bounded_search_is_the_twins_optimum_up_to_60_layers(rng):
    for _ in range(60):
        sizes, flops, w = _chain(rng, 40, 60)
        whole = twin.multi_front(flops, w, None)
        for limit in _limits(whole[0], 12):
            _check(flops, w, limit, _best(whole, limit))


@pytest.mark.parametrize("low,high,chains", [pytest.param(1, 8, 60), pytest.param(8, 11, 4, marks=pytest.mark.slow)])
def test_the_bounded_search_is_exhaustive_searchs_optimum_on_small_chains(rng, low, high, chains):
    """Every tree of chains of ``low`` to ``high - 1`` layers (4,862 trees at 9 layers, 16,796 at 10)."""
    checked = 0
    for _ in range(chains):
        n_layers = int(rng.integers(low, high))
        sizes = [int(s) for s in rng.integers(1, 9, size=n_layers + 1)]
        w, flops = state_bytes(sizes, 8, 8), list(forward_flops(sizes, 8))
        trees = [exhaustive.measure(t, n_layers, flops, w) for t in exhaustive.all_trees(0, n_layers + 1)]
        peaks = sorted({p for _, _, p in trees})
        for limit in sorted(set(peaks) | {p + 64 for p in peaks} | {peaks[0] - 1}):
            _check(flops, w, limit, min((c for c, _, p in trees if p <= limit), default=math.inf))
            checked += 1
    assert checked > 5 * chains


@pytest.mark.memory
def test_a_thousand_layer_budget_plan_is_memrays_peak_of_a_step():
    """The bounded search's plan of 1,000 heterogeneous layers: optimal, and its predicted bytes are memray's
    peak over building the net and training it one step (after a warm-up), within the memory contract."""
    from fastckpt import NetworkWithCheckpointing
    from fastckpt.report.measure import memray_peak
    rng = np.random.default_rng(7)
    sizes, batch = [64] + [int(s) for s in rng.integers(16, 129, size=1000)] + [10], 64
    w = state_bytes(sizes, batch, 8)
    widest = max(w[1:] + [a + b for a, b in zip(w[1:-1], w[2:])])
    strategy = f"budget({int(widest + 0.25 * (sum(w) - widest))})"
    chosen = fastckpt.plan(sizes, batch, strategy=strategy)
    assert chosen.optimality_gap == 0 and chosen.recompute_factor > 1
    predicted = chosen.bytes()["total"]
    x, y = rng.random((batch, sizes[0])), rng.random((batch, sizes[-1]))
    NetworkWithCheckpointing([64, 16, 10], strategy="sqrt").update_mini_batch(x, y, 0.01)     # load the kernels

    def build_and_train():
        np.random.seed(0)
        NetworkWithCheckpointing(sizes, strategy=strategy).update_mini_batch(x, y, 0.01)
    measured = memray_peak(build_and_train)
    assert abs(measured - predicted) <= 0.02 * predicted + 2**20, (measured, predicted)
