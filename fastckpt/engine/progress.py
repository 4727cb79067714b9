"""Progress bars on stderr: ``compare``'s and ``train``'s per epoch, and ``SGD(progress=...)``'s."""
import os
import sys
import time


class Progress:
    """A bar redrawn in place on a terminal (or wherever ``redraw``), one line per epoch otherwise (no
    carriage returns in logs)."""

    def __init__(self, name, epochs, stream=None, redraw=None):
        self.name, self.epochs = name, epochs
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if redraw is None else bool(redraw)
        self.t0 = time.perf_counter()
        self.drawn = 0

    def update(self, epoch, done, total):
        if self.tty and (done == total or done % max(1, total // 50) == 0):
            filled = int(30 * done / total)
            line = (f"\r{self.name:<16} epoch {epoch + 1}/{self.epochs} "
                    f"[{'#' * filled}{'.' * (30 - filled)}] {100 * done // total:3d}% "
                    f"{time.perf_counter() - self.t0:.1f} s")[:self._columns()]     # never wraps: \r redraws
            self.stream.write(line)
            self.stream.flush()
            self.drawn = len(line) - 1                 # the characters shown, the \r aside

    def _columns(self):
        """The terminal's width (the line's leading carriage return takes none), 80 when it cannot say."""
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            columns = 0
        return max(2, columns or 80)             # a terminal of unknown size says 0

    def epoch_done(self, epoch, accuracy):
        line = (f"{self.name:<16} epoch {epoch + 1}/{self.epochs} test accuracy {accuracy:.4f} "
                f"({time.perf_counter() - self.t0:.1f} s)")
        self.stream.write(("\r" + line + " " * 10 + "\n") if self.tty else line + "\n")
        self.stream.flush()
        self.drawn = 0

    def clear(self):
        """Wipe the bar's line, so what is printed next starts on a clean line."""
        if self.drawn:
            self.stream.write("\r" + " " * self.drawn + "\r")
            self.stream.flush()
            self.drawn = 0


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
