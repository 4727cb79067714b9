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


def layout_array(sizes, itemsize):
    """(L, 2) int64 offsets of each layer's weights and bias, as the step kernel takes them."""
    return np.array(param_layout(sizes, itemsize)[0], dtype=np.int64).reshape(-1, 2)


def grad_bytes(sizes, itemsize):
    """Bytes of each layer's block (weights then bias) in the flat parameter layout."""
    offsets, total = param_layout(sizes, itemsize)
    starts = [w_at for w_at, _ in offsets] + [total]
    return [(b - a) * itemsize for a, b in zip(starts[:-1], starts[1:])]
