"""The byte budget's search at depth: the least-FLOPs tree whose exact peak fits, found among bounded fronts.

NOTE [ Bounded search ]
:func:`~fastckpt.planner.search.multi_front` keeps every sub-chain's whole
Pareto front, ``K n^3`` steps.  A budget needs one point of the root's front:
the cheapest under the limit.  So, given ``U``, the FLOPs of some tree that
fits, a sub-chain keeps only the points that a tree of at most ``U`` FLOPs can
use, by the knapsack bound (NOTE [ Knapsack bound ] in
:mod:`fastckpt.planner.bounds`), and sub-chains off the spine that no such tree
can use are never built.  Every point a tree of at most ``U`` FLOPs is made of
survives, and so does every point that beats it, so the root's cheapest point
under the limit, its peak and its tree are the unbounded search's
(``tests/test_bounded.py`` checks them against today's and the old DPs).

``U`` comes first from a beam over the trees that recompute each layer at most
once (their left children keep everything): sub-chains off the spine hold one
point, their keep-all, and a spine node keeps the :data:`BEAM` points of least
bound.  The recompute-once optimum is often the optimum itself at moderate
budgets; the exact search then keeps little beyond it.  When no recompute-once
tree fits (budgets near the least memory), ``U`` climbs a ladder instead: the
exact search under budgets rising 4x from the knapsack bound, until one holds a
tree (:func:`ladder`).

Both searches count their inner steps.  When the exact one would pass
:data:`MAX_STEPS`, or its points the memory it may take, the beam's tree is the
plan and the knapsack bound is its certificate: :class:`Found` carries both
(``lower``), and the plan says how far from optimal it can be.  The steps, not
the clock, decide, so every process plans the same tree.
"""
from collections import namedtuple

import numpy as np

from fastckpt.core.resources import free_bytes
from fastckpt.kernels import NO_ROOM, OUT_OF_STEPS, band_ends, bounded_fronts

from .bounds import MARGIN, knapsack_bounds
from .search import TREE_OBJECTS, PlanTooCostly
from .trees import keep_all, points_tree, suffix_sums, walk

MAX_STEPS = 4 * 10**9        # inner steps of the exact search: about 40 s on the machines measured (docs/planning.md)
BEAM_STEPS = 10**9           # of the beam that finds the first tree
BEAM = 64                    # points a spine node keeps in the beam
POINT_BYTES = 40             # a point: peak, cost, split and two children
NO_LIMIT = 2**62             # bytes above any peak
LADDER_START = 1e-3          # the ladder's first budget above the knapsack bound, in forward passes

Found = namedtuple("Found", "tree cost peak lower held")
Found.__doc__ = """A searched tree: its FLOPs ``cost`` and ``peak`` bytes, ``lower``, FLOPs no tree that fits can
do without (``lower == cost``: optimal), and ``held``, at most the bytes of the search's arrays alive at once."""


class Chain:
    """A chain as the kernels take it: FLOP prefix sums, state bytes, gradient bytes by step, the limit."""

    def __init__(self, flops, w, limit, grads=None):
        self.prefix = np.concatenate([[0.0], np.cumsum(np.asarray(flops, dtype=np.float64))])
        self.w = np.asarray(w, dtype=np.int64)
        self.after = np.asarray(suffix_sums(list(grads) if grads is not None else [0] * (len(w) - 1)),
                                dtype=np.int64)
        self.limit = min(int(limit), NO_LIMIT)
        self.bounds = knapsack_bounds(self.prefix, self.w, self.limit)
        self.own = self.prefix.nbytes + self.w.nbytes + self.after.nbytes + \
            sum(a.nbytes for a in vars(self.bounds).values()) + TREE_OBJECTS * (len(w) - 1)   # the trees' objects
        self.held = self.own + 3 * self.bounds.excess.nbytes       # the bounds' temporaries while they were made

    @property
    def n_layers(self):
        return len(self.w) - 1

    @property
    def forward(self):
        """FLOPs of one forward pass, which every tree computes."""
        return float(self.prefix[-1])

    def margin(self, budget):
        """FLOPs of slack against rounding in the bounds (NOTE [ Knapsack bound ])."""
        return MARGIN * max(abs(budget), self.forward)


def search(chain, budget, *, beam=0, spread=np.inf, max_steps=None):
    """``(root point or None, points, status)`` of :func:`~fastckpt.kernels.bounded_fronts` for trees of at
    most ``budget`` FLOPs (by default within :data:`MAX_STEPS`)."""
    b, margin = chain.bounds, chain.margin(budget)
    base = budget - chain.forward + margin
    ends = band_ends(base, b.duals, b.excess, b.mu, b.kept, b.wsum, chain.w, chain.limit)
    nodes = (base, b.duals, b.mins, b.kept, b.mu, b.wsum, int(np.argmax(b.duals)))
    points, size, layout, status, held = bounded_fronts(
        chain.prefix, chain.w, chain.after, chain.limit, ends, nodes, (budget + margin, b.mu, b.spine), beam, spread,
        (MAX_STEPS if max_steps is None else max_steps, free_bytes() // 2 // POINT_BYTES))
    chain.held = max(chain.held, chain.own + ends.nbytes + held)
    offsets, _, start, stop, _ = layout
    root = offsets[-1]
    if status < 0 or stop[root] == start[root]:
        return None, points, status
    return int(stop[root] - 1), points, status


def first_tree(chain):
    """The beam's recompute-once tree, under bounds widened 4x until one fits; None if none does.  A beam of
    :data:`BEAM` points can drop every point that leads to a fitting tree when the limit is near the least peak
    of recompute-once trees (300 layers at 5% of the way from the least memory to plain's): then 8x wider."""
    for beam in (BEAM, 8 * BEAM, 64 * BEAM):
        gap = 1e-4 * max(chain.forward, 1.0)
        while gap < 64 * max(chain.forward, 1.0):
            root, points, status = search(chain, chain.forward + chain.bounds.recompute + gap, beam=beam,
                                          spread=0.0, max_steps=BEAM_STEPS)
            if root is not None:
                return points_tree(points, root), float(points[1][root]), int(points[0][root])
            if status == OUT_OF_STEPS or status == NO_ROOM:
                return None
            del points                          # freed before the next search, not held beside it
            gap *= 4
    return None


def ladder(chain):
    """:func:`search` under budgets rising 4x from just above the knapsack bound, for when no recompute-once tree
    fits: the first that holds a tree holds the optimum (every tree of at most its FLOPs is searched), and the
    low rungs, pruned hard, cost little beside one search with no budget (at 100 layers, 2.4 million inner steps
    against 48-63 million).  The last rung has no budget."""
    gap = LADDER_START * max(chain.forward, 1.0)
    while True:
        budget = chain.forward + chain.bounds.recompute + gap
        if budget > chain.forward * (chain.n_layers + 1):          # more than any tree: recompute all per step
            budget = np.inf
        root, points, status = search(chain, budget)
        if root is not None or status < 0 or budget == np.inf:
            return root, points, status
        del points                              # freed before the next search, not held beside it
        gap *= 4


def least_flops(flops, w, limit, grads=None):
    """The least-FLOPs tree whose peak (with ``grads``, the arena's: NOTE [ Gradients in the arena ]) fits
    ``limit``, as a :class:`Found`; None when no tree fits.  Raises :class:`PlanTooCostly` when neither
    search found a tree within its steps."""
    chain = Chain(flops, w, limit, grads)
    whole = keep_all(0, chain.n_layers + 1)
    peak = walk(whole, chain.n_layers, list(w), None if grads is None else list(grads))[5]
    if peak <= limit:
        return Found(whole, chain.forward, peak, chain.forward, chain.held)
    first = first_tree(chain)
    root, points, status = search(chain, first[1]) if first is not None else ladder(chain)
    if root is not None:
        cost = float(points[1][root])
        return Found(points_tree(points, root), cost, int(points[0][root]), cost, chain.held)
    if first is not None:
        return Found(first[0], first[1], first[2], chain.forward + chain.bounds.recompute, chain.held)
    if status >= 0:
        return None
    raise PlanTooCostly(f"planning a search over every schedule over {chain.n_layers} layers found no schedule "
                        f"within {MAX_STEPS:.0e} steps (seconds to a minute); use every_nth(n), segments(k) or sqrt, "
                        "which plan any depth, or a larger budget")
