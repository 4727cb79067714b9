"""fastckpt: fast CPU training of sigmoid MLPs, with gradient checkpointing.

``from fastckpt import Network, NetworkWithCheckpointing`` replaces the lab classes.
"""
from . import memory, strategies
from .checkpointing import NetworkWithCheckpointing
from .data import load_mnist
from .engine import Engine
from .network import Network
from .params import Parameters
from .planning import Plan, plan
from .saving import load
from .strategies import InfeasiblePlan

__version__ = "0.2.0"
__all__ = ["Engine", "InfeasiblePlan", "Network", "NetworkWithCheckpointing", "Parameters", "Plan", "load",
           "load_mnist", "memory", "plan", "strategies"]
