"""The lab's classes: :class:`Network` and :class:`NetworkWithCheckpointing`, and :func:`load` for saved ones.
Imports the engine, planner, core and kernels."""
from .checkpointing import NetworkWithCheckpointing
from .io import load
from .network import Network

__all__ = ["Network", "NetworkWithCheckpointing", "load"]
