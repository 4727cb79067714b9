"""The ``fastckpt`` command run inside the test process: what a subprocess gives, without a new interpreter.

A subprocess pays for Python, NumPy, Numba and the kernels' cache again (about 2.5 s on a 2-core Zen 3);
:func:`run_cli` calls :func:`fastckpt.cli.app.main` with the arguments, in ``cwd``, with ``env`` set and
file descriptors 1 and 2 (Python's ``sys.stdout`` and ``sys.stderr`` on them) captured, so what the
processes it starts write is captured too, in order; then it puts back everything the command changes in
the process (the BLAS threads, the environment, the warning hook, SIGINT's handler, the working
directory).  Tests of what only a real process shows (exit by signal, an installed script, ``mpiexec``,
a closed stdout, a terminal) keep the subprocess.
"""
import io
import os
import signal
import subprocess
import sys
import tempfile
import warnings

from fastckpt.cli import app
from fastckpt.engine import sharing


def run_cli(*args, cwd=None, env=None, timeout=None):
    """``fastckpt ARGS`` in this process; a :class:`subprocess.CompletedProcess` with its exit code and text.

    ``timeout`` is taken for the subprocess's signature and not enforced."""
    saved = _State()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            if cwd is not None:
                os.chdir(cwd)
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout, sys.stderr = (io.TextIOWrapper(open(fd, "wb", closefd=False), encoding="utf-8",
                                                       line_buffering=True) for fd in (1, 2))
            with warnings.catch_warnings():
                try:
                    code = app.main([str(a) for a in args])
                except SystemExit as exc:                  # argparse's --help and its errors
                    code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
        finally:
            saved.restore()
        text = []
        for f in (out, err):
            f.seek(0)
            text.append(f.read().decode("utf-8", "replace"))
    return subprocess.CompletedProcess([sys.executable, "-m", "fastckpt", *map(str, args)], code, *text)


class _State:
    """What a command may change in the process, to put back after it."""

    def __init__(self):
        self.cwd, self.env = os.getcwd(), dict(os.environ)
        self.showwarning, self.sigint = warnings.showwarning, signal.getsignal(signal.SIGINT)
        self.auto, self.fixed = sharing.SHARING.auto, sharing.blas_threads()
        self.streams = sys.stdout, sys.stderr
        for stream in self.streams:
            stream.flush()
        self.fds = os.dup(1), os.dup(2)

    def restore(self):
        for stream in (sys.stdout, sys.stderr):
            if stream is not None and stream not in self.streams:
                stream.flush()
        sys.stdout, sys.stderr = self.streams
        for fd, saved in zip((1, 2), self.fds):
            os.dup2(saved, fd)
            os.close(saved)
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.env)
        warnings.showwarning = self.showwarning
        signal.signal(signal.SIGINT, self.sigint)
        sharing.fix_threads(None if self.auto else self.fixed)
