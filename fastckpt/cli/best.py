"""``train --early-stopping N``, ``--tol`` and ``--save-best FILE``: the best epoch, kept and saved.

Both watch the same value (NOTE [ Early stopping ] in :mod:`fastckpt.engine.stopping`): the ``--validation``
score when the run validates, else the training loss.  ``--early-stopping`` stops the run and gives the net
back its best epoch's weights; ``--save-best`` writes the net after each epoch that is the best so far, as
Keras' ``ModelCheckpoint(save_best_only=True)`` does, with the training state ``--resume`` reads.  A run that
goes on from ``--resume`` counts its epochs without improvement afresh.
"""
from fastckpt.core.losses import is_regression
from fastckpt.engine.stopping import EarlyStopping

from .resume import Saver

TOL = 1e-4           # scikit-learn's


def stopper(args):
    """The run's :class:`EarlyStopping`, or None when neither ``--early-stopping`` nor ``--save-best`` is given."""
    if args.early_stopping is None and args.save_best is None:
        if args.tol is not None:
            raise ValueError(f"--tol {args.tol:g} is the least improvement --early-stopping or --save-best counts; "
                             "without them it would change nothing")
        return None
    return EarlyStopping(args.early_stopping, TOL if args.tol is None else args.tol,
                         restore_best_weights=args.early_stopping is not None)


def one_process(args, run, net, bar, training, test, done, saved, state_of):
    """``net``'s own ``SGD`` on one process, with ``--shuffle``, ``--validation``, ``--early-stopping`` and
    ``--save-best``: ``(update times, what the result adds)``.  After each epoch ``saved(epoch, updates)``
    (``--save``), then ``--save-best``, then ``bar`` (a :class:`~fastckpt.cli.progress.TrainBar`) prints its
    line; ``state_of(epoch, updates)`` is the training state a save keeps."""
    stopping = stopper(args)
    save = Saver(args.save_best, args.force)

    def after(epoch, updates):
        saved(epoch, updates)
        if args.save_best is not None and stopping.improved:
            save(lambda path, exclusive: net.save(path, exclusive=exclusive, training=state_of(epoch, updates)))
    _, times = net.SGD(training, args.epochs - done, run.batch_size, run.eta, test_data=test, verbose=False,
                       progress=bar.progress, on_epoch=bar.after(after, net), first_epoch=done,
                       shuffle=False if run.shuffle is None else run.shuffle, validation=run.validation,
                       lr_schedule=run.lr_schedule, early_stopping=stopping)
    result = {"activation": run.activation, "optimizer": run.optimizer, "training_loss": net.history["loss"]}
    if run.validation:
        score = "r2" if is_regression(run.loss) else "accuracy"
        result.update({"validation_loss": net.history["val_loss"], f"validation_{score}": net.history[f"val_{score}"]})
    return times, dict(result, **said(stopping))


def said(stopping):
    """What ``train``'s result adds: the best epoch (counted from 1) and, after an early stop, the last one."""
    if stopping is None or stopping.best_epoch is None:
        return {}
    out = {"best_epoch": stopping.best_epoch + 1, f"best_{stopping.monitored}": stopping.best}
    if stopping.stopped_epoch is not None:
        out["stopped_after_epoch"] = stopping.stopped_epoch + 1
    return out
