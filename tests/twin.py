"""Today's planner, frozen as the slow twin of the bounded search (fastckpt 0.4's ``search.py`` and its kernels).

Every sub-chain keeps its whole Pareto front (``multi_front``), ``revolve`` fills
its whole table: exact, and cubic in the depth.  ``tests/test_bounded.py`` holds
:func:`fastckpt.planner.bounded.least_flops` and ``revolve`` to these answers.
Compiled with Numba (cached beside this file) so that 60 layers take seconds.
"""
import numpy as np
from numba import njit

from fastckpt.planner.trees import suffix_sums

njit = njit(cache=True)


@njit
def region_table_of(w):
    """:func:`region_table` of int64 state bytes ``w``."""
    n = w.shape[0]
    table = np.zeros((n, n), dtype=np.int64)
    for s in range(n - 1):
        region = w[s + 1]
        table[s, s + 1] = region
        for i in range(s + 2, n):
            region = max(region, w[i - 1] + w[i])
            table[s, i] = region
    return table


@njit
def revolve_splits(prefix, w, regions, slots, unbounded, max_steps):
    """``(split, steps)``: ``split[d, s, t]`` of the least-(FLOPs, peak) trees, first split on ties, for
    depths 1 .. slots, and the inner steps taken.  Past ``max_steps`` it stops, incomplete.

    Depth ``d`` needs only depth ``d - 1``, so cost and peak roll over two
    layers.  ``unbounded`` fills one layer whose right children use it too.
    """
    n = w.shape[0]
    cost = np.full((2, n + 1, n + 1), np.inf)
    peak = np.zeros((2, n + 1, n + 1), dtype=np.int64)
    split = np.zeros((slots + 1, n + 1, n + 1), dtype=np.int32)
    steps = 0
    for s in range(n):
        cost[0, s, s + 1] = 0.0
        cost[1, s, s + 1] = 0.0
    for d in range(1, slots + 1):
        cur = d % 2
        prev = cur if unbounded else 1 - cur
        for length in range(2, n + 1):
            steps += (n - length + 1) * (length - 1)
            if steps > max_steps:
                return split, steps
            for s in range(n - length + 1):
                t = s + length
                best_c, best_p, best_i = np.inf, 0, 0
                for i in range(s + 1, t):
                    c = prefix[i] - prefix[s] + cost[prev, i, t] + cost[cur, s, i]
                    if c > best_c:
                        continue
                    p = max(regions[s, i], w[i] + peak[prev, i, t], peak[cur, s, i])
                    if c < best_c or p < best_p:
                        best_c, best_p, best_i = c, p, i
                cost[cur, s, t] = best_c
                peak[cur, s, t] = best_p
                split[d, s, t] = best_i
    return split, steps


@njit
def grow(a, size):
    """``a`` itself if it holds ``size`` rows, else a copy with room for twice as many."""
    if size <= a.shape[0]:
        return a
    out = np.empty((2 * size,) + a.shape[1:], dtype=a.dtype)
    out[:a.shape[0]] = a
    return out


@njit
def merge_front(a_ints, a_cost, na, b_ints, b_cost, nb, out_ints, out_cost):
    """The front of fronts ``a`` (earlier splits, first on ties) and ``b`` into ``out``; return its size.

    The same points as :func:`add_front` of all candidates: a point that an
    earlier one matches or beats in both peak and cost is never kept.
    """
    j = k = size = 0
    last = np.inf
    while j < na or k < nb:
        if k == nb or (j < na and (a_ints[j, 0] < b_ints[k, 0] or
                                   (a_ints[j, 0] == b_ints[k, 0] and a_cost[j] <= b_cost[k]))):
            row, c = a_ints, a_cost[j]
            at = j
            j += 1
        else:
            row, c = b_ints, b_cost[k]
            at = k
            k += 1
        if c < last:
            last = c
            for col in range(4):
                out_ints[size, col] = row[at, col]
            out_cost[size] = c
            size += 1
    return size


@njit
def multi_points(prefix, w, regions, after, cap, max_steps, max_points):
    """Every sub-chain's front as points: int rows (peak, split, right point, left point), costs,
    and ``start[s, t] .. stop[s, t]``, the points of steps ``s .. t-1``.

    ``after[t]`` bytes are added to the peak of every forward of a sub-chain
    ending at step ``t`` and to the leaf of step ``t`` (the gradients written
    by then; all zero for the activations' peak alone).  A sub-chain's front is
    merged split by split; a split is skipped when a point found already
    peaks at most its least peak for at most its least cost.  The last value
    returned counts the inner steps; past ``max_steps`` the search stops,
    incomplete, and past ``max_points`` points it stops and returns -1 steps.
    """
    n = w.shape[0]
    ints = np.full((max(1024, n + 1), 4), -1, dtype=np.int64)
    cost = np.zeros(ints.shape[0])
    size = n                                             # the leaves: no FLOPs, after[s] bytes
    start = np.zeros((n + 1, n + 1), dtype=np.int64)
    stop = np.zeros((n + 1, n + 1), dtype=np.int64)
    for s in range(n):
        ints[s, 0] = after[s]
        start[s, s + 1] = s
        stop[s, s + 1] = s + 1
    front_ints, front_cost = np.empty((64, 4), dtype=np.int64), np.empty(64)   # the sub-chain's front so far
    cand_ints, cand_cost = np.empty((64, 4), dtype=np.int64), np.empty(64)     # one split's points
    out_ints, out_cost = np.empty((64, 4), dtype=np.int64), np.empty(64)
    steps = 0
    for length in range(2, n + 1):
        for s in range(n - length + 1):
            if steps > max_steps:
                return ints[:size], cost[:size], start, stop, steps
            t = s + length
            nf = 0
            for i in range(s + 1, t):
                steps += 1 + nf
                region = regions[s, i] + after[t]
                if region > cap:
                    break                                # regions only widen with i
                rs, re, ls, le = start[i, t], stop[i, t], start[s, i], stop[s, i]
                if rs == re or ls == le:
                    continue
                wi, base = w[i], prefix[i] - prefix[s]
                floor = max(region, wi + ints[rs, 0], ints[ls, 0])
                least = base + cost[re - 1] + cost[le - 1]         # fronts' costs fall along them
                j = 0
                while j < nf and front_ints[j, 0] <= floor:
                    j += 1
                if floor > cap or (j > 0 and front_cost[j - 1] <= least):
                    continue
                # the cheapest right and left parts under each candidate peak, candidates rising
                r, k, next_r, next_k, last, m = rs, ls, rs, ls, -1, 0
                while next_r < re or next_k < le:
                    if next_k == le or (next_r < re and max(floor, wi + ints[next_r, 0])
                                        <= max(floor, ints[next_k, 0])):
                        p = max(floor, wi + ints[next_r, 0])
                        next_r += 1
                    else:
                        p = max(floor, ints[next_k, 0])
                        next_k += 1
                    if p == last:
                        continue
                    if p > cap:
                        break
                    last = p
                    while r + 1 < re and wi + ints[r + 1, 0] <= p:
                        r += 1
                    while k + 1 < le and ints[k + 1, 0] <= p:
                        k += 1
                    if m == cand_cost.shape[0]:
                        cand_ints, cand_cost = grow(cand_ints, m + 1), grow(cand_cost, m + 1)
                    cand_ints[m, 0], cand_ints[m, 1], cand_ints[m, 2], cand_ints[m, 3] = p, i, r, k
                    cand_cost[m] = base + cost[r] + cost[k]
                    m += 1
                steps += m
                if nf + m > out_cost.shape[0]:
                    out_ints, out_cost = grow(out_ints, nf + m), grow(out_cost, nf + m)
                nf_new = merge_front(front_ints, front_cost, nf, cand_ints, cand_cost, m, out_ints, out_cost)
                front_ints, out_ints = out_ints, front_ints
                front_cost, out_cost = out_cost, front_cost
                nf = nf_new
            start[s, t] = size
            ints = grow(ints, size + nf)
            cost = grow(cost, size + nf)
            ints[size:size + nf] = front_ints[:nf]
            cost[size:size + nf] = front_cost[:nf]
            size += nf
            stop[s, t] = size
            if size > max_points:
                return ints[:size], cost[:size], start, stop, -1
    return ints[:size], cost[:size], start, stop, steps


def _inputs(flops, w):
    prefix = np.concatenate([[0.0], np.cumsum(flops)])
    w = np.asarray(w, dtype=np.int64)
    return prefix, w, region_table_of(w)


def _build(root, children):
    built, stack = {}, [root]
    while stack:
        key = stack[-1]
        kids = children(key)
        if kids is None:
            built[key] = None
            stack.pop()
            continue
        i, right, left = kids
        missing = [k for k in (right, left) if k not in built]
        if missing:
            stack.extend(missing)
            continue
        built[key] = (i, built[right], built[left])
        stack.pop()
    return built[root]


def revolve_tree(flops, w, slots):
    """Least-FLOPs tree with stack depth <= slots, ties broken by peak bytes."""
    n = len(w)
    unbounded = slots >= n - 1
    depth = 1 if unbounded else slots
    prefix, w, regions = _inputs(flops, w)
    split, _ = revolve_splits(prefix, w, regions, depth, unbounded, 10**18)

    def children(key):
        s, t, d = key
        if t == s + 1:
            return None
        i = int(split[d, s, t])
        return i, (i, t, d if unbounded else d - 1), (s, i, d)
    return _build((0, n, 1 if unbounded else slots), children)


def multi_front(flops, w, limit, grads=None):
    """``(peaks, costs, tree(k))`` of the whole chain's front, points above ``limit`` dropped."""
    n = len(w)
    prefix, w, regions = _inputs(flops, w)
    cap = 2**62 if limit is None else min(limit, 2**62)
    after = np.array(suffix_sums(grads or [0] * (len(w) - 1)), dtype=np.int64)
    ints, cost, start, stop, _ = multi_points(prefix, w, regions, after, cap, 10**18, 10**12)
    first, end = start[0, n], stop[0, n]

    def tree(k):
        def children(g):
            i = int(ints[g, 1])
            return None if i < 0 else (i, int(ints[g, 2]), int(ints[g, 3]))
        return _build(first + k, children)
    return ints[first:end, 0].tolist(), cost[first:end].tolist(), tree
