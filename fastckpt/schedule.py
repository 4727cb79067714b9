"""Checkpoint schedules as trees, the op lists they run, and a workspace layout that meets their peak.

The chain has states ``a[0] .. a[L]`` (``a[0]`` is the caller's input, never in
the workspace) and ``L + 1`` reverse steps: step ``L`` is the loss, which reads
``a[L]`` and writes the output delta; step ``l < L`` back-propagates through
layer ``l`` and reads ``a[l]`` only (see ``kernels/dense.py``).

A schedule for the reverse steps ``s .. t-1``, given ``a[s]`` and the delta of
step ``t``, is a tree:

* ``None`` (a leaf, when ``t == s + 1``): run reverse step ``s``;
* ``(i, right, left)`` with ``s < i < t``: forward from ``a[s]`` to ``a[i]``,
  keep ``a[i]``, run ``right`` for ``i .. t-1``, drop ``a[i]``, then run
  ``left`` for ``s .. i-1``.

NOTE [ Recompute ]
Plain backprop is the tree that splits at ``s + 1`` everywhere: every state is
kept once it is computed.  The lab's rule keeps ``a[0], a[n], a[2n], ...``: its
tree splits at those checkpoints along the right spine, and each left child
recomputes its segment once, keeping everything inside it.  The last segment is
not recomputed: it is what the forward pass has just produced and the backward
pass needs first.  Trees whose left children split again recompute a layer
several times (revolve, budget).  Kept states form a stack: a state is pushed
when a split keeps it and popped when its right child is done.

NOTE [ Gradients in the arena ]
Layer ``l``'s gradient exists from its reverse step to the SGD update at the
end, and the reverse steps run from the top layer down.  So the gradients are
stacked from the top of the workspace downwards, layer ``L-1`` highest, and
end up contiguous in layer order, in the parameters' own layout: the SGD
kernel takes them as one flat array.  They take memory that activations no
longer need: plain backprop frees ``a[l]`` as it writes layer ``l``'s
gradient.  The arena is the largest sum, over the schedule, of the bytes the
activations use and the gradients already written.

The layout puts the stack at the bottom of the workspace.  While forwarding
from ``a[s]`` to ``a[i]`` the intermediate states alternate between the two
ends of the free region above the stack, ending with ``a[i]`` at its bottom,
where the stack continues.  Two neighbouring states sit at opposite ends, so
the region needs only the largest pair, and the workspace is exactly the peak
of live bytes: nothing is lost to fragmentation.
"""
from dataclasses import dataclass

import numpy as np

ALIGN_BYTES = 64  # every activation starts on a cache line

# OpenBLAS runs a GEMM on min(threads, m*n*k / 262144) threads (interface/gemm.c), so
# on two or more from m*n*k >= 524288; each multi-threaded call mallocs and frees a job
# table, 512 KiB in numpy's build (seen in memray's native traces, and measured at the
# threshold).  It is part of a step's peak.
BLAS_JOB_BYTES = 512 * 1024
BLAS_THREAD_MNK = 2 * 65536 * 4


@dataclass(frozen=True)
class Plan:
    """A schedule compiled for one net, batch size and dtype.

    Attributes
    ----------
    sizes, batch_size, dtype, strategy
        What the plan is for; ``strategy`` is its spelling, e.g. ``"revolve(4)"``.
    tree
        The schedule (see the module docstring).
    ops : tuple of (str, int)
        ``("fwd", l)`` computes ``a[l+1]``; ``("loss", L)`` starts the backward
        pass; ``("bwd", l)`` back-propagates through layer ``l``.  In order.
    reads, writes : tuple
        Per op, the workspace offset (elements) of the activation it reads
        (``None`` for the input) and, for ``fwd``, the one it writes.
    kept : tuple of int
        States held when the forward pass ends (the input ``0`` always).
    forward_counts : numpy.ndarray
        How many times each layer's forward is computed in one training step.
    workspace_elems : int
        Size of the activation workspace, in elements of ``dtype``: the peak of
        kept activations plus recompute buffers.
    optimizer_in_backward : bool
        Whether training applies SGD inside the backward pass, with no gradient buffers.
    blas_threads : int
        BLAS threads the prediction assumes.
    arena_elems : int
        Size of the workspace that holds the activations and, at its top, the
        gradients (NOTE [ Gradients in the arena ]); equal to ``workspace_elems``
        with the optimizer in backward.
    """

    sizes: tuple
    batch_size: int
    dtype: np.dtype
    strategy: str
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
    def extra_flop_fraction(self):
        """Recomputation FLOPs as a fraction of a plain training step's FLOPs."""
        fwd = forward_flops(self.sizes, self.batch_size)
        return float(np.dot(self.forward_counts - 1, fwd) / step_flops(self.sizes, self.batch_size))

    def bytes(self):
        """Predicted bytes of a network training with this plan, by part and in total.

        ``activation_memory`` is what a ``budget`` bounds: kept activations,
        recompute buffers and deltas.  ``total`` adds parameters, gradients
        (none with the optimizer in backward), the float64 scratch row and
        OpenBLAS's per-call job table when its GEMMs run threaded.
        ``shared_by_gradients`` (zero or negative) is the activation memory that
        gradients reuse once backprop has freed it.
        """
        s, b, item = self.sizes, self.batch_size, self.itemsize
        params = param_layout(s, item)[1] * item
        kept = sum(act_bytes(s, b, item, j) for j in self.kept if j > 0)
        workspace = self.workspace_elems * item
        grads = 0 if self.optimizer_in_backward else params
        parts = {
            "parameters": params,
            "gradients": grads,
            "kept_activations": kept,
            "recompute_buffers": workspace - kept,
            "shared_by_gradients": self.arena_elems * item - workspace - grads,
            "deltas": delta_elems(s, b) * item,
            "scratch": max(s[1:]) * 8,
            "blas": blas_bytes(s, b, self.blas_threads),
        }
        parts["activation_memory"] = workspace + parts["deltas"]
        parts["total"] = sum(v for k, v in parts.items() if k != "activation_memory")
        return parts


    def describe(self):
        """A few lines for people: what is kept, what is recomputed, and the bytes by part."""
        from .strategies import describe_sizes
        counts = self.forward_counts
        runs = ", ".join(f"{int((counts == k).sum())} layers x{k}" for k in sorted(set(counts.tolist())))
        order = self.recompute_order
        lines = [
            f"plan {self.strategy} for {describe_sizes(self.sizes)}, batch {self.batch_size}, "
            f"{self.dtype.name}{', SGD in backward' if self.optimizer_in_backward else ''}",
            f"kept after the forward pass: {_spans(self.kept)} ({len(self.kept) - 1} activations besides the input)",
            f"recomputed during backward, in order: {_spans(order, ordered=True) if order else 'nothing'}",
            f"forward computations per layer: {runs}",
            f"extra FLOPs: {100 * self.extra_flop_fraction:.1f}% of a plain step "
            f"(recompute factor {self.recompute_factor:.3f})",
            "predicted bytes:",
        ]
        for part, n in self.bytes().items():
            lines.append(f"  {part:<18} {n:>14,d}  {n / 2**20:10.3f} MiB")
        return "\n".join(lines)


def _spans(values, ordered=False):
    """``0-3 7 9-12``: runs of consecutive integers (in the given order when ``ordered``)."""
    values = list(values) if ordered else sorted(values)
    out, start = [], None
    for k, v in enumerate(values):
        if start is None:
            start = v
        if k + 1 == len(values) or values[k + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return " ".join(out)


def act_bytes(sizes, batch_size, itemsize, j):
    """Workspace bytes of state ``a[j]`` (j >= 1), rounded up to a cache line."""
    return -(-batch_size * sizes[j] * itemsize // ALIGN_BYTES) * ALIGN_BYTES


def state_bytes(sizes, batch_size, itemsize):
    """``w[j]`` = workspace bytes of ``a[j]`` for j = 0 .. L (``w[0] = 0``: the input)."""
    return [0] + [act_bytes(sizes, batch_size, itemsize, j) for j in range(1, len(sizes))]


def param_layout(sizes, itemsize):
    """Offsets (elements) of each layer's weights and bias in one flat buffer, and its length.

    Every block starts on a cache line; the gaps stay zero in parameters and gradients.
    """
    align = max(1, ALIGN_BYTES // itemsize)
    offsets, pos = [], 0
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        w_at = pos
        b_at = -(-(w_at + n_out * n_in) // align) * align
        pos = -(-(b_at + n_out) // align) * align
        offsets.append((w_at, b_at))
    return offsets, pos


def param_blocks(sizes, itemsize):
    """(k, 2) int64 [start, end) element ranges of every weight and bias in the flat layout."""
    offsets, _ = param_layout(sizes, itemsize)
    blocks = []
    for (w_at, b_at), n_in, n_out in zip(offsets, sizes[:-1], sizes[1:]):
        blocks += [(w_at, w_at + n_out * n_in), (b_at, b_at + n_out)]
    return np.array(blocks, dtype=np.int64)


def forward_flops(sizes, batch_size):
    """FLOPs of each layer's forward GEMM, as an array of length L."""
    return np.array([2 * batch_size * i * o for i, o in zip(sizes[:-1], sizes[1:])], dtype=np.float64)


def step_flops(sizes, batch_size):
    """GEMM FLOPs of one plain training step: forward, weight gradients, input deltas."""
    fwd = forward_flops(sizes, batch_size)
    return float(2 * fwd.sum() + fwd[1:].sum())


def delta_elems(sizes, batch_size):
    """Elements of the two ping-pong delta buffers (odd and even state indices)."""
    widths = sizes[1:]
    odd = max(widths[0::2])
    even = max(widths[1::2], default=0)
    return batch_size * (odd + even)


def blas_bytes(sizes, batch_size, threads):
    """Transient bytes OpenBLAS mallocs inside a step's GEMMs (its threaded job table)."""
    if threads <= 1:
        return 0
    threaded = any(batch_size * i * o >= BLAS_THREAD_MNK for i, o in zip(sizes[:-1], sizes[1:]))
    return BLAS_JOB_BYTES if threaded else 0


# -- trees ------------------------------------------------------------------------------------
def keep_all(s, t):
    """The tree that keeps every state from ``a[s+1]`` on: no recomputation."""
    tree = None
    for i in range(t - 1, s, -1):
        tree = (i, tree, None)
    return tree


def spine(checkpoints, n_layers):
    """Keep ``checkpoints`` (starting at 0) and the last segment; recompute each other segment once."""
    if list(checkpoints[:1]) != [0] or any(b <= a for a, b in zip(checkpoints, checkpoints[1:])) \
            or checkpoints[-1] > n_layers:
        raise ValueError(f"checkpoints must rise from 0 to at most {n_layers}, got {list(checkpoints)}")
    tree = keep_all(checkpoints[-1], n_layers + 1)
    for s, i in reversed(list(zip(checkpoints[:-1], checkpoints[1:]))):
        tree = (i, tree, keep_all(s, i))
    return tree


def forward_region(w, s, i):
    """Bytes above the stack while forwarding from a[s] to a[i]: the largest live pair."""
    region = w[s + 1]
    for j in range(s + 1, i):
        region = max(region, w[j] + w[j + 1])
    return region


def walk(tree, n_layers, w, grads=None):
    """Ops of a tree with the byte offset of every state they touch, and the peaks.

    Returns (ops, reads, writes, kept, peak, arena) with offsets in bytes; ``w``
    from :func:`state_bytes`.  ``peak`` is the activations' peak.  ``arena``
    also holds the gradients: ``grads[l]`` bytes for layer ``l`` from its
    reverse step to the end, stacked down from the arena's top (see NOTE
    [ Gradients in the arena ]).
    """
    after = _suffix_sums(grads or [0] * n_layers)          # after[t]: gradient bytes once step t is done
    ops, reads, writes = [], [], []
    kept = None
    peak = arena = 0
    stack = [(tree, 0, n_layers + 1, 0, None, ())]       # (tree, s, t, top, offset of a[s], held)
    while stack:
        node, s, t, top, at_s, held = stack.pop()
        if node is None:
            if t != s + 1:
                raise ValueError(f"a leaf must reverse one step, got steps {s}..{t - 1}")
            if s == n_layers:
                kept = (0,) + held
            arena = max(arena, top + after[s])
            ops.append(("loss" if s == n_layers else "bwd", s))
            reads.append(at_s)
            writes.append(None)
            continue
        i, right, left = node
        if not s < i < t:
            raise ValueError(f"split at {i} outside the steps {s}..{t - 1}")
        region = forward_region(w, s, i)
        peak = max(peak, top + region)
        arena = max(arena, top + region + after[t])
        src = at_s
        for j in range(s + 1, i + 1):                    # a[j]: low end if (i - j) is even
            dst = top if (i - j) % 2 == 0 else top + region - w[j]
            ops.append(("fwd", j - 1))
            reads.append(src)
            writes.append(dst)
            src = dst
        stack.append((left, s, i, top, at_s, held))
        stack.append((right, i, t, top + w[i], top, held + (i,)))
    return ops, reads, writes, kept, peak, arena


def _suffix_sums(grads):
    """``out[t]`` = bytes of the gradients of layers t .. L-1, for t = 0 .. L+1."""
    out = [0] * (len(grads) + 2)
    for t in range(len(grads) - 1, -1, -1):
        out[t] = out[t + 1] + grads[t]
    return out


def grad_bytes(sizes, itemsize):
    """Bytes of each layer's block (weights then bias) in the flat parameter layout."""
    offsets, total = param_layout(sizes, itemsize)
    starts = [w_at for w_at, _ in offsets] + [total]
    return [(b - a) * itemsize for a, b in zip(starts[:-1], starts[1:])]


def compile_plan(sizes, batch_size, dtype, tree, strategy, *, optimizer_in_backward=False,
                 blas_threads=1):
    """Lay a tree out for one batch size and dtype."""
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
    return Plan(sizes, int(batch_size), dtype, strategy, tree, tuple(ops), reads, writes, kept,
                counts, peak // item, bool(optimizer_in_backward), int(blas_threads), arena // item)


def tree_cost(tree, n_layers, flops):
    """Forward FLOPs a tree computes (the first forward pass included), and its stack depth."""
    cost, depth = 0.0, 0
    stack = [(tree, 0, 0)]
    while stack:
        node, s, d = stack.pop()
        depth = max(depth, d)
        if node is not None:
            i, right, left = node
            cost += sum(flops[s:i])
            stack.append((right, i, d + 1))
            stack.append((left, s, d))
    return cost, depth
