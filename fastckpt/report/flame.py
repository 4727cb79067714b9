"""Where the peak memory goes: an icicle chart of memray's high-water mark, drawn offline with matplotlib.

memray's flamegraph HTML loads its scripts from a CDN and is blank without internet; this
picture (PNG and SVG) reads the same capture file and needs nothing but matplotlib.
"""
import linecache
import os
import re
from collections import namedtuple
from functools import cache, lru_cache
from importlib.util import find_spec

MiB = 2**20
OTHER = "other"                              # the frame of a box that merges small siblings
Box = namedtuple("Box", "depth start width frame")
Frame = namedtuple("Frame", "function file line kind")
COLOURS = {"fastckpt": "#4c72b0", "numpy": "#dd8452", "other": "#b4b4b4", "merged": "#e6e6e6", "root": "#55585e"}
LEGEND = {"fastckpt": "fastckpt (fastckpt/, kernels/)", "numpy": "numpy", "other": "other code, native frames",
          "merged": "small frames merged"}
TITLE = "Memory live at memray's high-water mark"
# Where fastckpt allocates each part of the plan's bytes (fastckpt.planner.plan.Plan.bytes): the file and the
# name assigned on the allocating line (or the function that returns the allocation), so that a student reads
# "parameters" beside Parameters.__init__.  tests/test_flame.py checks that every entry names a real line.
PARTS = {
    ("fastckpt/core/params.py", "_flat"): "parameters",
    ("fastckpt/core/params.py", "new_buffer"): "gradients",
    ("fastckpt/engine/engine.py", "_grad"): "gradients",
    ("fastckpt/engine/workspace.py", "work"): "workspace: activations and deltas (and the gradients sharing them)",
    ("fastckpt/engine/workspace.py", "floats"): "scratch",
    ("fastckpt/engine/batches.py", "_buffers"): "data: a minibatch's staging rows",
    ("fastckpt/engine/inference.py", "work"): "evaluation: the layers' outputs",
    ("fastckpt/data/__init__.py", "_images"): "data",
}
_ASSIGNED = re.compile(r"^\s*(?:self\.)?(\w+)(?:\[[^\]]*\])?\s*=")
ROW_INCHES, TOP_INCHES, BOTTOM_INCHES = 0.28, 0.5, 0.45
FONT_POINTS, CHAR_EMS = 7.0, 0.60                # DejaVu Sans: under 0.6 em per character


def peak_tree(stacks, *, min_fraction=0.005):
    """Boxes ``(depth, start, width, frame)`` of an icicle from ``(stack, bytes)`` pairs, stacks root first.

    Depth 0 is the root (frame None, width the total); children sit left to right from their
    parent's start, largest first; siblings under ``min_fraction`` of the total merge into one
    ``"other"`` box (without children) after them.  Boxes come sorted by (depth, start).
    """
    root = {"size": 0, "children": {}}
    for stack, size in stacks:
        node = root
        node["size"] += size
        for frame in stack:
            node = node["children"].setdefault(frame, {"size": 0, "children": {}})
            node["size"] += size
    least = min_fraction * root["size"]
    boxes = []

    def walk(node, frame, depth, start):
        boxes.append(Box(depth, start, node["size"], frame))
        big = sorted(((f, c) for f, c in node["children"].items() if c["size"] >= least),
                     key=lambda fc: (-fc[1]["size"], str(fc[0])))
        for f, child in big:
            walk(child, f, depth + 1, start)
            start += child["size"]
        small = sum(c["size"] for c in node["children"].values() if c["size"] < least)
        if small:
            boxes.append(Box(depth + 1, start, small, OTHER))
    walk(root, None, 0, 0)
    return sorted(boxes, key=lambda b: (b.depth, b.start))


@cache
def _package_dirs():
    """The folders whose files count as fastckpt's and numpy's."""
    dirs = {}
    for name, kind in (("fastckpt", "fastckpt"), ("fastckpt.kernels", "fastckpt"), ("numpy", "numpy")):
        spec = find_spec(name)
        for d in (spec.submodule_search_locations or []) if spec else []:
            dirs[os.path.realpath(d) + os.sep] = kind
    return dirs


@lru_cache(maxsize=4096)
def source_kind(path):
    """'fastckpt', 'numpy' or 'other': whose source file ``path`` is."""
    real = os.path.realpath(path) if os.path.isabs(path) else ""
    return next((kind for d, kind in _package_dirs().items() if real.startswith(d)), "other")


@lru_cache(maxsize=4096)
def short_path(path):
    """``path`` relative to the folder above its top package (``fastckpt/engine.py``), else its basename."""
    if not os.path.isabs(path):
        return path
    top = os.path.dirname(path)
    while os.path.exists(os.path.join(top, "__init__.py")):
        top = os.path.dirname(top)
    return os.path.relpath(path, top) if top != os.path.dirname(path) else os.path.basename(path)


def _frames(record, native):
    """A record's stack, root first, as Frames; with ``native``, the C frames below its innermost Python
    frame as one more frame, 'entry ... allocator' (``array_empty ... default_malloc``)."""
    from memray.reporters.frame_tools import is_frame_interesting
    python = record.stack_trace()
    frames = [Frame(function, path, line, source_kind(path)) for function, path, line in reversed(python)]
    if native:
        hybrid = list(record.hybrid_stack_trace())
        chain = [f[0] for f in hybrid[:hybrid.index(python[0]) if python else len(hybrid)] if is_frame_interesting(f)]
        if chain:
            frames.append(Frame(chain[-1] + (f" ... {chain[0]}" if len(chain) > 1 else ""), "<native>", 0, "other"))
    return tuple(frames)


def _colour_key(frame):
    """The key of a box's colour in COLOURS."""
    return "root" if frame is None else "merged" if frame == OTHER else frame.kind


def plan_part(frame):
    """The part of the plan's bytes (:data:`PARTS`) that ``frame``'s line allocates, else None."""
    if frame is None or frame == OTHER or frame.kind != "fastckpt" or not os.path.isabs(frame.file):
        return None
    where = short_path(frame.file)
    assigned = _ASSIGNED.match(linecache.getline(frame.file, frame.line))
    return PARTS.get((where, assigned.group(1) if assigned else None)) or PARTS.get((where, frame.function))


def labels(frame, width):
    """Texts for a box, longest first: 'function [part] (file:line)  x MiB', 'function [part]  x MiB',
    'function [part]', 'function' (the last one cut short with an ellipsis where none fits); [part] is the
    plan's part the line allocates, where it is one."""
    size = f"{width / MiB:.2f} MiB"
    if frame is None:
        return (f"all  {size}",)
    if frame == OTHER:
        return (f"other  {size}", "other")
    where = f" ({short_path(frame.file)}:{frame.line})" if os.path.isabs(frame.file) else ""
    part = plan_part(frame)
    name = f"{frame.function} [{part}]" if part else frame.function
    return (f"{name}{where}  {size}", f"{name}  {size}", name) + ((frame.function,) if part else ())


def capture_boxes(capture_path, *, min_fraction=0.005, native=None):
    """The :func:`peak_tree` of a memray capture's high-water mark, frames as :class:`Frame`."""
    import memray
    if not 0 <= min_fraction < 1:
        raise ValueError(f"min_fraction must be in [0, 1), got {min_fraction}")
    reader = memray.FileReader(os.fspath(capture_path))
    if native is None:
        native = reader.metadata.has_native_traces
    stacks = [(_frames(r, native), r.size) for r in reader.get_high_watermark_allocation_records(merge_threads=True)]
    return peak_tree(stacks, min_fraction=min_fraction)


def write_peak_picture(capture_path, out_stem, *, title=None, min_fraction=0.005, native=None, width_inches=13):
    """Draw where memray's peak memory goes as an icicle chart, to ``out_stem`` + ``.png`` and ``.svg``.

    Parameters
    ----------
    capture_path : str or path
        A memray capture file (``memray.Tracker(path)`` or ``memray run -o path``).
    out_stem : str or path
        The output path without its suffix; its folder must exist.
    title : str, optional
        Text before the peak in the title (default :data:`TITLE`).
    min_fraction : float
        Frames holding less than this fraction of the peak merge, per parent, into one "other" box.
    native : bool, optional
        Show the native frames below each allocation's innermost Python frame (default: when the
        capture has native traces).
    width_inches : float
        The figure's width; its height follows from the deepest stack.

    Returns
    -------
    list of str
        The paths written, PNG first.  The root box's width is the sum of the sizes memray
        reports live at the high-water mark, which is ``reader.metadata.peak_memory``.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle
    boxes = capture_boxes(capture_path, min_fraction=min_fraction, native=native)
    total = boxes[0].width
    if total == 0:
        raise ValueError(f"capture_path {os.fspath(capture_path)!r} has no memory live at its peak")
    rows = max(b.depth for b in boxes) + 1
    height = rows * ROW_INCHES + TOP_INCHES + BOTTOM_INCHES
    fig = Figure(figsize=(width_inches, height), dpi=110)
    ax = fig.add_axes([0.01, BOTTOM_INCHES / height, 0.98, rows * ROW_INCHES / height])
    inches_per_byte = 0.98 * width_inches / total
    char = CHAR_EMS * FONT_POINTS / 72                            # the mean width of a character, in inches
    for b in boxes:
        kind = _colour_key(b.frame)
        ax.add_patch(Rectangle((b.start, b.depth), b.width, 1, facecolor=COLOURS[kind], edgecolor="white",
                               linewidth=0.6))
        room = int(b.width * inches_per_byte / char) - 1                # characters that fit in the box
        fits = [t for t in labels(b.frame, b.width) if len(t) <= room] or \
            ([labels(b.frame, b.width)[-1][:room - 1] + "\u2026"] if room >= 4 else [])
        if fits:
            ax.text(b.start + 0.5 * char / inches_per_byte, b.depth + 0.55, fits[0], fontsize=FONT_POINTS,
                    va="center", ha="left", color="white" if kind in ("root", "fastckpt") else "black")
    ax.set_xlim(0, total)
    ax.set_ylim(rows, 0)                                          # the root on top
    ax.axis("off")
    fig.suptitle(f"{title or TITLE}: peak {total / MiB:.2f} MiB", fontsize=11, y=1 - 0.12 / height, va="top")
    used = [k for k in LEGEND if any(_colour_key(b.frame) == k for b in boxes)]
    fig.legend(handles=[Patch(facecolor=COLOURS[k], label=LEGEND[k]) for k in used], loc="lower center",
               ncol=len(used), fontsize=8, frameon=False)
    paths = [os.fspath(out_stem) + ".png", os.fspath(out_stem) + ".svg"]
    for path in paths:
        fig.savefig(path, metadata={"Date": None} if path.endswith(".svg") else None)
    return paths
