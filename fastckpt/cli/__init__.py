"""The ``fastckpt`` command: parser, commands, ``train`` with save and resume, the MPI job guard, signals.
The top layer: it may import everything, and nothing imports it."""
from .app import main

__all__ = ["main"]
