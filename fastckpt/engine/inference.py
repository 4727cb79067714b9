"""Inference: the forward pass outside training, and accuracy counted in chunks of rows.

Both run the forward ops of a table on a run kernel (:func:`fastckpt.kernels.runner`, its
``"forward"`` mode), the same steps a training step's forward ops run, so predictions are
bit-identical to the activations a training step computes.  :class:`ChunkedForward` runs the
whole net over at most ``EVAL_CHUNK`` rows at a time through buffers made once per call (an
input staging buffer and two that the layers alternate between), so evaluating or predicting
on any number of rows raises the peak by :func:`fastckpt.planner.run.inference_bytes`, whatever
the depth.

Finite inputs can still overflow inside the net (1e308 times a weight): its output is then NaN, and
NaN's arg-max is class 0.  So every chunk's output is checked before a class or an accuracy is made of
it (:func:`output_error`), as every chunk's input is.
"""
import numpy as np

from fastckpt.core.checks import check_finite, check_in_range
from fastckpt.data.images import Images
from fastckpt.kernels import (
    LOG_SOFTMAX,
    N_INTS,
    Table,
    all_finite,
    float_record_elems,
    new_gate,
    runner,
    scale_into,
)
from fastckpt.planner.run import EVAL_CHUNK

from .engine import Sums, run_spans
from .workspace import net_table

__all__ = ["EVAL_CHUNK", "ChunkedForward", "count_correct", "forward", "in_chunks", "output_error", "stage_rows"]


class Forward:
    """Layers ``start..end-1`` of a net with ``params`` and state activation codes ``acts`` (L + 1,), each
    writing its (up to ``rows``, width) output at ``writes[layer - start]`` in :attr:`work`.  For a tensor
    shard (``params`` of its widths), ``row_split`` and ``sums`` as the :class:`~.engine.Engine` takes them:
    a row-split layer's partial products are summed over the shards before its bias and activation."""

    def __init__(self, params, acts, start, end, rows, writes, work_elems, row_split=(), sums=None):
        sizes, dtype = params.sizes, params.dtype
        self.params, self.start, self.end = params, start, end
        self.work = np.empty(work_elems, dtype=dtype)
        self.writes = writes
        reads = [-1] + list(writes[:-1])
        rows_of, points = [], {}
        for k, layer in enumerate(range(start, end)):
            if row_split and row_split[layer]:
                points[len(rows_of)] = (writes[k], sizes[layer + 1])
                rows_of.append((Table.LINEAR, layer, reads[k], writes[k], -1, -1, 0))
                rows_of.append((Table.ACTIVATE, layer, reads[k], writes[k], -1, -1, 0))
            else:
                rows_of.append((Table.FWD, layer, reads[k], writes[k], -1, -1, 0))
        self.table = np.array(rows_of, dtype=np.int64).reshape(-1, 7)
        self.sums = Sums(points, sums) if points else None
        ends = sorted({0, len(rows_of), *(r + 1 for r in points)})
        self.spans = list(zip(ends[:-1], ends[1:]))
        self.net = net_table(sizes, dtype.itemsize, acts)
        self.floats = np.zeros(float_record_elems(len(sizes) - 1, max(sizes[1:])))
        self.ints = np.zeros(N_INTS, dtype=np.int64)
        self._y = np.zeros((0, sizes[-1]), dtype=dtype)
        self._no_state = np.zeros((0, 0), dtype=dtype)
        self._gate = new_gate()
        self.kernel = runner(set(np.asarray(acts)[start + 1:end + 1].tolist()), "forward")

    def __call__(self, a):
        """Run the layers on ``a`` (m, sizes[start]), m <= rows; the outputs stay in :attr:`work`."""
        flat = self.params.flat
        run_spans(self.kernel, (self.table, self.net, self.ints, self.floats, a, self._y, flat, flat, self.work,
                                self._no_state, flat, self._gate), self.spans, a.shape[0], self.sums)

    def output(self, k, m):
        """Layer ``start + k``'s output for ``m`` rows, a view of :attr:`work`."""
        width = self.params.sizes[self.start + k + 1]
        return self.work[self.writes[k]:self.writes[k] + m * width].reshape(m, width)


def forward(params, acts, a, start, end, row_split=(), sums=None):
    """``[a, a[start+1], ..., a[end]]`` for ``a = a[start]`` (batch, sizes[start]), in fresh arrays.

    ``acts`` (L + 1,) holds the code of the activation of each state
    (:func:`fastckpt.core.activations.state_codes`).  A softmax net's output is given as
    probabilities (training keeps log-probabilities).  ``row_split`` and ``sums``: a tensor shard's
    (:class:`Forward`).
    """
    if end <= start:
        return [a]
    m, sizes = a.shape[0], params.sizes
    writes = np.cumsum([0] + [m * sizes[layer + 1] for layer in range(start, end)]).tolist()
    run = Forward(params, acts, start, end, m, writes[:-1], writes[-1], row_split, sums)
    run(a)
    outs = [a] + [run.output(k, m) for k in range(end - start)]
    if acts[-1] == LOG_SOFTMAX and end == len(sizes) - 1:
        np.exp(outs[-1], out=outs[-1])
    return outs


class ChunkedForward:
    """The whole net's output for up to ``rows`` rows at a time, through two buffers made once.

    ``self(a)`` takes (m, n_in) rows, m <= ``rows``, C-contiguous in the net's dtype, and returns
    a view of the output (m, n_out) that stays valid until the next call.
    """

    def __init__(self, params, acts, rows, row_split=(), sums=None):
        self.params, self.acts, self.rows = params, acts, int(rows)
        widest = max(params.sizes[1:])
        n_layers = len(params.sizes) - 1
        writes = [(layer % 2) * self.rows * widest for layer in range(n_layers)]
        self.run = Forward(params, acts, 0, n_layers, self.rows, writes, 2 * self.rows * widest, row_split, sums)

    def __call__(self, a):
        self.run(a)
        out = self.run.output(len(self.params.sizes) - 2, a.shape[0])
        if self.acts[-1] == LOG_SOFTMAX:
            np.exp(out, out=out)
        return out


def stage_rows(x, dtype, rows):
    """A function ``(i, m) -> x[i:i + m]`` as C-contiguous rows of ``dtype``: ``x``'s own rows where they
    already are, else converted into one staging buffer of ``rows`` rows made here."""
    if not isinstance(x, Images) and x.dtype == dtype and x.flags.c_contiguous:
        return lambda i, m: x[i:i + m]
    stage = np.empty((min(rows, x.shape[0]), x.shape[1]), dtype=dtype)

    def staged(i, m):
        part = x[i:i + m]
        if isinstance(part, Images):                     # the kernel training stages with: no NumPy cast buffer
            return scale_into(part.raw, part.divisor, stage[:m])
        with np.errstate(over="ignore"):                 # overflow to inf is reported by the finiteness check
            np.copyto(stage[:m], part, casting="unsafe")
        return stage[:m]
    return staged


def in_chunks(params, acts, x, name, consume, *, chunk=EVAL_CHUNK):
    """The whole net over the rows of ``x`` (n, n_in), ``chunk`` at a time through buffers made once
    (NOTE [ Inference bytes ]): ``consume(i, out)`` gets each chunk's output, rows ``i`` on, checked
    finite on the way in (``name`` in the error)."""
    n = x.shape[0]
    run = ChunkedForward(params, acts, min(chunk, n))
    rows_of = stage_rows(x, params.dtype, chunk)
    for i in range(0, n, chunk):
        rows = rows_of(i, min(chunk, n - i))
        _check_rows(rows, x, i, name)
        out = run(rows)
        error = output_error(out, name, i, params)
        if error is not None:
            raise error
        consume(i, out)


def _check_rows(rows, x, i, name):
    """``rows``, rows ``i`` on of ``x`` staged in the net's dtype, checked finite; when they are not, the error
    says so of ``x``'s own values if those are finite but past the dtype's range."""
    try:
        check_finite(rows, name, offset=i)
    except ValueError:
        if isinstance(x, np.ndarray):
            check_in_range(x[i:i + rows.shape[0]], rows.dtype, name, offset=i, done="nothing was predicted")
        raise


def output_error(out, name, offset=0, params=None):
    """None, or the ValueError for a chunk's output ``out`` (m, n_out; rows from ``offset`` of the input
    ``name``) that holds NaN or inf: a finite input whose values overflowed inside the net, or the net's own
    ``params`` (when given) that hold NaN or inf."""
    if all_finite(out):
        return None
    if params is not None and not all_finite(params.flat):
        return ValueError(f"the net's parameters hold NaN or inf (first at flat index "
                          f"{int(np.argwhere(~np.isfinite(params.flat))[0][0])}), so {name} gets no output: "
                          "the weights or biases were set to them")
    row, col = (int(k) for k in np.argwhere(~np.isfinite(out))[0])
    return ValueError(f"{name} row {row + offset} makes the net's output {float(out[row, col])!r}: a value overflowed "
                      f"{out.dtype} inside the net (the input is finite, but too large for these weights), so it has "
                      "no prediction")


def count_correct(x, labels, dtype, predict, *, chunk=EVAL_CHUNK, name="x_test_data"):
    """``(hits, error)``: how many rows of ``x`` (n, n_in) the model labels as ``labels`` (n,) says, in chunks
    of rows, and None or the :func:`output_error` of the first chunk whose output is not finite.

    Each chunk is made C-contiguous in ``dtype`` (in one staging buffer) and checked finite, then
    ``predict(chunk)`` returns the model's output rows, or None where another part of the model (a later
    pipeline stage) has them.  Every chunk is run even after an error, so that the ranks of a model
    split over several run the same chunks; the caller raises it (on every rank).
    """
    hits, error = 0, None
    rows_of = stage_rows(x, np.dtype(dtype), chunk)
    for i in range(0, x.shape[0], chunk):
        rows = rows_of(i, min(chunk, x.shape[0] - i))
        _check_rows(rows, x, i, name)
        out = predict(rows)
        if out is not None and error is None:
            error = output_error(out, name, i)
            hits += int(np.count_nonzero(out.argmax(axis=1) == labels[i:i + chunk]))
    return hits, error
