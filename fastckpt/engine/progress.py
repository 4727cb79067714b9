"""Progress bars on stderr: ``compare``'s and ``train``'s per epoch, and ``SGD(progress=...)``'s."""
import os
import sys
import time


class Progress:
    """A bar redrawn in place on a terminal (or wherever ``redraw``), one line per epoch otherwise (no
    carriage returns in logs).  The bar shows the epoch's share done, the running loss when one is given,
    and the time left for the whole run, from the updates and epochs timed so far."""

    def __init__(self, name, epochs, stream=None, redraw=None, width=16):
        self.name, self.epochs = f"{name:<{width}}", epochs        # names padded alike line up
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if redraw is None else bool(redraw)
        self.started = time.perf_counter()        # this epoch's start
        self.last_epoch = None                    # seconds the last whole epoch took
        self.drawn = 0

    def update(self, epoch, done, total, loss=None):
        if self.tty and (done == total or done % max(1, total // 50) == 0):
            filled = int(30 * done / total)
            shown = "" if loss is None else f" loss {loss:.4g}"
            line = (f"\r{self.name} epoch {epoch + 1}/{self.epochs} "
                    f"[{'#' * filled}{'.' * (30 - filled)}] {100 * done // total:3d}%{shown} "
                    f"ETA {clock(self.left(epoch, done, total))}")[:self._columns()]     # never wraps: \r redraws
            self.stream.write(line)
            self.stream.flush()
            self.drawn = len(line) - 1                 # the characters shown, the \r aside

    def left(self, epoch, done, total):
        """Seconds left in the run: this epoch's updates at its pace so far, then the epochs after it at the
        last whole epoch's time (this one's pace before there is one)."""
        spent = time.perf_counter() - self.started
        per_epoch = self.last_epoch if self.last_epoch is not None else spent * total / max(done, 1)
        return spent / max(done, 1) * (total - done) + max(0, self.epochs - epoch - 1) * per_epoch

    def _columns(self):
        """The terminal's width (the line's leading carriage return takes none), 80 when it cannot say."""
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            columns = 0
        return max(2, columns or 80)             # a terminal of unknown size says 0

    def end_epoch(self):
        """Seconds this epoch took (since the last one ended); the next epoch's clock starts."""
        now = time.perf_counter()
        self.last_epoch, self.started = now - self.started, now
        return self.last_epoch

    def epoch_done(self, epoch, accuracy):
        line = (f"{self.name} epoch {epoch + 1}/{self.epochs} test accuracy {accuracy:.4f} "
                f"({self.end_epoch():.1f} s)")
        self.stream.write(("\r" + line + " " * 10 + "\n") if self.tty else line + "\n")
        self.stream.flush()
        self.drawn = 0

    def clear(self):
        """Wipe the bar's line, so what is printed next starts on a clean line."""
        if self.drawn:
            self.stream.write("\r" + " " * self.drawn + "\r")
            self.stream.flush()
            self.drawn = 0


def clock(seconds):
    """``42 s``, ``3:05`` or ``1:02:05``: a time left, to the second."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    return f"{s // 60}:{s % 60:02d}" if s < 3600 else f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def epoch_progress(progress, epochs, first_epoch=0, stream=None):
    """``(callback, bar)`` of ``SGD``'s ``progress`` argument: ``"auto"`` a bar on stderr while each
    epoch trains when stderr is a terminal, ``True`` the bar whatever stderr is (a notebook redraws
    it too), ``False``/``None`` none, a callable is called as ``progress(epoch, done, total)``."""
    if progress is None or progress is False:
        return None, None
    if callable(progress):
        return progress, None
    if progress is True or (isinstance(progress, str) and progress == "auto"):
        stream = stream or sys.stderr
        if progress is not True and not stream.isatty():
            return None, None
        bar = Progress("SGD", first_epoch + epochs, stream, redraw=True)
        return (lambda j, done, total: bar.update(first_epoch + j, done, total)), bar
    raise ValueError(f"progress must be 'auto', True, False, None or a callable (epoch, done, total), "
                     f"got {progress!r}")
