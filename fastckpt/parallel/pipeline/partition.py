"""Which layers each pipeline stage holds: balanced predicted time, within a memory limit, and a stage's bytes."""
import numpy as np

from fastckpt.core.checks import check_positive_int
from fastckpt.core.layout import column_widths, param_layout, tensor_split
from fastckpt.core.resources import shown_bytes
from fastckpt.engine.workspace import stash_elems, workspace_delta_elems
from fastckpt.planner import InfeasiblePlan, reshard, shard_plan
from fastckpt.planner import plan as make_plan
from fastckpt.planner.costs import blas_bytes, layer_costs, sum_bytes
from fastckpt.planner.strategies import Budget, Fit, format_bytes

from .links import SEND_BUFFERS
from .schedules import in_flight, pending_weights, storage_slots
from .stage import live_ranges
from .transport import Codec


def balance(costs, stages, fits=None):
    """Layers per stage: contiguous ranges of ``costs`` whose largest sum is least, stage ``p``'s range
    ``[lo, hi)`` passing ``fits(p, lo, hi)`` (default: any); ties go to the earliest cut.
    ValueError when no split fits."""
    n = len(costs)
    if stages > n:
        raise ValueError(f"{stages} stages need at least {stages} layers, the net has {n}")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    _, parts = least_largest(n, stages, lambda p, lo, hi: prefix[hi] - prefix[lo]
                             if fits is None or fits(p, lo, hi) else float("inf"))
    if parts is None:
        raise ValueError(f"no split of the {n} layers into {stages} stages fits the memory limit")
    return parts


def least_largest(n, stages, cost):
    """``(value, parts)``: the split of ``n`` layers into ``stages`` contiguous ranges whose largest
    ``cost(stage, lo, hi)`` is least (inf: that range cannot be that stage), ties to the earliest cut;
    ``(inf, None)`` when every split has a range that cannot be."""
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for p in range(1, stages + 1):
        for j in range(p, n - (stages - p) + 1):
            for i in range(p - 1, j):
                if best[p - 1][i] == inf:
                    continue
                value = max(best[p - 1][i], cost(p - 1, i, j))
                if value < best[p][j]:
                    best[p][j], cut[p][j] = value, i
    if best[stages][n] == inf:
        return inf, None
    bounds, j = [n], n
    for p in range(stages, 0, -1):
        j = cut[p][j]
        bounds.append(j)
    bounds.reverse()
    return best[stages][n], [b - a for a, b in zip(bounds[:-1], bounds[1:])]


def stage_bytes(sizes, lo, hi, rows, dtype, strategy, order, transport="native", threads=1, slots=0,
                replicated=False, staged=(0, 0), tensor=None, fused=None, buckets=False):
    """Predicted bytes of the stage holding layers ``lo .. hi-1``, by part (see :class:`~fastckpt.parallel.Trainer`).

    ``rows``: the largest micro-batch; ``order``: the stage's schedule; ``slots``: the optimizer's
    state buffers the size of the stage's parameters; ``replicated``: the stage sums its gradient over
    data-parallel replicas (an in-place Allreduce, whose temporary mpich makes the gradient's size;
    with ``buckets``, a sum buffer of its own too); ``staged``: the rows of x the first stage, and of y the
    last, convert into staging buffers (a minibatch not given as C-contiguous rows of the trainer's dtype,
    or integer labels); ``tensor``: ``(shards, shard)`` of a stage split over tensor shards; ``fused``: the
    optimizer (``slots`` its state buffers) applied in the backward pass, which holds no gradient sum.
    The stage runs :func:`stage_plan`, so with ``fit(bytes)`` the total is within the bound.
    """
    plan = stage_plan(sizes, lo, hi, rows, dtype, strategy, order, transport, threads, slots, replicated, staged,
                      tensor, fused, buckets)
    return _parts(sizes, lo, hi, rows, plan, order, transport, threads, slots, replicated, staged, tensor, buckets)


def stage_plan(sizes, lo, hi, rows, dtype, strategy, order, transport="native", threads=1, slots=0,
               replicated=False, staged=(0, 0), tensor=None, fused=None, buckets=False):
    """The plan a stage runs: its strategy's, except that ``fit(bytes)`` bounds what the stage holds in all
    (its gradient sum, message buffers and the checkpoints of every micro-batch in flight), not one
    micro-batch's step.  A stage then plans the largest activation ``budget`` whose whole stage fits, found
    by bisection, so that fewer checkpoints are stored per micro-batch in flight; plain when all of it fits.
    InfeasiblePlan when even the least activation memory does not.  A tensor shard's plan is chosen on the
    widest shard, shard 0 (every shard runs its ops, NOTE [ One engine for every part ]), and laid out for
    ``tensor``'s shard; ``fused``: the optimizer (of ``slots`` state buffers) in the backward pass."""
    sub = tuple(sizes[lo:hi + 1])
    shards, shard = tensor or (1, 0)
    options = dict(blas_threads=threads, optimizer_in_backward=fused is not None, optimizer=fused or "sgd")

    def made(kind):
        if shards == 1:
            return make_plan(sub, rows, dtype, kind, **options)
        return shard_plan(sub, rows, dtype, kind, shards=shards, shard=0, **options)

    def planned(kind):
        plan = made(kind)
        return plan, _parts(sizes, lo, hi, rows, plan, order, transport, threads, slots, replicated, staged,
                            None if tensor is None else (shards, 0), buckets)["total"]
    whole = lo == 0 and hi == len(sizes) - 1              # no pipeline: a rank's part is all layers, or a shard
    best = made(strategy) if not isinstance(strategy, Fit) else _fit(strategy, planned, made, lo, hi, rows, whole)
    return best if shard == 0 else reshard(best, tensor_split(sub, shards, shard)[0])


def _fit(strategy, planned, made, lo, hi, rows, whole):
    """``fit(bytes)``'s plan of a stage (:func:`stage_plan`), by bisection on an activation budget."""
    best, total = planned("plain")
    if total <= strategy.nbytes:
        return best
    try:
        made(Budget(1))
    except InfeasiblePlan as exc:
        low = exc.minimum_bytes
    best, total = planned(Budget(low))
    if total > strategy.nbytes:
        part = f"this rank's part of the net at {rows} rows a pass" if whole else \
            f"the stage of layers {lo}..{hi - 1} at micro-batches of {rows}"
        held = "its gradient sum and message buffers" if whole else \
            "its micro-batches in flight, gradient sum and message buffers"
        raise InfeasiblePlan(f"{strategy.shown()}: {part} holds at least {total} bytes ({shown_bytes(total)}) "
                             f"with {held}; got {strategy.nbytes}", total)
    high = made("plain").bytes()["activation_memory"]
    while high - low > max(64 * 1024, high // 256):     # low fits, high does not: the most that still fits
        mid = (low + high) // 2
        plan, total = planned(Budget(mid))
        if total <= strategy.nbytes:
            best, low = plan, mid
        else:
            high = mid
    return best


def _parts(sizes, lo, hi, rows, p, order, transport, threads, slots=0, replicated=False, staged=(0, 0),
           tensor=None, buckets=False):
    """The bytes by part of a stage that runs the plan ``p`` (of the stage's widths, or a shard's)."""
    dtype, local = p.dtype, p.sizes
    item = dtype.itemsize
    first, last = lo == 0, hi == len(sizes) - 1
    live = sum(b - a for a, b in live_ranges(p, loss=last))
    params = param_layout(local, item)[1] * item
    deferred = pending_weights(order)
    parts = {
        "parameters": params,
        "gradients": 0 if p.optimizer_in_backward else params,     # their sum over the micro-batches
        "optimizer_state": slots * params,                    # velocity, or m and v, of the stage's layers
        "replica_sum": params * (replicated + buckets),       # the Allreduce's temporary (and the buckets' sum)
        "workspace": p.arena_elems * item,                    # activations, and each micro-batch's gradients
        "layer_gradient": p.bytes()["gradients"] if p.optimizer_in_backward else 0,
        "deltas": workspace_delta_elems(local, rows, not first) * item,
        "scratch": max(local[1:]) * 8,
        "stored_micro_batches": storage_slots(order) * live * item,
        "deferred_weights": deferred * stash_elems(local, rows) * item,   # zb1: inputs and deltas for W
        "deferred_gradients": params if deferred else 0,                     # and the gradient W writes
    }
    if p.row_split:                                           # NOTE [ One engine for every part ]
        parts.update(_shard_parts(sizes[lo:hi + 1], rows, p, tensor[0], first))
    parts.update(_io_parts(sizes, lo, hi, rows, dtype, order, transport, threads, staged, local))
    parts["total"] = sum(parts.values())
    return parts


def _shard_parts(sub, rows, p, shards, first):
    """What a tensor shard of a stage holds besides its plan's buffers: MPI's temporary of its largest sum, and
    with a row-split first layer its columns of the stage input and, but on the first stage, the whole input
    delta gathered from the shards' columns and the buffer it is gathered in."""
    item, local = p.dtype.itemsize, p.sizes
    gathered = rows * (sub[0] + max(column_widths(sub[0], shards)) * shards) if p.row_split[0] and not first else 0
    return {"sums": sum_bytes(local, p.row_split, rows, item, input_delta=not first),
            "input_columns": rows * local[0] * item if p.row_split[0] else 0,
            "gathered_delta": gathered * item}


def _io_parts(sizes, lo, hi, rows, dtype, order, transport, threads, staged, local):
    """The bytes of a stage's inputs in flight, message buffers, BLAS and staging rows, by part."""
    item, sub = dtype.itemsize, tuple(sizes[lo:hi + 1])
    first, last = lo == 0, hi == len(sizes) - 1
    out_codec = None if last else Codec(transport, dtype, rows, sub[-1])
    in_codec = None if first else Codec(transport, dtype, rows, sub[0])
    return {
        "stage_inputs": 0 if first else in_flight(order) * rows * sub[0] * item,
        "send_buffers": SEND_BUFFERS * sum(c.nbytes for c in (out_codec, in_codec) if c is not None),
        "receive_buffers": sum(c.nbytes for c in (out_codec, in_codec) if c is not None and transport != "native"),
        "blas": blas_bytes(local, rows, threads, input_delta=not first),
        "staging": (staged[0] * sub[0] * first + staged[1] * sub[-1] * last) * item,   # x, y converted
    }


def choose_partition(sizes, stages, partition, memory_limit, batch_size, stage_total, strategy=None, splits=None):
    """Layers per stage: ``partition`` checked, or the balanced split of :func:`balance` on the layers'
    predicted time, each stage within ``memory_limit`` bytes (``stage_total(stage, lo, hi)``) if given
    (by default ``fit(bytes)``'s bound, when the batch size is known), and ``splits(lo, hi)`` if given (a
    tensor-parallel stage's layers wide enough for its shards; when no split has that, the balanced one,
    which :func:`check_stages` refuses naming the layer)."""
    n_layers = len(sizes) - 1
    if partition is not None:
        parts = [check_positive_int(p, "partition[i]") for p in partition]
        if len(parts) != stages or sum(parts) != n_layers:
            raise ValueError(f"partition must give the layers of each of the {stages} stages, summing to "
                             f"{n_layers}, got {list(partition)}")
        return parts
    if memory_limit is None and isinstance(strategy, Fit) and batch_size is not None:
        memory_limit = strategy.nbytes                      # fit(bytes) bounds every stage: split accordingly
    costs = layer_costs(sizes, batch_size or 1)
    ok = splits or (lambda lo, hi: True)
    if memory_limit is None:
        try:
            return balance(costs, stages, lambda stage, lo, hi: ok(lo, hi))
        except ValueError:
            return balance(costs, stages)
    limit, inf = check_positive_int(memory_limit, "memory_limit"), float("inf")
    if batch_size is None:
        raise ValueError("memory_limit needs batch_size: the memory of a stage depends on it")

    needs = {}

    def need(stage, lo, hi):
        """The stage's bytes within ``limit``, or the least it can take (more than ``limit``)."""
        if (stage, lo, hi) not in needs:
            try:
                needs[stage, lo, hi] = stage_total(stage, lo, hi)["total"]
            except InfeasiblePlan as exc:
                needs[stage, lo, hi] = exc.minimum_bytes
        return needs[stage, lo, hi]
    try:
        return balance(costs, stages, lambda stage, lo, hi: ok(lo, hi) and need(stage, lo, hi) <= limit)
    except ValueError:
        # the least bound any split the trainer would take keeps: over every split, its largest stage's least
        # bytes (a stage within ``limit`` counts its bytes there, below every stage that is not)
        most, parts = least_largest(n_layers, stages, lambda s, lo, hi: need(s, lo, hi) if ok(lo, hi) else inf)
        if parts is None:                          # no split's stages split over the shards: check_stages says so
            parts = balance(costs, stages)
            most = max(need(s, sum(parts[:s]), sum(parts[:s + 1])) for s in range(stages))
        raise InfeasiblePlan(f"no split of the {n_layers} layers into {stages} stages fits {format_bytes(limit)} "
                             f"per rank: the least any split needs is {most} bytes ({shown_bytes(most)}) on its "
                             f"largest stage, with the split {parts}", most) from None


def check_stages(strategy, sizes, partition, shards=1, shard=0):
    """Refuse a strategy that cannot apply to some stage's layers (``segments(k)`` on fewer than k), or a
    stage too narrow to split over ``shards`` tensor ranks."""
    for stage, n in enumerate(partition):
        lo = sum(partition[:stage])
        if shards > 1:
            try:
                tensor_split(sizes[lo:lo + n + 1], shards, shard, first=lo)
            except ValueError as exc:
                if len(partition) == 1:
                    raise
                raise ValueError(f"stage {stage} (layers {lo}..{lo + n - 1}) cannot be split over its {shards} tensor "
                                 f"ranks: {exc}; or give a partition whose stages split") from None
        try:
            strategy.check(sizes[lo:lo + n + 1])
        except ValueError as exc:
            raise ValueError(f"strategy {strategy} does not fit stage {stage} (layers {lo}..{lo + n - 1}): "
                             f"{exc}") from None
