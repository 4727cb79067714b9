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
"""
import math
from array import array

import numpy as np

from .trees import keep_all


def region_table(w):
    """``R[s][i]``: bytes above the stack while forwarding a[s] -> a[i] (the largest live pair)."""
    n = len(w)
    table = np.zeros((n, n), dtype=np.int64)
    for s in range(n - 1):
        region = w[s + 1]
        table[s, s + 1] = region
        for i in range(s + 2, n):
            region = max(region, w[i - 1] + w[i])
            table[s, i] = region
    return table.tolist()


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
    n = len(flops) + 1                                   # reverse steps 0 .. L
    prefix = np.concatenate([[0.0], np.cumsum(flops)]).tolist()
    regions = region_table(w)
    shape = (n + 1, n + 1, slots + 1)
    cost = np.full(shape, math.inf).tolist()
    peak = np.zeros(shape, dtype=np.int64).tolist()
    split = np.zeros(shape, dtype=np.int64).tolist()
    for s in range(n):
        for d in range(slots + 1):
            cost[s][s + 1][d] = 0.0
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

    def children(key):
        s, t, d = key
        if t == s + 1:
            return None
        i = split[s][t][d]
        return i, (i, t, d - 1), (s, i, d)
    return _build((0, n, slots), children)


class Front:
    """Pareto front of one chain: ``peaks`` (bytes) rising, ``costs`` (FLOPs) falling, and their trees."""

    def __init__(self, peaks, costs, tree):
        self.peaks, self.costs, self._tree = peaks, costs, tree

    def tree(self, k):
        """The schedule tree of point ``k``."""
        return self._tree(k)


class _Points:
    """Flat storage of many small fronts: per point its peak, cost and back-pointers."""

    def __init__(self):
        self.peak, self.cost = array("q"), array("d")
        self.split, self.right, self.left = array("q"), array("q"), array("q")

    def add_front(self, points):
        """Append the Pareto-optimal ones of ``points`` [(peak, cost, i, r, l)]; return (start, stop)."""
        start = len(self.peak)
        points.sort(key=lambda p: (p[0], p[1]))
        last = math.inf
        for peak, cost, split, right, left in points:
            if cost < last:
                last = cost
                self.peak.append(peak)
                self.cost.append(cost)
                self.split.append(split)
                self.right.append(right)
                self.left.append(left)
        return start, len(self.peak)


def multi_front(flops, w, limit):
    """Front over all trees of the whole chain; points above ``limit`` bytes (if given) are dropped.

    Peaks only grow going up a tree, so a point dropped for exceeding the limit
    could never be part of a tree that fits it.
    """
    n = len(flops) + 1
    prefix = np.concatenate([[0.0], np.cumsum(flops)]).tolist()
    cap = math.inf if limit is None else limit
    regions = region_table(w)
    pts = _Points()
    leaf = pts.add_front([(0, 0.0, -1, -1, -1)])
    ranges = {(s, s + 1): leaf for s in range(n)}
    for length in range(2, n + 1):
        for s in range(0, n - length + 1):
            t = s + length
            points = []
            for i in range(s + 1, t):
                region = regions[s][i]
                if region > cap:
                    break                                  # regions only widen with i
                (rs, re), (ls, le) = ranges[i, t], ranges[s, i]
                if rs == re or ls == le:
                    continue
                _combine(pts, rs, re, ls, le, w[i], region, prefix[i] - prefix[s], cap, i, points)
            ranges[s, t] = pts.add_front(points)
    start, stop = ranges[0, n]

    def tree(k):
        def children(g):
            i = pts.split[g]
            return None if i < 0 else (i, pts.right[g], pts.left[g])
        return _build(start + k, children)
    return Front(pts.peak[start:stop].tolist(), pts.cost[start:stop].tolist(), tree)


def _combine(pts, rs, re, ls, le, wi, region, base, cap, i, out):
    """Points of one split: the cheapest right and left parts under each candidate peak."""
    peak, cost = pts.peak, pts.cost
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
        out.append((p, base + cost[r] + cost[k], i, r, k))


def once_front(flops, w, limit):
    """Front over trees that recompute each layer at most once: checkpoints on the spine,
    each segment below the last recomputed once with everything inside it kept."""
    n_layers = len(flops)
    prefix = np.concatenate([[0.0], np.cumsum(flops)]).tolist()
    cap = math.inf if limit is None else limit
    regions = region_table(w)
    pts = _Points()
    ranges = {n_layers: pts.add_front([(0, prefix[-1], -1, -1, -1)])}
    for s in range(n_layers - 1, -1, -1):
        points = []
        kept_inside = 0                                  # bytes of a[s+1 .. i-1]
        for i in range(s + 1, n_layers + 1):
            if i > s + 1:
                kept_inside += w[i - 1]
            floor = max(regions[s][i], kept_inside)
            if floor > cap:
                break
            recompute = prefix[i - 1] - prefix[s] if i > s + 1 else 0.0
            start, stop = ranges[i]
            for g in range(start, stop):
                p = max(floor, w[i] + pts.peak[g])
                if p <= cap:
                    points.append((p, pts.cost[g] + recompute, i, g, s))
        ranges[s] = pts.add_front(points)
    start, stop = ranges[0]

    def tree(k):
        nodes = []                                       # (s, i) down the spine
        g = start + k
        while pts.split[g] >= 0:
            nodes.append((pts.left[g], pts.split[g]))
            g = pts.right[g]
        t = keep_all(nodes[-1][1], n_layers + 1) if nodes else keep_all(0, n_layers + 1)
        for s, i in reversed(nodes):
            t = (i, t, keep_all(s, i))
        return t
    return Front(pts.peak[start:stop].tolist(), pts.cost[start:stop].tolist(), tree)
