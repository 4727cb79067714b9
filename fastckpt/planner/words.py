"""A plan in words: what it keeps and recomputes, how far from optimal it is, its bytes by part."""
from .costs import describe_sizes


def describe(plan):
    """:meth:`Plan.describe <fastckpt.planner.plan.Plan.describe>`: a few lines for people."""
    counts = plan.forward_counts
    runs = ", ".join(count((counts == k).sum(), "layer") + f" x{k}" for k in sorted(set(counts.tolist())))
    order = plan.recompute_order
    lines = [
        f"plan {plan.strategy} for {describe_sizes(plan.sizes)}, batch {plan.batch_size}, "
        f"{plan.dtype.name}{update_mode(plan)}",
        f"kept after the forward pass: {spans(plan.kept)} ({count(len(plan.kept) - 1, 'activation')} besides the "
        "input)",
        f"recomputed during backward, in order: {spans(order, ordered=True) if order else 'nothing'}",
        f"forward computations per layer: {runs}",
        f"extra FLOPs: {100 * plan.extra_flop_fraction:.1f}% of a plain step "
        f"(recompute factor {plan.recompute_factor:.3f}){optimality(plan)}",
        "predicted bytes:",
    ]
    for part, n in plan.bytes().items():
        lines.append(f"  {part:<18} {n:>14,d}  {n / 2**20:10.3f} MiB")
    return "\n".join(lines)


def optimality(plan):
    """``", optimal"`` or ``", within 0.3% of optimal"`` for a searched plan, else ``""``."""
    gap = plan.optimality_gap
    if gap is None:
        return ""
    if gap == 0:
        return ", optimal"
    if gap < 1:
        return f", within {100 * gap:.2g}% of optimal"
    return f", at most {plan.recompute_flops - plan.least_recompute:.3g} FLOPs more than optimal"


def update_mode(plan):
    """``""`` for the lab's SGD after the backward pass, else ``", SGD in backward"``, ``", adam"``, ..."""
    name = "SGD" if plan.optimizer.slots == 0 else plan.optimizer.name
    if plan.optimizer_in_backward:
        return f", {name} in backward"
    return f", {name}" if plan.optimizer.slots else ""


def spans(values, ordered=False):
    """``0-3 7 9-12``: runs of consecutive integers (in the given order when ``ordered``)."""
    values = list(values) if ordered else sorted(values)
    out, start = [], None
    for k, v in enumerate(values):
        if start is None:
            start = v
        if k + 1 == len(values) or values[k + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return " ".join(out)


def count(n, noun):
    """``n`` and ``noun``, plural unless one: "1 layer", "3 layers"."""
    return f"{int(n)} {noun}{'' if int(n) == 1 else 's'}"
