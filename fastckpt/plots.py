"""The look every fastckpt plot shares: one figure size, labelled axes, a grid and a legend, written as PNG."""

MiB = 2**20


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
