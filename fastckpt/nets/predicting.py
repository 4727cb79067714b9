"""What a net computes once trained: the forward pass, predictions and accuracy, in the lab's layouts."""
import numpy as np

from fastckpt.core.checks import as_batch, as_labels, check_finite
from fastckpt.engine.inference import EVAL_CHUNK, count_correct, forward


class Predicting:
    """``feedforward``, ``predict`` and ``evaluate`` of a net with ``params``, ``sizes``, ``num_layers``,
    ``dtype`` and the activation codes of its states (``_acts``); :class:`~fastckpt.nets.network.Network`
    is one."""

    def _forward(self, a, start, end):
        with self.params.lock:
            return forward(self.params, self._acts, a, start, end)

    def _as_input(self, a, width, name):
        """(batch, width) contiguous array in the network's dtype, and how to shape results."""
        arr = np.asarray(a)
        if arr.ndim == 1 and arr.shape[0] == width:
            layout = "vector"
            arr = arr.reshape(1, width)
        elif arr.ndim == 2 and arr.shape == (width, 1):
            layout = "column"
            arr = arr.reshape(1, width)
        else:
            layout = "batch3" if arr.ndim == 3 else "batch"
        arr = as_batch(arr, width, name, "input" if width == self.sizes[0] else "receiving")
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        check_finite(arr, name)
        return arr, layout

    @staticmethod
    def _shape_like(out, layout):
        if layout == "vector":
            return out.reshape(-1)
        if layout == "column":
            return out.reshape(-1, 1)
        if layout == "batch3":
            return out[:, :, None]
        return out

    def feedforward(self, a):
        """Network output for one (n_in, 1) column, one (n_in,) vector or a batch."""
        arr, layout = self._as_input(a, self.sizes[0], "a")
        return self._shape_like(self._forward(arr, 0, self.num_layers - 1)[-1], layout)

    def predict(self, x):
        """Class indices: the arg-max output of each sample of a batch, an int for one sample.

        ``x`` is (batch, n_in), the lab's (batch, n_in, 1), one (n_in,) vector
        or one (n_in, 1) column.
        """
        arr, layout = self._as_input(x, self.sizes[0], "x")
        with self.params.lock:
            labels = np.concatenate([self._forward(arr[i:i + EVAL_CHUNK], 0, self.num_layers - 1)[-1].argmax(axis=1)
                                     for i in range(0, arr.shape[0], EVAL_CHUNK)])
        return int(labels[0]) if layout in ("vector", "column") else labels

    def evaluate(self, x_test_data, y_test_data):
        """Fraction of samples whose arg-max output matches the label (one-hot or integer)."""
        x = as_batch(x_test_data, self.sizes[0], "x_test_data", "input")
        y = as_labels(y_test_data, self.sizes[-1], x.shape[0], ("x_test_data", "y_test_data"))
        with self.params.lock:                                 # every chunk sees the same parameters
            hits = count_correct(x, y, self.dtype, lambda rows: self._forward(rows, 0, self.num_layers - 1)[-1]
                                 .argmax(axis=1))
        return hits / x.shape[0]
