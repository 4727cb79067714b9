"""The planner: a net, batch size and strategy in, a frozen :class:`~fastckpt.planner.plan.Plan` out,
with its op list, workspace layout and predicted bytes, before any work.  Imports only core and kernels."""
from . import strategies
from .plan import Plan, plan, reshard, shard_plan
from .search import PlanTooCostly
from .strategies import InfeasiblePlan, parse_strategies, parse_strategy

__all__ = ["InfeasiblePlan", "Plan", "PlanTooCostly", "parse_strategies", "parse_strategy", "plan", "reshard",
           "shard_plan", "strategies"]
