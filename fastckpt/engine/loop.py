"""The lab's training loop, shared by :meth:`Network.SGD <fastckpt.nets.network.Network.SGD>` and every
parallel trainer (threads, MPI data, pipeline and tensor parallelism):
arguments checked once, mini-batches in order, RSS and time per update, accuracy per epoch.
"""
import os
import time
import warnings

import psutil

from fastckpt.core.checks import as_batch, as_targets, check_eta, check_finite_rows, check_positive_int


def check_training(net, training_data, epochs, mini_batch_size, eta):
    """The lab loop's arguments checked: (x, y, epochs, mini_batch_size, eta)."""
    x_train, y_train = pair(training_data, "training_data")
    epochs = check_positive_int(epochs, "epochs", minimum=0)
    mini_batch_size = check_positive_int(mini_batch_size, "mini_batch_size")
    eta = check_eta(eta)
    check_finite_rows(as_batch(x_train, net.sizes[0], "training_data[0]", "input"), "training_data[0]")
    y_rows = as_targets(y_train, net.sizes[-1], "training_data[1]")     # one-hot rows or integer labels
    if y_rows.ndim == 2:
        check_finite_rows(y_rows, "training_data[1]")
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
    """Starts of the mini-batches of ``n`` samples, in order; warns about the samples the lab's rule skips
    (and, with ``hint``, that ``drop_last=False`` trains on them)."""
    starts = list(range(0, n - mini_batch_size + 1, mini_batch_size))
    if not drop_last and n % mini_batch_size:
        starts.append(starts[-1] + mini_batch_size)
    elif n % mini_batch_size:
        warnings.warn(SkippedSamples(n % mini_batch_size, n, mini_batch_size, hint), stacklevel=3)
    return starts


def run_epochs(net, epochs, groups, update, test_data, verbose, progress=None, lock=None, on_epoch=None,
               first_epoch=0):
    """The lab's loop over ``update(group)`` for each group of mini-batch starts, every epoch.

    Records the process RSS before each update and its duration, evaluates and
    prints per epoch as the lab does; returns (memusage, updatetime).  Epochs
    are numbered from ``first_epoch``; ``on_epoch(epoch, updates_done)`` is
    called after each.  The whole run holds the net's lock (or ``lock``): it is
    one call, and other threads' calls wait for it.
    """
    if test_data is not None:
        x_test, y_test = pair(test_data, "test_data")
    process = psutil.Process(os.getpid())
    memusage, updatetime = [], []
    with net.params.lock if lock is None else lock:
        net.accuracies = []
        for j in range(epochs):
            for i, group in enumerate(groups):
                t0 = time.perf_counter()
                memusage.append(process.memory_info().rss)
                try:
                    update(group)
                except FloatingPointError as exc:
                    raise FloatingPointError(f"training stopped at epoch {first_epoch + j}, update {i}: {exc}") \
                        from exc
                updatetime.append(time.perf_counter() - t0)
                if progress is not None:
                    progress(j, i + 1, len(groups))
            if test_data is not None:
                acc = net.evaluate(x_test, y_test)
                net.accuracies.append(acc)
                if verbose:
                    print("Epoch: {0}, Accuracy: {1}".format(first_epoch + j, acc), flush=True)
            elif verbose:
                print("Epoch: {0}".format(first_epoch + j), flush=True)
            if on_epoch is not None:
                on_epoch(first_epoch + j, len(updatetime))
    return memusage, updatetime


def pair(data, name):
    try:
        x, y = data
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a pair (x, y), got {type(data).__name__}") from None
    return x, y
