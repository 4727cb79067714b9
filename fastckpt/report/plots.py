"""The look every fastckpt plot shares: one figure size, one style per strategy, labelled axes, a grid and a
legend, written as PNG.

NOTE [ Strategy styles ]
A strategy has the same colour, line style and marker in every plot (:func:`style`).  The kind (the text
before "(") picks a colour of Okabe and Ito's palette, which stays distinguishable under the common
colour-vision deficiencies, and a line style and marker of its own:

    plain      black           solid            circle
    every_nth  orange          dashed           square
    segments   sky blue        dash-dot-dot     triangle down
    sqrt       bluish green    dotted           triangle up
    revolve    blue            dash-dot         diamond
    budget     vermillion      long dashes      plus (filled)
    fit        reddish purple  dense dots       x (filled)
    any other  grey            dash-dot-dot-dot star

The argument picks one of four shades of the kind's colour: an integer ``n`` shade ``(n - 2) % 4``, so
``every_nth(2)`` and ``revolve(2)`` get the pure colour and ``every_nth(3)`` a different one; any other
argument (``budget(10MiB)``) shade ``crc32(argument) % 4``, spaces removed.  Shade 0 is the colour itself,
1 and 3 mix in 35% and 60% black, 2 mixes in 30% white.

Curves can coincide (on the lab net every strategy's memory and accuracy are those of plain), so
:func:`draw` keeps every one visible: earlier curves are drawn wider and under later ones, markers of long
curves are staggered so that they do not sit on each other, and a curve equal to an earlier one says so
in its label.  :func:`save` writes each strategy's drawn style into the PNG as a ``fastckpt-styles`` text
chunk (JSON), so the written file tells which colour is which strategy.
"""
import json
import zlib

import numpy as np

MiB = 2**20

_KINDS = {  # kind: (colour, line style, marker)
    "plain": ("#000000", "-", "o"),
    "every_nth": ("#E69F00", "--", "s"),
    "segments": ("#56B4E9", (0, (6, 2, 1, 2, 1, 2)), "v"),
    "sqrt": ("#009E73", ":", "^"),
    "revolve": ("#0072B2", "-.", "D"),
    "budget": ("#D55E00", (0, (9, 3)), "P"),
    "fit": ("#CC79A7", (0, (1, 1)), "X"),
}
_OTHER = ("#999999", (0, (5, 2, 1, 2, 1, 2, 1, 2)), "*")
_SHADES = (0.0, -0.35, 0.3, -0.6)  # < 0: mix in that much black; > 0: that much white
MARKERS = 10  # markers on a long curve


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def style(name):
    """``dict(color=, linestyle=, marker=)`` of a strategy (a name or a Strategy); see NOTE [ Strategy styles ]."""
    text = str(name).replace(" ", "")
    kind, _, argument = text.partition("(")
    argument = argument[:-1] if argument.endswith(")") else argument
    color, linestyle, marker = _KINDS.get(kind, _OTHER)
    if argument.isdecimal():
        shade = _SHADES[(int(argument) - 2) % len(_SHADES)]
    elif argument:
        shade = _SHADES[zlib.crc32(argument.encode()) % len(_SHADES)]
    else:
        shade = 0.0
    rgb = np.array([int(color[k:k + 2], 16) for k in (1, 3, 5)], dtype=np.float64)
    rgb = rgb * (1 + shade) if shade < 0 else rgb + (255 - rgb) * shade
    return {"color": "#" + "".join(f"{round(c):02x}" for c in rgb), "linestyle": linestyle, "marker": marker}


def figure():
    """A new (fig, ax) of the size every fastckpt plot uses."""
    return _pyplot().subplots(figsize=(7, 4.5), dpi=120)


def _twin(xs, ys, earlier, near):
    """The first earlier curve that ``(xs, ys)`` lies on (at every x of its own), else within ``near`` of; and
    the largest distance."""
    close = None
    for name, exs, eys in earlier:
        at = {x: k for k, x in enumerate(exs)}
        if not all(x in at for x in xs):
            continue
        gap = float(np.max(np.abs(ys - eys[[at[x] for x in xs]]))) if len(xs) else 0.0
        if gap == 0:
            return name, gap
        if close is None and gap <= near:
            close = name, gap
    return close or (None, None)


def draw(ax, curves, *, near=0.0, gap_text=None):
    """Plot ``curves``, ``(strategy, xs, ys, label)`` each, in the strategies' styles so that none hides another.

    Earlier curves are drawn wider, with larger markers, under later ones; a long curve's markers are
    staggered against the others'.  A curve equal to an earlier one gets "[same as <strategy>]" in its
    label (its xs may be fewer: a strategy that does not fit some nets); one within ``near`` (a fraction of
    the curves' y range) of it everywhere looks the same, and gets "[within <gap_text(gap)> of <strategy>]".
    Returns the lines.
    """
    n = len(curves)
    ys_all = np.concatenate([np.ravel(c[2]) for c in curves] or [[0.0]]).astype(np.float64)
    near *= float(np.ptp(ys_all)) if ys_all.size else 0.0
    earlier, lines = [], []
    for i, (name, xs, ys, label) in enumerate(curves):
        xs, ys = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
        twin, gap = _twin(xs, ys, earlier, near)
        if twin is not None:
            label += f" [same as {twin}]" if gap == 0 else f" [within {gap_text(gap)} of {twin}]"
        under = (n - 1 - i) / max(n - 1, 1)                   # 1 for the first curve, 0 for the last
        step = max(1, len(xs) // MARKERS)
        markevery = None if step == 1 else (i * step // n, step)
        (line,) = ax.plot(xs, ys, label=label, gid=str(name), linewidth=1.3 + 1.2 * under,
                          markersize=4 + 3.5 * under, markevery=markevery, zorder=2 + i / n, **style(name))
        earlier.append((str(name), xs, ys))
        lines.append(line)
    return lines


def drawn_styles(ax):
    """``{strategy: {color, linestyle, marker, label}}`` of the lines :func:`draw` and :func:`plot_tradeoff` drew."""
    from matplotlib.colors import to_hex
    return {line.get_gid(): {"color": to_hex(line.get_color()), "linestyle": line.get_linestyle(),
                             "marker": line.get_marker(), "label": line.get_label()}
            for line in ax.get_lines() if line.get_gid()}


def save(fig, ax, path, xlabel, ylabel, title, *, legend=None):
    """Label, grid and legend the axes, write the PNG (styles in its text) to ``path``, close the figure.
    ``legend`` takes Axes.legend's options (a legend placed outside the axes is kept in the picture)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(**(legend or {}))
    fig.tight_layout()
    fig.savefig(path, metadata={"fastckpt-styles": json.dumps(drawn_styles(ax))},
                bbox_inches="tight")                     # a legend below the axes (long labels) is kept whole
    _pyplot().close(fig)
    return path


def read_styles(path):
    """The ``{strategy: style}`` a PNG written by :func:`save` carries."""
    from PIL import Image
    with Image.open(path) as image:
        return json.loads(image.text.get("fastckpt-styles", "{}"))


def plot_depth(rows, path, *, title=None, key="total"):
    """Memory against hidden layers, one line per strategy, to a PNG."""
    fig, ax = figure()
    strategies = [k for k in rows[0] if k not in ("hidden_layers", "sizes", "measured", "refused")]
    curves = []
    for strategy in strategies:
        xs = [r["hidden_layers"] for r in rows if r[strategy] is not None]
        ys = [r[strategy][key] / MiB for r in rows if r[strategy] is not None]
        curves.append((strategy, xs, ys, strategy))
    draw(ax, curves)
    return save(fig, ax, path, "hidden layers", "predicted peak memory of a training step (MiB)" if key == "total"
                else "activation memory (MiB)", title or "Memory against depth")


def plot_tradeoff(points, path, *, marks=(), title=None):
    """The budget curve (activation MiB against extra FLOPs), with named strategies marked."""
    fig, ax = figure()
    xs = [p[0] / MiB for p in points]
    ys = [100 * p[1] for p in points]
    ax.step(xs, ys, where="post", color=style("budget")["color"], label="budget: least recomputation at each memory")
    at = {}                                                   # point: the names marked there
    for name, nbytes, extra in marks:
        at.setdefault((nbytes / MiB, 100 * extra), []).append(str(name))
    right = 0.8 * max([x for x, _ in at] + xs + [0.0])
    for point, names in at.items():
        for k, name in enumerate(names):                      # on one point: the first largest, underneath
            label = name + (f" [same point as {names[0]}]" if k else "")
            ax.plot(*point, linestyle="none", marker=style(name)["marker"], color=style(name)["color"],
                    markersize=8 + 4 * (len(names) - 1 - k), zorder=3 + k / len(names), gid=name, label=label)
        ax.annotate(" = ".join(names), point, textcoords="offset points", xytext=(-7, 7) if point[0] > right
                    else (7, 7), ha="right" if point[0] > right else "left")
    return save(fig, ax, path, "activation memory: kept + recompute buffers + deltas (MiB)",
                "recomputation (% of a plain step's FLOPs)", title or "Time against memory")
