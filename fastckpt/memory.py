"""Memory: memray's measured peak, and the planner's answers to "how does memory grow with depth?".

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
import os
import tempfile

import numpy as np

from .strategies import InfeasiblePlan, plan

MiB = 2**20


def memray_peak(run):
    """memray's peak bytes (all native allocations) while ``run()`` executes."""
    import memray
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "peak.bin")
        with memray.Tracker(path):
            run()
        return memray.FileReader(path).metadata.peak_memory


def depth_table(depths, *, width=256, n_in=784, n_out=10, batch_size=100, dtype=np.float64,
                strategies=("plain", "every_nth(2)", "sqrt", "revolve(4)"), optimizer_in_backward=False):
    """Predicted bytes of a training step for nets ``[n_in] + [width] * depth + [n_out]``.

    Returns one dict per depth: ``hidden_layers``, ``sizes`` and, per strategy,
    its :meth:`Plan.bytes` plus ``extra_flop_fraction`` (``None`` where the
    strategy does not apply, e.g. ``segments(8)`` on fewer than 8 layers).
    """
    rows = []
    for depth in depths:
        sizes = [n_in] + [width] * int(depth) + [n_out]
        row = {"hidden_layers": int(depth), "sizes": sizes}
        for strategy in strategies:
            try:
                p = plan(sizes, batch_size, dtype, strategy, optimizer_in_backward=optimizer_in_backward)
            except ValueError:
                row[str(strategy)] = None
                continue
            row[str(strategy)] = dict(p.bytes(), extra_flop_fraction=p.extra_flop_fraction)
        rows.append(row)
    return rows


def tradeoff(sizes, batch_size, dtype=np.float64, recompute="multi"):
    """The ``budget`` curve of one net: (activation bytes, extra FLOP fraction) at every breakpoint.

    Each point is the least activation memory (kept activations, recompute
    buffers, deltas) at which the least recomputation drops to that value.
    """
    from .schedule import delta_elems, forward_flops, state_bytes, step_flops
    from .search import multi_front, once_front
    item = np.dtype(dtype).itemsize
    search = once_front if recompute == "once" else multi_front
    front = search(list(forward_flops(sizes, batch_size)), state_bytes(sizes, batch_size, item), None)
    fixed = delta_elems(sizes, batch_size) * item
    one_pass = forward_flops(sizes, batch_size).sum()
    step = step_flops(sizes, batch_size)
    return [(peak + fixed, (cost - one_pass) / step) for peak, cost in zip(front.peaks, front.costs)]


def least_activation_bytes(sizes, batch_size, dtype=np.float64, recompute="multi"):
    """The least activation memory any schedule of the given kind needs."""
    try:
        plan(sizes, batch_size, dtype, f"budget(1{', once' if recompute == 'once' else ''})")
    except InfeasiblePlan as exc:
        return exc.minimum_bytes
    return 1


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def figure():
    """A new (fig, ax) of the size every fastckpt plot uses."""
    return _pyplot().subplots(figsize=(7, 4.5), dpi=120)


def save(fig, ax, path, xlabel, ylabel, title):
    """Label, grid and legend the axes, write the PNG to ``path`` and close the figure."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    _pyplot().close(fig)
    return path


def plot_depth(rows, path, *, title=None, key="total"):
    """Memory against hidden layers, one line per strategy, to a PNG."""
    fig, ax = figure()
    strategies = [k for k in rows[0] if k not in ("hidden_layers", "sizes", "measured")]
    for strategy in strategies:
        xs = [r["hidden_layers"] for r in rows if r[strategy] is not None]
        ys = [r[strategy][key] / MiB for r in rows if r[strategy] is not None]
        ax.plot(xs, ys, marker="o", label=strategy)
    return save(fig, ax, path, "hidden layers", "predicted peak memory of a training step (MiB)" if key == "total"
                else "activation memory (MiB)", title or "Memory against depth")


def plot_tradeoff(points, path, *, marks=(), title=None):
    """The budget curve (activation MiB against extra FLOPs), with named strategies marked."""
    fig, ax = figure()
    xs = [p[0] / MiB for p in points]
    ys = [100 * p[1] for p in points]
    ax.step(xs, ys, where="post", label="budget: least recomputation at each memory")
    for name, nbytes, extra in marks:
        ax.plot(nbytes / MiB, 100 * extra, "o")
        ax.annotate(name, (nbytes / MiB, 100 * extra), textcoords="offset points", xytext=(5, 5))
    return save(fig, ax, path, "activation memory: kept + recompute buffers + deltas (MiB)",
                "recomputation (% of a plain step's FLOPs)", title or "Time against memory")
