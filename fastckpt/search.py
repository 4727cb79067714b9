"""Dynamic programs over schedule trees (see :mod:`fastckpt.trees`).

.. math::

    C(s, t) = \\min_{s < i < t} \\; F(s, i) + C(i, t) + C(s, i), \\qquad C(s, s + 1) = 0

``F(s, i)`` is the forward FLOPs of layers ``s .. i-1``; ``C(i, t)`` runs with
``a[i]`` held on top of the stack and ``C(s, i)`` after it is dropped.  The
peak of a split is ``max(R(s, i), w[i] + P(i, t), P(s, i))`` above the stack,
with ``R`` the forward region.  ``revolve_tree`` bounds the stack depth;
``multi_front`` and ``once_front`` keep for every sub-chain the Pareto front of
(exact peak bytes, FLOPs), so a byte budget needs no discretisation.

The trees are the persistent schedules: a kept activation stays until its
layer is reversed, as in revolve.  Tables are flat arrays of numbers, and the
winning tree is built only at the end, so planning leaves no garbage behind
in Python's allocator that would blur a measured peak.

NOTE [ Planning bounds ]
The tables are filled by Numba-compiled loops (plain Python, same answers,
under ``NUMBA_DISABLE_JIT=1``).  With ``n = L + 1`` reverse steps:

* ``revolve_tree`` with ``d < L`` slots: about ``d n^3 / 6`` inner steps and
  ``(40 + 4 (d + 1)) n^2`` bytes.  A sub-chain of ``m`` steps never holds more
  than ``m - 1`` states, so ``d >= L`` slots is the unbounded search:
  ``n^3 / 6`` steps and ``48 n^2`` bytes, whatever ``d`` is.
* ``multi_front``: at most ``K n^3 / 3`` steps and ``24 n^2 + 80 N`` bytes, where
  ``K`` is the largest front below the limit and ``N`` the points of all
  fronts (at most ``K n^2 / 2``).  Every point of a front has its own peak, a
  sum of state sizes below the limit, so ``K`` grows with the budget.
* ``once_front``: about ``K n^2 / 2`` steps and ``8 n^2 + 80 N`` bytes, ``N <= K n``.

docs/planning.md has measurements.
"""
import math

import numba
import numpy as np

from .trees import keep_all

_jit = numba.njit(cache=True, nogil=True)   # no fastmath: ties between equal costs must stay ties
_NO_LIMIT = 2**62                            # bytes above any peak


def region_table(w):
    """``R[s, i]``: bytes above the stack while forwarding a[s] -> a[i] (the largest live pair)."""
    return _regions(np.asarray(w, dtype=np.int64))


@_jit
def _regions(w):
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


def _inputs(flops, w):
    """Prefix sums of ``flops``, int64 ``w`` and the region table, as the compiled searches take them."""
    prefix = np.concatenate([[0.0], np.cumsum(flops)])
    w = np.asarray(w, dtype=np.int64)
    return prefix, w, _regions(w)


def _build(root, children):
    """A nested-tuple tree from ``children(key) -> None | (i, right_key, left_key)``, without recursion."""
    built = {}
    stack = [root]
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
    prefix, w, regions = _inputs(flops, w)
    n = len(w)                                           # reverse steps 0 .. L
    unbounded = slots >= n - 1                           # no tree of n steps holds more than n - 1 states
    split = _revolve_splits(prefix, w, regions, 1 if unbounded else slots, unbounded)

    def children(key):
        s, t, d = key
        if t == s + 1:
            return None
        i = int(split[d, s, t])
        return i, (i, t, d if unbounded else d - 1), (s, i, d)
    return _build((0, n, 1 if unbounded else slots), children)


@_jit
def _revolve_splits(prefix, w, regions, slots, unbounded):
    """``split[d, s, t]`` of the least-(FLOPs, peak) trees, first split on ties, for depths 1 .. slots.

    Depth ``d`` needs only depth ``d - 1``, so cost and peak roll over two
    layers.  ``unbounded`` fills one layer whose right children use it too.
    """
    n = w.shape[0]
    cost = np.full((2, n + 1, n + 1), np.inf)
    peak = np.zeros((2, n + 1, n + 1), dtype=np.int64)
    split = np.zeros((slots + 1, n + 1, n + 1), dtype=np.int32)
    for s in range(n):
        cost[0, s, s + 1] = 0.0
        cost[1, s, s + 1] = 0.0
    for d in range(1, slots + 1):
        cur = d % 2
        prev = cur if unbounded else 1 - cur
        for length in range(2, n + 1):
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
    return split


class Front:
    """Pareto front of one chain: ``peaks`` (bytes) rising, ``costs`` (FLOPs) falling, and their trees."""

    def __init__(self, peaks, costs, tree):
        self.peaks, self.costs, self._tree = peaks, costs, tree

    def tree(self, k):
        """The schedule tree of point ``k``."""
        return self._tree(k)


@_jit
def _grow(a, size):
    """``a`` itself if it holds ``size`` rows, else a copy with room for twice as many."""
    if size <= a.shape[0]:
        return a
    out = np.empty((2 * size,) + a.shape[1:], dtype=a.dtype)
    out[:a.shape[0]] = a
    return out


@_jit
def _add_front(cand_ints, cand_cost, m, ints, cost, size):
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
            ints = _grow(ints, size + 1)
            cost = _grow(cost, size + 1)
            ints[size] = cand_ints[j]
            cost[size] = last
            size += 1
    return ints, cost, size


@_jit
def _merge_front(a_ints, a_cost, na, b_ints, b_cost, nb, out_ints, out_cost):
    """The front of fronts ``a`` (earlier splits, first on ties) and ``b`` into ``out``; return its size.

    The same points as :func:`_add_front` of all candidates: a point that an
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


def multi_front(flops, w, limit):
    """Front over all trees of the whole chain; points above ``limit`` bytes (if given) are dropped.

    Peaks only grow going up a tree, so a point dropped for exceeding the limit
    could never be part of a tree that fits it.
    """
    prefix, w, regions = _inputs(flops, w)
    cap = _NO_LIMIT if limit is None else min(limit, _NO_LIMIT)
    ints, cost, start, stop = _multi_points(prefix, w, regions, cap)
    n = len(w)
    first, end = start[0, n], stop[0, n]

    def tree(k):
        def children(g):
            i = int(ints[g, 1])
            return None if i < 0 else (i, int(ints[g, 2]), int(ints[g, 3]))
        return _build(first + k, children)
    return Front(ints[first:end, 0].tolist(), cost[first:end].tolist(), tree)


@_jit
def _multi_points(prefix, w, regions, cap):
    """Every sub-chain's front as points: int rows (peak, split, right point, left point), costs,
    and ``start[s, t] .. stop[s, t]``, the points of steps ``s .. t-1``.

    A sub-chain's front is merged split by split; a split is skipped when a
    point found already peaks at most its least peak for at most its least cost.
    """
    n = w.shape[0]
    ints = np.full((1024, 4), -1, dtype=np.int64)
    cost = np.zeros(1024)
    ints[0, 0] = 0                                       # the leaf: no bytes, no FLOPs
    size = 1
    start = np.zeros((n + 1, n + 1), dtype=np.int64)
    stop = np.zeros((n + 1, n + 1), dtype=np.int64)
    for s in range(n):
        stop[s, s + 1] = 1
    front_ints, front_cost = np.empty((64, 4), dtype=np.int64), np.empty(64)   # the sub-chain's front so far
    cand_ints, cand_cost = np.empty((64, 4), dtype=np.int64), np.empty(64)     # one split's points
    out_ints, out_cost = np.empty((64, 4), dtype=np.int64), np.empty(64)
    for length in range(2, n + 1):
        for s in range(n - length + 1):
            t = s + length
            nf = 0
            for i in range(s + 1, t):
                region = regions[s, i]
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
                        cand_ints, cand_cost = _grow(cand_ints, m + 1), _grow(cand_cost, m + 1)
                    cand_ints[m, 0], cand_ints[m, 1], cand_ints[m, 2], cand_ints[m, 3] = p, i, r, k
                    cand_cost[m] = base + cost[r] + cost[k]
                    m += 1
                if nf + m > out_cost.shape[0]:
                    out_ints, out_cost = _grow(out_ints, nf + m), _grow(out_cost, nf + m)
                nf_new = _merge_front(front_ints, front_cost, nf, cand_ints, cand_cost, m, out_ints, out_cost)
                front_ints, out_ints = out_ints, front_ints
                front_cost, out_cost = out_cost, front_cost
                nf = nf_new
            start[s, t] = size
            ints = _grow(ints, size + nf)
            cost = _grow(cost, size + nf)
            ints[size:size + nf] = front_ints[:nf]
            cost[size:size + nf] = front_cost[:nf]
            size += nf
            stop[s, t] = size
    return ints[:size], cost[:size], start, stop


def once_front(flops, w, limit):
    """Front over trees that recompute each layer at most once: checkpoints on the spine,
    each segment below the last recomputed once with everything inside it kept."""
    n_layers = len(flops)
    prefix, w, regions = _inputs(flops, w)
    cap = _NO_LIMIT if limit is None else min(limit, _NO_LIMIT)
    ints, cost, start, stop = _once_points(prefix, w, regions, cap)
    first, end = start[0], stop[0]

    def tree(k):
        nodes = []                                       # (s, i) down the spine
        g = first + k
        while ints[g, 1] >= 0:
            nodes.append((int(ints[g, 3]), int(ints[g, 1])))
            g = ints[g, 2]
        t = keep_all(nodes[-1][1], n_layers + 1) if nodes else keep_all(0, n_layers + 1)
        for s, i in reversed(nodes):
            t = (i, t, keep_all(s, i))
        return t
    return Front(ints[first:end, 0].tolist(), cost[first:end].tolist(), tree)


@_jit
def _once_points(prefix, w, regions, cap):
    """The fronts of the spines from each ``a[s]``, as :func:`_multi_points` stores them (left = ``s``)."""
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
    for s in range(n_layers - 1, -1, -1):
        m = 0
        kept_inside = 0                                  # bytes of a[s+1 .. i-1]
        for i in range(s + 1, n_layers + 1):
            if i > s + 1:
                kept_inside += w[i - 1]
            floor = max(regions[s, i], kept_inside)
            if floor > cap:
                break
            recompute = prefix[i - 1] - prefix[s] if i > s + 1 else 0.0
            for g in range(start[i], stop[i]):
                p = max(floor, w[i] + ints[g, 0])
                if p <= cap:
                    cand_ints = _grow(cand_ints, m + 1)
                    cand_cost = _grow(cand_cost, m + 1)
                    cand_ints[m, 0], cand_ints[m, 1], cand_ints[m, 2], cand_ints[m, 3] = p, i, g, s
                    cand_cost[m] = cost[g] + recompute
                    m += 1
        start[s] = size
        ints, cost, size = _add_front(cand_ints, cand_cost, m, ints, cost, size)
        stop[s] = size
    return ints[:size], cost[:size], start, stop


def least_peak(search, flops, w):
    """The least peak of any tree ``search`` (:func:`multi_front` or :func:`once_front`) covers.

    It is the first point of the front without a limit, found under doubling
    limits so that no front holds points much above it.
    """
    limit = 2 * int(np.max(region_table(w)))            # every tree forwards through the widest pair
    while True:
        front = search(flops, w, limit)
        if front.peaks:
            return front.peaks[0]
        limit *= 2
