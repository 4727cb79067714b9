"""What ``compare`` reports: the ratios, the table, the JSON summary and the files of ``--out``."""
import os

import numpy as np

from fastckpt.planner.curves import depth_table

from .compare import MEMRAY_STEPS
from .plots import draw, figure, plot_depth, save

MiB = 2**20


def ratios(results):
    """Each run's ``time_ratio`` and ``memory_ratio`` against the first (plain) run, in place."""
    base = results[0]
    for r in results:
        r["time_ratio"] = r["ms_per_update"] / base["ms_per_update"]
        r["memory_ratio"] = r["memray_peak_bytes"] / base["memray_peak_bytes"]


def same_accuracy(results, tol=1e-3):
    """Whether every run reached the plain run's accuracy at every epoch, to ``tol``."""
    base = results[0]["accuracies"]
    return all(len(r["accuracies"]) == len(base) and np.allclose(r["accuracies"], base, atol=tol)
               for r in results)


def summary(results, setup):
    """The JSON-ready summary: setup, per-run numbers (no per-update series) and the verdict."""
    ratios(results)
    keep = ("name", "strategy", "accuracies", "ms_per_update", "memray_peak_bytes", "predicted_bytes",
            "recompute_factor", "extra_flop_fraction", "time_ratio", "memory_ratio")
    return {"setup": setup, "runs": [{k: r[k] for k in keep} for r in results],
            "same_accuracy": same_accuracy(results)}


def table(results, setup):
    """The text table ``fastckpt compare`` prints."""
    ratios(results)
    lines = [f"{setup['sizes']}, batch {setup['batch_size']}, eta {setup['eta']}, {setup['epochs']} epochs, "
             f"{setup['dtype']}, seed {setup['seed']}, {setup['data']}"
             + (", SGD in backward" if setup.get("sgd_in_backward") else ""),
             "test accuracy per epoch:"]
    for r in results:
        lines.append(f"  {r['name']:<16} " + " ".join(f"{a:.3f}" for a in r["accuracies"]))
    lines += ["", f"{'run':<16} {'accuracy':>8} {'ms/update':>10} {'x time':>7} {'peak MiB':>9} "
                  f"{'x mem':>6} {'plan MiB':>9} {'recompute':>9}"]
    for r in results:
        final = r["accuracies"][-1] if r["accuracies"] else float("nan")
        lines.append(f"{r['name']:<16} {final:>8.4f} {r['ms_per_update']:>10.3f} {r['time_ratio']:>7.2f} "
                     f"{r['memray_peak_bytes'] / MiB:>9.3f} {r['memory_ratio']:>6.2f} "
                     f"{r['predicted_bytes'] / MiB:>9.3f} {r['recompute_factor']:>9.2f}")
    lines += ["", f"same accuracy with and without checkpointing: {'yes' if same_accuracy(results) else 'NO'}",
              f"ms/update: median over all updates; peak: memray, building the net and {MEMRAY_STEPS} training "
              "steps;",
              "plan: fastckpt's predicted bytes; recompute: forward FLOPs per step / one forward pass"]
    return "\n".join(lines)


def write_report(out, results, setup):
    """PNGs (memory per update, cumulative update time, memory against depth) and summary.md in ``out``."""
    os.makedirs(out, exist_ok=True)
    title = f"{setup['sizes']}, batch {setup['batch_size']}, {setup['dtype']}"
    paths = {}
    fig, ax = figure()
    fig.set_figheight(5.5)                                # room for the legend below the axes
    curves = [(r["name"], np.arange(len(r["rss_bytes"])),
               (np.array(r["rss_bytes"], dtype=np.float64) - r["rss_base_bytes"]) / MiB) for r in results]
    draw(ax, [(name, xs, ys, f"{name}: RSS rise up to {ys.max() if len(ys) else 0:.2f} MiB, of which the "
               f"training step's buffers {r['memray_peak_bytes'] / MiB:.2f} MiB (memray)")
              for (name, xs, ys), r in zip(curves, results)],
         near=0.03, gap_text=lambda mib: f"{mib * 1024:.0f} KiB")
    paths["memory"] = save(fig, ax, os.path.join(out, "memory_per_update.png"), "weight update",
                           "process RSS before the update, above its\nvalue before the net was built (MiB)",
                           f"Memory usage per weight update\n{title}",
                           legend={"fontsize": "small", "loc": "upper center", "bbox_to_anchor": (0.5, -0.2)})
    fig, ax = figure()
    draw(ax, [(r["name"], np.arange(len(r["update_seconds"])), np.cumsum(r["update_seconds"]),
               f"{r['name']} ({r['ms_per_update']:.3f} ms/update)") for r in results])
    paths["time"] = save(fig, ax, os.path.join(out, "cumulative_update_time.png"), "weight update",
                         "cumulative update time (s)", f"Cumulative update time\n{title}")
    sizes = setup["sizes"]
    width = max(sizes[1:-1]) if len(sizes) > 2 else sizes[0]
    rows = depth_table([1, 2, 4, 8, 16, 32], width=width, n_in=sizes[0], n_out=sizes[-1],
                              batch_size=setup["batch_size"], dtype=setup["dtype"],
                              strategies=["plain"] + [r["strategy"] for r in results[1:]])
    paths["depth"] = plot_depth(rows, os.path.join(out, "memory_vs_depth.png"),
                                title=f"[{sizes[0]}] + [{width}]*H + [{sizes[-1]}], batch "
                                      f"{setup['batch_size']}, {setup['dtype']} (planner)")
    paths["summary"] = os.path.join(out, "summary.md")
    with open(paths["summary"], "w") as f:
        f.write("# fastckpt compare\n\n```\n" + table(results, setup) + "\n```\n\n")
        f.write("![Memory per weight update](memory_per_update.png)\n\n"
                "![Cumulative update time](cumulative_update_time.png)\n\n"
                "![Memory against depth](memory_vs_depth.png)\n")
    return paths

