"""The offline picture of memray's peak (fastckpt.flame): the icicle's boxes by hand, then from real captures."""
import os
import re
from importlib.util import find_spec

import numpy as np
import pytest

import fastckpt
import fastckpt.engine.engine
from fastckpt.report.flame import OTHER, Box, capture_boxes, peak_tree, short_path, source_kind, write_peak_picture

MiB = 2**20


def test_peak_tree_widths_other_and_order_by_hand():
    stacks = [(("main", "a", "x"), 600), (("main", "a", "y"), 300), (("main", "a"), 100),   # a's own 100 bytes
              (("main", "b"), 90), (("main", "c", "z"), 6), (("main", "d"), 4)]
    assert peak_tree(stacks, min_fraction=0.02) == [        # under 22 bytes of 1100: c and d merge, z goes with c
        Box(0, 0, 1100, None),
        Box(1, 0, 1100, "main"),
        Box(2, 0, 1000, "a"), Box(2, 1000, 90, "b"), Box(2, 1090, 10, OTHER),
        Box(3, 0, 600, "x"), Box(3, 600, 300, "y"),                                          # a gap of 100 after y
    ]
    every = peak_tree(stacks, min_fraction=0)
    assert OTHER not in [b.frame for b in every]
    assert [(b.depth, b.start, b.width, b.frame) for b in every if b.frame in ("c", "d", "z")] == [
        (2, 1090, 6, "c"), (2, 1096, 4, "d"), (3, 1090, 6, "z")]
    assert peak_tree([], min_fraction=0.1) == [Box(0, 0, 0, None)]


def test_peak_tree_children_stay_inside_their_parent():
    rng = np.random.default_rng(3)
    stacks = [(tuple(f"f{d}_{rng.integers(3)}" for d in range(rng.integers(1, 6))), int(rng.integers(1, 1000)))
              for _ in range(60)]
    boxes = peak_tree(stacks, min_fraction=0.01)
    assert boxes[0].width == sum(size for _, size in stacks)
    assert [(b.depth, b.start) for b in boxes] == sorted((b.depth, b.start) for b in boxes)
    for child in boxes[1:]:
        parents = [p for p in boxes if p.depth == child.depth - 1 and p.start <= child.start < p.start + p.width]
        assert len(parents) == 1 and child.start + child.width <= parents[0].start + parents[0].width
    for depth in {b.depth for b in boxes}:
        row = [b for b in boxes if b.depth == depth]
        assert all(a.start + a.width <= b.start for a, b in zip(row, row[1:]))   # no overlap in a row


def test_source_files_are_named_and_coloured_by_package(tmp_path):
    script = tmp_path / "loose.py"
    script.write_text("")
    dense = find_spec("fastckpt.kernels.dense").origin
    assert short_path(fastckpt.engine.engine.__file__) == "fastckpt/engine/engine.py"
    assert short_path(dense).endswith("kernels/dense.py")
    assert short_path(np.__file__) == "numpy/__init__.py"
    assert short_path(str(script)) == "loose.py" and short_path("<frozen runpy>") == "<frozen runpy>"
    assert source_kind(fastckpt.engine.engine.__file__) == source_kind(dense) == "fastckpt"
    assert source_kind(np.__file__) == "numpy"
    assert source_kind(str(script)) == source_kind("<unknown>") == "other"


def _allocate_eight_mib():
    """The one big allocation of the capture below: 8 MiB of float64, alive at the peak."""
    return np.ones(MiB)


def _capture(path, native):
    import memray
    with memray.Tracker(path, native_traces=native):
        big = _allocate_eight_mib()
        small = [np.zeros(100) for _ in range(3)]
        del big, small
    return memray.FileReader(path)


@pytest.mark.memory
@pytest.mark.parametrize("native", [False, True], ids=["python", "native"])
def test_a_real_capture_shows_the_big_allocation_and_sums_to_the_peak(tmp_path, native):
    reader = _capture(tmp_path / "capture.bin", native)
    records = list(reader.get_high_watermark_allocation_records(merge_threads=True))
    boxes = capture_boxes(tmp_path / "capture.bin", min_fraction=0.005)
    # exact: the root is the sum of the records at the high-water mark, and memray's reported peak is that sum
    assert boxes[0].width == sum(r.size for r in records) == reader.metadata.peak_memory
    mine = [b for b in boxes if b.frame not in (None, OTHER) and b.frame.function == "_allocate_eight_mib"]
    assert len(mine) == 1 and 8 * MiB <= mine[0].width <= 8 * MiB + 64 * 1024
    assert mine[0].frame.kind == "other" and os.path.basename(mine[0].frame.file) == "test_flame.py"
    below = [b for b in boxes if b.depth == mine[0].depth + 1 and mine[0].start <= b.start < mine[0].start + MiB]
    assert below[0].frame.function == "ones" and below[0].frame.kind == "numpy" and below[0].width == 8 * MiB
    if native:                     # numpy's C frames under np.ones, collapsed into one box ending in the allocator
        leaf = [b for b in boxes if b.depth == below[0].depth + 1 and b.start == below[0].start]
        assert leaf[0].frame.file == "<native>" and "malloc" in leaf[0].frame.function
        assert leaf[0].width == 8 * MiB
    else:
        assert max(b.depth for b in boxes) == below[0].depth


def test_the_picture_is_a_png_and_a_self_contained_svg(tmp_path):
    import matplotlib.image
    _capture(tmp_path / "capture.bin", native=False)
    paths = write_peak_picture(tmp_path / "capture.bin", tmp_path / "peak", title="eight MiB")
    assert paths == [str(tmp_path / "peak.png"), str(tmp_path / "peak.svg")]
    image = matplotlib.image.imread(paths[0])
    assert image.ndim == 3 and image.shape[1] > 1000 and image.shape[0] > 150 and image.std() > 0
    svg = (tmp_path / "peak.svg").read_text()
    assert len(svg) > 10_000 and "<svg" in svg[:2000]
    assert "<script" not in svg and "@import" not in svg
    assert not re.search(r"""(?:href|src)\s*=\s*["']\s*(?:https?:)?//""", svg)     # nothing fetched from a network
    assert not re.search(r"""url\(\s*["']?\s*(?:https?:)?//""", svg)
    with pytest.raises(ValueError, match="min_fraction must be in"):
        write_peak_picture(tmp_path / "capture.bin", tmp_path / "no", min_fraction=1.5)


def test_every_part_names_an_allocating_line_or_function_of_its_file():
    from fastckpt.report.flame import _ASSIGNED, PARTS
    root = os.path.dirname(os.path.dirname(find_spec("fastckpt").origin))
    for (where, name), part in PARTS.items():
        lines = open(os.path.join(root, where)).read().splitlines()
        assigned = [line for line in lines if (m := _ASSIGNED.match(line)) and m.group(1) == name
                    and re.search(r"np\.(empty|zeros|full|ones)", line)]
        assert assigned or any(re.match(rf"\s*def {name}\(", line) for line in lines), (where, name, part)


@pytest.mark.memory
def test_a_training_step_s_picture_names_the_plan_s_parts_beside_the_code(tmp_path):
    import memray

    from fastckpt.report.flame import labels
    x, y = np.random.default_rng(0).random((64, 50)), np.eye(4)[np.arange(64) % 4]
    fastckpt.NetworkWithCheckpointing([50, 40, 40, 40, 4], strategy="sqrt").update_mini_batch(x, y, 0.1)  # warm-up
    with memray.Tracker(tmp_path / "step.bin"):
        net = fastckpt.NetworkWithCheckpointing([50, 40, 40, 40, 4], strategy="sqrt")
        net.update_mini_batch(x, y, 0.1)
    texts = " | ".join(labels(b.frame, b.width)[0] for b in capture_boxes(tmp_path / "step.bin", min_fraction=0))
    for part in ("[parameters]", "[workspace: activations and deltas (and the gradients sharing them)]"):
        assert part in texts, (part, texts)
    assert re.search(r"__init__ \[parameters\] \(fastckpt/core/params\.py:\d+\)  0\.\d\d MiB", texts), texts
