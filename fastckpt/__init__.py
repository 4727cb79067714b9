"""fastckpt: fast CPU training of MLPs, with gradient checkpointing.

``from fastckpt import Network, NetworkWithCheckpointing`` replaces the lab classes.
The layers beneath this facade are drawn in docs/architecture.md.
"""
import os as _os
import sys as _sys

try:                                         # the BLAS is chosen as the kernels load (FASTCKPT_BLAS)
    from . import kernels as _kernels  # noqa: F401
except ImportError as _exc:
    _cli = _os.path.basename(_sys.argv[0]) == "fastckpt" or _sys.argv[0] in ("-m", "") or \
        _sys.argv[0].endswith(_os.path.join("fastckpt", "__main__.py"))
    if type(_exc).__name__ == "BlasChoiceError" and _cli:
        _sys.stderr.write(f"fastckpt: error: {_exc}\n")         # the command line's one line, exit 2
        raise SystemExit(2) from None
    raise

from . import optimizers
from ._version import __version__
from .core.params import Parameters
from .data import load_mnist
from .engine import Engine
from .nets import Network, NetworkWithCheckpointing, load
from .planner import InfeasiblePlan, Plan, plan, strategies

__all__ = ["Engine", "InfeasiblePlan", "Network", "NetworkWithCheckpointing", "Parameters", "Plan", "__version__",
           "load", "load_mnist", "optimizers", "plan", "strategies"]
