"""The compiled planner: the old pure-Python DPs' answers on medium chains, slots capped, bounded memory.

``_Old`` is the planner before it was compiled (fastckpt 0.1.0, ``search.py``),
kept here verbatim in substance as the slow reference.
"""
import json
import math
import os
import re
import subprocess
import sys
from array import array

import exhaustive
import numpy as np
import pytest

import fastckpt
from fastckpt.planner.costs import forward_flops, state_bytes
from fastckpt.planner.search import (
    arena_lower_bound,
    least_peak,
    multi_front,
    once_front,
    region_table,
    revolve_tree,
)
from fastckpt.planner.strategies import Budget, Revolve
from fastckpt.planner.trees import keep_all, walk


class _Old:
    """The pure-Python DPs this module's searches replaced."""

    @staticmethod
    def regions(w):
        n = len(w)
        table = [[0] * n for _ in range(n)]
        for s in range(n - 1):
            region = w[s + 1]
            table[s][s + 1] = region
            for i in range(s + 2, n):
                region = max(region, w[i - 1] + w[i])
                table[s][i] = region
        return table

    @staticmethod
    def build(root, children):
        def rec(key):
            kids = children(key)
            return None if kids is None else (kids[0], rec(kids[1]), rec(kids[2]))
        return rec(root)

    @staticmethod
    def revolve(flops, w, slots):
        n = len(flops) + 1
        prefix = [0.0] + np.cumsum(flops).tolist()
        regions = _Old.regions(w)
        cost = [[[math.inf] * (slots + 1) for _ in range(n + 1)] for _ in range(n + 1)]
        peak = [[[0] * (slots + 1) for _ in range(n + 1)] for _ in range(n + 1)]
        split = [[[0] * (slots + 1) for _ in range(n + 1)] for _ in range(n + 1)]
        for s in range(n):
            cost[s][s + 1] = [0.0] * (slots + 1)
        for length in range(2, n + 1):
            for s in range(0, n - length + 1):
                t = s + length
                for d in range(1, slots + 1):
                    best = (math.inf, 0, 0)
                    for i in range(s + 1, t):
                        c = prefix[i] - prefix[s] + cost[i][t][d - 1] + cost[s][i][d]
                        if c > best[0]:
                            continue
                        p = max(regions[s][i], w[i] + peak[i][t][d - 1], peak[s][i][d])
                        if (c, p) < best[:2]:
                            best = (c, p, i)
                    cost[s][t][d], peak[s][t][d], split[s][t][d] = best
        return _Old.build((0, n, slots), lambda k: None if k[1] == k[0] + 1 else
                          (split[k[0]][k[1]][k[2]], (split[k[0]][k[1]][k[2]], k[1], k[2] - 1),
                           (k[0], split[k[0]][k[1]][k[2]], k[2])))

    @staticmethod
    def add_front(pts, points):
        start = len(pts[0])
        points.sort(key=lambda p: (p[0], p[1]))
        last = math.inf
        for point in points:
            if point[1] < last:
                last = point[1]
                for column, value in zip(pts, point):
                    column.append(value)
        return start, len(pts[0])

    @staticmethod
    def front(pts, start, stop, tree):
        return list(pts[0][start:stop]), list(pts[1][start:stop]), [tree(k) for k in range(stop - start)]

    @staticmethod
    def multi(flops, w, limit):
        n = len(flops) + 1
        prefix = [0.0] + np.cumsum(flops).tolist()
        cap = math.inf if limit is None else limit
        regions = _Old.regions(w)
        pts = (array("q"), array("d"), array("q"), array("q"), array("q"))   # peak, cost, split, right, left
        leaf = _Old.add_front(pts, [(0, 0.0, -1, -1, -1)])
        ranges = {(s, s + 1): leaf for s in range(n)}
        for length in range(2, n + 1):
            for s in range(0, n - length + 1):
                t = s + length
                points = []
                for i in range(s + 1, t):
                    region = regions[s][i]
                    if region > cap:
                        break
                    (rs, re), (ls, le) = ranges[i, t], ranges[s, i]
                    if rs == re or ls == le:
                        continue
                    peak, cost, wi = pts[0], pts[1], w[i]
                    floor = max(region, wi + peak[rs], peak[ls])
                    candidates = {max(floor, wi + peak[r]) for r in range(rs, re)}
                    candidates.update(max(floor, peak[k]) for k in range(ls, le))
                    r, k = rs, ls
                    for p in sorted(candidates):
                        if p > cap:
                            break
                        while r + 1 < re and wi + peak[r + 1] <= p:
                            r += 1
                        while k + 1 < le and peak[k + 1] <= p:
                            k += 1
                        points.append((p, prefix[i] - prefix[s] + cost[r] + cost[k], i, r, k))
                ranges[s, t] = _Old.add_front(pts, points)
        start, stop = ranges[0, n]
        return _Old.front(pts, start, stop, lambda k: _Old.build(
            start + k, lambda g: None if pts[2][g] < 0 else (pts[2][g], pts[3][g], pts[4][g])))

    @staticmethod
    def once(flops, w, limit):
        n_layers = len(flops)
        prefix = [0.0] + np.cumsum(flops).tolist()
        cap = math.inf if limit is None else limit
        regions = _Old.regions(w)
        pts = (array("q"), array("d"), array("q"), array("q"), array("q"))
        ranges = {n_layers: _Old.add_front(pts, [(0, prefix[-1], -1, -1, -1)])}
        for s in range(n_layers - 1, -1, -1):
            points = []
            kept_inside = 0
            for i in range(s + 1, n_layers + 1):
                if i > s + 1:
                    kept_inside += w[i - 1]
                floor = max(regions[s][i], kept_inside)
                if floor > cap:
                    break
                recompute = prefix[i - 1] - prefix[s] if i > s + 1 else 0.0
                start, stop = ranges[i]
                for g in range(start, stop):
                    p = max(floor, w[i] + pts[0][g])
                    if p <= cap:
                        points.append((p, pts[1][g] + recompute, i, g, s))
            ranges[s] = _Old.add_front(pts, points)
        start, stop = ranges[0]

        def tree(k):
            nodes, g = [], start + k
            while pts[2][g] >= 0:
                nodes.append((pts[4][g], pts[2][g]))
                g = pts[3][g]
            t = keep_all(nodes[-1][1], n_layers + 1) if nodes else keep_all(0, n_layers + 1)
            for s, i in reversed(nodes):
                t = (i, t, keep_all(s, i))
            return t
        return _Old.front(pts, start, stop, tree)


def _medium_chain(rng, low, high):
    """Random widths (some runs of equal ones, which make ties) at a random batch and itemsize."""
    n_layers = int(rng.integers(low, high + 1))
    sizes = [int(s) for s in rng.integers(1, 300, size=n_layers + 1)]
    for j in rng.integers(0, n_layers, size=n_layers // 2):
        sizes[j + 1] = sizes[j]
    batch, item = int(rng.integers(1, 65)), int(rng.choice([4, 8]))
    return sizes, list(forward_flops(sizes, batch)), state_bytes(sizes, batch, item)


def _new_front(search, flops, w, limit):
    front = search(flops, w, limit)
    return front.peaks, front.costs, [front.tree(k) for k in range(len(front.peaks))]


def test_revolve_trees_are_the_old_ones_on_medium_chains(rng):
    for _ in range(12):
        sizes, flops, w = _medium_chain(rng, 8, 24)
        n_layers = len(flops)
        for slots in sorted({1, 2, 3, 5, n_layers - 1, n_layers} - {0}):
            assert revolve_tree(flops, w, slots) == _Old.revolve(flops, w, slots), (sizes, slots)


@pytest.mark.slow
def test_budget_fronts_are_the_old_ones_on_medium_chains(rng):
    for _ in range(12):
        sizes, flops, w = _medium_chain(rng, 8, 24)
        peaks = _Old.multi(flops, w, None)[0]
        for limit in (None, peaks[0] - 1, peaks[0], peaks[len(peaks) // 3], peaks[len(peaks) // 2] + 1):
            assert _new_front(multi_front, flops, w, limit) == _Old.multi(flops, w, limit), (sizes, limit)
        assert least_peak(multi_front, flops, w) == peaks[0]


@pytest.mark.slow
def test_once_fronts_are_the_old_ones_on_medium_chains(rng):
    for _ in range(15):
        sizes, flops, w = _medium_chain(rng, 10, 60)
        peaks = _Old.once(flops, w, None)[0]
        for limit in (None, peaks[0] - 1, peaks[0], peaks[len(peaks) // 2] + 1):
            assert _new_front(once_front, flops, w, limit) == _Old.once(flops, w, limit), (sizes, limit)
        assert least_peak(once_front, flops, w) == peaks[0]


def test_the_least_arena_is_the_first_point_of_the_front_with_gradients(rng):
    """least_peak with gradients (a min-max table) against the Pareto search's least point, on random chains
    with gradients of random sizes, and against every tree on small ones."""
    for trial in range(40):
        sizes, flops, w = _medium_chain(rng, 1, 6 if trial < 20 else 20)
        grads = [int(g) for g in rng.integers(0, 3 * max(w), size=len(flops))]
        least = least_peak(multi_front, flops, w, grads)
        assert least == multi_front(flops, w, None, grads).peaks[0], (sizes, grads)
        assert arena_lower_bound(w, grads) <= least
        if trial < 20:
            n_layers = len(flops)
            assert least == min(walk(t, n_layers, w, grads)[5] for t in exhaustive.all_trees(0, n_layers + 1))


def test_region_table_is_the_old_one(rng):
    _, _, w = _medium_chain(rng, 1, 30)
    assert region_table(w).tolist() == _Old.regions(w)


def test_slots_beyond_the_layers_are_the_unbounded_search():
    """A chain of L layers never holds more than L states: revolve(L) is revolve(anything larger)."""
    sizes = [784] + [256] * 12 + [10]                  # 13 layers
    flops, w = list(forward_flops(sizes, 32)), state_bytes(sizes, 32, 8)
    assert revolve_tree(flops, w, 13) == revolve_tree(flops, w, 10**18) == keep_all(0, 14)
    assert revolve_tree(flops, w, 12) != keep_all(0, 14)
    assert fastckpt.plan(sizes, 32, strategy=Revolve(10**30)).tree == keep_all(0, 14)


@pytest.mark.memory
def test_a_thousand_layers_plan_within_the_stated_memory():
    """NOTE [ Planning bounds ] in fastckpt/search.py: revolve(d >= L) needs about 48 (L + 2)^2 bytes."""
    from fastckpt.report.measure import memray_peak
    sizes = [784] + [256] * 1000 + [10]
    Revolve(10**9).tree([8, 8, 8], 1, 8)                 # compile or load the DP before measuring
    peak = memray_peak(lambda: Revolve(10**9).tree(sizes, 2048, 8))
    assert peak <= 48 * 1003**2 + 2**20


def test_huge_budgets_and_slots_are_no_error():
    sizes = [5] * 9
    assert Budget(10**30).tree(sizes, 4, 8) == Budget(10**30, "once").tree(sizes, 4, 8) == keep_all(0, 9)
    assert Revolve(2**80).tree(sizes, 4, 8) == keep_all(0, 9)


def test_the_searches_give_the_same_answers_without_the_jit(rng):
    """Under NUMBA_DISABLE_JIT=1 the compiled loops run as Python: slow, never wrong."""
    sizes, flops, w = _medium_chain(rng, 6, 9)
    code = ("import sys, fastckpt.planner.search as s; f, w = eval(sys.argv[1]), eval(sys.argv[2]); "
            "m, o = s.multi_front(f, w, None), s.once_front(f, w, None); "
            "print(repr((s.revolve_tree(f, w, 2), m.peaks, m.costs, m.tree(0), o.peaks, o.costs, o.tree(0))))")
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    out = subprocess.run([sys.executable, "-c", code, repr([float(f) for f in flops]), repr(w)],
                         capture_output=True, text=True, env=env, check=True).stdout
    m, o = multi_front(flops, w, None), once_front(flops, w, None)
    assert eval(out) == (revolve_tree(flops, w, 2), m.peaks, m.costs, m.tree(0), o.peaks, o.costs, o.tree(0))


def test_a_search_past_its_step_limit_stops_and_says_what_to_do_instead(monkeypatch):
    import fastckpt.planner.bounded as bounded
    import fastckpt.planner.search as search
    monkeypatch.setattr(search, "MAX_STEPS", 1000)
    monkeypatch.setattr(bounded, "MAX_STEPS", 10)
    monkeypatch.setattr(bounded, "BEAM_STEPS", 10)
    sizes = [20] + [16] * 40 + [4]
    for strategy, batch in (("revolve(3)", 8), ("budget(16KiB)", 8), ("budget(16KiB, once)", 8), ("fit(300KiB)", 64)):
        with pytest.raises(search.PlanTooCostly, match=r"^" + re.escape(strategy) + r": planning .* over 41 layers "
                           r"(takes more than 1e\+03|found no schedule within 1e\+01) steps .*use "
                           r"every_nth\(n\), segments\(k\) or sqrt"):
            fastckpt.plan(sizes, batch, strategy=strategy)
    assert fastckpt.plan(sizes, 8, strategy="sqrt").recompute_factor > 1               # linear strategies go on


def test_a_budget_past_its_exact_search_keeps_the_first_tree_and_its_certificate(monkeypatch):
    """The exact search stops at its steps; the beam's tree is the plan, with the knapsack bound beside it."""
    import fastckpt.planner.bounded as bounded
    sizes = [20] + [16] * 40 + [4]
    exact = fastckpt.plan(sizes, 8, strategy="budget(16KiB)")
    monkeypatch.setattr(bounded, "MAX_STEPS", 10)
    first = fastckpt.plan(sizes, 8, strategy="budget(16KiB)")
    assert exact.optimality_gap == 0 and "optimal" in exact.describe()
    assert first.least_recompute <= exact.recompute_flops <= first.recompute_flops
    assert first.bytes()["activation_memory"] <= 16 * 1024
    gap = first.optimality_gap
    assert gap == 0 or f"within {100 * gap:.2g}% of optimal" in first.describe()


@pytest.mark.memory
def test_a_search_whose_tables_cannot_fit_is_refused_before_it_allocates():
    from fastckpt.report.measure import memray_peak
    sizes = [784] + [256] * 100_000 + [10]

    def refused():
        with pytest.raises(fastckpt.planner.PlanTooCostly, match=r"revolve\(4\): planning revolve\(4\) over 100001 "
                           r"layers needs 5\d\d\.\d\d GiB of tables, more than half the"):
            fastckpt.plan(sizes, 100, strategy="revolve(4)")
    assert memray_peak(refused) < 200 * len(sizes)                  # O(L) costs per layer, no table
    plain = memray_peak(lambda: fastckpt.plan(sizes, 100))          # O(L): the op list, offsets and counts
    assert plain < 1000 * len(sizes)


@pytest.mark.slow
def test_analyze_at_3000_layers_refuses_the_searches_it_cannot_finish_and_goes_on():
    proc = subprocess.run([sys.executable, "-m", "fastckpt", "analyze", "--depths", "3000", "--measure", "1",
                           "--strategies", "plain,sqrt,revolve(4)", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    row = got["rows"][0]
    assert row["plain"]["total"] > 0 and row["sqrt"]["total"] > 0 and row["revolve(4)"] is None
    assert "takes more than" in row["refused"]["revolve(4)"] and "takes more than" in got["tradeoff_skipped"]
