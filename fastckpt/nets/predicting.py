"""What a net computes once trained: the forward pass, predictions and accuracy, in the lab's layouts.

``feedforward``, ``predict`` and ``evaluate`` run the whole net 1,024 rows at a time through buffers
made once per call (NOTE [ Inference bytes ] in :mod:`fastckpt.planner.run`), on arrays or on
compact :class:`~fastckpt.data.images.Images`.
"""
import numpy as np

from fastckpt.core.checks import as_batch, as_labels, as_rows, check_finite, shaped_like
from fastckpt.core.losses import is_regression, l2_penalty
from fastckpt.engine.inference import forward, in_chunks
from fastckpt.engine.loop import target_rows
from fastckpt.engine.scores import held_out_scores


class Predicting:
    """``feedforward``, ``predict`` and ``evaluate`` of a net with ``params``, ``sizes``, ``num_layers``,
    ``dtype`` and the activation codes of its states (``_acts``); :class:`~fastckpt.nets.network.Network`
    is one."""

    def _forward(self, a, start, end):
        with self.params.lock:
            return forward(self.params, self._acts, a, start, end)

    def _as_input(self, a, width, name):
        """(batch, width) contiguous array in the network's dtype, and how to shape results."""
        arr, layout = as_rows(a, width, name, "input" if width == self.sizes[0] else "receiving")
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        check_finite(arr, name)
        return arr, layout

    def _in_chunks(self, x, name, consume):
        with self.params.lock:                                 # every chunk sees the same parameters
            in_chunks(self.params, self._acts, x, name, consume)

    def feedforward(self, a, *, name="a"):
        """Network output for one (n_in, 1) column, one (n_in,) vector or a batch (``name`` in errors)."""
        arr, layout = as_rows(a, self.sizes[0], name, "input")
        out = np.empty((arr.shape[0], self.sizes[-1]), dtype=self.dtype)
        self._in_chunks(arr, name, lambda i, chunk: out.__setitem__(slice(i, i + chunk.shape[0]), chunk))
        return shaped_like(out, layout)

    def predict(self, x):
        """Class indices: the arg-max output of each sample of a batch, an int for one sample.

        ``x`` is (batch, n_in), the lab's (batch, n_in, 1), one (n_in,) vector
        or one (n_in, 1) column.
        """
        arr, layout = as_rows(x, self.sizes[0], "x", "input")
        labels = np.empty(arr.shape[0], dtype=np.int64)
        self._in_chunks(arr, "x", lambda i, chunk: chunk.argmax(axis=1, out=labels[i:i + chunk.shape[0]]))
        return int(labels[0]) if layout in ("vector", "column") else labels

    def evaluate(self, x_test_data, y_test_data):
        """Fraction of samples whose arg-max output matches the label (one-hot or integer)."""
        x = as_batch(x_test_data, self.sizes[0], "x_test_data", "input")
        y = as_labels(y_test_data, self.sizes[-1], x.shape[0], ("x_test_data", "y_test_data"))
        hits = [0]

        def count(i, chunk):
            hits[0] += int(np.count_nonzero(chunk.argmax(axis=1) == y[i:i + chunk.shape[0]]))
        self._in_chunks(x, "x_test_data", count)
        return hits[0] / x.shape[0]

    def held_out_scores(self, x, y):
        """``(loss, score)`` on held-out samples: the mean loss with the L2 penalty, as training reports it, and
        the accuracy, or R² for a regression net (``loss="squared_error"``), in one pass
        (:mod:`fastckpt.engine.scores`).  ``y``: one-hot rows or class indices; a regression net's target rows."""
        x = as_batch(x, self.sizes[0], "x", "input")
        names = ("x", "y")
        y = target_rows(y, self.sizes[-1], x.shape[0], names) if is_regression(self.loss) else \
            as_labels(y, self.sizes[-1], x.shape[0], names)
        with self.params.lock:
            penalty = l2_penalty(self.l2, self.params.layers()[0])
            return held_out_scores(self.params, self._acts, x, y, penalty, "x")
