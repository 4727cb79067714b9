"""``train``'s result: one line for people, or its JSON (``--json``)."""
import json

import numpy as np

from fastckpt.planner.strategies import format_bytes


def report(args, run, state, done, times, accuracies, workers, seconds, bound=None):
    """The run's one line (or its JSON); ``bound``: what the memory bound chose (:mod:`fastckpt.cli.notes`)."""
    result = {"sizes": run.sizes, "strategy": str(run.strategy), "loss": run.loss, "l2": run.l2,
              "batch_size": run.batch_size, "eta": run.eta, "epochs": args.epochs, "accuracies": accuracies,
              "updates": len(times), "ms_per_update": float(np.median(times) * 1e3) if times else float("nan"),
              "seconds": seconds, **workers}
    if bound:
        result["bound"] = bound
    if args.resume:
        result["resumed_after_epoch"] = done                       # updates and ms_per_update are this run's
        result["updates_in_all"] = state["updates_done"] + len(times)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    shown = result["strategy"] if not bound else f"--max-memory {format_bytes(bound['max_memory'])}: " + (
        f"{bound['recomputed_layers']} of {len(run.sizes) - 1} layers recomputed" if bound["recomputed_layers"]
        else "nothing recomputed")
    print(f"trained {run.sizes} ({shown}) for {args.epochs} epoch{'s' * (args.epochs != 1)}"
          + (f" ({args.epochs - done} after the {done} of {args.resume})" if args.resume else "")
          + f": accuracy {accuracies[-1] if accuracies else float('nan'):.4f}, {len(times)} updates, "
          f"{result['ms_per_update']:.3f} ms per update, {seconds:.1f} s in all"
          + "".join(f", {key.replace('_', ' ')} {shown_value(value)}" for key, value in workers.items()))
    if args.save:
        print(f"saved to {args.save}" + ("" if args.save.endswith(".npz") else ".npz"))


def shown_value(value):
    """A result for people: fractions to 3 digits, byte counts with separators, a partition as given (8,9), a
    value per epoch from the first epoch to the last (0.366 -> 0.174)."""
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,d}"
    if isinstance(value, list) and value and all(isinstance(v, float) for v in value):
        return " -> ".join(f"{v:.4g}" for v in value) + (" by epoch" if len(value) > 1 else "")
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)
