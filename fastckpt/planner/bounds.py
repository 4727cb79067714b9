"""Lower bounds on the FLOPs a byte budget costs: the knapsack relaxation of the schedule trees and its lines.

NOTE [ Knapsack bound ]
Any tree of the chain (see :mod:`fastckpt.planner.trees`) computes every layer
once in its first forward pass, ``F = prefix[L]`` FLOPs, and the states it
does not keep on the root's right spine (*dropped*) again inside the left
child that holds them: ``cost >= F + sum of f[j]`` over the dropped ``j``, with
``f[j]`` the FLOPs of the layer that makes ``a[j]``.  When the loss runs, the
stack holds every spine state, and the forward into ``a[L]`` held ``a[L-1]``
beside it, kept or not: ``sum of w[j]`` over the kept ``j < L - 1`` is at most
``limit - w[L] - w[L-1]``.  So the recompute is at least the least cost of
dropping ``N = sum w - capacity`` bytes of states ``1 .. L-2``, a knapsack,
and for every price ``mu >= 0`` of a byte (the Lagrangian dual of its
linear relaxation)::

    recompute >= D(mu) = mu N - sum_j max(0, mu w[j] - f[j])

The same holds of parts of a tree, and these are what prune the search
(:mod:`fastckpt.planner.bounded`):

* a sub-chain ``(s, t)`` off the root's spine drops ``a[s+1] .. a[t-1]`` and
  recomputes them inside, so whatever else the tree does costs at least
  ``D(mu) - sum over s < j < t of min(mu w[j], f[j])``;
* a spine node ``(s, n)`` whose point peaks at ``p`` above ``a[s]`` holds the
  kept states before ``s`` beside it, at most ``limit - w[s] - p`` bytes: what
  comes before ``a[s]`` costs at least ``mu (wsum[s-1] + w[s] + p - limit)
  - kept[s-1]``, a line in ``p`` (``wsum``, ``kept``: prefix sums of ``w[j]``
  and ``max(0, mu w[j] - f[j])``).

Each bound is computed for a few prices around the best one (the knapsack's
break ratio) and the largest is used.  Gradients in the arena (``fit``) only
add bytes, so every bound holds for them too.  Float sums of non-integer
prices round, so the search compares against them with a margin of ``1e-9``
of the FLOPs (:data:`MARGIN`).
"""
from dataclasses import dataclass

import numpy as np

LINES = 16                  # prices per bound: the break ratio and neighbours at doubling distances
MARGIN = 1e-9               # relative margin kept against rounding in the bounds' float sums


@dataclass(frozen=True)
class Bounds:
    """The knapsack bound of one chain and limit, at several prices ``mu`` (rising).

    ``duals[k]`` is ``D(mu[k])``; ``excess``, ``mins``, ``kept`` and ``wsum`` are prefix sums over states
    ``0 .. L`` of ``max(0, f - mu w)``, ``min(mu w, f)``, ``max(0, mu w - f)`` and ``w``;
    ``spine[k, s]`` is the offset of spine node ``s``'s line ``mu[k] p + spine[k, s]``.
    """

    mu: np.ndarray
    duals: np.ndarray
    excess: np.ndarray
    mins: np.ndarray
    kept: np.ndarray
    wsum: np.ndarray
    spine: np.ndarray

    @property
    def recompute(self):
        """The best lower bound on the recompute FLOPs (0 when nothing need be dropped)."""
        return max(0.0, float(self.duals.max()))


def items(prefix, w):
    """``(f, weight)`` over states ``0 .. L``: the FLOPs that make ``a[j]`` and the bytes dropping it frees
    (none for ``a[0]``, ``a[L]``, or ``a[L-1]``, which the forward into ``a[L]`` holds anyway)."""
    n_layers = len(w) - 1
    f, weight = np.zeros(n_layers + 1), np.zeros(n_layers + 1)
    f[1:n_layers] = np.diff(prefix)[:n_layers - 1]
    weight[1:n_layers - 1] = w[1:n_layers - 1]
    return f, weight


def prices(f, weight, need):
    """The break ratio of the knapsack that drops ``need`` bytes, and ratios around it in rising order."""
    held = np.nonzero(weight > 0)[0]
    if need <= 0 or len(held) == 0:
        return np.zeros(1)
    order = held[np.argsort(f[held] / weight[held], kind="stable")]
    at = int(min(np.searchsorted(np.cumsum(weight[order]), need), len(order) - 1))
    picks, step = {at}, 1
    while len(picks) < LINES and step < len(order):
        picks.update((max(0, at - step), min(len(order) - 1, at + step)))
        step *= 2
    return np.unique(f[order[sorted(picks)]] / weight[order[sorted(picks)]])


def knapsack_bounds(prefix, w, limit):
    """:class:`Bounds` of the chain with FLOP prefix sums ``prefix`` and state bytes ``w`` under ``limit`` bytes."""
    n_layers = len(w) - 1
    f, weight = items(prefix, w)
    capacity = limit - w[n_layers] - (w[n_layers - 1] if n_layers >= 2 else 0)
    need = float(weight.sum() - capacity)
    mu = prices(f, weight, need)
    mw = mu[:, None] * weight[None, :]
    excess = np.cumsum(np.maximum(f - mw, 0.0), axis=1)
    mins = np.cumsum(np.minimum(mw, f), axis=1)
    kept = np.cumsum(np.maximum(mw - f, 0.0), axis=1)
    wsum = np.cumsum(weight)
    spine = np.empty_like(mw)
    spine[:, 0] = -mu * limit
    spine[:, 1:] = mu[:, None] * (wsum[None, :-1] + np.asarray(w[1:], dtype=np.float64) - limit) - kept[:, :-1]
    return Bounds(mu, mu * need - kept[:, -1], excess, mins, kept, wsum, spine)
