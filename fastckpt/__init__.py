"""fastckpt: fast CPU training of sigmoid MLPs, with gradient checkpointing.

``from fastckpt import Network, NetworkWithCheckpointing`` replaces the lab classes.
"""
from .data import load_mnist
from .network import Network, NetworkWithCheckpointing
from .plan import Plan

__version__ = "0.1.0"
__all__ = ["Network", "NetworkWithCheckpointing", "Plan", "load_mnist"]
