"""Inference: the forward pass outside training, and accuracy counted in chunks of rows.

Both run the forward kernel that training runs, ``dense_forward_layer``, so
predictions are bit-identical to the activations a training step computes.
"""
import numpy as np

from fastckpt.core.checks import check_finite
from fastckpt.kernels import LOG_SOFTMAX, dense_forward_layer

EVAL_CHUNK = 4096  # rows per forward pass in evaluate() and predict()


def forward(params, acts, a, start, end):
    """``[a, a[start+1], ..., a[end]]`` for ``a = a[start]`` (batch, sizes[start]), in fresh arrays.

    ``acts`` (L + 1,) holds the code of the activation of each state
    (:func:`fastckpt.core.activations.state_codes`).  A softmax net's output is given as
    probabilities (training keeps log-probabilities).
    """
    weights, biases = params.layers()
    scratch = np.empty(max(params.sizes[1:]), dtype=np.float64)
    outs = [a]
    for layer in range(start, end):
        out = np.empty((a.shape[0], params.sizes[layer + 1]), dtype=params.dtype)   # (batch, n_out)
        dense_forward_layer(a, weights[layer], biases[layer], acts[layer + 1], scratch, out)
        outs.append(out)
        a = out
    if acts[-1] == LOG_SOFTMAX and end == len(weights) and end > start:
        np.exp(outs[-1], out=outs[-1])
    return outs


def count_correct(x, labels, dtype, predict, *, chunk=EVAL_CHUNK, name="x_test_data"):
    """How many rows of ``x`` (n, n_in) ``predict`` labels as ``labels`` (n,) says, in chunks of rows.

    Each chunk is made C-contiguous in ``dtype`` and checked finite, then
    ``predict(chunk)`` returns its class indices, or None where another part
    of the model (a later pipeline stage) counts them.
    """
    hits = 0
    for i in range(0, x.shape[0], chunk):
        rows = np.ascontiguousarray(x[i:i + chunk], dtype=dtype)
        check_finite(rows, name)
        predicted = predict(rows)
        if predicted is not None:
            hits += int(np.count_nonzero(predicted == labels[i:i + chunk]))
    return hits
