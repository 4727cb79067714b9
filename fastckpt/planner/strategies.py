"""Checkpoint strategies: each turns a net, batch size and dtype into a schedule tree.

``plain``, ``every_nth(n)``, ``segments(k)`` and ``sqrt`` keep a set of
checkpoints and recompute each segment between them at most once.
``revolve(slots)`` and ``budget(bytes)`` search the schedule trees of
:mod:`fastckpt.planner.trees` by dynamic programming (:mod:`fastckpt.planner.search`).
"""
import math
import re

import numpy as np

from fastckpt.core.layout import grad_bytes, param_layout
from fastckpt.core.resources import shown_bytes

from .bounded import least_flops
from .costs import blas_bytes, delta_elems, describe_sizes, forward_flops, gradient_bytes, scratch_bytes, state_bytes
from .search import (
    PlanTooCostly,
    arena_lower_bound,
    least_peak,
    multi_front,
    once_front,
    revolve_table_bytes,
    revolve_tree,
)
from .trees import keep_all, spine, tree_cost
from .units import format_bytes, parse_bytes


class Strategy:
    """Base class: ``tree(sizes, batch_size, itemsize)`` returns the schedule tree."""

    def tree(self, sizes, batch_size, itemsize):
        raise NotImplementedError

    def step_search(self, sizes, batch_size, itemsize, optimizer_in_backward=False, blas_threads=1,
                    optimizer_slots=0, extra_bytes=0):
        """``(tree, least, held)``: the tree for a whole training step, :meth:`tree` unless the strategy bounds
        the step's total bytes (:class:`Fit`), which depend on the update mode, BLAS threads, the optimizer's
        state (``optimizer_slots`` buffers the size of the parameters) and ``extra_bytes`` the step holds besides
        (a tensor shard's sums); for a strategy that searches, the forward FLOPs no tree it searched could do
        with less (equal to the tree's own when it is optimal), None otherwise; and at most the bytes the
        search's tables held at once (0 for the strategies that keep fixed checkpoints: linear in the depth)."""
        return self.tree(sizes, batch_size, itemsize), None, 0

    def check(self, sizes):
        """Refuse a net this strategy cannot apply to, whatever the batch size (cheap: no search)."""

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

    def check(self, sizes):
        n_layers = len(sizes) - 1
        if self.k > n_layers:
            raise ValueError(f"segments(k): k must be <= the {n_layers} layers of {list(sizes)}, "
                             f"got {self.k}")

    def tree(self, sizes, batch_size, itemsize):
        self.check(sizes)
        n_layers = len(sizes) - 1
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
        return self.step_search(sizes, batch_size, itemsize)[0]

    def step_search(self, sizes, batch_size, itemsize, optimizer_in_backward=False, blas_threads=1,
                    optimizer_slots=0, extra_bytes=0):
        n_layers = len(sizes) - 1
        flops = forward_flops(sizes, batch_size)
        tree = revolve_tree(flops, state_bytes(sizes, batch_size, itemsize), min(self.slots, n_layers))
        held = revolve_table_bytes(n_layers + 1, self.slots) if self.slots < n_layers else 0
        return tree, tree_cost(tree, n_layers, flops)[0], held          # the search is exact

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
        return self.step_search(sizes, batch_size, itemsize)[0]

    def step_search(self, sizes, batch_size, itemsize, optimizer_in_backward=False, blas_threads=1,
                    optimizer_slots=0, extra_bytes=0):
        fixed = delta_elems(sizes, batch_size) * itemsize
        w = state_bytes(sizes, batch_size, itemsize)
        flops = forward_flops(sizes, batch_size)
        if self.recompute == "once":
            front = once_front(flops, w, self.nbytes - fixed)
            found = (front.tree(len(front.peaks) - 1), front.costs[-1], front.held) if front.peaks else None
        else:
            found = searched(least_flops, flops, w, self.nbytes - fixed) if self.nbytes > fixed else None
        if found is None:
            least = fixed + least_peak(once_front if self.recompute == "once" else multi_front, flops, w)
            raise InfeasiblePlan(
                f"{self}: {describe_sizes(sizes)} at batch {batch_size} in float{8 * itemsize} needs at "
                f"least {least} bytes ({shown_bytes(least)}) of activation memory, of which {fixed} "
                f"are the two delta buffers; got {self.nbytes}", least)
        return found

    def __str__(self):
        spelled = format_bytes(self.nbytes)
        return f"budget({spelled})" if self.recompute == "multi" else f"budget({spelled}, once)"


class Fit(Strategy):
    """The least recomputation whose whole training step is predicted to fit ``nbytes``.

    Where ``budget(bytes)`` bounds the activation memory only, ``fit(bytes)``
    bounds the plan's predicted ``total``: parameters, gradients, the optimizer's
    state, activations, deltas, scratch and BLAS's buffers.  memray measures that total to within
    the Python objects (views, the op list) a net and its plan add, some 2 KiB a layer
    (tens of KiB at ten layers, 0.9 MiB at 500), so leave that much room when the bound is a hard one.
    It does not count the Python interpreter and libraries nor the training
    data.  The search is ``budget``'s, over all schedule trees, with each
    gradient's bytes counted from the step that writes it (NOTE [ Gradients
    in the arena ]).
    """

    def __init__(self, nbytes, named=None):
        self.nbytes = parse_bytes(nbytes, "fit(bytes)")
        self.named = named              # how a refusal names the bound (the command line's --max-memory B)

    def tree(self, sizes, batch_size, itemsize):
        return self.step_search(sizes, batch_size, itemsize)[0]

    def step_search(self, sizes, batch_size, itemsize, optimizer_in_backward=False, blas_threads=1,
                    optimizer_slots=0, extra_bytes=0):
        fixed = (extra_bytes + (1 + optimizer_slots) * param_layout(sizes, itemsize)[1] * itemsize
                 + (gradient_bytes(sizes, itemsize, True, optimizer_slots) if optimizer_in_backward else 0)
                 + delta_elems(sizes, batch_size) * itemsize + scratch_bytes(sizes)
                 + blas_bytes(sizes, batch_size, blas_threads))
        w = state_bytes(sizes, batch_size, itemsize)
        grads = None if optimizer_in_backward else grad_bytes(sizes, itemsize)
        flops = forward_flops(sizes, batch_size)
        room = self.nbytes - fixed
        found = searched(least_flops, flops, w, room, grads) if room > 0 else None
        if found is not None:                                  # peaks: the arena with the gradients
            return found
        least, exact = fixed + least_peak(multi_front, flops, w), grads is None
        if not exact:
            try:                                               # with the gradients in the arena: a table
                least, exact = fixed + least_peak(multi_front, flops, w, grads), True
            except PlanTooCostly:                              # past some 1,400 layers: a bound
                least = fixed + arena_lower_bound(w, grads)
        least = least if exact else max(least, self.nbytes + 1)      # a lower bound: more than what did not fit
        bound = "" if exact else ", a lower bound: the exact least is too long a search at this depth"
        raise InfeasiblePlan(
            f"{self.shown()}: {describe_sizes(sizes)} at batch {batch_size} in float{8 * itemsize} needs at "
            f"least {least} bytes ({shown_bytes(least)}{bound}) "
            f"for a training step, of which {fixed} "
            f"({shown_bytes(fixed)}) are parameters{', optimizer state' if optimizer_slots else ''}, deltas and "
            f"buffers no schedule removes; got {self.nbytes}",
            least)

    def shown(self):
        """How a refusal names the bound: as the user gave it."""
        return self.named or str(self)

    def __str__(self):
        return f"fit({format_bytes(self.nbytes)})"


class InfeasiblePlan(ValueError):
    """A budget below what any schedule needs; ``minimum_bytes`` says what would fit (for ``fit`` past some
    1,400 layers, where finding it takes too long, a lower bound of it, above the bytes refused)."""

    def __init__(self, message, minimum_bytes):
        super().__init__(message)
        self.minimum_bytes = minimum_bytes


# -- helpers ----------------------------------------------------------------------------------
def searched(search, *args):
    """``(tree, least, held)`` of ``search(*args)`` (a :class:`~fastckpt.planner.bounded.Found` or None), or
    None."""
    found = search(*args)
    return None if found is None else (found.tree, found.lower, found.held)


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


_CALL = re.compile(r"\s*([a-z_]+)\s*(?:\((.*)\))?\s*")


def parse_strategy(spec):
    """A :class:`Strategy` from itself or a spelling: ``"plain"``, ``"every_nth(2)"``,
    ``"segments(8)"``, ``"sqrt"``, ``"revolve(4)"``, ``"budget(24MiB)"``, ``"budget(24MiB, once)"``,
    ``"fit(1GiB)"``."""
    if isinstance(spec, Strategy):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"strategy must be a Strategy or a string such as 'sqrt', got {type(spec).__name__}")
    m = _CALL.fullmatch(spec)
    name = m.group(1) if m else None
    args = [a.strip() for a in m.group(2).split(",")] if m and m.group(2) is not None else []
    if name in ("plain", "sqrt") and not args:
        return Plain() if name == "plain" else Sqrt()
    if name in ("every_nth", "segments", "revolve") and len(args) == 1 and re.fullmatch(r"[+-]?[0-9]+", args[0]):
        return {"every_nth": EveryNth, "segments": Segments, "revolve": Revolve}[name](int(args[0]))
    if name == "budget" and len(args) in (1, 2):
        return Budget(args[0], *args[1:])
    if name == "fit" and len(args) == 1:
        return Fit(args[0])
    raise ValueError(f"unknown strategy {spec!r}; use plain, every_nth(n), segments(k), sqrt, "
                     "revolve(slots), budget(bytes[, once]) or fit(bytes)")


def parse_strategies(text):
    """Strategies from one comma-separated string, as every command and script takes them:
    ``"every_nth(2),sqrt,budget(24MiB, once)"`` (commas inside parentheses belong to the strategy)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [parse_strategy(p) for p in parts if p.strip()]
