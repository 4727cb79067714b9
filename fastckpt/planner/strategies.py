"""Checkpoint strategies: each turns a net, batch size and dtype into a schedule tree.

``plain``, ``every_nth(n)``, ``segments(k)`` and ``sqrt`` keep a set of
checkpoints and recompute each segment between them at most once.
``revolve(slots)`` and ``budget(bytes)`` search the schedule trees of
:mod:`fastckpt.planner.trees` by dynamic programming (:mod:`fastckpt.planner.search`).
"""
import math
import re
from fractions import Fraction

import numpy as np

from fastckpt.core.layout import grad_bytes, param_layout
from fastckpt.core.resources import shown_bytes

from .costs import blas_bytes, delta_elems, describe_sizes, forward_flops, gradient_bytes, scratch_bytes, state_bytes
from .search import least_peak, multi_front, once_front, revolve_tree
from .trees import keep_all, spine

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_TOO_MANY = 2**63                             # bytes no plan could count past


class Strategy:
    """Base class: ``tree(sizes, batch_size, itemsize)`` returns the schedule tree."""

    def tree(self, sizes, batch_size, itemsize):
        raise NotImplementedError

    def step_tree(self, sizes, batch_size, itemsize, optimizer_in_backward=False, blas_threads=1, optimizer_slots=0,
                  extra_bytes=0):
        """The tree for a whole training step: :meth:`tree`, unless the strategy bounds the
        step's total bytes (:class:`Fit`), which depend on the update mode, BLAS threads,
        the optimizer's state (``optimizer_slots`` buffers the size of the parameters) and
        ``extra_bytes`` the step holds besides (a tensor shard's sums)."""
        return self.tree(sizes, batch_size, itemsize)

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
        search = once_front if self.recompute == "once" else multi_front
        front = search(flops, w, self.nbytes - fixed)
        if not front.peaks:
            least = fixed + least_peak(search, flops, w)
            raise InfeasiblePlan(
                f"{self}: {describe_sizes(sizes)} at batch {batch_size} in float{8 * itemsize} needs at "
                f"least {least} bytes ({shown_bytes(least)}) of activation memory, of which {fixed} "
                f"are the two delta buffers; got {self.nbytes}", least)
        return front.tree(len(front.peaks) - 1)

    def __str__(self):
        spelled = format_bytes(self.nbytes)
        return f"budget({spelled})" if self.recompute == "multi" else f"budget({spelled}, once)"


class Fit(Strategy):
    """The least recomputation whose whole training step is predicted to fit ``nbytes``.

    Where ``budget(bytes)`` bounds the activation memory only, ``fit(bytes)``
    bounds the plan's predicted ``total``: parameters, gradients, the optimizer's
    state, activations, deltas, scratch and BLAS's buffers.  memray measures that total to within
    the few tens of KiB of Python objects (views, the op list) a net and its
    plan add, so leave that much room when the bound is a hard one.
    It does not count the Python interpreter and libraries nor the training
    data.  The search is ``budget``'s, over all schedule trees, with each
    gradient's bytes counted from the step that writes it (NOTE [ Gradients
    in the arena ]).
    """

    def __init__(self, nbytes):
        self.nbytes = parse_bytes(nbytes, "fit(bytes)")

    def tree(self, sizes, batch_size, itemsize):
        return self.step_tree(sizes, batch_size, itemsize)

    def step_tree(self, sizes, batch_size, itemsize, optimizer_in_backward=False, blas_threads=1, optimizer_slots=0,
                  extra_bytes=0):
        fixed = (extra_bytes + (1 + optimizer_slots) * param_layout(sizes, itemsize)[1] * itemsize
                 + (gradient_bytes(sizes, itemsize, True, optimizer_slots) if optimizer_in_backward else 0)
                 + delta_elems(sizes, batch_size) * itemsize + scratch_bytes(sizes)
                 + blas_bytes(sizes, batch_size, blas_threads))
        w = state_bytes(sizes, batch_size, itemsize)
        grads = None if optimizer_in_backward else grad_bytes(sizes, itemsize)
        flops = forward_flops(sizes, batch_size)
        room = self.nbytes - fixed
        front = multi_front(flops, w, room, grads) if room > 0 else None
        if front is not None and front.peaks:                     # peaks: the arena with the gradients
            return front.tree(len(front.peaks) - 1)
        least = fixed + least_peak(multi_front, flops, w, grads=grads)
        raise InfeasiblePlan(
            f"{self}: {describe_sizes(sizes)} at batch {batch_size} in float{8 * itemsize} needs at least "
            f"{least} bytes ({shown_bytes(least)}) for a training step, of which {fixed} "
            f"({shown_bytes(fixed)}) are parameters{', optimizer state' if optimizer_slots else ''}, deltas and "
            f"buffers no schedule removes; got {self.nbytes}",
            least)

    def __str__(self):
        return f"fit({format_bytes(self.nbytes)})"


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
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value, flags=re.ASCII)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{where}: cannot read {value!r} as bytes (e.g. 24MiB, 1.5GB, 4096)")
        if len(m.group(1)) > 40:                      # more digits than any count of bytes (and than int() takes)
            raise ValueError(f"{where}: a number of {len(m.group(1))} digits is too many bytes to count")
        exact = Fraction(m.group(1)) * _UNITS[m.group(2).lower()]        # no float rounding
        if exact >= _TOO_MANY:
            shown = m.group(0).strip()
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise ValueError(f"{where}: {shown!r} is too many bytes to count")
        if exact.denominator != 1:
            raise ValueError(f"{where}: {m.group(0).strip()!r} is not a whole number of bytes")
        value = int(exact)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{where}: bytes must be a positive integer, got {value!r}")
    return int(value)


def format_bytes(n):
    """``25165824`` -> ``"24MiB"`` when exact, else the plain integer."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if n % _UNITS[unit.lower()] == 0:
            return f"{n // _UNITS[unit.lower()]}{unit}"
    return str(n)


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
    if name in ("every_nth", "segments", "revolve") and len(args) == 1 and re.fullmatch(r"[0-9]+", args[0]):
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
