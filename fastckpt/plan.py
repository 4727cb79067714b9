"""Checkpoint schedules as plans: which activations live where, and when.

A schedule is a list of ops over the chain of layers ``0 .. L-1``:
``("fwd", l)`` computes activation ``a[l+1]`` from ``a[l]``; ``("bwd", l)``
back-propagates through layer ``l`` and reads ``a[l]`` and ``a[l+1]``.  Each
read takes the most recent copy of that activation, so lifetimes, and with them
memory, follow from the op list alone: plain backprop is the schedule that
never recomputes.  ``a[0]`` is the caller's input and takes no workspace.

NOTE [ Recompute ]
The lab rule keeps ``a[0], a[n], a[2n], ...`` after the forward pass.  The
backward pass walks the segments between checkpoints in reverse; for each it
recomputes the activations strictly inside the segment from the checkpoint
below, back-propagates through the segment, and the recomputed copies die as
soon as the layer below has used them.  The last segment is not recomputed:
its activations are the ones the forward pass has just produced and the
backward pass needs first, so keeping them costs no more than the peak of
recomputing them would.  Every layer is therefore computed at most twice.
"""
from dataclasses import dataclass

import numpy as np

ALIGN_BYTES = 64  # every activation starts on a cache line


@dataclass(frozen=True)
class Plan:
    """A schedule compiled for one net, batch size and dtype.

    Attributes
    ----------
    sizes, batch_size, dtype, strategy
        What the plan is for.
    ops : tuple of (str, int)
        The schedule, in execution order.
    reads, writes : tuple
        Per op, the workspace offset (in elements) of the activations it reads
        (``None`` for the input) and writes.
    kept : tuple of int
        Activations alive when the forward pass ends (``0``, the input, always).
    forward_counts : numpy.ndarray
        How many times each layer's forward is computed in one training step.
    workspace_elems : int
        Size of the activation workspace, in elements of ``dtype``.
    """

    sizes: tuple
    batch_size: int
    dtype: np.dtype
    strategy: str
    ops: tuple
    reads: tuple
    writes: tuple
    kept: tuple
    forward_counts: np.ndarray
    workspace_elems: int

    @property
    def n_layers(self):
        return len(self.sizes) - 1

    @property
    def itemsize(self):
        return self.dtype.itemsize

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
        """Predicted bytes by part, and in total, of a network training with this plan."""
        s, b, item = self.sizes, self.batch_size, self.itemsize
        params = param_layout(s, item)[1] * item
        parts = {
            "parameters": params,
            "gradients": params,
            "activations": self.workspace_elems * item,
            "deltas": delta_elems(s, b) * item,
            "scratch": max(s[1:]) * 8,
        }
        parts["total"] = sum(parts.values())
        return parts


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


def forward_flops(sizes, batch_size):
    """FLOPs of each layer's forward GEMM, as an array of length L."""
    return np.array([2 * batch_size * i * o for i, o in zip(sizes[:-1], sizes[1:])], dtype=np.float64)


def step_flops(sizes, batch_size):
    """GEMM FLOPs of one plain training step: forward, weight gradients, input deltas."""
    fwd = forward_flops(sizes, batch_size)
    return float(2 * fwd.sum() + fwd[1:].sum())


def delta_elems(sizes, batch_size):
    """Elements of the two ping-pong delta buffers (odd and even activation indices)."""
    widths = sizes[1:]
    odd = max(widths[0::2])
    even = max(widths[1::2], default=0)
    return batch_size * (odd + even)


def lab_checkpoints(n_layers, every_nth):
    """The lab's checkpoint layer indices: 0, n, 2n, ... below ``n_layers``."""
    return list(range(0, n_layers, every_nth))


def segment_schedule(n_layers, checkpoints):
    """Ops that keep ``checkpoints`` and recompute each other segment at most once."""
    ops = [("fwd", layer) for layer in range(n_layers)]
    last = checkpoints[-1]
    ops += [("bwd", layer) for layer in range(n_layers - 1, last - 1, -1)]
    for start, end in reversed(list(zip(checkpoints[:-1], checkpoints[1:]))):
        ops += [("fwd", layer) for layer in range(start, end - 1)]
        ops += [("bwd", layer) for layer in range(end - 1, start - 1, -1)]
    return ops


def compile_plan(sizes, batch_size, dtype, ops, strategy):
    """Check a schedule, derive lifetimes from its reads, and lay the workspace out."""
    sizes = tuple(int(s) for s in sizes)
    dtype = np.dtype(dtype)
    n_layers = len(sizes) - 1
    _check_schedule(ops, n_layers)
    # Lifetimes: each fwd creates a copy of a[l+1]; it lives until its last read.
    current = {0: None}                         # activation index -> copy id (None = input)
    copies = []                                 # [activation index, created at, last read]
    op_reads, op_writes = [], []
    for t, (kind, layer) in enumerate(ops):
        if kind == "fwd":
            src = current[layer]
            if src is not None:
                copies[src][2] = t
            copies.append([layer + 1, t, t])
            current[layer + 1] = len(copies) - 1
            op_reads.append((src,))
            op_writes.append(len(copies) - 1)
        else:
            if layer + 1 not in current:
                raise ValueError(f"schedule reads a[{layer + 1}] before computing it")
            pair = (current[layer], current[layer + 1])
            for c in pair:
                if c is not None:
                    copies[c][2] = t
            op_reads.append(pair)
            op_writes.append(None)
    n_fwd = n_layers
    kept = (0,) + tuple(sorted(copies[c][0] for c in range(len(copies))
                               if copies[c][1] < n_fwd and copies[c][2] >= n_fwd))
    offsets, total = _first_fit(copies, sizes, batch_size, dtype.itemsize)
    reads = tuple(tuple(None if c is None else offsets[c] for c in r) for r in op_reads)
    writes = tuple(None if c is None else offsets[c] for c in op_writes)
    counts = np.zeros(n_layers, dtype=np.int64)
    for kind, layer in ops:
        if kind == "fwd":
            counts[layer] += 1
    return Plan(sizes, int(batch_size), dtype, strategy, tuple(ops), reads, writes, kept, counts, total)


def _check_schedule(ops, n_layers):
    backward = [layer for kind, layer in ops if kind == "bwd"]
    if backward != list(range(n_layers - 1, -1, -1)):
        raise ValueError(f"schedule must back-propagate each layer once, top to bottom, got {backward}")
    for kind, layer in ops:
        if kind not in ("fwd", "bwd") or not 0 <= layer < n_layers:
            raise ValueError(f"bad op {(kind, layer)!r} for {n_layers} layers")


def _first_fit(copies, sizes, batch_size, itemsize):
    """Offsets (elements) so that copies alive at the same time never overlap."""
    align = max(1, ALIGN_BYTES // itemsize)
    placed = []                                 # (start, end, born, dies)
    offsets = []
    total = 0
    for act, born, dies in copies:
        n = batch_size * sizes[act]
        busy = sorted((s, e) for s, e, b, d in placed if b <= dies and born <= d)
        off = 0
        for s, e in busy:
            if off + n <= s:
                break
            off = max(off, -(-e // align) * align)
        placed.append((off, off + n, born, dies))
        offsets.append(off)
        total = max(total, off + n)
    return offsets, total
