"""The lab's ``NetworkWithCheckpointing``: a :class:`~fastckpt.nets.network.Network` with a checkpoint strategy."""
import numpy as np

from fastckpt.core.checks import check_positive_int, check_sizes, shaped_like
from fastckpt.planner.strategies import EveryNth, parse_strategy

from .network import Network


class NetworkWithCheckpointing(Network):
    """A :class:`Network` whose backprop keeps only some activations and recomputes the rest.

    Parameters
    ----------
    sizes : sequence of int
        Units per layer, input first.
    checkpoint_every_nth_layer : int, optional
        The lab's rule (default 2): keep the inputs of layers 0, n, 2n, ...
        after the forward pass and recompute every other activation at most
        once during backprop.  1 is plain backprop.  Same as
        ``strategy="every_nth(n)"``.
    dtype : {numpy.float64, numpy.float32}, optional
    strategy : Strategy or str, optional
        Any strategy of :func:`fastckpt.plan` instead: ``"sqrt"``,
        ``"segments(8)"``, ``"revolve(4)"``, ``"budget(24MiB)"``, ...
        Give this or ``checkpoint_every_nth_layer``, not both.  It is parsed
        here; a search (``revolve``, ``budget``) runs when the first step's
        batch size is known, and an impossible budget is refused then.
    optimizer_in_backward, loss, l2, activation, init
        See :class:`Network`.
    """

    def __init__(self, sizes, checkpoint_every_nth_layer=None, dtype=np.float64, *, strategy=None, **kwargs):
        if strategy is not None and checkpoint_every_nth_layer is not None:
            raise ValueError(f"give checkpoint_every_nth_layer or strategy, not both; got "
                             f"{checkpoint_every_nth_layer!r} and {strategy!r}")
        if strategy is None:
            n = 2 if checkpoint_every_nth_layer is None else checkpoint_every_nth_layer
            strategy = EveryNth(check_positive_int(n, "checkpoint_every_nth_layer"))
        strategy = parse_strategy(strategy)
        strategy.check(check_sizes(sizes))               # e.g. segments(k > L): refused before any draw
        super().__init__(sizes, dtype, **kwargs)
        self._set_strategy(strategy)

    @classmethod
    def blank(cls, sizes, dtype=np.float64, *, strategy="every_nth(2)", **kwargs):
        """A net with zero parameters and ``strategy``, made without drawing from ``numpy.random``."""
        strategy = parse_strategy(strategy)
        strategy.check(check_sizes(sizes))
        self = super().blank(sizes, dtype, **kwargs)
        self._set_strategy(strategy)
        return self

    def _set_strategy(self, strategy):
        self.strategy = strategy
        self.checkpoint_every_nth_layer = getattr(strategy, "n", None)

    @property
    def checkpoints_layer_idx(self):
        """Layers whose input is kept after the forward pass: the lab's 0, n, 2n, ... for
        ``every_nth(n)``; for other strategies, those of the plan in use (batch 1 before any step)."""
        if isinstance(self.strategy, EveryNth):
            return list(range(0, self.num_layers - 1, self.strategy.n))
        plan = self._engine.plan if self._engine is not None else self.plan(1)
        return [j for j in plan.kept if j < self.num_layers - 1]

    def forward_between_checkpoints(self, a, layer_idx_start, layer_idx_end):
        """Activations ``[a, a[start+1], ..., a[end]]`` from ``a``, the input of layer ``start``.

        ``a`` may be a batch (batch, n) or (batch, n, 1), or one (n, 1) column;
        results have the same layout.  Uses the same kernel as backprop, so the
        values are bit-identical to the ones training computes.
        """
        n = self.num_layers - 1
        start = check_positive_int(layer_idx_start, "layer_idx_start", minimum=0)
        end = check_positive_int(layer_idx_end, "layer_idx_end", minimum=0)
        if not start <= end <= n:
            raise ValueError(f"need 0 <= layer_idx_start <= layer_idx_end <= {n}, got {start} and {end}")
        arr, layout = self._as_input(a, self.sizes[start], "a")
        outs = self._forward(arr, start, end)
        return [a] + [shaped_like(o, layout) for o in outs[1:]]
