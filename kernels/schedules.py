"""Compiled loops of the checkpoint planner's dynamic programs (:mod:`fastckpt.planner.search` decides).

Cost, peak and Pareto-front tables over sub-chains of a chain of layers, on
int64 byte counts and float64 FLOP prefix sums.  Unlike the step kernels,
these size and grow their own tables: they run once per plan, not per step.
No ``fastmath``: ties between equal costs must stay ties, so the trees do not
depend on the CPU.
"""
import numpy as np

from ._jit import kernel


@kernel
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


@kernel
def least_arena(w, after, max_steps):
    """The least arena peak of any schedule tree over reverse steps ``0 .. n-1`` (``n = len(w)``), gradients
    included (``after[t]``: their bytes once step ``t`` is done), or -1 past ``max_steps`` inner steps.

    A tree's arena is a maximum over its split and its two subtrees, which are chosen apart, so the least of
    the whole is the least over splits of the maxima of the least subtrees: one table, no fronts.
    """
    n = w.shape[0]
    if (n + 1) ** 3 // 6 > max_steps:
        return -1
    least = np.zeros((n + 1, n + 1), dtype=np.int64)
    for s in range(n):
        least[s, s + 1] = after[s]
    for length in range(2, n + 1):
        for s in range(n - length + 1):
            t = s + length
            best = 1 << 62                                # above any peak
            region = w[s + 1]
            for i in range(s + 1, t):
                if i > s + 1:
                    region = max(region, w[i - 1] + w[i])
                p = max(region + after[t], w[i] + least[i, t], least[s, i])
                if p < best:
                    best = p
            least[s, t] = best
    return least[0, n]


@kernel
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


@kernel
def grow(a, size):
    """``a`` itself if it holds ``size`` rows, else a copy with room for twice as many."""
    if size <= a.shape[0]:
        return a
    out = np.empty((2 * size,) + a.shape[1:], dtype=a.dtype)
    out[:a.shape[0]] = a
    return out


@kernel
def add_front(cand_ints, cand_cost, m, ints, cost, size):
    """Append the Pareto-optimal ones of the ``m`` candidates to the points; return (ints, cost, size).

    Candidates are rows (peak, split, right, left) and their costs; sorted
    stably by (peak, cost), a point is kept when it costs less than every one
    before it, so of equal points the first candidate wins.
    """
    order = np.argsort(cand_cost[:m], kind="mergesort")
    order = order[np.argsort(cand_ints[:m, 0][order], kind="mergesort")]
    last = np.inf
    for j in order:
        if cand_cost[j] < last:
            last = cand_cost[j]
            ints = grow(ints, size + 1)
            cost = grow(cost, size + 1)
            ints[size] = cand_ints[j]
            cost[size] = last
            size += 1
    return ints, cost, size


@kernel
def once_points(prefix, w, regions, cap, max_steps, max_points):
    """The fronts of the spines from each ``a[s]``: int rows (peak, split, next point, ``s``), costs, and
    each spine's range ``start[s] .. stop[s]``; the inner steps; and at most the bytes of its arrays alive at
    once (they only grow, each to twice what it needs, the old copy freed once copied).  Past ``max_steps`` it
    stops, incomplete, past ``max_points`` with -1 steps."""
    n_layers = w.shape[0] - 1
    ints = np.full((1024, 4), -1, dtype=np.int64)
    cost = np.zeros(1024)
    ints[0, 0] = 0                                       # a[L] reached: the last segment, kept, is done
    cost[0] = prefix[n_layers]
    size = 1
    start = np.zeros(n_layers + 1, dtype=np.int64)
    stop = np.zeros(n_layers + 1, dtype=np.int64)
    stop[n_layers] = 1
    cand_ints = np.empty((1024, 4), dtype=np.int64)
    cand_cost = np.empty(1024)
    steps = 0
    for s in range(n_layers - 1, -1, -1):
        if steps > max_steps:
            return ints[:size], cost[:size], start, stop, steps, once_held(ints, cand_ints, start)
        m = 0
        kept_inside = 0                                  # bytes of a[s+1 .. i-1]
        for i in range(s + 1, n_layers + 1):
            if i > s + 1:
                kept_inside += w[i - 1]
            floor = max(regions[s, i], kept_inside)
            if floor > cap:
                break
            recompute = prefix[i - 1] - prefix[s] if i > s + 1 else 0.0
            steps += 1 + stop[i] - start[i]
            for g in range(start[i], stop[i]):
                p = max(floor, w[i] + ints[g, 0])
                if p <= cap:
                    cand_ints = grow(cand_ints, m + 1)
                    cand_cost = grow(cand_cost, m + 1)
                    cand_ints[m, 0], cand_ints[m, 1], cand_ints[m, 2], cand_ints[m, 3] = p, i, g, s
                    cand_cost[m] = cost[g] + recompute
                    m += 1
        start[s] = size
        steps += m * 16                                  # add_front sorts the candidates
        ints, cost, size = add_front(cand_ints, cand_cost, m, ints, cost, size)
        stop[s] = size
        if size > max_points:
            return ints[:size], cost[:size], start, stop, -1, once_held(ints, cand_ints, start)
    return ints[:size], cost[:size], start, stop, steps, once_held(ints, cand_ints, start)


@kernel
def once_held(ints, cand_ints, start):
    """:func:`once_points`' arrays at their largest: points and candidates (four int64 and a cost a row), the
    spines' ranges, and the old copy of the larger of the two while it grew."""
    points, cands = 40 * ints.shape[0], 40 * cand_ints.shape[0]
    return points + cands + 16 * start.shape[0] + max(points, cands) // 2
