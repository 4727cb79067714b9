"""fastckpt: fast CPU training of MLPs, with gradient checkpointing.

``from fastckpt import Network, NetworkWithCheckpointing`` replaces the lab classes.
The layers beneath this facade are drawn in docs/architecture.md.
"""
from . import optimizers
from ._version import __version__
from .core.params import Parameters
from .data import load_mnist
from .engine import Engine
from .nets import Network, NetworkWithCheckpointing, load
from .planner import InfeasiblePlan, Plan, plan, strategies

__all__ = ["Engine", "InfeasiblePlan", "Network", "NetworkWithCheckpointing", "Parameters", "Plan", "__version__",
           "load", "load_mnist", "optimizers", "plan", "strategies"]
