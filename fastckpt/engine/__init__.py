"""The engine: runs a plan's steps on parameters, in a workspace allocated once; the lab's loop; inference.
Imports the planner, core and kernels, nothing above."""
from .engine import Engine

__all__ = ["Engine"]
