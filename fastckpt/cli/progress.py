"""``train``'s progress: one line per epoch on stdout, the same on a terminal and in a pipe, and while an
epoch trains a bar on stderr when it is a terminal (rank 0 alone) with the running loss and the time left.

Epochs are counted from 1 and each line gives that epoch's time; ``train``'s last line gives the total.
The Python API's ``SGD`` keeps the lab's ``Epoch: 0, Accuracy: ...`` lines (:mod:`fastckpt.engine.loop`).
"""
import math
import sys
import time

from fastckpt.engine.progress import Progress


class TrainBar:
    """What ``train`` passes to an ``SGD`` (with ``verbose=False``): ``progress``, and ``after(on_epoch,
    model)``, which runs ``on_epoch`` (a save) and then prints the epoch's line from ``model``'s accuracies
    and history.  ``watch(trainer)`` names what holds each update's ``last_loss``, for the bar."""

    def __init__(self, args, lead, first_epoch):
        self.shown = lead and not args.json
        self.bar = Progress("train", args.epochs, width=0) if self.shown and sys.stderr.isatty() else None
        self.first, self.epochs = first_epoch, args.epochs
        self.source, self.losses = None, []
        self.clock = time.perf_counter()

    def watch(self, trainer):
        self.source = trainer
        return trainer

    def progress(self, epoch, done, total):
        if done == 1:
            self.losses = []
        loss = getattr(self.source, "last_loss", None)
        if loss is not None and math.isfinite(loss):
            self.losses.append(loss)
        if self.bar is not None:
            running = math.fsum(self.losses) / len(self.losses) if self.losses else None
            self.bar.update(self.first + epoch, done, total, loss=running)

    def after(self, on_epoch, model):
        def ended(epoch, updates):
            on_epoch(epoch, updates)
            now = time.perf_counter()
            seconds, self.clock = now - self.clock, now
            if self.bar is not None:
                self.bar.clear()
                self.bar.end_epoch()
            if self.shown:
                print(epoch_line(epoch, self.epochs, model, seconds), flush=True)
        return ended


def epoch_line(epoch, epochs, model, seconds):
    """``epoch 3/10: test accuracy 0.8520, training loss 0.2741, validation loss 0.3012, validation accuracy
    0.8650 (1.2 s)`` (a regression net's ``validation R²``)."""
    history = getattr(model, "history", None) or {}
    line = f"epoch {epoch + 1}/{epochs}: test accuracy {model.accuracies[-1]:.4f}"
    if history.get("loss"):
        line += f", training loss {history['loss'][-1]:.4g}"
    if history.get("val_loss"):
        line += f", validation loss {history['val_loss'][-1]:.4g}"
    for key, name in (("val_accuracy", "accuracy"), ("val_r2", "R²")):
        if history.get(key):
            line += f", validation {name} {history[key][-1]:.4f}"
    return line + f" ({seconds:.1f} s)"
