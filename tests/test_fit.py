"""``fit(bytes)``: a bound on the whole step's predicted bytes, against exhaustive search over schedule trees."""
import re

import exhaustive
import numpy as np
import pytest

from fastckpt import InfeasiblePlan, plan
from fastckpt.core.layout import grad_bytes
from fastckpt.planner.costs import forward_flops, state_bytes
from fastckpt.planner.run import run_bytes
from fastckpt.planner.trees import tree_cost, walk


def _every_tree(sizes, batch, item, fused, optimizer):
    """(total bytes, forward FLOPs) of every schedule tree of the net, from the plan's own byte count
    (the optimizer's state among the bytes no schedule changes)."""
    n_layers = len(sizes) - 1
    fixed = plan(sizes, batch, np.dtype(f"f{item}"), "plain", optimizer_in_backward=fused, blas_threads=1,
                 optimizer=optimizer).bytes()
    assert fixed["optimizer_state"] == {"sgd": 0, "momentum": 1, "adam": 2}[optimizer] * fixed["parameters"]
    fixed = fixed["total"] - (0 if fused else fixed["gradients"]) - fixed["kept_activations"] \
        - fixed["recompute_buffers"] - fixed["shared_by_gradients"]      # in backward: one layer's, fixed
    w = state_bytes(sizes, batch, item)
    grads = None if fused else grad_bytes(sizes, item)
    flops = forward_flops(sizes, batch)
    return [(fixed + walk(t, n_layers, w, grads)[5], tree_cost(t, n_layers, flops)[0])
            for t in exhaustive.all_trees(0, n_layers + 1)]


@pytest.mark.parametrize("fused, optimizer", [(False, "sgd"), (True, "sgd"), (False, "momentum"), (False, "adam"),
                                              (True, "momentum"), (True, "adam")],
                         ids=["sgd-after", "sgd-in-backward", "momentum", "adam", "momentum-in-backward",
                              "adam-in-backward"])
def test_fit_is_the_least_recomputation_whose_total_fits(rng, fused, optimizer):
    checked = 0
    for _ in range(60):
        n_layers = int(rng.integers(2, 7))
        sizes = [int(s) for s in rng.integers(1, 40, size=n_layers + 1)]
        batch, item = int(rng.integers(1, 30)), int(rng.choice([4, 8]))
        trees = _every_tree(sizes, batch, item, fused, optimizer)
        dtype = np.dtype(f"f{item}")
        for limit in sorted({t for t, _ in trees}):
            p = plan(sizes, batch, dtype, f"fit({limit})", optimizer_in_backward=fused, blas_threads=1,
                     optimizer=optimizer)
            best = min(c for t, c in trees if t <= limit)
            got = float(np.dot(p.forward_counts, forward_flops(sizes, batch)))
            assert p.bytes()["total"] <= limit
            assert got == pytest.approx(best, rel=1e-12), (sizes, batch, item, limit)
            checked += 1
        least = min(t for t, _ in trees)
        with pytest.raises(InfeasiblePlan) as info:
            plan(sizes, batch, dtype, f"fit({least - 1})", optimizer_in_backward=fused, blas_threads=1,
                 optimizer=optimizer)
        assert info.value.minimum_bytes == least
        assert f"fit({least - 1})" in str(info.value) and str(least) in str(info.value)
    assert checked > 100


@pytest.mark.memory
@pytest.mark.parametrize("fused", [False, True], ids=["sgd-after", "sgd-in-backward"])
def test_a_fit_net_trains_within_its_bytes_by_memray(fused):
    from fastckpt import NetworkWithCheckpointing
    from fastckpt.report.measure import memray_peak
    sizes, batch = [784] + [256] * 24 + [10], 512
    whole = plan(sizes, batch, "float64", "plain", optimizer_in_backward=fused).bytes()["total"]
    with pytest.raises(InfeasiblePlan) as info:
        plan(sizes, batch, "float64", "fit(1MiB)", optimizer_in_backward=fused)
    limit = (whole + info.value.minimum_bytes) // 2
    p = plan(sizes, batch, "float64", f"fit({limit})", optimizer_in_backward=fused)
    assert info.value.minimum_bytes <= p.bytes()["total"] <= limit < whole
    rng = np.random.default_rng(0)
    x, y = rng.random((batch, sizes[0])), rng.random((batch, sizes[-1]))

    def build_and_train():
        np.random.seed(0)
        net = NetworkWithCheckpointing(sizes, strategy=f"fit({limit})", optimizer_in_backward=fused)
        for _ in range(3):
            net.update_mini_batch(x, y, 0.01)
    build_and_train()                                                   # warm-up: kernels and BLAS threads
    measured = memray_peak(build_and_train)
    assert measured <= limit + 256 * 1024, (measured, limit)
    assert abs(measured - p.bytes()["total"]) <= 256 * 1024


def test_bytes_are_read_exactly():
    from fastckpt.planner.strategies import parse_strategy
    assert str(parse_strategy("budget(9007199254740993)")) == "budget(9007199254740993)"   # 2**53 + 1, no float
    assert parse_strategy("fit(1.5GiB)").nbytes == 3 * 2**29 and str(parse_strategy("fit(2TiB)")) == "fit(2TiB)"
    for bad in ("revolve(\uff12)", "fit(1e3)", "budget(0.5)", "fit(0)"):
        with pytest.raises(ValueError):
            parse_strategy(bad)


@pytest.mark.parametrize("depth", [150, 300])
def test_a_deep_fit_that_cannot_be_is_refused_with_the_exact_least(depth):
    """Past 100 layers too the refusal names the least a step needs with its gradients in the arena, exactly: a fit
    of that many bytes plans a step of that total, one byte less is refused (it named a lower bound there, one
    byte above what was refused, and a bound on the whole run then could not find its step)."""
    sizes = [8] + [4] * depth + [3]
    with pytest.raises(InfeasiblePlan) as info:
        plan(sizes, 20, strategy="fit(1KiB)")
    least = info.value.minimum_bytes
    assert "lower bound" not in str(info.value) and str(least) in str(info.value)
    assert plan(sizes, 20, strategy=f"fit({least})").bytes()["total"] == least
    with pytest.raises(InfeasiblePlan) as info:
        plan(sizes, 20, strategy=f"fit({least - 1})")
    assert info.value.minimum_bytes == least


def test_a_deep_nets_run_bound_under_its_least_names_max_memory(rng):
    """A bound on a 150-layer net's whole run under what its least step needs: the refusal names max_memory and
    that step (it was a fit(...) the run derived, 'needing' one byte more than it was given)."""
    from fastckpt import NetworkWithCheckpointing
    sizes = [8] + [4] * 150 + [3]
    with pytest.raises(InfeasiblePlan) as info:
        plan(sizes, 20, strategy="fit(1KiB)")
    x, y = rng.random((100, 8)), np.eye(3)[rng.integers(0, 3, 100)]
    net = NetworkWithCheckpointing(sizes, strategy="plain")
    rest = run_bytes(net.plan(20), (x, y), updates=5)
    bound = rest["total"] - rest["step: total"] + info.value.minimum_bytes // 2    # the rest fits, the step not
    with pytest.raises(ValueError) as refused:
        net.SGD((x, y), 1, 20, 0.1, max_memory=bound)
    assert str(refused.value).startswith(f"max_memory {bound}: the whole run needs at least ")
    assert "the least training step" in str(refused.value)


def test_a_run_bound_past_the_exact_least_s_depth_is_refused_naming_max_memory(rng, monkeypatch):
    """Where the least step is too long a search (past ~1,400 layers; here made so at 40 by fewer steps), a run
    bound between the lower bound and the least is refused naming max_memory (a fit(...) the run derived was
    refused instead, 'needing' one byte more than it was given).  The lower bound is made a loose one (the widest
    state), so that bounds fall between it and the least."""
    from fastckpt import NetworkWithCheckpointing
    monkeypatch.setattr("fastckpt.planner.search.MAX_STEPS", 1000)
    monkeypatch.setattr("fastckpt.planner.strategies.arena_lower_bound", lambda w, grads: max(w))
    sizes = [8] + [int(s) for s in rng.integers(2, 9, 40)] + [3]
    with pytest.raises(InfeasiblePlan, match="a lower bound") as info:
        plan(sizes, 20, strategy="fit(1KiB)")
    x, y = rng.random((100, 8)), np.eye(3)[rng.integers(0, 3, 100)]
    net, said = NetworkWithCheckpointing(sizes, strategy="plain"), set()
    for bound in range(info.value.minimum_bytes, info.value.minimum_bytes + 2**23, 2**14):
        try:
            net.SGD((x, y), 1, 20, 0.1, max_memory=bound, verbose=False)
            break
        except ValueError as exc:
            assert type(exc) is ValueError and str(exc).startswith(f"max_memory {bound}: "), exc
            said.add("more than" if "and a training step of more than" in str(exc) else "other")
    assert "more than" in said


def test_past_the_exact_least_s_depth_the_lower_bound_counts_the_gradients(rng, monkeypatch):
    """The lower bound named where the exact least is too long a search holds every gradient (every schedule
    writes them all before the update): it was the widest pair of states alone, about half the least of a
    1,450-layer net, and a fit of it was refused naming one byte more, again and again."""
    sizes = [8] + [int(s) for s in rng.integers(2, 9, 40)] + [3]
    with pytest.raises(InfeasiblePlan) as exact:
        plan(sizes, 20, strategy="fit(1KiB)")
    monkeypatch.setattr("fastckpt.planner.search.MAX_STEPS", 1000)
    with pytest.raises(InfeasiblePlan, match="a lower bound") as bound:
        plan(sizes, 20, strategy="fit(1KiB)")
    grads = plan(sizes, 20, strategy="plain").bytes()["gradients"]
    fixed = int(re.search(r"of which (\d+) \(", str(bound.value)).group(1))     # what no schedule removes
    assert fixed + grads <= bound.value.minimum_bytes <= exact.value.minimum_bytes


def test_a_run_bound_refused_names_the_least_run_that_is_taken(rng):
    """A bound one byte under the least that SGD(max_memory) takes is refused naming that least, in bytes (a
    plan keeping every activation was never tried, and the least named was a sum of parts that overlap:
    163 bytes over, or a rounded figure)."""
    from fastckpt import NetworkWithCheckpointing
    sizes = [20] + [3] * 60 + [3]
    x, y = rng.random((100, 20)), np.eye(3)[rng.integers(0, 3, 100)]

    def refused(bound):
        try:
            NetworkWithCheckpointing(sizes, strategy="plain").SGD((x, y), 1, 4, 0.01, verbose=False,
                                                                  max_memory=bound)
        except ValueError as exc:
            return str(exc)
        return None
    low, high = 10_000, 10_000_000
    while high - low > 1:
        low, high = (low, (low + high) // 2) if refused((low + high) // 2) is None else ((low + high) // 2, high)
    named = re.search(r"needs (?:at least )?(\d+) bytes", refused(high - 1) or "")
    assert named is not None and int(named.group(1)) == high, refused(high - 1)
