"""Dynamic programs over schedule trees (see :mod:`fastckpt.planner.trees`).

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
The tables are filled by compiled loops in ``kernels/schedules.py`` (plain
Python, same answers, under ``NUMBA_DISABLE_JIT=1``).  With ``n = L + 1`` reverse steps:

* ``revolve_tree`` with ``d < L`` slots: about ``d n^3 / 6`` inner steps and
  ``(40 + 4 (d + 1)) n^2`` bytes (:func:`revolve_table_bytes`).  A sub-chain of ``m`` steps never holds more
  than ``m - 1`` states, so ``d >= L`` slots is the unbounded search:
  ``n^3 / 6`` steps and ``48 n^2`` bytes, whatever ``d`` is.
* ``multi_front``: at most ``K n^3 / 3`` steps and ``24 n^2 + 80 N`` bytes, where
  ``K`` is the largest front below the limit and ``N`` the points of all
  fronts (at most ``K n^2 / 2``).  Every point of a front has its own peak, a
  sum of state sizes below the limit, so ``K`` grows with the budget.
* ``once_front``: about ``K n^2 / 2`` steps and ``8 n^2 + 80 N`` bytes, ``N <= K n``.

So a search is refused, with :class:`PlanTooCostly`, before it allocates
tables larger than half the memory the machine has free, and stopped once it
has taken :data:`MAX_STEPS` inner steps (2 to 30 s here) or once its fronts
outgrow half the free memory: planning a few thousand layers never runs for
minutes or exhausts the machine.  The
strategies that keep a fixed set of checkpoints (``every_nth``, ``segments``,
``sqrt``) plan in time and memory linear in the depth.  docs/planning.md has
measurements.
"""

import numpy as np

from fastckpt.core.resources import free_bytes, shown_bytes
from fastckpt.kernels import NO_ROOM, bounded_fronts, least_arena, once_points, region_table_of, revolve_splits

from .trees import keep_all, points_tree, suffix_sums

MAX_STEPS = 5 * 10**8        # inner steps of one search: 2 to 8 s on the machines measured (docs/planning.md)


class PlanTooCostly(ValueError):
    """A search whose tables or time would exceed what planning may take (NOTE [ Planning bounds ])."""


def check_room(what, n, nbytes):
    """Refuse a search over ``n`` reverse steps whose tables need ``nbytes``, if above half the free memory."""
    free = free_bytes()
    if nbytes > free // 2:
        raise PlanTooCostly(f"planning {what} over {n - 1} layers needs {shown_bytes(nbytes)} of tables, more "
                            f"than half the {shown_bytes(free)} this process can allocate; use every_nth(n), "
                            "segments(k) or sqrt, which plan any depth, or fewer layers")


def max_points():
    """Front points a search may hold (40 bytes each): half the memory free now."""
    return free_bytes() // 2 // 40


def check_steps(what, n, steps):
    """Refuse the result of a search that stopped, unfinished: at :data:`MAX_STEPS` inner steps, or (negative)
    when its fronts outgrew :func:`max_points`."""
    if steps == NO_ROOM or steps == -1:
        raise PlanTooCostly(f"planning {what} over {n - 1} layers needs fronts larger than half the free memory; "
                            "use a smaller bound, budget(bytes, once), every_nth(n), segments(k) or sqrt")
    if steps > MAX_STEPS or steps < 0:
        raise PlanTooCostly(f"planning {what} over {n - 1} layers takes more than {MAX_STEPS:.0e} steps (seconds "
                            "to tens of seconds); use every_nth(n), segments(k) or sqrt, which plan any depth, or "
                            "fewer layers")


_NO_LIMIT = 2**62                            # bytes above any peak
# The Python objects a search makes beside its arrays, per layer: the trees it builds (a tuple a node), the dict
# that builds the winner and the walk of the tree that keeps everything; measured 100-650 bytes a layer on
# CPython 3.11 (81 to 151 layers, with the gradients in the arena too), counted at 768; the recompute-once
# search builds one spine, 80-140 bytes a layer, counted at 256.
TREE_OBJECTS, ONCE_OBJECTS = 768, 256


def region_table(w):
    """``R[s, i]``: bytes above the stack while forwarding a[s] -> a[i] (the largest live pair)."""
    return region_table_of(np.asarray(w, dtype=np.int64))


def _inputs(flops, w):
    """Prefix sums of ``flops``, int64 ``w`` and the region table, as the compiled searches take them."""
    prefix = np.concatenate([[0.0], np.cumsum(flops)])
    w = np.asarray(w, dtype=np.int64)
    return prefix, w, region_table_of(w)


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


def revolve_table_bytes(n, slots):
    """The bytes :func:`revolve_tree`'s tables over ``n`` states hold at once, ``slots < n - 1``: the region table
    (``n^2`` int64), two layers of costs and peaks (``(n + 1)^2`` float64 and int64 each) and the splits of every
    depth (``(slots + 1) (n + 1)^2`` int32); memray measures them within 11 KB (the inputs and the tree built)."""
    return 8 * n * n + (32 + 4 * (slots + 1)) * (n + 1) ** 2


def revolve_tree(flops, w, slots):
    """Least-FLOPs tree with stack depth <= slots, ties broken by peak bytes."""
    n = len(w)                                           # reverse steps 0 .. L
    if slots >= n - 1:                                   # keep_all holds L states and alone recomputes nothing
        return keep_all(0, n)
    check_room(f"revolve({slots})", n, revolve_table_bytes(n, slots))
    prefix, w, regions = _inputs(flops, w)
    split, steps = revolve_splits(prefix, w, regions, slots, False, MAX_STEPS)
    check_steps(f"revolve({slots})", n, steps)

    def children(key):
        s, t, d = key
        if t == s + 1:
            return None
        i = int(split[d, s, t])
        return i, (i, t, d - 1), (s, i, d)
    return _build((0, n, slots), children)


class Front:
    """Pareto front of one chain: ``peaks`` (bytes) rising, ``costs`` (FLOPs) falling, and their trees;
    ``held``: at most the bytes of the search's arrays alive at once (0: not counted)."""

    def __init__(self, peaks, costs, tree, held=0):
        self.peaks, self.costs, self._tree, self.held = peaks, costs, tree, held

    def tree(self, k):
        """The schedule tree of point ``k``."""
        return self._tree(k)


def multi_front(flops, w, limit, grads=None):
    """Front over all trees of the whole chain; points above ``limit`` bytes (if given) are dropped.

    Peaks only grow going up a tree, so a point dropped for exceeding the limit
    could never be part of a tree that fits it.  With ``grads`` (bytes per
    layer) a point's peak is the arena that also holds the gradients written so
    far, as :func:`~fastckpt.planner.trees.walk` counts it (NOTE [ Gradients in the arena ]).
    Every sub-chain keeps its whole front: for the cheapest tree under a limit,
    :func:`~fastckpt.planner.bounded.least_flops` is the search that scales.
    """
    n = len(w)
    check_room("a search over every schedule", n, 24 * (n + 1) ** 2)
    cap = _NO_LIMIT if limit is None else min(limit, _NO_LIMIT)
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(flops, dtype=np.float64))])
    w = np.asarray(w, dtype=np.int64)
    after = np.array(suffix_sums(grads or [0] * (n - 1)), dtype=np.int64)
    ends = np.full(n, n - 1, dtype=np.int64)
    ends[-1] = n
    price, zeros = np.zeros(1), np.zeros((1, n))                  # one price of nothing: no bound prunes
    unbounded = (np.inf, price, zeros, zeros, price, zeros[0], 0)
    points, _, layout, steps, _ = bounded_fronts(prefix, w, after, cap, ends, unbounded, (np.inf, price, zeros), 0,
                                              np.inf, (MAX_STEPS, max_points()))
    check_steps("a search over every schedule", n, steps)
    offsets, _, start, stop, _ = layout
    first, end = start[offsets[-1]], stop[offsets[-1]]

    def tree(k):
        return points_tree(points, first + k)
    return Front(points[0][first:end].tolist(), points[1][first:end].tolist(), tree)


def once_front(flops, w, limit):
    """Front over trees that recompute each layer at most once: checkpoints on the spine,
    each segment below the last recomputed once with everything inside it kept."""
    n_layers = len(flops)
    check_room("a search over the recompute-once schedules", n_layers + 1, 8 * (n_layers + 2) ** 2)
    prefix, w, regions = _inputs(flops, w)
    cap = _NO_LIMIT if limit is None else min(limit, _NO_LIMIT)
    ints, cost, start, stop, steps, held = once_points(prefix, w, regions, cap, MAX_STEPS, max_points())
    check_steps("a search over the recompute-once schedules", n_layers + 1, steps)
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
    return Front(ints[first:end, 0].tolist(), cost[first:end].tolist(), tree,
                 held + prefix.nbytes + w.nbytes + regions.nbytes + ONCE_OBJECTS * n_layers)


def least_peak(search, flops, w, grads=None):
    """The least peak of any tree ``search`` (:func:`multi_front` or :func:`once_front`) covers.

    Every tree forwards from ``a[0]`` through each pair of neighbouring states,
    and the tree that recomputes each state from ``a[0]`` holds nothing else, so
    without gradients the least over every tree is the widest pair.  With ``grads``
    (bytes per layer, in the arena from the step that writes them: NOTE [ Gradients
    in the arena ]) it is :func:`~fastckpt.kernels.least_arena`'s table, ``n^3 / 6``
    steps and ``8 n^2`` bytes.  For :func:`once_front`, the first point of its front,
    found under doubling limits so that no front holds points much above it.
    """
    w = [int(v) for v in w]
    if search is multi_front:
        return least_arena_peak(w, grads) if grads else _widest(w)
    limit = 2 * _widest(w)
    while True:
        front = search(flops, w, limit)
        if front.peaks:
            return front.peaks[0]
        limit *= 2


def arena_lower_bound(w, grads):
    """A lower bound of :func:`least_arena_peak`, in linear time: every tree forwards through the widest pair,
    and reverse step ``s >= 1`` runs with ``a[s]`` held and the gradients of layers ``s ..`` written."""
    w = [int(v) for v in w]
    after = suffix_sums(list(grads))
    return max([_widest(w), after[0]] + [w[s] + after[s] for s in range(1, len(w))])


def _widest(w):
    """The widest state or pair of neighbouring states: every tree forwards through it."""
    return max(w[1:] + [a + b for a, b in zip(w[1:-1], w[2:])])


def least_arena_peak(w, grads):
    """The least arena, activations and ``grads``, of any tree over the states ``w``: exact, or
    :class:`PlanTooCostly` past :data:`MAX_STEPS` steps (some 1,400 layers) or half the free memory."""
    n = len(w)
    check_room("the least memory of a step", n, 8 * (n + 1) ** 2)
    least = least_arena(np.asarray(w, dtype=np.int64), np.array(suffix_sums(list(grads)), dtype=np.int64), MAX_STEPS)
    check_steps("the least memory of a step", n, MAX_STEPS + 1 if least < 0 else 0)
    return int(least)
