"""The lab's initial parameters: ``np.random.randn`` draws, every bias then every weight, in one place.

The lab draws ``biases = [randn(n_out, 1) ...]`` and then
``weights = [randn(n_out, n_in) ...]``, layer by layer.  Every net, pipeline
stage and tensor-parallel shard draws that same stream and keeps its own part,
so from one ``np.random.seed`` they all start from the lab's weights.

Drawing is done in chunks of at most :data:`DRAW_CHUNK` numbers (whole rows
when only some columns are kept): the legacy generator keeps its spare normal
between calls, so the numbers are those of one big draw, without a float64
temporary the size of the largest layer.
"""
import numpy as np

DRAW_CHUNK = 32768  # normals drawn per call


def lab_blocks(sizes):
    """The lab's draw order: ``(kind, layer, (n_rows, n_cols))`` for every bias, then every weight."""
    pairs = list(zip(sizes[:-1], sizes[1:]))
    return ([("biases", layer, (1, n_out)) for layer, (_, n_out) in enumerate(pairs)]
            + [("weights", layer, (n_out, n_in)) for layer, (n_in, n_out) in enumerate(pairs)])


def draw_lab(sizes, keep):
    """Draw the lab's initial parameters of ``sizes`` from ``np.random`` in its order.

    ``keep(kind, layer)`` returns ``None`` (the block is drawn and dropped) or
    ``(out, rows, cols)``: the part ``block[rows[0]:rows[1], cols[0]:cols[1]]``
    of the (n_rows, n_cols) block is written into ``out`` of that shape.  A
    bias is a (1, n_out) block.
    """
    for kind, layer, (n_rows, n_cols) in lab_blocks(sizes):
        kept = keep(kind, layer)
        if kept is None:
            _skip(n_rows * n_cols)
        else:
            out, rows, cols = kept
            draw_block(n_rows, n_cols, out, rows, cols)


def whole(out):
    """``keep``'s answer for a block kept whole in ``out`` (n_rows, n_cols)."""
    return out, (0, out.shape[0]), (0, out.shape[1])


def draw_block(n_rows, n_cols, out, rows, cols):
    """Draw an (n_rows, n_cols) block of ``np.random.randn`` in C order, keeping ``[rows, cols]`` in ``out``."""
    (r0, r1), (c0, c1) = rows, cols
    if (c0, c1) == (0, n_cols):                   # whole rows: the kept part is one contiguous run
        flat = out.reshape(-1)
        _skip(r0 * n_cols)
        for i in range(0, flat.shape[0], DRAW_CHUNK):
            part = flat[i:i + DRAW_CHUNK]
            part[...] = np.random.randn(part.shape[0])
        _skip((n_rows - r1) * n_cols)
        return
    step = max(1, DRAW_CHUNK // n_cols)
    for i in range(0, n_rows, step):
        block = np.random.randn(min(step, n_rows - i) * n_cols).reshape(-1, n_cols)   # (rows drawn, n_cols)
        lo, hi = max(i, r0), min(i + block.shape[0], r1)
        if lo < hi:
            out[lo - r0:hi - r0] = block[lo - i:hi - i, c0:c1]


def _skip(n):
    """Draw and drop ``n`` normals in chunks: the stream moves on as if drawn."""
    for i in range(0, n, DRAW_CHUNK):
        np.random.randn(min(DRAW_CHUNK, n - i))
