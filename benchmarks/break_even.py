"""The batch from which checkpointing saves memory, against the width: docs/break_even_batch.png.

    python benchmarks/break_even.py [OUT.png]

Planner numbers only (no timing): for [784] + [W]*16 + [10] in float64, the least batch at which
each strategy's step holds fewer bytes than plain's (fastckpt.planner.pays.pays_from) with the
lab's update, which keeps the gradients; with the optimizer in backward every strategy saves
from batch 1 (printed, not drawn).
"""
import os
import sys

import numpy as np

from fastckpt.planner.pays import pays_from
from fastckpt.report.plots import draw, figure, save

WIDTHS = [32, 64, 128, 256, 512, 1024, 2048]
DEPTH = 16


FIGURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "break_even_batch.png")


def main(out=FIGURE):
    fig, ax = figure()
    curves = []
    for strategy in ("every_nth(2)", "sqrt", "revolve(2)"):
        found = [pays_from([784] + [w] * DEPTH + [10], np.float64, strategy) for w in WIDTHS]
        fused = [pays_from([784] + [w] * DEPTH + [10], np.float64, strategy, optimizer_in_backward=True)
                 for w in WIDTHS]
        curves.append((strategy, np.array(WIDTHS), np.array(found, dtype=float), strategy))
        print(f"{strategy}: " + ", ".join(f"W={w}: {b}" for w, b in zip(WIDTHS, found))
              + f"; optimizer in backward: {sorted(set(fused))}")
    draw(ax, curves)
    ax.plot(WIDTHS, WIDTHS, color="#bbbbbb", linewidth=0.8, zorder=0, label="batch = width")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    save(fig, ax, out, "hidden width W", "least batch at which it saves memory over plain",
         f"When checkpointing pays: [784] + [W]*{DEPTH} + [10],\nfloat64, the lab's SGD (planner)")
    print(f"written {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
