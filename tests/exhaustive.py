"""Exhaustive references for the schedule searches, written from the definitions, not the DPs.

A schedule is any sequence of moves over states a[0..L] (a[0], the input, is
always there): forward layer j (a[j] held -> also a[j+1]), drop a held state,
or reverse step t (needs a[t]; steps go L, L-1, ..., 0, and L is the loss).
Memory is the bytes of held states, counting both while a layer is computed.
A *persistent* schedule never drops a state it has computed from and kept:
it is either a transient (dropped right after its successor is computed) or
stays until its step is reversed.
"""
import heapq
import itertools
import math

from fastckpt.planner.trees import keep_all, spine, tree_cost, walk


def least_flops(flops, w, limit, persistent=True):
    """Least forward FLOPs of a schedule whose held bytes never exceed ``limit`` (Dijkstra)."""
    n_layers = len(flops)

    def held(mask):
        return sum(w[j] for j in range(1, n_layers + 1) if mask >> j & 1)

    dist = {(0, 0, n_layers): 0.0}
    queue = [(0.0, 0, 0, n_layers)]               # cost, held mask, kept-for-good mask, next step
    while queue:
        cost, mask, kept, t = heapq.heappop(queue)
        if dist.get((mask, kept, t), math.inf) < cost:
            continue
        if t < 0:
            return cost
        moves = []
        if t == 0 or mask >> t & 1:              # reverse step t; states >= t are of no more use
            below = (1 << t) - 1 if t > 0 else 0
            moves.append((cost, mask & below, kept & below, t - 1))
        for j in range(min(t, n_layers)):
            if (j == 0 or mask >> j & 1) and not mask >> (j + 1) & 1 and held(mask) + w[j + 1] <= limit:
                grown = mask | 1 << (j + 1)
                if j == 0 or kept >> j & 1 or not persistent:
                    moves.append((cost + flops[j], grown, kept, t))
                else:
                    moves.append((cost + flops[j], grown, kept | 1 << j, t))      # keep a[j]
                    moves.append((cost + flops[j], grown & ~(1 << j), kept, t))  # a[j] was transient
        for j in range(1, n_layers + 1):
            if mask >> j & 1 and not (persistent and kept >> j & 1):
                moves.append((cost, mask & ~(1 << j), kept, t))
        for move in moves:
            if move[0] < dist.get(move[1:], math.inf):
                dist[move[1:]] = move[0]
                heapq.heappush(queue, move)
    return math.inf


def all_trees(s, t):
    """Every schedule tree for reverse steps s .. t-1."""
    if t == s + 1:
        yield None
        return
    for i in range(s + 1, t):
        for right in list(all_trees(i, t)):
            for left in all_trees(s, i):
                yield (i, right, left)


def all_spines(n_layers):
    """Every at-most-once schedule: a checkpoint set from 0 with the last segment kept."""
    for r in range(n_layers):
        for inner in itertools.combinations(range(1, n_layers), r):
            yield spine([0, *inner], n_layers)
    yield keep_all(0, n_layers + 1)


def measure(tree, n_layers, flops, w):
    """(FLOPs, stack depth, peak bytes) of a tree, by walking its ops."""
    cost, depth = tree_cost(tree, n_layers, flops)
    return cost, depth, walk(tree, n_layers, w)[4]
