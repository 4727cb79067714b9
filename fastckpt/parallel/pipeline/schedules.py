"""Pipeline schedules: the order of one stage's micro-batch passes, and what that order keeps in flight.

A schedule is a list of ``("F", k)`` (micro-batch ``k``'s forward pass) and
``("B", k)`` (its backward pass) for one stage, and for ``zb1`` ``("W", k)``
(the weight-gradient half of its backward pass, put off); the stages' lists
together must never wait on each other in a cycle (``tests/test_pipeline.py``
plays them through the message rules of :mod:`fastckpt.parallel.pipeline.links`).

NOTE [ Zero bubble ]
A layer's backward pass is two GEMMs: the delta of its input, ``dz W``, which
the stage below waits for, and the weight gradient, ``dz^T a``, which nothing
waits for until the optimizer step.  ``zb1`` (ZB-H1 of Qi et al., "Zero Bubble
Pipeline Parallelism", ICLR 2024; PyTorch's ``ScheduleInterleavedZeroBubble``
with one stage per rank) runs the first as ``B`` and keeps each layer's ``a``
and ``dz`` until the second, ``W``.  Stage ``s`` of ``P`` warms up with
1F1B's ``P - s - 1`` forwards, then runs F and B in turn, then the remaining
Bs; each B from the ``(s + 1)``-th on is followed by the oldest pending W, and
the ``s`` W's still pending run at the end, where the stage would wait.  So every stage
holds at most ``P`` micro-batches between their F and their W (1F1B's first
stage holds as many), and with F, B and W taking one unit of time each (an
MLP's are one GEMM per layer) the bubble is ``(P - 1) / (3 M + P - 1)`` for
``M >= P`` micro-batches, against 1F1B's ``(P - 1) / (M + P - 1)``: a third
of the idle time.  The W passes' deltas and layer inputs are the stage's
memory for each micro-batch whose W is pending (:func:`pending_weights`,
counted in the stage's plan).
"""


def storage_slots(order):
    """Slots a stage needs for ``order`` (a list of ("F"|"B"|"W", k)): the most micro-batches whose live set
    is stored, not in the arena, at any time (NOTE [ Micro-batches in flight ] in :mod:`.stage`)."""
    owner, stored, most = None, set(), 0
    for op, k in order:
        if op == "W":                            # the stash's, not the arena's (NOTE [ Zero bubble ])
            continue
        if owner is not None and owner != k:     # evicted: another micro-batch's pass overwrites the arena
            stored.add(owner)
        most = max(most, len(stored))            # the evicted and the restored are both stored a moment
        stored.discard(k)                        # restored for its backward pass (a forward's k is not stored)
        owner = k if op == "F" else None
    return most


SCHEDULES = ("gpipe", "1f1b", "zb1")


def check_schedule(kind):
    """``kind`` if it names a schedule, else a ValueError naming it."""
    if kind not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {kind!r}")
    return kind


def schedule(kind, stage, stages, micro):
    """The order of micro-batch passes on ``stage`` of ``stages``: a list of ("F"|"B", k).

    ``gpipe``: every forward, then every backward, last micro-batch first (its
    activations are still in the workspace).  ``1f1b``: ``stages - stage - 1``
    forwards to fill the pipe, then one forward and one backward in turn, then
    the remaining backwards; at most ``stages - stage`` micro-batches are in
    flight.
    """
    if kind == "gpipe":
        return [("F", k) for k in range(micro)] + [("B", k) for k in reversed(range(micro))]
    if kind == "zb1":
        return zero_bubble(stage, stages, micro)
    check_schedule(kind)
    warm = min(stages - stage - 1, micro)
    order = [("F", k) for k in range(warm)]
    for k in range(warm, micro):
        order += [("F", k), ("B", k - warm)]
    return order + [("B", k) for k in range(micro - warm, micro)]


def zero_bubble(stage, stages, micro):
    """Stage ``stage``'s ``zb1`` order (NOTE [ Zero bubble ])."""
    warm = min(stages - stage - 1, micro)
    order = [("F", k) for k in range(warm)]
    backwards = weights = 0

    def backward():
        nonlocal backwards, weights
        order.append(("B", backwards))
        backwards += 1
        if backwards > stage:                      # the stage's first ``stage`` W's wait for the end
            order.append(("W", weights))
            weights += 1
    for k in range(warm, micro):
        order.append(("F", k))
        backward()
    while backwards < micro:
        backward()
    return order + [("W", k) for k in range(weights, micro)]


def pending_weights(order):
    """The most micro-batches whose B has run and W has not, at once (0 for a schedule without W)."""
    live, most = 0, 0
    for op, _ in order:
        live += 1 if op == "B" else -1 if op == "W" else 0
        most = max(most, live)
    return most if any(op == "W" for op, _ in order) else 0


def in_flight(order):
    """The most micro-batches between their forward and their backward pass at once."""
    live, most = 0, 0
    for op, _ in order:
        live += 1 if op == "F" else -1 if op == "B" else 0
        most = max(most, live)
    return most
