"""Plots: one style per strategy in every PNG, and coinciding curves that stay visible and say so."""
import numpy as np
import pytest
from PIL import Image

from fastckpt.planner import curves
from fastckpt.planner.strategies import parse_strategy
from fastckpt.report import plots, summary

MiB = 2**20
SIZES = [784, 40, 30, 10]
NAMES = ["plain", "every_nth(2)", "every_nth(3)", "segments(4)", "sqrt", "revolve(2)", "revolve(4)",
         "budget(10MiB)", "budget(10MiB, once)", "fit(1GiB)"]


def _result(name, rss, seconds):
    """What ``fastckpt.report.compare.run_one`` returns, with made-up series."""
    return {"name": name, "strategy": name, "accuracies": [0.5, 0.6], "ms_per_update": 1e3 * float(np.median(seconds)),
            "memray_peak_bytes": MiB, "predicted_bytes": MiB, "recompute_factor": 1.0, "extra_flop_fraction": 0.0,
            "time_ratio": 1.0, "memory_ratio": 1.0, "rss_bytes": [int(b) for b in rss], "rss_base_bytes": 0,
            "update_seconds": [float(t) for t in seconds]}


def _setup():
    return {"sizes": SIZES, "batch_size": 10, "eta": 3.0, "epochs": 2, "dtype": "float64", "seed": 0, "data": "x"}


def _pixels(path):
    with Image.open(path) as image:
        rgb = np.asarray(image.convert("RGB")).reshape(-1, 3)
    return {"#" + bytes(p.astype(np.uint8)).hex() for p in np.unique(rgb, axis=0)}


def _write_all(tmp_path, results):
    """Every PNG the package writes, from ``results`` (the compare report) and an analysis of the same names."""
    paths = summary.write_report(tmp_path / "compare", results, _setup())
    names = [r["name"] for r in results]
    rows = curves.depth_table([1, 2, 4, 8], width=64, batch_size=16, strategies=names)
    depth = plots.plot_depth(rows, tmp_path / "memory_vs_depth.png")
    marks = [(n, (k + 1) * MiB, 0.1 * k) for k, n in enumerate(names)]
    curve = [(8 * MiB, 0.0), (4 * MiB, 0.2), (2 * MiB, 1.0)]
    tradeoff = plots.plot_tradeoff(curve, tmp_path / "budget_tradeoff.png", marks=marks)
    return [paths["memory"], paths["time"], paths["depth"], depth, tradeoff]


def test_style_is_fixed_by_name_and_documented_for_the_plain_kinds():
    for name in NAMES:
        assert plots.style(name) == plots.style(name) == plots.style(name.replace("(", "( ").replace(")", " )"))
    assert plots.style(parse_strategy("budget(10MiB, once)")) == plots.style("budget(10MiB, once)")
    expected = {"plain": "#000000", "every_nth(2)": "#e69f00", "segments(2)": "#56b4e9", "sqrt": "#009e73",
                "revolve(2)": "#0072b2", "every_nth(6)": "#e69f00"}          # (n - 2) % 4 == 0: the kind's colour
    assert {n: plots.style(n)["color"] for n in expected} == expected


def test_kinds_get_different_colours_and_variants_of_a_kind_different_shades():
    kinds = ["plain", "every_nth(2)", "segments(2)", "sqrt", "revolve(2)", "budget(10MiB)", "fit(1GiB)", "newkind"]
    styles = [plots.style(n) for n in kinds]
    for key in ("color", "linestyle", "marker"):
        values = [repr(s[key]) for s in styles]
        assert len(set(values)) == len(kinds), key
    for kind in ("every_nth", "segments", "revolve"):
        shades = {plots.style(f"{kind}({n})")["color"] for n in (2, 3, 4, 5)}
        assert len(shades) == 4
        assert {plots.style(f"{kind}({n})")["marker"] for n in (2, 3, 4, 5)} == {plots.style(f"{kind}(2)")["marker"]}


def test_a_strategy_has_one_style_in_every_png(tmp_path):
    rng = np.random.default_rng(0)
    names = ["plain", "every_nth(2)", "sqrt", "revolve(2)"]
    results = [_result(n, MiB * (k + np.arange(40) / 40), rng.uniform(1e-4, 2e-4, 40)) for k, n in enumerate(names)]
    pngs = _write_all(tmp_path, results)
    seen = {}
    for png in pngs:
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        drawn = plots.read_styles(png)
        assert set(drawn) == set(names), png
        pixels = _pixels(png)
        for name, got in drawn.items():
            want = plots.style(name)
            assert (got["color"], got["marker"]) == (want["color"], want["marker"]), (png, name)
            assert got["color"] in pixels, (png, name)          # drawn, not only announced
            seen.setdefault(name, set()).add((got["color"], got["marker"]))
    assert all(len(styles) == 1 for styles in seen.values())
    assert len({s.pop()[0] for s in seen.values()}) == len(names)


def test_coinciding_curves_differ_in_style_and_say_so():
    fig, ax = plots.figure()
    xs = np.arange(200)
    ys = np.sqrt(xs)
    lines = plots.draw(ax, [("plain", xs, ys, "plain"), ("every_nth(2)", xs, ys, "every_nth(2)"),
                            ("sqrt", xs, ys + 1e-3, "sqrt"), ("revolve(2)", xs, ys + 5, "revolve(2)")],
                       near=0.01, gap_text=lambda d: f"{d:.3f}")
    labels = [line.get_label() for line in lines]
    assert labels == ["plain", "every_nth(2) [same as plain]", "sqrt [within 0.001 of plain]", "revolve(2)"]
    assert len({repr(plots.style(line.get_gid())["linestyle"]) for line in lines}) == 4
    assert len({line.get_marker() for line in lines}) == 4
    assert len({line.get_markevery() for line in lines}) == 4                   # staggered markers
    widths = [line.get_linewidth() for line in lines]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1]    # the first is wider, underneath
    assert [line.get_zorder() for line in lines] == sorted(line.get_zorder() for line in lines)
    plots._pyplot().close(fig)


def test_a_curve_on_fewer_xs_is_the_same_where_it_is_defined():
    fig, ax = plots.figure()
    xs, ys = np.array([1, 2, 4, 8, 16]), np.array([1.0, 2, 3, 5, 8])
    lines = plots.draw(ax, [("plain", xs, ys, "plain"), ("segments(8)", xs[3:], ys[3:], "segments(8)"),
                            ("sqrt", xs[3:], ys[3:] + 1, "sqrt")])
    assert [line.get_label() for line in lines] == ["plain", "segments(8) [same as plain]", "sqrt"]
    plots._pyplot().close(fig)


def test_the_written_report_says_which_curves_are_the_same(tmp_path):
    rss = MiB * (1 + np.arange(50) / 50)
    seconds = np.full(50, 1e-4)
    results = [_result("plain", rss, seconds), _result("every_nth(2)", rss, seconds),
               _result("sqrt", rss + 4096, 2 * seconds), _result("segments(3)", rss + MiB, 3 * seconds)]
    paths = summary.write_report(tmp_path, results, _setup())
    memory_labels = {n: s["label"] for n, s in plots.read_styles(paths["memory"]).items()}
    assert memory_labels["every_nth(2)"].endswith("[same as plain]")
    assert memory_labels["sqrt"].endswith("[within 4 KiB of plain]")
    assert "[" not in memory_labels["plain"] + memory_labels["segments(3)"]
    # the legend speaks of what the axis shows, in its unit: the RSS rise (max of plain's series: 1.98 MiB), and
    # names the step's own memray peak as a part of it
    assert memory_labels["plain"] == "plain: RSS rise up to 1.98 MiB, of which the training step's buffers 1.00 MiB " \
        "(memray)"
    assert memory_labels["segments(3)"].startswith("segments(3): RSS rise up to 2.98 MiB,")
    time_labels = [s["label"] for s in plots.read_styles(paths["time"]).values()]
    assert sum("[same as plain]" in label for label in time_labels) == 1
    depth_labels = {n: s["label"] for n, s in plots.read_styles(paths["depth"]).items()}
    assert depth_labels["every_nth(2)"] == "every_nth(2) [same as plain]"  # lab net: no strategy saves memory


@pytest.mark.parametrize("names", [["sqrt", "revolve(2)"], ["sqrt", "revolve(2)", "budget(64MiB)"]])
def test_marks_on_the_same_point_are_all_shown(tmp_path, names):
    marks = [(n, 64 * MiB, 0.25) for n in names] + [("plain", 128 * MiB, 0.0)]
    path = plots.plot_tradeoff([(128 * MiB, 0.0), (64 * MiB, 0.25)], tmp_path / "t.png", marks=marks)
    drawn = plots.read_styles(path)
    assert drawn[names[0]]["label"] == names[0] and drawn["plain"]["label"] == "plain"
    assert all(drawn[n]["label"] == f"{n} [same point as {names[0]}]" for n in names[1:])
    assert {plots.style(n)["color"] for n in names} <= _pixels(path)
