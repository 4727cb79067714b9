"""When checkpointing pays for an MLP: the bytes a strategy saves over plain, and the batch from which it saves.

A training step holds the parameters and their gradients whatever the strategy.  The
activations (batch x width per layer) are what checkpointing trims, and plain backprop
already reuses the activations' memory for the gradients as the backward pass frees it
(``shared_by_gradients``).  So at a small batch, where all activations fit under the
gradients, a strategy keeps the same bytes as plain and only recomputes: it pays from the
batch where the activations outgrow what the gradients cover.  With the optimizer in
backward there are no gradient buffers to hide under, and it pays from batch 1.

The saving grows with the batch (each strategy's activations are a fixed fraction of
plain's, and the rest is the same for both), so the first batch that saves is found by
doubling and bisection; tests/test_pays.py checks it against a scan of every batch.
"""
from .costs import describe_sizes
from .plan import plan as make_plan
from .strategies import Budget, Fit, Plain, parse_strategy

LARGEST = 2**24        # batches searched: beyond this a step's activations outgrow any machine


def saving(sizes, batch_size, dtype, strategy, *, optimizer_in_backward=False, optimizer="sgd"):
    """(bytes plain's step holds minus ``strategy``'s, ``strategy``'s plan) at ``batch_size``."""
    mine = make_plan(sizes, batch_size, dtype, strategy, optimizer_in_backward=optimizer_in_backward,
                     optimizer=optimizer)
    plain = make_plan(sizes, batch_size, dtype, "plain", optimizer_in_backward=optimizer_in_backward,
                      optimizer=optimizer)
    return plain.bytes()["total"] - mine.bytes()["total"], mine


def pays_from(sizes, dtype, strategy, *, optimizer_in_backward=False, optimizer="sgd", largest=LARGEST):
    """The least batch at which ``strategy`` holds fewer bytes than plain, or None up to ``largest``."""
    def saves(b):
        return saving(sizes, b, dtype, strategy, optimizer_in_backward=optimizer_in_backward,
                      optimizer=optimizer)[0] > 0
    high = 1
    while not saves(high):
        if high >= largest:
            return None
        high = min(2 * high, largest)
    low = high // 2                                     # low saves nothing (or is 0), high saves
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if saves(mid) else (mid, high)
    return high


def does_not_pay(sizes, batch_size, dtype, strategy, *, optimizer_in_backward=False, optimizer="sgd"):
    """One line when ``strategy`` recomputes at ``batch_size`` but saves no bytes over plain, naming the batch
    from which it saves (and, without the optimizer in backward, the batch with it); else None.

    ``budget`` and ``fit`` choose by bytes and are not judged (a fit that plain meets plans plain)."""
    strategy = parse_strategy(strategy)
    if isinstance(strategy, (Plain, Budget, Fit)):
        return None
    saved, mine = saving(sizes, batch_size, dtype, strategy, optimizer_in_backward=optimizer_in_backward,
                         optimizer=optimizer)
    if saved > 0 or mine.recompute_factor <= 1:
        return None
    start = pays_from(sizes, dtype, strategy, optimizer_in_backward=optimizer_in_backward, optimizer=optimizer)
    why = "" if optimizer_in_backward else " (the activations fit in the gradient buffers)"
    line = (f"{strategy} saves no memory over plain for {describe_sizes(sizes)} at batch {batch_size}{why} and "
            f"runs {100 * mine.extra_flop_fraction:.0f}% more FLOPs; "
            + (f"it saves from batch {start}" if start else f"it saves nothing at any batch up to {LARGEST}"))
    if not optimizer_in_backward:
        fused = pays_from(sizes, dtype, strategy, optimizer_in_backward=True, optimizer=optimizer)
        if fused is not None and (start is None or fused < start):
            line += f", or from batch {fused} with the optimizer in backward (--optimizer-in-backward)"
    return line
