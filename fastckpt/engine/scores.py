"""What an epoch's end measures on a held-out set: its mean loss and its score, in one pass over chunks of rows.

The score is scikit-learn's: the accuracy of a classifier (the arg-max against class indices), the
coefficient of determination R² of a regression net (``loss="squared_error"``, real target rows), as
``sklearn.metrics.r2_score`` gives it, averaged over the outputs, an output whose targets are constant
scoring 1 when predicted exactly and 0 otherwise.  The loss is the training loss's, the L2 penalty
included, so the two compare.  Each chunk's sums are taken by a kernel (:func:`fastckpt.kernels.label_sums`,
:func:`fastckpt.kernels.target_sums`) into a few float64 numbers: the pass holds what an ``evaluate``
holds (NOTE [ Inference bytes ]) and no per-row result.
"""
import numpy as np

from fastckpt.kernels import label_sums, target_sums

from .inference import in_chunks


def held_out_scores(params, acts, x, y, penalty, name="validation[0]"):
    """``(mean loss, score)`` of the net of ``params`` and state codes ``acts`` on rows ``x`` (n, n_in) and
    ``y``: class indices (n,), or for a regression net target rows (n, n_out)."""
    n = x.shape[0]
    if y.ndim == 1:
        sums = np.zeros(2)
        in_chunks(params, acts, x, name, lambda i, out: label_sums(out, y[i:i + out.shape[0]], acts[-1], sums))
        return float(sums[0]) / n + penalty, float(sums[1]) / n
    mean = np.mean(y, axis=0, dtype=np.float64)
    sums = np.zeros((2, y.shape[1]))
    in_chunks(params, acts, x, name, lambda i, out: target_sums(out, y[i:i + out.shape[0]], mean, sums))
    return 0.5 * float(sums[0].sum()) / n + penalty, r2(sums[0], sums[1])


def r2(residual, total):
    """R² averaged over the outputs from their residual and total sums of squares (scikit-learn's
    ``force_finite``: a constant target scores 1 when predicted exactly, else 0)."""
    scores = [1.0 - res / tot if tot != 0 else (1.0 if res == 0 else 0.0) for res, tot in zip(residual, total)]
    return float(np.mean(scores))
