"""The planner's answers to "how does memory grow with depth?" and "what does each byte cost?".

For ``H`` hidden layers of width ``n`` between ``n_in`` inputs and ``n_out``
outputs, batch ``B`` and ``s`` bytes per number (each activation rounded up to
a 64-byte line), a training step holds

* parameters and gradients, ``s (n_in n + (H - 1) n^2 + n n_out + H n + n_out)`` each
  (no gradients with the optimizer in backward);
* two delta buffers, ``2 B s n`` (any ``H >= 2``);
* activations, which is where strategies differ:

  - plain: ``B s (H n + n_out)``, linear in depth;
  - ``every_nth(k)``: about ``B s n (H / k + k)`` (checkpoints plus one segment);
  - ``sqrt``: about ``2 B s n sqrt(H)``, for one extra forward pass;
  - ``revolve(d)``: at most ``d`` kept activations plus two being computed,
    ``B s n (d + 2)`` whatever the depth, paid for in recomputation that grows
    like ``H^(1/d)`` passes.

:func:`depth_table` gives the exact numbers from the planner; the formulas
above are what they follow.
"""
import numpy as np

from .costs import delta_elems, forward_flops, state_bytes, step_flops
from .plan import plan
from .search import multi_front, once_front


def depth_table(depths, *, width=256, n_in=784, n_out=10, batch_size=100, dtype=np.float64,
                strategies=("plain", "every_nth(2)", "sqrt", "revolve(4)"), optimizer_in_backward=False,
                max_memory=None):
    """Predicted bytes of a training step for nets ``[n_in] + [width] * depth + [n_out]``.

    Returns one dict per depth: ``hidden_layers``, ``sizes`` and, per strategy,
    its :meth:`Plan.bytes` plus ``extra_flop_fraction`` (``None`` where the
    strategy does not apply, e.g. ``segments(8)`` on fewer than 8 layers, or
    its search would take too long: ``refused`` says why, per strategy).  With
    ``max_memory`` (bytes), ``largest_batch`` gives per strategy the largest batch
    whose step fits it (:func:`largest_step_batch`; None when batch 1 does not).
    """
    rows = []
    for depth in depths:
        sizes = [n_in] + [width] * int(depth) + [n_out]
        row = {"hidden_layers": int(depth), "sizes": sizes, "refused": {}}
        for strategy in strategies:
            try:
                p = plan(sizes, batch_size, dtype, strategy, optimizer_in_backward=optimizer_in_backward)
            except ValueError as exc:
                row[str(strategy)] = None
                row["refused"][str(strategy)] = str(exc)
                continue
            row[str(strategy)] = dict(p.bytes(), extra_flop_fraction=p.extra_flop_fraction)
        if max_memory is not None:
            found = {str(s): largest_step_batch(sizes, max_memory, dtype, s,
                                                optimizer_in_backward=optimizer_in_backward)
                     for s in strategies if row[str(s)] is not None}
            row["largest_batch"] = {name: got[0] if got else None for name, got in found.items()}
        rows.append(row)
    return rows


BATCH_LIMIT = 2**24      # analyze's largest batch: shown as "≥" when the search stops there


def largest_step_batch(sizes, bound, dtype=np.float64, strategy="plain", *, optimizer_in_backward=False,
                       limit=BATCH_LIMIT):
    """``(batch, plan)``: the largest batch (at most ``limit``) whose training step with ``strategy`` plans
    within ``bound`` bytes, or None when batch 1 does not.  A step's bytes grow with its batch, so a
    bisection finds it (tests/test_pays.py checks it against a scan)."""
    def fitting(b):
        try:
            p = plan(sizes, b, dtype, strategy, optimizer_in_backward=optimizer_in_backward)
        except ValueError:                              # refused (too costly a search, too large a step)
            return None
        return p if p.bytes()["total"] <= bound else None
    if fitting(1) is None:
        return None
    low, high = 1, limit
    if fitting(high) is None:
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if fitting(mid) is not None else (low, mid)
        high = low
    return high, fitting(high)


def tradeoff(sizes, batch_size, dtype=np.float64, recompute="multi"):
    """The ``budget`` curve of one net: (activation bytes, extra FLOP fraction) at every breakpoint.

    Each point is the least activation memory (kept activations, recompute
    buffers, deltas) at which the least recomputation drops to that value.
    """
    item = np.dtype(dtype).itemsize
    search = once_front if recompute == "once" else multi_front
    front = search(list(forward_flops(sizes, batch_size)), state_bytes(sizes, batch_size, item), None)
    fixed = delta_elems(sizes, batch_size) * item
    one_pass = forward_flops(sizes, batch_size).sum()
    step = step_flops(sizes, batch_size)
    return [(peak + fixed, (cost - one_pass) / step) for peak, cost in zip(front.peaks, front.costs)]
