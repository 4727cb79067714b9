"""The optimizers as objects, for hyper-parameters other than PyTorch's defaults:
``Network(sizes, optimizer=Adam(betas=(0.9, 0.99)))``.  The formulas are in
:mod:`fastckpt.core.optimizers`."""
from .core.optimizers import SGD, Adam, AdamW, Momentum, Optimizer, OptimizerState

__all__ = ["SGD", "Adam", "AdamW", "Momentum", "Optimizer", "OptimizerState"]
