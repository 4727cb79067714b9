"""The parameter layout: every layer's weights and bias in one flat buffer, each block on a cache line.

Parameters (:class:`~fastckpt.core.params.Parameters`), gradients and every
optimizer's state share this layout, so one kernel call updates them all and
a gradient buffer is a flat array the SGD kernel takes whole.
"""
import numpy as np

ALIGN_BYTES = 64  # every weight and bias block, and every activation in a workspace, starts on a cache line


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


def layer_views(flat, sizes):
    """(n_out, n_in) weight and (n_out,) bias views of a flat buffer in the parameter layout."""
    offsets, _ = param_layout(sizes, flat.itemsize)
    w = [flat[w_at:w_at + o * i].reshape(o, i) for (w_at, _), i, o in zip(offsets, sizes[:-1], sizes[1:])]
    b = [flat[b_at:b_at + o] for (_, b_at), o in zip(offsets, sizes[1:])]
    return w, b


def param_blocks(sizes, itemsize):
    """(k, 2) int64 [start, end) element ranges of every weight and bias in the flat layout."""
    offsets, _ = param_layout(sizes, itemsize)
    blocks = []
    for (w_at, b_at), n_in, n_out in zip(offsets, sizes[:-1], sizes[1:]):
        blocks += [(w_at, w_at + n_out * n_in), (b_at, b_at + n_out)]
    return np.array(blocks, dtype=np.int64)


def grad_bytes(sizes, itemsize):
    """Bytes of each layer's block (weights then bias) in the flat parameter layout."""
    offsets, total = param_layout(sizes, itemsize)
    starts = [w_at for w_at, _ in offsets] + [total]
    return [(b - a) * itemsize for a, b in zip(starts[:-1], starts[1:])]


def column_widths(n, shards):
    """The widths ``np.array_split`` gives ``n`` units over ``shards``."""
    q, extra = divmod(n, shards)
    return [q + (t < extra) for t in range(shards)]


def tensor_split(sizes, shards, shard, first=0):
    """One tensor shard's part of a net of ``sizes`` split ``shards`` ways: ``(local, row_split, slices)``.

    Megatron-LM's column/row pairs counted from the output: layer ``l`` of ``L`` is *row-split* when
    ``L - 1 - l`` is even (the shard holds ``W[:, cols]`` and the whole bias; its partial products are
    summed over the shards), else *column-split* (``W[rows, :]`` and ``b[rows]``; its output slice is
    whole).  Units are split as ``np.array_split`` splits them.  ``local`` are the widths of the states the
    shard holds (a split state's slice, a whole state whole), so the shard's parameters are
    ``Parameters(local)`` and its plan one of ``local``; ``slices[l]`` is ``((r0, r1), (c0, c1))`` of layer
    ``l``'s weight.  A ValueError names a layer too narrow for the shards (counting layers from
    ``first``: ``sizes`` a pipeline stage's part of a net).
    """
    n_layers = len(sizes) - 1
    row_split = tuple((n_layers - 1 - layer) % 2 == 0 for layer in range(n_layers))
    slices, local = [], [int(sizes[0])]
    for layer, row in enumerate(row_split):
        k = layer if row else layer + 1                   # the width this layer splits
        if sizes[k] < shards:
            raise ValueError(f"layer {layer + first} splits its {'inputs' if row else 'outputs'}, sizes[{k + first}] "
                             f"= {sizes[k]} units, over {shards} ranks, but every rank needs at least one; use at "
                             f"most {sizes[k]} rank{'s' * (sizes[k] > 1)} or widen that layer")
        widths = column_widths(int(sizes[k]), shards)
        part = (sum(widths[:shard]), sum(widths[:shard + 1]))
        slices.append(((0, int(sizes[k + 1])), part) if row else (part, (0, int(sizes[k - 1]))))
        if row and layer == 0:
            local[0] = part[1] - part[0]
        local.append(int(sizes[layer + 1]) if row else part[1] - part[0])
    return tuple(local), row_split, slices
