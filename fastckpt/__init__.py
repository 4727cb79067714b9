"""fastckpt: fast CPU training of sigmoid MLPs, with gradient checkpointing.

``from fastckpt import Network, NetworkWithCheckpointing`` replaces the lab classes.
"""
from . import memory, strategies
from .data import load_mnist
from .network import Network, NetworkWithCheckpointing
from .schedule import Plan
from .strategies import InfeasiblePlan, plan

__version__ = "0.1.0"
__all__ = ["InfeasiblePlan", "Network", "NetworkWithCheckpointing", "Plan", "load_mnist", "memory", "plan",
           "strategies"]
