"""Pipeline schedules: the order of one stage's micro-batch passes, and what that order keeps in flight.

A schedule is a list of ``("F", k)`` (micro-batch ``k``'s forward pass) and
``("B", k)`` (its backward pass) for one stage; the stages' lists together
must never wait on each other in a cycle (``tests/test_pipeline.py`` plays them
through the message rules of :mod:`fastckpt.parallel.pipeline.links`).
"""


def storage_slots(order):
    """Slots a stage needs for ``order`` (a list of ("F"|"B", k)): the most micro-batches whose live set
    is stored, not in the arena, at any time (NOTE [ Micro-batches in flight ] in :mod:`.stage`)."""
    owner, stored, most = None, set(), 0
    for op, k in order:
        if op == "F":
            if owner is not None:
                stored.add(owner)
            owner = k
            most = max(most, len(stored))
        elif owner != k:
            if owner is not None:
                stored.add(owner)
            most = max(most, len(stored))        # the evicted and the restored are both stored a moment
            stored.discard(k)
            owner = None
        else:
            owner = None
    return most


SCHEDULES = ("gpipe", "1f1b")


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
    check_schedule(kind)
    warm = min(stages - stage - 1, micro)
    order = [("F", k) for k in range(warm)]
    for k in range(warm, micro):
        order += [("F", k), ("B", k - warm)]
    return order + [("B", k) for k in range(micro - warm, micro)]


def in_flight(order):
    """The most micro-batches between their forward and their backward pass at once."""
    live, most = 0, 0
    for op, _ in order:
        live += 1 if op == "F" else -1
        most = max(most, live)
    return most
