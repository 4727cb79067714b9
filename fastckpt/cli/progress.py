"""``train``'s progress: a bar on stderr when it is a terminal (rank 0 alone), else the lab's line per epoch."""
import sys

from fastckpt.engine.progress import Progress


class TrainBar:
    """What ``train`` passes to an ``SGD``: ``lines`` (print the lab's epoch lines), ``progress`` and
    ``after(on_epoch, model)``, which runs ``on_epoch`` and then ends the epoch's bar with its accuracy."""

    def __init__(self, args, lead, first_epoch):
        shown = lead and not args.json
        self.bar = Progress("train", args.epochs) if shown and sys.stderr.isatty() else None
        self.first = first_epoch
        self.lines = shown and self.bar is None

    def progress(self, epoch, done, total):
        if self.bar is not None:
            self.bar.update(self.first + epoch, done, total)

    def after(self, on_epoch, model):
        def ended(epoch, updates):
            on_epoch(epoch, updates)
            if self.bar is not None:
                self.bar.epoch_done(epoch, model.accuracies[-1])
        return ended
