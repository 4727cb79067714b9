"""The byte-exact planner at depth: ``budget`` and ``fit`` on chains of 100 to 10,000 layers.

    python benchmarks/planner_depth.py [--depths 100,300,1000,3000,10000] [--twin-max 100] [--rotor-max 300]
                                       [--slots 500] [--seeds 1] [--equal-max 1000]

Chains: heterogeneous widths drawn uniformly from 32..1024 (``--seeds`` chains per depth), and equal widths
of 256 up to ``--equal-max`` layers (their tight budgets take minutes past it); batch 256, float64.
Budgets at 5%, 25% and 60% of the way from the least activation memory any
schedule needs (the widest pair of neighbouring states) to plain's.  For each:

* ``budget``: :func:`fastckpt.planner.bounded.least_flops` (the planner): seconds, the recompute FLOPs found,
  the exact peak of its tree, and the certified gap (0: optimal);
* the slow twin (``tests/twin.py``: every sub-chain's whole Pareto front, the planner before the bounded
  search), up to ``--twin-max`` layers: seconds and its optimum, which the planner must equal;
* a rotor-style slotted DP (Beaumont et al., "Optimal checkpointing for heterogeneous chains", 2019,
  written from the paper's recurrence for fastckpt's chain model): the budget in ``--slots`` slots, every
  state's bytes rounded up to whole slots, ``C[s, t, m] = min_i f(s..i) + C[i, t, m - w_i] + C[s, i, m]``;
  optimal only to the slot, O(S L^3) steps and S L^2 costs in memory, so up to ``--rotor-max`` layers;
* ``fit``: ``fastckpt.plan(..., strategy=fit(bytes), optimizer_in_backward=True)`` with the bytes at the same
  three points between the least whole step any schedule needs and plain's: seconds and the recompute factor.

Prints the CPU, AVX-512 or not, the versions, the date and the command above the table.
"""
import argparse
import datetime
import os
import resource
import sys
import time

import numpy as np
from fastckpt.kernels import region_table_of
from numba import njit

HERE = os.path.dirname(os.path.abspath(__file__))
FRACTIONS = (0.05, 0.25, 0.60)
BATCH, ITEM = 256, 8


@njit(cache=True)
def slotted_dp(prefix, w_slots, region_slots, slots):
    """Rotor's recurrence over ``slots`` memory slots: the least FLOPs of sub-chain ``0..n`` whose peak (in
    slots, every size rounded up) fits; inf when none does."""
    n = w_slots.shape[0]
    cost = np.full((n + 1, n + 1, slots + 1), np.inf)
    for s in range(n):
        cost[s, s + 1, :] = 0.0
    for length in range(2, n + 1):
        for s in range(n - length + 1):
            t = s + length
            for i in range(s + 1, t):
                region = region_slots[s, i]
                if region > slots:
                    break
                base = prefix[i] - prefix[s]
                wi = w_slots[i]
                for m in range(max(region, wi), slots + 1):
                    c = base + cost[i, t, m - wi] + cost[s, i, m]
                    if c < cost[s, t, m]:
                        cost[s, t, m] = c
    return cost[0, n, slots]


def rotor(flops, w, limit, slots):
    """The slotted DP's least FLOPs under ``limit`` bytes (peaks as the planner counts them: ``a[0]``, the
    input, is not in the workspace)."""
    q = limit / slots
    w_slots = np.array([int(np.ceil(v / q)) for v in w], dtype=np.int64)
    regions = region_table_of(w_slots)                     # the planner's own table, in slots
    prefix = np.concatenate([[0.0], np.cumsum(flops)])
    return slotted_dp(prefix, w_slots, regions, slots)


def chains(depth, seeds, equal_max):
    rng = np.random.default_rng(depth)
    for seed in range(seeds):
        yield f"32..1024 #{seed}", [784] + [int(s) for s in rng.integers(32, 1025, size=depth)] + [10]
    if depth <= equal_max:
        yield "equal 256", [784] + [256] * depth + [10]


def timed(fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t, out


def warm_up(fastckpt, least_flops):
    """Compile or load every kernel the timed calls run: searches whose keep-all does not fit."""
    assert least_flops([1.0] * 4, [8, 16, 8, 16, 8], 40).cost > 4.0              # a tree that recomputes
    sizes = [784] + [256] * 8 + [10]
    try:
        fastckpt.plan(sizes, BATCH, strategy="fit(1)", optimizer_in_backward=True)
    except fastckpt.InfeasiblePlan as exc:
        fastckpt.plan(sizes, BATCH, strategy=f"fit({int(1.05 * exc.minimum_bytes)})", optimizer_in_backward=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", default="100,300,1000,3000,10000")
    p.add_argument("--twin-max", type=int, default=100)
    p.add_argument("--rotor-max", type=int, default=300)
    p.add_argument("--slots", type=int, default=500)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--equal-max", type=int, default=1000)
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import twin

    import fastckpt
    from fastckpt.planner import InfeasiblePlan
    from fastckpt.planner.bounded import least_flops
    from fastckpt.planner.costs import forward_flops, state_bytes
    from fastckpt.report.machine import cpu_summary
    print(f"{cpu_summary()}; fastckpt {fastckpt.__version__}, numpy {np.__version__}; {datetime.date.today()}; "
          f"command: python benchmarks/planner_depth.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    warm_up(fastckpt, least_flops)
    rotor(np.ones(3), [8, 8, 8, 8], 32, 4)
    twin.multi_front([1.0, 1.0], [8, 8, 8], None)
    print("| layers | chain | at | budget s | recompute (GFLOP) | peak / limit | gap | twin s | rotor s "
          "| rotor recompute / budget's | fit s | fit recompute factor |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for depth in (int(d) for d in args.depths.split(",")):
        for name, sizes in chains(depth, args.seeds, args.equal_max):
            flops, w = list(forward_flops(sizes, BATCH)), state_bytes(sizes, BATCH, ITEM)
            one_pass = sum(flops)
            widest = max(w[1:] + [a + b for a, b in zip(w[1:-1], w[2:])])
            whole = fastckpt.plan(sizes, BATCH, optimizer_in_backward=True).bytes()["total"]
            try:
                fastckpt.plan(sizes, BATCH, strategy="fit(1)", optimizer_in_backward=True)
            except InfeasiblePlan as exc:
                least = exc.minimum_bytes
            for frac in FRACTIONS:
                limit = int(widest + frac * (sum(w) - widest))
                seconds, found = timed(least_flops, flops, w, limit)
                recompute = found.cost - one_pass
                gap = (found.cost - found.lower) / found.cost
                twin_s = rotor_s = rotor_ratio = "-"
                if depth <= args.twin_max:
                    twin_s, front = timed(twin.multi_front, flops, w, limit)
                    best = min(front[1])
                    assert abs(best - found.cost) <= 1e-12 * best, (depth, name, frac, best, found.cost)
                    twin_s = f"{twin_s:.2f}"
                if depth <= args.rotor_max:
                    rotor_s, got = timed(rotor, np.asarray(flops), w, limit, args.slots)
                    rotor_ratio = f"{(got - one_pass) / recompute:.4f}" if recompute > 0 else f"{got - one_pass:.3g}"
                    rotor_s = f"{rotor_s:.2f}"
                nbytes = int(least + frac * (whole - least))
                fit_s, planned = timed(fastckpt.plan, sizes, BATCH, strategy=f"fit({nbytes})",
                                       optimizer_in_backward=True)
                print(f"| {depth} | {name} | {int(100 * frac)}% | {seconds:.2f} | {recompute / 1e9:.1f} | "
                      f"{found.peak / limit:.4f} | {gap:.2g} | {twin_s} | {rotor_s} | {rotor_ratio} | {fit_s:.2f} | "
                      f"{planned.recompute_factor:.3f} |", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"the process's peak resident memory: {peak:.2f} GiB")


if __name__ == "__main__":
    main()
