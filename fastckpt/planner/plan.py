"""A plan: one training step of one net, batch size and dtype, compiled from a strategy before any work.

:func:`plan` asks a :class:`~fastckpt.planner.strategies.Strategy` for its schedule
tree (:mod:`fastckpt.planner.trees`), walks it into the op list and workspace offsets
the engine runs, and predicts the step's bytes by part.
"""
from dataclasses import dataclass, field

import numpy as np

from fastckpt.core.checks import check_dtype, check_positive_int, check_sizes
from fastckpt.core.layout import grad_bytes, param_layout, tensor_split
from fastckpt.core.optimizers import SGD, parse_optimizer
from fastckpt.kernels import blas_threads as current_blas_threads

from .costs import (
    act_bytes,
    blas_bytes,
    delta_elems,
    describe_sizes,
    forward_flops,
    gradient_bytes,
    scratch_bytes,
    state_bytes,
    step_flops,
    sum_bytes,
)
from .search import PlanTooCostly
from .strategies import parse_strategy
from .trees import walk
from .words import describe


@dataclass(frozen=True, eq=False)
class Plan:
    """A schedule compiled for one net, batch size and dtype.

    Two plans are equal (and hash alike) when they are for the same sizes,
    batch size, dtype, strategy, update mode and BLAS threads and run the same
    tree: everything else is derived from those.

    Attributes
    ----------
    sizes, batch_size, dtype
        What the plan is for.
    strategy : Strategy
        The checked strategy object it was made from; ``str(plan.strategy)``
        is its spelling, e.g. ``"revolve(4)"``.
    tree
        The schedule (see :mod:`fastckpt.planner.trees`).
    ops : tuple of (str, int)
        ``("fwd", l)`` computes ``a[l+1]``; ``("loss", L)`` starts the backward
        pass; ``("bwd", l)`` back-propagates through layer ``l``.  In order.
    reads, writes : tuple
        Per op, the workspace offset (elements) of the activation it reads
        (``None`` for the input) and, for ``fwd``, the one it writes.
    kept : tuple of int
        States held when the forward pass ends (the input ``0`` always).
    forward_counts : numpy.ndarray
        Read-only: how many times each layer's forward is computed in one training step.
    workspace_elems : int
        Size of the activation workspace, in elements of ``dtype``: the peak of
        kept activations plus recompute buffers.
    optimizer_in_backward : bool
        Whether training applies the optimizer inside the backward pass, layer by layer: no
        gradient buffers with SGD, one layer's with an optimizer that keeps state.
    optimizer : Optimizer
        The update rule (:mod:`fastckpt.core.optimizers`), whose state the bytes count.
    blas_threads : int
        BLAS threads the prediction assumes.
    arena_elems : int
        Size of the workspace that holds the activations and, at its top, the
        gradients (NOTE [ Gradients in the arena ]); equal to ``workspace_elems``
        with the optimizer in backward.
    least_recompute : float or None
        For a strategy that searches (``revolve``, ``budget``, ``fit``): recompute FLOPs that no schedule
        it searched could do with less, certified by the search.  Equal to the plan's own when the plan
        is optimal; less when the search stopped at its step limit with a bound (:attr:`optimality_gap`).
        None for the fixed strategies.
    row_split : tuple of bool
        For a tensor shard (:func:`shard_plan`), per layer whether it is row-split
        (:func:`fastckpt.core.layout.tensor_split`); ``sizes`` are then the shard's own widths.
        Empty for a net that is not split.
    table_bytes : int
        At most the bytes the strategy's search held at once while it planned (``revolve``'s tables exactly,
        ``budget``'s and ``fit``'s fronts as they grew); 0 for the fixed strategies.  Not part of the step:
        the whole run counts it (NOTE [ The whole run ] in :mod:`fastckpt.planner.run`).
    """

    sizes: tuple
    batch_size: int
    dtype: np.dtype
    strategy: object
    tree: object
    ops: tuple
    reads: tuple
    writes: tuple
    kept: tuple
    forward_counts: np.ndarray
    workspace_elems: int
    optimizer_in_backward: bool = False
    blas_threads: int = 1
    arena_elems: int = 0
    optimizer: object = field(default_factory=SGD)
    least_recompute: object = None
    row_split: tuple = ()
    table_bytes: int = 0

    def _key(self):
        return (self.sizes, self.batch_size, self.dtype, str(self.strategy), self.optimizer_in_backward,
                self.blas_threads, self.tree, str(self.optimizer), self.row_split)

    def __eq__(self, other):
        return isinstance(other, Plan) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return (f"Plan({describe_sizes(self.sizes)}, batch_size={self.batch_size}, dtype={self.dtype.name}, "
                f"strategy={self.strategy}{', optimizer_in_backward=True' if self.optimizer_in_backward else ''}"
                f"{'' if self.optimizer.slots == 0 else f', optimizer={self.optimizer}'})")

    @property
    def grad_offset(self):
        """Where the flat gradients start in the arena (elements); they run to its end."""
        return self.arena_elems - (0 if self.optimizer_in_backward else param_layout(self.sizes, self.itemsize)[1])

    @property
    def n_layers(self):
        return len(self.sizes) - 1

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def recompute_order(self):
        """Layers whose forward runs again during the backward pass, in order."""
        start = self.ops.index(("loss", self.n_layers))
        return tuple(layer for kind, layer in self.ops[start:] if kind == "fwd")

    @property
    def recompute_factor(self):
        """Forward FLOPs of a step divided by those of one forward pass."""
        fwd = forward_flops(self.sizes, self.batch_size)
        return float(np.dot(self.forward_counts, fwd) / fwd.sum())

    @property
    def recompute_flops(self):
        """Forward FLOPs of a step beyond one forward pass."""
        fwd = forward_flops(self.sizes, self.batch_size)
        return float(np.dot(self.forward_counts - 1, fwd))

    @property
    def optimality_gap(self):
        """How much more this plan recomputes than the least (:attr:`least_recompute`), as a fraction of
        that least: 0.0 when optimal, ``inf`` when the least is 0 and this plan recomputes; None when the
        strategy does not search."""
        if self.least_recompute is None:
            return None
        extra = max(0.0, self.recompute_flops - self.least_recompute)
        return 0.0 if extra == 0 else extra / self.least_recompute if self.least_recompute > 0 else float("inf")

    @property
    def extra_flop_fraction(self):
        """Recomputation FLOPs as a fraction of a plain training step's FLOPs."""
        fwd = forward_flops(self.sizes, self.batch_size)
        return float(np.dot(self.forward_counts - 1, fwd) / step_flops(self.sizes, self.batch_size))

    def bytes(self):
        """Predicted bytes of a network training with this plan, by part and in total.

        ``activation_memory`` is what a ``budget`` bounds: kept activations,
        recompute buffers and deltas.  ``total`` adds parameters, gradients
        (none with SGD in backward, the largest layer's with another optimizer in
        backward), the optimizer's state (velocity,
        or Adam's ``m`` and ``v``: buffers the size of the parameters), the float64 scratch row and
        OpenBLAS's per-call job table when its GEMMs run threaded.
        ``shared_by_gradients`` (zero or negative) is the activation memory that
        gradients reuse once backprop has freed it.
        """
        s, b, item = self.sizes, self.batch_size, self.itemsize
        params = param_layout(s, item)[1] * item
        kept = sum(act_bytes(s, b, item, j) for j in self.kept if j > 0)
        workspace = self.workspace_elems * item
        grads = gradient_bytes(s, item, self.optimizer_in_backward, self.optimizer.slots)
        parts = {
            "parameters": params,
            "gradients": grads,
            "optimizer_state": self.optimizer.slots * params,
            "kept_activations": kept,
            "recompute_buffers": workspace - kept,
            "shared_by_gradients": self.arena_elems * item - workspace - (0 if self.optimizer_in_backward else grads),
            "deltas": delta_elems(s, b) * item,
            "scratch": scratch_bytes(s),
            "blas": blas_bytes(s, b, self.blas_threads),
        }
        if self.row_split:                                    # a tensor shard: MPI's temporary of its sums
            parts["sums"] = sum_bytes(s, self.row_split, b, item)
        parts["activation_memory"] = workspace + parts["deltas"]
        parts["total"] = sum(v for k, v in parts.items() if k != "activation_memory")
        return parts

    def describe(self):
        """A few lines for people: what is kept, what is recomputed, and the bytes by part."""
        return describe(self)


def compile_plan(sizes, batch_size, dtype, tree, strategy, *, optimizer_in_backward=False,
                 blas_threads=1, optimizer=None, row_split=(), least_flops=None, table_bytes=0):
    """Lay a tree out for one batch size and dtype; ``least_flops``: the search's certificate, if any
    (:attr:`Plan.least_recompute`); ``table_bytes``: what the search held (:attr:`Plan.table_bytes`)."""
    sizes = tuple(int(s) for s in sizes)
    dtype = np.dtype(dtype)
    n_layers = len(sizes) - 1
    w = state_bytes(sizes, batch_size, dtype.itemsize)
    grads = None if optimizer_in_backward else grad_bytes(sizes, dtype.itemsize)
    ops, reads, writes, kept, peak, arena = walk(tree, n_layers, w, grads)
    item = dtype.itemsize
    reads = tuple(None if r is None else r // item for r in reads)
    writes = tuple(None if r is None else r // item for r in writes)
    counts = np.zeros(n_layers, dtype=np.int64)
    for kind, layer in ops:
        if kind == "fwd":
            counts[layer] += 1
    counts.setflags(write=False)
    one_pass = float(forward_flops(sizes, batch_size).sum())
    least = None if least_flops is None else max(0.0, float(least_flops) - one_pass)
    return Plan(sizes, int(batch_size), dtype, strategy, tree, tuple(ops), reads, writes, kept,
                counts, peak // item, bool(optimizer_in_backward), int(blas_threads), arena // item,
                SGD() if optimizer is None else parse_optimizer(optimizer), least_recompute=least,
                row_split=tuple(bool(r) for r in row_split), table_bytes=int(table_bytes))


def reshard(plan, sizes):
    """``plan``'s tree laid out for ``sizes``, another tensor shard's widths: the same ops, and that shard's
    offsets and bytes (:func:`shard_plan`); no certificate (the search ran on the widest shard)."""
    return compile_plan(sizes, plan.batch_size, plan.dtype, plan.tree, plan.strategy,
                        optimizer_in_backward=plan.optimizer_in_backward, blas_threads=plan.blas_threads,
                        optimizer=plan.optimizer, row_split=plan.row_split, table_bytes=plan.table_bytes)


def plan(sizes, batch_size, dtype=np.float64, strategy="plain", *, optimizer_in_backward=False,
         blas_threads=None, optimizer="sgd", row_split=()):
    """The :class:`Plan` of one training step, before any work.

    Parameters
    ----------
    sizes : sequence of int
        Units per layer, input first.
    batch_size : int
        Samples per step; buffers are sized for it.
    dtype : {numpy.float64, numpy.float32}, optional
    strategy : Strategy or str, optional
        ``"plain"``, ``"every_nth(n)"``, ``"segments(k)"``, ``"sqrt"``,
        ``"revolve(slots)"``, ``"budget(bytes)"``, ``"budget(bytes, once)"`` (a bound on
        activation memory) or ``"fit(bytes)"`` (a bound on the whole step's ``total``),
        or the objects of the same names in :mod:`fastckpt.planner.strategies`.
    optimizer_in_backward : bool, optional
        Plan for the optimizer applied inside the backward pass, each layer as soon as its
        gradient is final: no gradient buffers with SGD, the largest layer's with another.
    blas_threads : int, optional
        BLAS threads to plan for; default: what numpy's OpenBLAS uses now.
    optimizer : str or Optimizer, optional
        The update rule (``"sgd"``, ``"momentum"``, ``"adam"``, ``"adamw"``, or an object of
        :mod:`fastckpt.optimizers`); its state is the ``optimizer_state`` part of the bytes,
        and ``fit(bytes)`` counts it.
    row_split : sequence of bool, optional
        ``sizes`` are a tensor shard's widths and these its row-split layers
        (:func:`shard_plan` makes such plans); its sums' buffer is then a part of the bytes.

    Raises
    ------
    InfeasiblePlan
        When a ``budget`` or ``fit`` is below the least any schedule needs; the message
        and ``minimum_bytes`` give that least.
    PlanTooCostly
        When a search (``revolve``, ``budget``, ``fit``) would need more memory or time
        than planning may take (NOTE [ Planning bounds ] in :mod:`fastckpt.planner.search`).
    """
    sizes = check_sizes(sizes)
    batch_size = check_positive_int(batch_size, "batch_size")
    dtype = check_dtype(dtype)
    strategy = parse_strategy(strategy)
    optimizer = parse_optimizer(optimizer)
    threads = current_blas_threads() if blas_threads is None else check_positive_int(blas_threads, "blas_threads")
    sums = sum_bytes(sizes, row_split, batch_size, dtype.itemsize)
    try:
        tree, least, held = strategy.step_search(sizes, batch_size, dtype.itemsize, bool(optimizer_in_backward),
                                           threads, optimizer.slots, sums)
    except PlanTooCostly as exc:
        raise PlanTooCostly(f"{strategy}: {exc}") from None
    return compile_plan(sizes, batch_size, dtype, tree, strategy, optimizer_in_backward=optimizer_in_backward,
                        blas_threads=threads, optimizer=optimizer, row_split=row_split,
                        least_flops=least, table_bytes=held)


def shard_plan(sizes, batch_size, dtype=np.float64, strategy="plain", *, shards, shard, **options):
    """The :class:`Plan` of tensor shard ``shard`` of ``shards`` of the net ``sizes`` (whole widths).

    Its ``sizes`` are the shard's widths (:func:`~fastckpt.core.layout.tensor_split`).  Every shard runs
    the same ops, since a recomputed row-split layer sums over all of them again: the strategy chooses
    on the widest shard, shard 0 (under ``fit(bytes)`` every shard then fits, none holding more), and
    the others lay that tree out for their own widths (:func:`reshard`).  ``options`` as for :func:`plan`.
    """
    widest, row_split, _ = tensor_split(check_sizes(sizes), shards, 0)
    chosen = plan(widest, batch_size, dtype, strategy, row_split=row_split, **options)
    return chosen if shard == 0 else reshard(chosen, tensor_split(sizes, shards, shard)[0])
