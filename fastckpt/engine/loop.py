"""The lab's training loop, shared by :meth:`Network.SGD <fastckpt.nets.network.Network.SGD>` and every
parallel trainer (threads, MPI data, pipeline and tensor parallelism):
arguments checked once, mini-batches in order, RSS and time per update, accuracy per epoch;
and, for a net's own ``SGD``, a held-out validation set (its loss and score every epoch), a new order every
epoch and early stopping (:mod:`fastckpt.engine.stopping`).
"""
import operator
import time
import warnings

import numpy as np

from fastckpt.core.checks import (
    as_batch,
    as_labels,
    as_targets,
    check_bool,
    check_eta,
    check_finite_rows,
    check_in_range,
    check_positive_int,
    check_rows,
)
from fastckpt.core.losses import is_regression
from fastckpt.core.lr import parse_lr_schedule
from fastckpt.core.resources import ResidentBytes
from fastckpt.data.images import Images

from .progress import epoch_progress


def check_training(net, training_data, epochs, mini_batch_size, eta):
    """The lab loop's arguments checked: (x, y, epochs, mini_batch_size, eta)."""
    x_train, y_train = pair(training_data, "training_data")
    epochs = check_positive_int(epochs, "epochs", minimum=0)
    mini_batch_size = check_positive_int(mini_batch_size, "mini_batch_size")
    eta = check_eta(eta)
    check_rows(x_train, net.sizes[0], "training_data[0]", "input", net.dtype)    # finite in the net's dtype too
    y_rows = as_targets(y_train, net.sizes[-1], "training_data[1]")     # one-hot rows or integer labels
    if y_rows.ndim == 2:
        check_finite_rows(y_rows, "training_data[1]")
        check_in_range(y_rows, net.dtype, "training_data[1]")
    n = len(x_train)
    if len(y_train) != n:
        raise ValueError(f"training_data[0] has {n} samples but training_data[1] has {len(y_train)}")
    if mini_batch_size > n:
        raise ValueError(f"mini_batch_size must be <= the {n} training samples, got {mini_batch_size}")
    return x_train, y_train, epochs, mini_batch_size, eta


class SkippedSamples(UserWarning):
    """The lab's rule skips the samples after the last full mini-batch; ``skipped`` of ``n`` every epoch."""

    def __init__(self, skipped, n, mini_batch_size, hint):
        self.skipped, self.n, self.mini_batch_size = skipped, n, mini_batch_size
        self.what = (f"the last {skipped} of {n} training samples do not fill a mini-batch of {mini_batch_size} "
                     "and are skipped every epoch, as in the lab")
        super().__init__(f"SGD: {self.what}" + ("; pass drop_last=False to train on them" if hint else ""))


def batch_starts(n, mini_batch_size, drop_last=True, hint=True):
    """Starts of the mini-batches of ``n`` samples, in order, as a ``range`` (no object per minibatch: NOTE [ The
    whole run ]); warns about the samples the lab's rule skips (and, with ``hint``, that ``drop_last=False``
    trains on them)."""
    if not check_bool(drop_last, "drop_last"):               # "no" is truthy: it would drop, as True does
        return range(0, n, mini_batch_size)
    if n % mini_batch_size:
        warnings.warn(SkippedSamples(n % mini_batch_size, n, mini_batch_size, hint), stacklevel=3)
    return range(0, n - mini_batch_size + 1, mini_batch_size)


def run_epochs(net, epochs, groups, update, test_data, verbose, progress=None, lock=None, on_epoch=None,
               first_epoch=0, validation=None, start_epoch=None, eta=None, lr_schedule=None, stopping=None,
               rows=None):
    """The lab's loop over ``update(group, eta)`` for each group of ``groups`` (a minibatch's start, or the starts
    of the minibatches one update takes), every epoch, with
    the epoch's learning rate from ``lr_schedule`` (:mod:`fastckpt.core.lr`; constant ``eta`` by default),
    kept per epoch in ``net.history["eta"]``.

    Records the process RSS before each update and its duration, evaluates and
    prints per epoch as the lab does; returns (memusage, updatetime).  Epochs
    are numbered from ``first_epoch``; ``start_epoch(epoch)`` is called before
    each and ``on_epoch(epoch, updates_done)`` after each.  ``net.history`` gets
    per epoch the mean of the losses ``update`` returns (``"loss"``; none if it
    returns None; weighted by ``rows(group)``, the samples of a group, when given), the accuracy on
    ``test_data``, and on ``validation``, a pair ``(x, y)``, the loss and the score (accuracy, or R² for a
    regression net), which the printed line then shows too.  ``stopping``, an
    :class:`~fastckpt.engine.stopping.EarlyStopping`, may end the run after an epoch (after its
    ``on_epoch``) and gives back its best weights at the end.  The whole run holds the
    net's lock (or ``lock``): it is one call, and other threads' calls wait for it.
    """
    if test_data is not None:                            # refused before any training, not after an epoch
        check_rows(pair(test_data, "test_data")[0], net.sizes[0], "test_data[0]", "input", net.dtype)
    first_epoch = check_positive_int(first_epoch, "first_epoch", minimum=0)
    schedule = parse_lr_schedule(lr_schedule).resolved(first_epoch + epochs)
    if eta is not None:
        schedule.check_rates(eta, first_epoch, epochs)
    progress, bar = epoch_progress(progress, epochs, first_epoch)
    memusage, updatetime = [], []
    if stopping is not None:
        stopping.start(net.params, validating=validation is not None, regression=is_regression(net.loss))
    with net.params.lock if lock is None else lock, ResidentBytes() as rss:
        net.accuracies = []
        net.history = {"loss": [], "accuracy": net.accuracies, "val_loss": [],
                       "val_r2" if is_regression(net.loss) else "val_accuracy": [], "eta": []}
        for j in range(epochs):
            epoch = first_epoch + j
            if start_epoch is not None:
                start_epoch(epoch)
            rate = schedule.rate(eta, epoch, first_epoch + epochs) * (1.0 if stopping is None else stopping.factor)
            net.history["eta"].append(rate)
            losses = _updates(groups, lambda group, rate=rate: update(group, rate), rss, (memusage, updatetime),
                              lambda i, j=j: progress(j, i, len(groups)) if progress is not None else None,
                              f"{epoch + 1}/{first_epoch + epochs}")
            line = _end_epoch(net, epoch, _mean_loss(losses, groups, rows), test_data, validation)
            stop = stopping is not None and stopping.update(net.history, epoch, rate)
            if bar is not None:
                bar.clear()
                bar.end_epoch()
            if verbose:
                print(line + (_stopped(stopping) if stop else ""), flush=True)
            if on_epoch is not None:
                on_epoch(epoch, len(updatetime))
            if stop:
                break
        if stopping is not None:
            stopping.finish()
    return memusage, updatetime


def _updates(groups, update, rss, records, progress, epoch):
    """One epoch's ``update(group)`` of every group, the RSS before each and its time appended to ``records``,
    ``progress(updates done)`` after each; returns their losses.  ``epoch`` ("3/10") names it in an error."""
    memusage, updatetime = records
    losses = []
    for i, group in enumerate(groups):
        t0 = time.perf_counter()
        memusage.append(rss())
        try:
            losses.append(update(group))
        except FloatingPointError as exc:
            raise FloatingPointError(f"training stopped at epoch {epoch}, update {i + 1}/{len(groups)}: "
                                     f"{exc}") from exc                     # counted from 1, as the bar
        updatetime.append(time.perf_counter() - t0)
        progress(i + 1)
    return losses


def _mean_loss(losses, groups, rows):
    """The epoch's mean loss: over its samples when ``rows`` gives the groups' samples and they differ (the
    last minibatch is smaller), else over its updates; None when an update gave none."""
    if not losses or any(loss is None for loss in losses):
        return None
    if rows is None or rows(groups[0]) == rows(groups[len(losses) - 1]):
        return float(np.mean(losses))
    return sum(loss * rows(g) for loss, g in zip(losses, groups)) / sum(rows(g) for g in groups[:len(losses)])


def _end_epoch(net, epoch, loss, test_data, validation):
    """Record the epoch's mean loss, accuracies and validation scores in ``net.history``; returns the line to
    print (the lab's ``Epoch: 3, Accuracy: 0.85``, with the training and validation loss and the validation
    accuracy, or R², when validating)."""
    line = "Epoch: {0}".format(epoch)
    if loss is not None:
        net.history["loss"].append(loss)
    if test_data is not None:
        acc = net.evaluate(*pair(test_data, "test_data"))
        net.accuracies.append(acc)
        line += ", Accuracy: {0}".format(acc)
    if validation is not None:
        val_loss, score = net.held_out_scores(*validation)
        net.history["val_loss"].append(val_loss)
        regression = is_regression(net.loss)
        net.history["val_r2" if regression else "val_accuracy"].append(score)
        if net.history["loss"]:
            line += f", training loss: {net.history['loss'][-1]:.6g}"
        line += f", validation loss: {val_loss:.6g}, validation {'R²' if regression else 'accuracy'}: {score:.4g}"
    return line


def _stopped(stopping):
    """What the line of the epoch a run stops after adds."""
    restored = f"; the weights of epoch {stopping.best_epoch} restored" if stopping.restore_best_weights else ""
    return (f" (stopped early: {stopping.monitored} did not improve by {stopping.tol:g} for "
            f"{stopping.n_iter_no_change + 1} epochs in a row{restored})")


def split_validation(net, training_data, validation):
    """``(training_data, validation_data)``: ``validation`` None (no validation), a pair ``(x, y)``
    used as it is, or a fraction in (0, 1) of the training samples held out from its end, as
    Keras' ``validation_split`` takes them (before any shuffling).  The validation targets come back as
    class indices, or for a regression net as target rows (integer labels made one-hot rows)."""
    if validation is None:
        return training_data, None
    if isinstance(validation, (tuple, list)):
        x_val, y_val = pair(validation, "validation")
    else:
        x, y = pair(training_data, "training_data")
        try:
            fraction = float(validation)
        except (TypeError, ValueError):
            fraction = None
        if isinstance(validation, (bool, str)) or fraction is None or not 0 < fraction < 1:
            raise ValueError(f"validation must be a fraction in (0, 1) or a pair (x, y), got {validation!r}")
        n = len(x)
        split = int(n * (1 - fraction))
        if not 0 < split < n:
            raise ValueError(f"validation={validation!r} of {n} training samples leaves {split} to train on and "
                             f"{n - split} to validate on; each needs at least one")
        training_data, (x_val, y_val) = (x[:split], y[:split]), (x[split:], y[split:])
    x_val = as_batch(x_val, net.sizes[0], "validation[0]", "input")
    check_finite_rows(x_val, "validation[0]")                # evaluated after each epoch: refused before the first
    check_in_range(x_val, net.dtype, "validation[0]")
    if is_regression(net.loss):
        return training_data, (x_val, target_rows(y_val, net.sizes[-1], x_val.shape[0],
                                                  ("validation[0]", "validation[1]")))
    return training_data, (x_val, as_labels(y_val, net.sizes[-1], x_val.shape[0], ("validation[0]", "validation[1]")))


def target_rows(y, n_out, n, names):
    """A regression net's targets ``y`` as real rows (n, n_out), checked finite: integer labels made one-hot;
    ``names`` = (x's, y's)."""
    rows = as_targets(y, n_out, names[1])
    if rows.ndim == 1:
        rows = np.eye(n_out)[rows]
    if rows.dtype.kind not in "f":
        rows = rows.astype(np.float64)
    if rows.shape[0] != n:
        raise ValueError(f"{names[0]} has {n} samples but {names[1]} has {rows.shape[0]}")
    check_finite_rows(rows, names[1])
    return rows


def epoch_order(shuffle, n):
    """``order(epoch)``: None (the lab's order) with ``shuffle`` False, else a permutation of ``n``
    samples: from ``numpy.random``'s global state with True, or from the integer seed and the
    epoch's number alone (so a resumed run shuffles as the first one would have)."""
    if shuffle is False or shuffle is None:
        return lambda epoch: None
    if shuffle is True:
        return lambda epoch: np.random.permutation(n)
    try:
        seed = operator.index(shuffle)
    except TypeError:
        seed = -1
    if seed < 0:
        raise ValueError(f"shuffle must be False, True or an integer seed >= 0, got {shuffle!r}")
    return lambda epoch: np.random.default_rng([seed, epoch]).permutation(n)


class EpochOrder:
    """The minibatches of ``x`` and ``y`` in each epoch's order: the lab's, or a new one (:func:`epoch_order`)."""

    def __init__(self, x, y, mini_batch_size, shuffle):
        self.order = epoch_order(shuffle, len(x))
        if shuffle is not False:                               # rows are taken by index: arrays, not lists
            x, y = (a if isinstance(a, Images) else np.asarray(a) for a in (x, y))
        self.x, self.y, self.size, self.rows = x, y, mini_batch_size, None

    def start(self, epoch):
        """Draw epoch ``epoch``'s order; the last one is let go first (one order is held at a time)."""
        self.rows = None
        self.rows = self.order(epoch)

    def minibatch(self, start):
        """The minibatch at ``start`` of this epoch's order, gathered as the data holds it (Images as bytes)."""
        take = slice(start, start + self.size)
        if self.rows is None:
            return self.x[take], self.y[take]
        take = self.rows[take]
        x = Images(_rows(self.x.raw, take), self.x.divisor) if isinstance(self.x, Images) else _rows(self.x, take)
        return x, _rows(self.y, take)


def _rows(a, take):
    """The rows ``take`` of ``a``: np.take is 2.5x faster than ``a[take]`` for 200 rows of 10 floats, but on an
    array that is not C-contiguous (a DataFrame's values, Fortran order) it copies the whole array first, at
    every minibatch."""
    return np.take(a, take, axis=0) if a.flags.c_contiguous else a[take]


def pair(data, name):
    try:
        x, y = data
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a pair (x, y), got {type(data).__name__}") from None
    return x, y


def held_arrays(training_data, test_data, validation, checked=None):
    """The arrays (or lists) a run keeps, each counted whole: the training pair as given (also when a
    fraction of it is held out for validation), the test pair, a validation pair, and the class indices
    made of one-hot validation rows (``checked``: the validation pair as :func:`split_validation` gives it)."""
    found = list(pair(training_data, "training_data"))
    for extra, name in ((test_data, "test_data"), (validation if isinstance(validation, (tuple, list)) else None,
                                                     "validation")):
        if extra is not None:
            found += pair(extra, name)
    if checked is not None and not any(isinstance(a, np.ndarray) and np.may_share_memory(checked[1], a)
                                       for a in found):
        found.append(checked[1])
    return found
