"""Initial parameters, in one place: the lab's draws, and Glorot's and He's.

Every draw comes from ``numpy.random``'s global generator, as the lab's do, so
``np.random.seed`` makes any of them reproducible.  :func:`draw` takes the name:

* ``"lab"`` (the default): ``np.random.randn`` for every bias, then every weight
  (below).
* ``"xavier"`` or ``"glorot"``: weights from the uniform distribution
  ``U(-a, a)``, ``a = sqrt(6 / (fan_in + fan_out))`` (Glorot and Bengio, 2010),
  as Keras' ``Dense`` draws them by default (``GlorotUniform``) and PyTorch's
  ``xavier_uniform_`` with gain 1; drawn as ``np.random.uniform(-a, a, (n_out, n_in))``
  layer by layer.  Biases are 0.  Suits sigmoid and tanh layers.
* ``"he"`` or ``"kaiming"``: weights from the normal distribution ``N(0, 2 / fan_in)``
  (He et al., 2015), not truncated: PyTorch's ``kaiming_normal_`` with its default
  ``mode="fan_in"`` and the gain of ReLU, sqrt(2) (Keras' ``HeNormal`` truncates at
  two standard deviations).  Drawn as ``sqrt(2 / fan_in) * np.random.randn(n_out, n_in)``
  layer by layer.  Biases are 0.  Suits ReLU layers.

``fan_in`` is a layer's inputs ``n_in``, ``fan_out`` its units ``n_out``.  Values are
drawn in float64 and cast to the net's dtype.

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

DRAW_CHUNK = 4096  # numbers drawn per call: a 32 KiB temporary, within what a memory plan leaves

INITS = {"lab": "lab", "xavier": "xavier", "glorot": "xavier", "he": "he", "kaiming": "he"}


def check_init(init):
    """The initialisation's canonical name (``"lab"``, ``"xavier"`` or ``"he"``), else a ValueError naming it."""
    if not isinstance(init, str) or init not in INITS:
        raise ValueError(f"init must be 'lab', 'xavier' (or 'glorot') or 'he' (or 'kaiming'), got {init!r}")
    return INITS[init]


def draw(init, sizes, keep):
    """Draw the initial parameters of ``sizes`` by the initialisation ``init`` from ``np.random``.

    ``keep`` is :func:`draw_lab`'s: it says which part of each block to write where.
    """
    init = check_init(init)
    if init == "lab":
        draw_lab(sizes, keep)
        return
    for layer, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        kept = keep("biases", layer)
        if kept is not None:
            kept[0][...] = 0.0
        if init == "xavier":
            bound = np.sqrt(6.0 / (n_in + n_out))

            def sample(n, bound=bound):
                return np.random.uniform(-bound, bound, n)
        else:
            std = np.sqrt(2.0 / n_in)

            def sample(n, std=std):
                return std * np.random.randn(n)
        kept = keep("weights", layer)
        if kept is None:
            _skip(n_out * n_in, sample)
        else:
            draw_block(n_out, n_in, *kept, sample=sample)


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


def draw_block(n_rows, n_cols, out, rows, cols, sample=np.random.randn):
    """Draw an (n_rows, n_cols) block of ``sample(n)`` (float64 numbers, default ``np.random.randn``)
    in C order, keeping ``[rows, cols]`` in ``out``.

    Drawn in chunks: ``sample`` must give the same numbers in chunks as in one call, as
    ``randn`` and ``uniform`` of the legacy generator do.
    """
    (r0, r1), (c0, c1) = rows, cols
    if (c0, c1) == (0, n_cols):                   # whole rows: the kept part is one contiguous run
        flat = out.reshape(-1)
        _skip(r0 * n_cols, sample)
        for i in range(0, flat.shape[0], DRAW_CHUNK):
            part = flat[i:i + DRAW_CHUNK]
            part[...] = sample(part.shape[0])
        _skip((n_rows - r1) * n_cols, sample)
        return
    step = max(1, DRAW_CHUNK // n_cols)
    for i in range(0, n_rows, step):
        block = sample(min(step, n_rows - i) * n_cols).reshape(-1, n_cols)   # (rows drawn, n_cols)
        lo, hi = max(i, r0), min(i + block.shape[0], r1)
        if lo < hi:
            out[lo - r0:hi - r0] = block[lo - i:hi - i, c0:c1]


def _skip(n, sample=np.random.randn):
    """Draw and drop ``n`` numbers in chunks: the stream moves on as if drawn."""
    for i in range(0, n, DRAW_CHUNK):
        sample(min(DRAW_CHUNK, n - i))
