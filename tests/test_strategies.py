"""Strategies against exhaustive search, the binomial bound, exact layouts, bit-identical gradients."""
import math
from math import comb

import exhaustive
import numpy as np
import pytest

import fastckpt
from fastckpt import InfeasiblePlan, Network, NetworkWithCheckpointing
from fastckpt.core.layout import param_layout
from fastckpt.planner.costs import forward_flops, state_bytes
from fastckpt.planner.search import multi_front, once_front, revolve_tree
from fastckpt.planner.strategies import balanced_checkpoints, parse_strategy

STRATEGIES = ["plain", "every_nth(2)", "every_nth(3)", "segments(2)", "segments(3)", "sqrt",
              "revolve(1)", "revolve(2)", "revolve(3)", "budget(12KiB)", "budget(16KiB, once)"]


def _chain(rng, max_layers=7):
    n_layers = int(rng.integers(1, max_layers + 1))
    sizes = [int(s) for s in rng.integers(1, 9, size=n_layers + 1)]
    return sizes, state_bytes(sizes, 8, 8), list(forward_flops(sizes, 8))


def _limits(peaks):
    """Every breakpoint of a front, just above it and just below the least."""
    return sorted(set(peaks) | {p + 64 for p in peaks} | {peaks[0] - 64})


def test_budget_matches_exhaustive_search_over_persistent_schedules(rng):
    checked = 0
    for _ in range(60):
        sizes, w, flops = _chain(rng)
        n_layers = len(flops)
        trees = [exhaustive.measure(t, n_layers, flops, w) for t in exhaustive.all_trees(0, n_layers + 1)]
        for limit in _limits(multi_front(flops, w, None).peaks):
            front = multi_front(flops, w, limit)
            got = front.costs[-1] if front.peaks else math.inf
            assert got == exhaustive.least_flops(flops, w, limit), (sizes, limit)
            assert got == min((c for c, _, p in trees if p <= limit), default=math.inf)
            if front.peaks:
                tree = front.tree(len(front.peaks) - 1)
                cost, _, peak = exhaustive.measure(tree, n_layers, flops, w)
                assert (cost, peak) == (got, front.peaks[-1]) and peak <= limit
            checked += 1
    assert checked > 300


def test_non_persistent_schedules_rarely_do_better(rng):
    """The documented limit of the search: it covers persistent schedules only."""
    better = total = 0
    for _ in range(40):
        _, w, flops = _chain(rng, 6)
        for limit in _limits(multi_front(flops, w, None).peaks):
            front = multi_front(flops, w, limit)
            got = front.costs[-1] if front.peaks else math.inf
            general = exhaustive.least_flops(flops, w, limit, persistent=False)
            assert general <= got
            better += general < got
            total += 1
    assert better <= total // 20


def test_once_budget_matches_exhaustive_search_over_checkpoint_sets(rng):
    for _ in range(60):
        sizes, w, flops = _chain(rng, 8)
        n_layers = len(flops)
        spines = [exhaustive.measure(t, n_layers, flops, w) for t in exhaustive.all_spines(n_layers)]
        assert max(d for _, d, _ in spines) <= n_layers
        for limit in _limits(once_front(flops, w, None).peaks):
            front = once_front(flops, w, limit)
            got = front.costs[-1] if front.peaks else math.inf
            assert got == min((c for c, _, p in spines if p <= limit), default=math.inf), (sizes, limit)
            if front.peaks:
                tree = front.tree(len(front.peaks) - 1)
                assert exhaustive.measure(tree, n_layers, flops, w)[::2] == (got, front.peaks[-1])


def test_revolve_matches_exhaustive_search_over_trees(rng):
    for _ in range(40):
        sizes, w, flops = _chain(rng, 7)
        n_layers = len(flops)
        trees = [exhaustive.measure(t, n_layers, flops, w) for t in exhaustive.all_trees(0, n_layers + 1)]
        for slots in range(1, n_layers + 1):
            tree = revolve_tree(flops, w, slots)
            cost, depth, peak = exhaustive.measure(tree, n_layers, flops, w)
            fits = [(c, p) for c, d, p in trees if d <= slots]
            assert depth <= slots
            assert (cost, peak) == min(fits), (sizes, slots)


@pytest.mark.parametrize("slots", [1, 2, 3, 4])
@pytest.mark.parametrize("runs", [1, 2, 3, 4])
def test_revolve_reaches_the_binomial_bound(slots, runs):
    """C(slots + runs, slots) reverse steps need each layer at most ``runs`` times; one more step needs more."""
    steps = comb(slots + runs, slots)
    for extra, most in ((0, runs), (1, runs + 1)):
        n_layers = steps - 1 + extra
        if n_layers < 1:
            continue
        plan = fastckpt.plan([8] * (n_layers + 1), 4, strategy=f"revolve({slots})")
        assert plan.forward_counts.max() == most


def _lifetimes(plan):
    """Copies of states made by the plan's fwd ops: [state, offset, made at, last read at]."""
    copies, latest = [], {}
    for t, ((kind, layer), read, write) in enumerate(zip(plan.ops, plan.reads, plan.writes)):
        if layer in latest:                          # every op reads state ``layer``
            copy = copies[latest[layer]]
            assert copy[1] == read, "an op reads a stale copy"
            copy[3] = t
        else:
            assert layer == 0 and read is None, "an op reads a state never computed"
        if kind == "fwd":
            latest[layer + 1] = len(copies)
            copies.append([layer + 1, write, t, t])
    return copies


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_layout_is_valid_and_exactly_the_peak_of_live_bytes(rng, strategy):
    """Replay each plan's ops: live copies never overlap, and the workspace is the peak of live bytes."""
    planned = 0
    for _ in range(25):
        sizes = [int(s) for s in rng.integers(1, 40, size=int(rng.integers(2, 10)))]
        try:
            plan = fastckpt.plan(sizes, 8, strategy=strategy)
        except ValueError:
            continue                                 # segments(k > L), a budget below the least
        planned += 1
        elems = [b // 8 for b in state_bytes(sizes, 8, 8)]
        copies = _lifetimes(plan)
        for a, b in zip(*np.triu_indices(len(copies), 1)):
            (sa, oa, ba, da), (sb, ob, bb, db) = copies[a], copies[b]
            if ba <= db and bb <= da:                # alive at the same time
                assert oa + elems[sa] <= ob or ob + elems[sb] <= oa, (sizes, copies[a], copies[b])
        live = [sum(elems[s] for s, _, born, dies in copies if born <= t <= dies) for t in range(len(plan.ops))]
        assert plan.workspace_elems == max(live), sizes
        assert all(o + elems[s] <= plan.workspace_elems for s, o, _, _ in copies)
        # gradients: layer l's block is written at bwd(l) and lives to the end, at the arena's top
        offsets, total = param_layout(sizes, 8)
        assert plan.grad_offset + total == plan.arena_elems
        floor = plan.arena_elems                     # lowest gradient element written so far
        for t, (kind, layer) in enumerate(plan.ops):
            if kind == "bwd":
                floor = plan.grad_offset + offsets[layer][0]
            for state, at, born, dies in copies:
                if born <= t <= dies:
                    assert at + elems[state] <= floor, (sizes, plan.ops[t], state)
        assert plan.arena_elems <= plan.workspace_elems + total
    assert planned >= 10


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("sizes", [[784, 40, 30, 10], [7, 1, 9, 2, 4, 6, 3], [13] * 9], ids=str)
def test_every_strategy_is_bit_identical_to_plain_and_counts_as_planned(rng, sizes, strategy):
    np.random.seed(1)
    plain = Network(sizes)
    np.random.seed(1)
    try:
        ckpt = NetworkWithCheckpointing(sizes, strategy=strategy)
        plan = ckpt.plan(9)
    except ValueError:
        pytest.skip(f"{strategy} does not apply to {sizes}")
    x, y = rng.random((9, sizes[0])), rng.random((9, sizes[-1]))
    for a, b in zip(sum(plain.backprop(x, y), []), sum(ckpt.backprop(x, y), [])):
        np.testing.assert_array_equal(a, b)
    assert ckpt.engine(1).forward_counts == list(plan.forward_counts)
    trace = []
    ckpt.engine(1).trace = trace
    for _ in range(3):
        plain.update_mini_batch(x, y, 0.5)
        ckpt.update_mini_batch(x, y, 0.5)
    assert trace == list(plan.ops) * 3
    for a, b in zip(plain.weights + plain.biases, ckpt.weights + ckpt.biases):
        np.testing.assert_array_equal(a, b)


def test_optimizer_in_backward_equals_the_separate_update_to_rounding(rng):
    sizes = [20, 16, 12, 16, 5]
    nets = []
    for fused in (False, True):
        np.random.seed(4)
        nets.append(NetworkWithCheckpointing(sizes, strategy="revolve(2)", optimizer_in_backward=fused))
    x, y = rng.random((30, 20)), rng.random((30, 5))
    for _ in range(5):
        for net in nets:
            net.update_mini_batch(x, y, 2.0)
    for a, b in zip(nets[0].weights + nets[0].biases, nets[1].weights + nets[1].biases):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)
    assert nets[1].engine(30)._grad is None          # no gradient buffers were ever made
    parts = nets[1].plan(30).bytes()
    assert parts["gradients"] == 0 and nets[0].plan(30).bytes()["gradients"] == parts["parameters"]
    # backprop still returns the lab's gradients
    for a, b in zip(sum(nets[0].backprop(x, y), []), sum(nets[1].backprop(x, y), [])):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-14)


def test_optimizer_in_backward_stops_on_a_non_finite_update(rng):
    net = Network([3, 4, 2], optimizer_in_backward=True)
    with pytest.raises(FloatingPointError, match="layer 1"):
        net.update_mini_batch(rng.random((5, 3)), rng.random((5, 2)) + 100.0, 1e307)


def test_segments_are_balanced_unlike_checkpoint_sequential():
    assert balanced_checkpoints(9, 5) == [0, 2, 4, 6, 8]             # lengths 2, 2, 2, 2, 1
    for n_layers in range(1, 30):
        for k in range(1, n_layers + 1):
            starts = balanced_checkpoints(n_layers, k) + [n_layers]
            lengths = np.diff(starts)
            assert len(lengths) == k and lengths.max() - lengths.min() <= 1
    plan = fastckpt.plan([5] * 10, 4, strategy="segments(5)")
    assert plan.kept[:5] == (0, 2, 4, 6, 8)


def test_plan_reports_what_a_user_needs():
    plan = fastckpt.plan([784] + [256] * 16 + [10], 64, strategy="sqrt")
    parts = plan.bytes()
    assert parts["total"] == sum(parts[k] for k in ("parameters", "gradients", "optimizer_state", "kept_activations",
                                                    "recompute_buffers", "shared_by_gradients", "deltas", "scratch",
                                                    "blas"))
    assert parts["optimizer_state"] == 0                         # the lab's SGD keeps no state
    assert -parts["gradients"] <= parts["shared_by_gradients"] <= 0
    assert parts["activation_memory"] == parts["kept_activations"] + parts["recompute_buffers"] + parts["deltas"]
    assert plan.recompute_order == tuple(k for kind, k in plan.ops[plan.ops.index(("loss", 17)):] if kind == "fwd")
    fwd = forward_flops(plan.sizes, 64)
    assert plan.extra_flop_fraction == pytest.approx(
        sum(fwd[k] for k in plan.recompute_order) / (3 * fwd.sum() - fwd[0]))
    assert plan.recompute_factor == pytest.approx(1 + sum(fwd[k] for k in plan.recompute_order) / fwd.sum())


def test_budget_is_kept_and_the_least_feasible_is_exact():
    sizes = [784] + [256] * 12 + [10]
    with pytest.raises(InfeasiblePlan, match=r"needs at least (\d+) bytes") as info:
        fastckpt.plan(sizes, 32, strategy="budget(1KiB)")
    least = info.value.minimum_bytes
    assert f"got {1024}" in str(info.value)
    assert fastckpt.plan(sizes, 32, strategy=f"budget({least})").bytes()["activation_memory"] == least
    with pytest.raises(InfeasiblePlan):
        fastckpt.plan(sizes, 32, strategy=f"budget({least - 1})")
    previous = math.inf
    for budget in np.linspace(least, 2 * least, 7).astype(int):
        plan = fastckpt.plan(sizes, 32, strategy=f"budget({budget})")
        assert plan.bytes()["activation_memory"] <= budget
        assert plan.extra_flop_fraction <= previous                  # more memory never costs more
        previous = plan.extra_flop_fraction


@pytest.mark.parametrize("spec,message", [
    ("revolve(0)", r"revolve\(slots\): slots must be an integer >= 1, got 0"),
    ("segments(0)", r"k must be an integer >= 1, got 0"),
    ("every_nth(0)", r"n must be an integer >= 1, got 0"),
    ("revolve(-1)", r"revolve\(slots\): slots must be an integer >= 1, got -1"),
    ("every_nth(-2)", r"n must be an integer >= 1, got -2"),
    ("budget(0)", r"bytes must be a positive integer, got 0"),
    ("budget(12 furlongs)", r"cannot read '12 furlongs' as bytes"),
    ("budget(1MiB, sometimes)", r"recompute must be 'multi' or 'once', got 'sometimes'"),
    ("fastest", r"unknown strategy 'fastest'"),
    ("revolve(two)", r"unknown strategy 'revolve\(two\)'"),
])
def test_bad_strategies_are_refused_with_the_value(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_strategy(spec)


def test_strategy_errors_from_the_network():
    with pytest.raises(ValueError, match=r"segments\(k\): k must be <= the 3 layers of \[4, 5, 6, 7\], got 4"):
        NetworkWithCheckpointing([4, 5, 6, 7], strategy="segments(4)")
    with pytest.raises(ValueError, match="not both"):
        NetworkWithCheckpointing([4, 5, 6], 2, strategy="sqrt")
    with pytest.raises(TypeError, match="strategy must be"):
        NetworkWithCheckpointing([4, 5, 6], strategy=3)
    with pytest.raises(TypeError, match="optimizer_in_backward must be True or False, got 'yes'"):
        Network([4, 5], optimizer_in_backward="yes")
    assert NetworkWithCheckpointing([4, 5, 6, 7, 8], strategy="revolve(1)").checkpoints_layer_idx == [0]
