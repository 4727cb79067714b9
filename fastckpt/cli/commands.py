"""What each ``fastckpt`` subcommand does, given its parsed arguments; :mod:`fastckpt.cli` parses them."""
import json
import os
import signal
import sys
from types import SimpleNamespace

import numpy as np

from fastckpt.core.resources import check_fits
from fastckpt.data import loading_bytes
from fastckpt.nets import NetworkWithCheckpointing
from fastckpt.planner import PlanTooCostly, parse_strategy
from fastckpt.planner import plan as make_plan
from fastckpt.planner.costs import describe_sizes
from fastckpt.planner.curves import BATCH_LIMIT, depth_table, tradeoff
from fastckpt.planner.pays import does_not_pay
from fastckpt.planner.run import NOT_AT_ONCE, largest_batch, refuse_under_mkl
from fastckpt.planner.strategies import format_bytes
from fastckpt.report import compare as report
from fastckpt.report.measure import memray_peak
from fastckpt.report.plots import plot_depth, plot_tradeoff
from fastckpt.report.summary import summary, table, write_report

from .bound import step_strategy, whole_run
from .data import check_trainable, data_name, data_path, load_data
from .signals import Stopped, Stopper


# -- compare ----------------------------------------------------------------------------------
def compare(args):
    (x_train, y_train), _ = load_data(args.data, args.sizes)
    if args.batch_size > len(x_train):
        raise ValueError(f"--batch-size {args.batch_size} is more than the {len(x_train)} training samples")
    if args.strategies and args.every:
        raise ValueError("give --strategies or --every, not both")
    strategies = args.strategies or [parse_strategy(f"every_nth({args.every or 2})"), parse_strategy("sqrt")]
    for s in strategies:                                          # refuse before any training
        check_trainable(args.sizes, args.batch_size, args.dtype, s, optimizer_in_backward=args.sgd_in_backward)
    setup = {"sizes": args.sizes, "batch_size": args.batch_size, "eta": args.eta, "epochs": args.epochs,
             "dtype": args.dtype, "seed": args.seed,
             "data": data_path(args.data) or "embedded MNIST (4000 train, 1000 test)",
             "sgd_in_backward": args.sgd_in_backward}
    done = []
    with Stopper() as stopper:                                    # SIGINT, SIGTERM, SIGHUP: see _signals

        def keep(results):
            done[:] = results
            if args.out:
                write_report(args.out, results, setup)
        try:
            results = report.run_compare(args.sizes, strategies, data_path(args.data), epochs=args.epochs,
                                         batch_size=args.batch_size, eta=args.eta, dtype=args.dtype,
                                         seed=args.seed, quiet=args.json, on_result=keep, hold=stopper.deferred,
                                         sgd_in_backward=args.sgd_in_backward)
        except (Stopped, KeyboardInterrupt) as exc:
            stop = exc if isinstance(exc, Stopped) else Stopped(signal.SIGINT)
            names = ", ".join(r["name"] for r in done)
            kept = f"; finished runs written to {args.out}: {names}" if args.out and done else ""
            print(f"fastckpt compare: {stop}{kept}", file=sys.stderr)
            return stop.exit_code
    if args.json:
        print(json.dumps(summary(results, setup), indent=2))
    else:
        print("\n" + table(results, setup))
        for s in strategies:
            note = does_not_pay(args.sizes, args.batch_size, args.dtype, s, optimizer_in_backward=args.sgd_in_backward)
            if note:
                print(f"note: {note}")
        if args.out:
            print(f"\nreport written to {args.out}: summary.md, memory_per_update.png, "
                  "cumulative_update_time.png, memory_vs_depth.png")
    return 0


# -- plan and analyze -------------------------------------------------------------------------
def show_plan(args):
    if args.max_batch:
        return show_max_batch(args)
    run = whole = None
    if args.data is not None:
        run = SimpleNamespace(sizes=args.sizes, batch_size=args.batch_size, dtype=args.dtype, strategy=args.strategy,
                              sgd_in_backward=args.sgd_in_backward, optimizer=args.optimizer, validation=None,
                              shuffle=None, data=args.data)
        training, test = load_data(args.data, args.sizes)
        if args.max_memory is not None:
            run.strategy = step_strategy(run, training, test, args.epochs, False)
        whole = whole_run(run, training, test, args.epochs, False)
    strategy = args.strategy if run is None else run.strategy
    p = make_plan(args.sizes, args.batch_size, args.dtype, strategy, optimizer_in_backward=args.sgd_in_backward,
                  optimizer=args.optimizer)
    note = does_not_pay(args.sizes, args.batch_size, args.dtype, strategy,
                        optimizer_in_backward=args.sgd_in_backward, optimizer=args.optimizer)
    if args.json:
        print(json.dumps({"sizes": list(p.sizes), "batch_size": p.batch_size, "dtype": p.dtype.name,
                          "strategy": str(p.strategy), "optimizer": args.optimizer,
                          "optimizer_in_backward": p.optimizer_in_backward,
                          "kept": list(p.kept), "recompute_order": list(p.recompute_order),
                          "forward_counts": p.forward_counts.tolist(), "recompute_factor": p.recompute_factor,
                          "extra_flop_fraction": p.extra_flop_fraction, "bytes": p.bytes(), "does_not_pay": note,
                          "whole_run": whole}, indent=2))
    else:
        print(p.describe() + (f"\nnote: {note}" if note else ""))
        if whole is not None:
            _print_whole_run(args, whole)
    return 0


def _print_whole_run(args, whole):
    """The whole run's parts, which add up to its total, the step's own parts indented below it."""
    print(f"the whole run on {data_name(args.data)} ({args.epochs} epoch{'s' * (args.epochs != 1)}, as train runs "
          "it), predicted bytes; the parts add up to the total:")
    step = [(name[len("step: "):], value) for name, value in whole.items() if name.startswith("step: ")]
    for name, value in whole.items():
        if name.startswith("step: "):
            if name != "step: total":
                continue
            print(f"  {'step':<24}{value:>14,} {value / 2**20:>11.3f} MiB")
            print("\n".join(f"    {part:<22}{n:>14,} {n / 2**20:>11.3f} MiB" for part, n in step if part != "total"))
        else:
            print(f"  {name:<24}{value:>14,} {value / 2**20:>11.3f} MiB")
    if whole.get(NOT_AT_ONCE):
        print(f"{NOT_AT_ONCE}: the step's BLAS job table (inside a GEMM), an evaluation and a save never meet; "
              "only the largest counts")


def show_max_batch(args):
    """``plan --max-memory B --max-batch``: per strategy and update, the largest batch whose whole run fits B."""
    if args.max_memory is None:
        raise ValueError("--max-batch finds the largest batch that fits --max-memory BYTES: give --max-memory")
    refuse_under_mkl("--max-memory", args.max_memory)
    training, test = load_data(args.data, args.sizes)
    rows, loading = [], loading_bytes(data_path(args.data))
    for strategy in ("plain", "every_nth(2)", "sqrt"):
        for fused in (False, True):
            found = largest_batch(args.sizes, args.max_memory, training, test, dtype=args.dtype, strategy=strategy,
                                  epochs=args.epochs, optimizer_in_backward=fused, optimizer=args.optimizer,
                                  command=True, loading=loading)
            batch, p, parts = found if found else (None, None, None)
            rows.append({"strategy": strategy, "optimizer_in_backward": fused, "batch": batch,
                         "recompute_factor": p.recompute_factor if p else None,
                         "whole_run_bytes": parts["total"] if parts else None,
                         "gradient_bytes": p.bytes()["gradients"] if p else None,
                         "unshared_gradient_bytes": p.bytes()["gradients"] + p.bytes()["shared_by_gradients"]
                         if p else None})
    note = fewer_in_backward(rows, args.optimizer)
    if args.json:
        print(json.dumps({"max_memory": args.max_memory, "sizes": list(args.sizes), "dtype": args.dtype,
                          "optimizer": args.optimizer, "epochs": args.epochs, "data": data_path(args.data),
                          "largest": rows, "note": note},
                         indent=2))
        return 0
    print(f"the largest batch whose whole train run ({args.epochs} epochs on {data_name(args.data)}) "
          f"fits {format_bytes(args.max_memory)}, {describe_sizes(args.sizes)} in {args.dtype}"
          + ("" if args.optimizer == "sgd" else f", {args.optimizer}") + ":")
    print(f"  {'strategy':<14}{'update':<22}{'batch':>7}{'recompute':>11}{'whole run MiB':>15}")
    for r in rows:
        update = "optimizer in backward" if r["optimizer_in_backward"] else "gradients kept"
        cells = (f"{r['batch']:>7}{r['recompute_factor']:>11.2f}{r['whole_run_bytes'] / 2**20:>15.2f}"
                 if r["batch"] else f"{'none':>7}")
        print(f"  {r['strategy']:<14}{update:<22}{cells}")
    if note:
        print(f"note: {note}")
    return 0


def fewer_in_backward(rows, optimizer):
    """Why the optimizer in backward fits a smaller batch than keeping the gradients, where it does: a stateful
    optimizer in backward holds its largest layer's gradient beside the activations, while kept gradients go
    into the memory the backward pass frees from the activations (NOTE [ Gradients in the arena ])."""
    kept = {r["strategy"]: r for r in rows if not r["optimizer_in_backward"]}
    fewer = [r for r in rows if r["optimizer_in_backward"] and r["batch"] and kept[r["strategy"]]["batch"]
             and r["batch"] < kept[r["strategy"]]["batch"]]
    if not fewer:
        return None
    shared = all(kept[r["strategy"]]["unshared_gradient_bytes"] == 0 for r in fewer)
    return (f"with {optimizer} the optimizer in backward still holds one layer's gradient, the largest "
            f"({fewer[0]['gradient_bytes'] / 2**20:.2f} MiB), beside the activations, "
            + ("while the kept gradients fit wholly in the memory the backward pass frees from the activations "
               "(shared_by_gradients in fastckpt plan)" if shared else
               "while most of the kept gradients go into the memory the backward pass frees from the activations")
            + f": so {', '.join(r['strategy'] for r in fewer)} fit{'s' * (len(fewer) == 1)} a larger batch with "
            "the gradients kept; with SGD the optimizer in backward holds no gradient at all")


def _measured(sizes, batch, dtype, strategy, fused):
    """memray's peak over building a net and 3 training steps on random data."""
    rng = np.random.default_rng(0)
    x = rng.random((batch, sizes[0])).astype(dtype)
    y = rng.random((batch, sizes[-1])).astype(dtype)

    def build_and_train():
        net = NetworkWithCheckpointing(sizes, strategy=strategy, dtype=dtype, optimizer_in_backward=fused)
        for _ in range(3):
            net.update_mini_batch(x, y, 0.01)
    build_and_train()                                             # warm-up
    return memray_peak(build_and_train)


def analyze(args):
    names = [str(s) for s in args.strategies]
    rows = depth_table(args.depths, width=args.width, n_in=args.n_in, n_out=args.n_out,
                              batch_size=args.batch_size, dtype=args.dtype, strategies=args.strategies,
                              optimizer_in_backward=args.sgd_in_backward, max_memory=args.max_memory)
    for row in rows:
        row["measured"] = {}
        if row["hidden_layers"] in args.measure:
            for s in args.strategies:
                if row[str(s)] is not None:
                    check_fits(row[str(s)]["total"], f"training {row['hidden_layers']} layers with {s}", "--measure")
                    row["measured"][str(s)] = _measured(row["sizes"], args.batch_size, args.dtype, s,
                                                        args.sgd_in_backward)
    try:
        curve, skipped = tradeoff(rows[-1]["sizes"], args.batch_size, args.dtype), None
    except PlanTooCostly as exc:
        curve, skipped = [], str(exc)
    if args.json:
        print(json.dumps({"rows": rows, "tradeoff": [{"activation_bytes": b, "extra_flop_fraction": e}
                                                     for b, e in curve], "tradeoff_skipped": skipped}, indent=2))
    else:
        _print_analysis(args, rows, names, curve, skipped)
    if args.out:
        _plot_analysis(args, rows, curve)
    return 0


def _print_analysis(args, rows, names, curve, skipped):
    print(f"peak MiB of a training step, [{args.n_in}] + [{args.width}]*H + [{args.n_out}], batch "
          f"{args.batch_size}, {args.dtype}: planned (memray-measured where H is in --measure)")
    print(f"{'H':>4} " + " ".join(f"{n:>22}" for n in names))
    for r in rows:
        cells = []
        for n in names:
            if r[n] is None:
                cells.append(f"{'-':>22}")
                continue
            got = r["measured"].get(n)
            text = f"{r[n]['total'] / 2**20:.2f}" + (f" ({got / 2**20:.2f})" if got else "")
            cells.append(f"{text:>22}")
        print(f"{r['hidden_layers']:>4} " + " ".join(cells))
    print("plain activations grow linearly with H; the formulas are in fastckpt.planner.curves")
    if args.max_memory is not None:
        print(f"\nthe largest batch whose training step fits {format_bytes(args.max_memory)}, by depth H")
        print(f"{'H':>4} " + " ".join(f"{n:>22}" for n in names))
        for r in rows:
            print(f"{r['hidden_layers']:>4} " + " ".join(f"{_at_least(r['largest_batch'].get(n)):>22}" for n in names))
    refused = {reason: None for r in rows for reason in r["refused"].values()}
    for reason in refused:
        print(f"- : {reason}")
    print(f"\nbudget trade-off for H = {rows[-1]['hidden_layers']}: activation MiB -> extra FLOPs "
          "(% of a plain step)" + (f": skipped: {skipped}" if skipped else ""))
    for nbytes, extra in _thin(curve, 12):
        print(f"  {nbytes / 2**20:10.2f} MiB  {100 * extra:7.1f}%")


def _at_least(batch):
    """A largest batch as analyze shows it: ``-`` when none fits, ``≥N`` where the search stopped."""
    return "-" if not batch else f"≥{batch}" if batch >= BATCH_LIMIT else str(batch)


def _plot_analysis(args, rows, curve):
    os.makedirs(args.out, exist_ok=True)
    depth_png = plot_depth(rows, os.path.join(args.out, "memory_vs_depth.png"),
                                  title=f"[{args.n_in}] + [{args.width}]*H + [{args.n_out}], "
                                        f"batch {args.batch_size}, {args.dtype}")
    deepest = rows[-1]
    marks = [(str(s), deepest[str(s)]["activation_memory"], deepest[str(s)]["extra_flop_fraction"])
             for s in args.strategies if deepest[str(s)] is not None]
    wrote = [depth_png]
    if curve:
        wrote.append(plot_tradeoff(curve, os.path.join(args.out, "budget_tradeoff.png"), marks=marks,
                                   title=f"H = {deepest['hidden_layers']}, batch {args.batch_size}, {args.dtype}"))
    print(f"\nwrote {' and '.join(map(str, wrote))}", file=sys.stderr if args.json else sys.stdout)


def _thin(points, n):
    """About ``n`` points of a long curve, ends included."""
    if len(points) <= n:
        return points
    keep = sorted(set(np.linspace(0, len(points) - 1, n).round().astype(int)))
    return [points[k] for k in keep]
