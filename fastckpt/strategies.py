"""Checkpoint strategies: each turns a net, batch size and dtype into a schedule tree.

``plain``, ``every_nth(n)``, ``segments(k)`` and ``sqrt`` keep a set of
checkpoints and recompute each segment between them at most once.
``revolve(slots)`` and ``budget(bytes)`` search the trees of
:mod:`fastckpt.schedule` by dynamic programming:

.. math::

    C(s, t) = \\min_{s < i < t} \\; F(s, i) + C(i, t) + C(s, i), \\qquad C(s, s + 1) = 0

where ``F(s, i)`` is the forward FLOPs of layers ``s .. i-1``, ``C(i, t)``
runs with ``a[i]`` held on top of the stack and ``C(s, i)`` without it.
``revolve`` bounds the stack depth; ``budget`` bounds the exact peak bytes,
keeping for every sub-chain the whole Pareto front of (peak, FLOPs).
"""
import math
import re

import numpy as np

from .schedule import delta_elems, forward_flops, keep_all, spine, state_bytes

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30}


class Strategy:
    """Base class: ``tree(sizes, batch_size, itemsize)`` returns the schedule tree."""

    def tree(self, sizes, batch_size, itemsize):
        raise NotImplementedError

    def __repr__(self):
        return str(self)

    def __eq__(self, other):
        return type(other) is type(self) and str(other) == str(self)

    def __hash__(self):
        return hash(str(self))


class Plain(Strategy):
    """Keep every activation: ordinary backprop."""

    def tree(self, sizes, batch_size, itemsize):
        return keep_all(0, len(sizes))

    def __str__(self):
        return "plain"


class EveryNth(Strategy):
    """The lab's rule: keep the inputs of layers 0, n, 2n, ...; recompute each segment once."""

    def __init__(self, n):
        self.n = _positive(n, "every_nth(n)", "n")

    def tree(self, sizes, batch_size, itemsize):
        n_layers = len(sizes) - 1
        return spine(list(range(0, n_layers, self.n)), n_layers)

    def __str__(self):
        return f"every_nth({self.n})"


class Segments(Strategy):
    """``k`` segments whose lengths differ by at most one layer (longer ones first)."""

    def __init__(self, k):
        self.k = _positive(k, "segments(k)", "k")

    def tree(self, sizes, batch_size, itemsize):
        n_layers = len(sizes) - 1
        if self.k > n_layers:
            raise ValueError(f"segments(k): k must be <= the {n_layers} layers of {list(sizes)}, "
                             f"got {self.k}")
        return spine(balanced_checkpoints(n_layers, self.k), n_layers)

    def __str__(self):
        return f"segments({self.k})"


class Sqrt(Strategy):
    """Chen et al. (2016): about sqrt(L) balanced segments, O(sqrt(L)) memory for one extra forward."""

    def tree(self, sizes, batch_size, itemsize):
        n_layers = len(sizes) - 1
        return spine(balanced_checkpoints(n_layers, max(1, round(math.sqrt(n_layers)))), n_layers)

    def __str__(self):
        return "sqrt"


class Revolve(Strategy):
    """Binomial checkpointing: at most ``slots`` kept activations, least recomputation.

    A kept activation takes a slot (the input does not); the one or two being
    computed in a forward sweep do not.  With ``slots = d`` and every layer
    computed at most ``r`` times, ``C(d + r, d)`` reverse steps (layers plus
    the loss) can be reversed, Griewank and Walther's binomial bound.
    Among the schedules of least recomputation FLOPs, the one with the
    smallest peak bytes is chosen.
    """

    def __init__(self, slots):
        self.slots = _positive(slots, "revolve(slots)", "slots")

    def tree(self, sizes, batch_size, itemsize):
        n_layers = len(sizes) - 1
        w = state_bytes(sizes, batch_size, itemsize)
        return revolve_tree(forward_flops(sizes, batch_size), w, min(self.slots, n_layers))

    def __str__(self):
        return f"revolve({self.slots})"


class Budget(Strategy):
    """The least recomputation whose activation memory fits ``nbytes``.

    Activation memory is the kept activations, recompute buffers and the two
    delta buffers, in exact bytes.  ``recompute="multi"`` searches all
    schedule trees (layers may run many times); ``"once"`` only those that
    recompute each layer at most once.
    """

    def __init__(self, nbytes, recompute="multi"):
        self.nbytes = parse_bytes(nbytes, "budget(bytes)")
        if recompute not in ("multi", "once"):
            raise ValueError(f"budget: recompute must be 'multi' or 'once', got {recompute!r}")
        self.recompute = recompute

    def tree(self, sizes, batch_size, itemsize):
        fixed = delta_elems(sizes, batch_size) * itemsize
        w = state_bytes(sizes, batch_size, itemsize)
        flops = forward_flops(sizes, batch_size)
        front = (once_front if self.recompute == "once" else multi_front)(flops, w, self.nbytes - fixed)
        if not front:
            least = fixed + (once_front if self.recompute == "once" else multi_front)(flops, w, None)[0][0]
            raise InfeasiblePlan(
                f"{self}: {list(sizes)} at batch {batch_size} in {8 * itemsize}-bit floats needs at least "
                f"{least} bytes ({least / 2**20:.2f} MiB) of activation memory, of which {fixed} are "
                f"the two delta buffers; got {self.nbytes}", least)
        return front[-1][2]

    def __str__(self):
        spelled = format_bytes(self.nbytes)
        return f"budget({spelled})" if self.recompute == "multi" else f"budget({spelled}, once)"


class InfeasiblePlan(ValueError):
    """A budget below what any schedule needs; ``minimum_bytes`` says what would fit."""

    def __init__(self, message, minimum_bytes):
        super().__init__(message)
        self.minimum_bytes = minimum_bytes


# -- helpers ----------------------------------------------------------------------------------
def _positive(value, where, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{where}: {name} must be an integer >= 1, got {value!r}")
    return int(value)


def balanced_checkpoints(n_layers, k):
    """Starts of ``k`` segments over ``n_layers`` layers whose lengths differ by at most one."""
    base, extra = divmod(n_layers, k)
    starts, pos = [], 0
    for seg in range(k):
        starts.append(pos)
        pos += base + (1 if seg < extra else 0)
    return starts


def parse_bytes(value, where):
    """Bytes from an int or a string like ``"24MiB"``, ``"1.5 GB"``, ``"4096"``."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{where}: cannot read {value!r} as bytes (e.g. 24MiB, 1.5GB, 4096)")
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
        if value != int(value):
            raise ValueError(f"{where}: {value} is not a whole number of bytes")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{where}: bytes must be a positive integer, got {value!r}")
    return int(value)


def format_bytes(n):
    """``25165824`` -> ``"24MiB"`` when exact, else the plain integer."""
    for unit in ("GiB", "MiB", "KiB"):
        if n % _UNITS[unit.lower()] == 0:
            return f"{n // _UNITS[unit.lower()]}{unit}"
    return str(n)


_CALL = re.compile(r"\s*([a-z_]+)\s*(?:\((.*)\))?\s*")


def parse_strategy(spec):
    """A :class:`Strategy` from itself or a spelling: ``"plain"``, ``"every_nth(2)"``,
    ``"segments(8)"``, ``"sqrt"``, ``"revolve(4)"``, ``"budget(24MiB)"``, ``"budget(24MiB, once)"``."""
    if isinstance(spec, Strategy):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"strategy must be a Strategy or a string such as 'sqrt', got {type(spec).__name__}")
    m = _CALL.fullmatch(spec)
    name = m.group(1) if m else None
    args = [a.strip() for a in m.group(2).split(",")] if m and m.group(2) is not None else []
    if name in ("plain", "sqrt") and not args:
        return Plain() if name == "plain" else Sqrt()
    if name in ("every_nth", "segments", "revolve") and len(args) == 1 and args[0].isdigit():
        return {"every_nth": EveryNth, "segments": Segments, "revolve": Revolve}[name](int(args[0]))
    if name == "budget" and len(args) in (1, 2):
        return Budget(args[0], *args[1:])
    raise ValueError(f"unknown strategy {spec!r}; use plain, every_nth(n), segments(k), sqrt, "
                     "revolve(slots) or budget(bytes[, once])")


# -- dynamic programs -------------------------------------------------------------------------
def region_table(w):
    """``R[s][i]``: bytes above the stack while forwarding a[s] -> a[i] (see ``forward_region``)."""
    n = len(w)
    table = [[0] * n for _ in range(n)]
    for s in range(n - 1):
        region = w[s + 1]
        table[s][s + 1] = region
        for i in range(s + 2, n):
            region = max(region, w[i - 1] + w[i])
            table[s][i] = region
    return table


def revolve_tree(flops, w, slots):
    """Least-FLOPs tree with stack depth <= slots, ties broken by peak bytes."""
    n = len(flops) + 1                                   # reverse steps 0 .. L
    prefix = np.concatenate([[0.0], np.cumsum(flops)])
    regions = region_table(w)
    best = {}                                            # (s, t, d) -> (cost, peak, tree)
    for length in range(1, n + 1):
        for s in range(0, n - length + 1):
            t = s + length
            for d in range(0, slots + 1):
                if length == 1:
                    best[s, t, d] = (0.0, 0, None)
                    continue
                if d == 0:
                    continue
                choice = None
                for i in range(s + 1, t):
                    right, left = best.get((i, t, d - 1)), best.get((s, i, d))
                    if right is None or left is None:
                        continue
                    cost = prefix[i] - prefix[s] + right[0] + left[0]
                    peak = max(regions[s][i], w[i] + right[1], left[1])
                    if choice is None or (cost, peak) < choice[:2]:
                        choice = (cost, peak, (i, right[2], left[2]))
                if choice is not None:
                    best[s, t, d] = choice
    return best[0, n, slots][2]


def _pareto(points):
    """Keep (peak, cost, tree) points not beaten on both; sorted by peak, costs falling."""
    points.sort(key=lambda p: (p[0], p[1]))
    front = []
    for p in points:
        if not front or p[1] < front[-1][1]:
            front.append(p)
    return front


def multi_front(flops, w, limit):
    """Pareto front (peak, forward FLOPs, tree) over all trees of the whole chain.

    ``limit`` (bytes, or None) drops points whose workspace peak exceeds it:
    peaks only grow going up the tree, so nothing lost can come back.
    """
    n = len(flops) + 1
    prefix = np.concatenate([[0.0], np.cumsum(flops)])
    cap = math.inf if limit is None else limit
    regions = region_table(w)
    front = {}
    for s in range(n - 1):
        front[s, s + 1] = [(0, 0.0, None)]
    front[n - 1, n] = [(0, 0.0, None)]
    for length in range(2, n + 1):
        for s in range(0, n - length + 1):
            t = s + length
            points = []
            for i in range(s + 1, t):
                region = regions[s][i]
                if region > cap:
                    break                                  # regions only widen with i
                right, left = front[i, t], front[s, i]
                if not right or not left:
                    continue
                base = prefix[i] - prefix[s]
                points.extend(_combine(right, left, w[i], region, base, cap, i))
            front[s, t] = _pareto(points)
    return front[0, n]


def _combine(right, left, wi, region, base, cap, i):
    """Points of one split: the cheapest right and left parts under each candidate peak."""
    peaks = sorted({max(region, wi + p[0], left[0][0]) for p in right} |
                   {max(region, wi + right[0][0], p[0]) for p in left})
    out = []
    r = l = 0
    for peak in peaks:
        if peak > cap:
            break
        while r + 1 < len(right) and wi + right[r + 1][0] <= peak:
            r += 1
        while l + 1 < len(left) and left[l + 1][0] <= peak:
            l += 1
        out.append((peak, base + right[r][1] + left[l][1], (i, right[r][2], left[l][2])))
    return out


def once_front(flops, w, limit):
    """Pareto front over trees that recompute each layer at most once (checkpoints on the spine)."""
    n_layers = len(flops)
    prefix = np.concatenate([[0.0], np.cumsum(flops)])
    cap = math.inf if limit is None else limit
    regions = region_table(w)
    spine_front = {n_layers: [(0, float(prefix[-1]), None)]}
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
            for peak, cost, tree in spine_front[i]:
                p = max(floor, w[i] + peak)
                if p <= cap:
                    points.append((p, cost + recompute, (i, tree, keep_all(s, i))))
        spine_front[s] = _pareto(points)
    return spine_front[0]


def plan(sizes, batch_size, dtype=np.float64, strategy="plain", *, optimizer_in_backward=False,
         blas_threads=None):
    """The :class:`~fastckpt.schedule.Plan` of one training step, before any work.

    Parameters
    ----------
    sizes : sequence of int
        Units per layer, input first.
    batch_size : int
        Samples per step; buffers are sized for it.
    dtype : {numpy.float64, numpy.float32}, optional
    strategy : Strategy or str, optional
        ``"plain"``, ``"every_nth(n)"``, ``"segments(k)"``, ``"sqrt"``,
        ``"revolve(slots)"``, ``"budget(bytes)"`` or ``"budget(bytes, once)"``,
        or the objects of the same names in :mod:`fastckpt.strategies`.
    optimizer_in_backward : bool, optional
        Plan for SGD applied inside the backward pass (no gradient buffers).
    blas_threads : int, optional
        BLAS threads to plan for; default: what numpy's OpenBLAS uses now.

    Raises
    ------
    InfeasiblePlan
        When a ``budget`` is below the least any schedule needs; the message
        and ``minimum_bytes`` give that least.
    """
    from fastckpt.kernels import blas_threads as current_threads

    from ._checks import check_dtype, check_positive_int, check_sizes
    from .schedule import compile_plan
    sizes = check_sizes(sizes)
    batch_size = check_positive_int(batch_size, "batch_size")
    dtype = check_dtype(dtype)
    strategy = parse_strategy(strategy)
    threads = current_threads() if blas_threads is None else check_positive_int(blas_threads, "blas_threads")
    tree = strategy.tree(sizes, batch_size, dtype.itemsize)
    return compile_plan(sizes, batch_size, dtype, tree, str(strategy),
                        optimizer_in_backward=optimizer_in_backward, blas_threads=threads)
