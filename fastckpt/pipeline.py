"""Pipeline parallelism over MPI: each rank holds a contiguous range of layers, a stage.

A minibatch is split into ``M`` micro-batches.  Stage ``s`` receives each
micro-batch's activations from stage ``s - 1``, runs its layers forward and
sends its output on; later it receives the delta of that output from stage
``s + 1``, runs its backward pass (recomputing inside the stage as its
strategy says) and sends the delta of its input back.  Gradients are summed
over the micro-batches and each stage applies one SGD step to its own layers:
the same update as one process on the whole minibatch, up to the order of
summation.  The schedules and the memory of micro-batches in flight are in
:mod:`fastckpt.stage`.

Every message is the (rows, width) activation or delta of one micro-batch at a
stage boundary, sent as ``transport`` says (:mod:`fastckpt.transport`):
``native`` (the net's dtype, exact), ``float16``, ``bfloat16`` or ``int8``.
Sends are non-blocking, from ``SEND_BUFFERS`` buffers per link that are
reused in turn (a send waits only for the one two sends before it to be
received); receives block.  Blocking sends would deadlock 1F1B, where two
neighbours send to each other at once; one buffer per link is already enough
(tests/test_pipeline.py plays every schedule up to 6 stages and 9 micro-batches
through these rules), and two let a stage compute while its last send drains.

NOTE [ Pipeline errors ]
As for data parallelism (NOTE [ No rank waits forever ] in
:mod:`fastckpt.distributed`), an error is either shared or ends the job:

* the settings (sizes, micro-batches, schedule, strategy, dtype, loss, l2,
  partition, transport) are compared across ranks when the trainer is made,
  and the minibatch's shape and eta at every update; a mismatch or a bad value
  is the same ValueError on every rank;
* one ``Allreduce`` of three numbers after the backward passes gives every rank
  the loss and whether the loss or any stage's gradient is NaN or inf; then
  every rank raises FloatingPointError and no weights change;
* anything else on one rank (an update refused on that stage alone, MemoryError,
  SIGINT, an MPI error) prints the rank's error and calls ``MPI_Abort``.
"""
import time

import numpy as np

from fastckpt.kernels import all_finite
from fastckpt.kernels.runs import BAD_LOSS

from ._checks import (
    as_batch,
    as_labels,
    as_targets,
    check_dtype,
    check_eta,
    check_l2,
    check_positive_int,
    check_sizes,
    one_hot_into,
)
from .costs import blas_bytes, layer_costs, param_layout
from .distributed import abort_job, check_same_minibatch, check_same_settings, lab_loop, mpi_world, share_cores
from .engine import forward
from .network import _draw_normal, _skip_normal
from .params import Parameters
from .planning import plan as make_plan
from .stage import SCHEDULES, Stage, in_flight, live_ranges, schedule, storage_slots
from .strategies import parse_strategy
from .transport import TRANSPORTS, Codec
from .workspace import workspace_delta_elems

_EVAL_CHUNK = 4096
SEND_BUFFERS = 2


def balance(costs, stages, fits=None):
    """Layers per stage: contiguous ranges of ``costs`` whose largest sum is least, stage ``p``'s range
    ``[lo, hi)`` passing ``fits(p, lo, hi)`` (default: any); ties go to the earliest cut.
    ValueError when no split fits."""
    n = len(costs)
    if stages > n:
        raise ValueError(f"{stages} stages need at least {stages} layers, the net has {n}")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for p in range(1, stages + 1):
        for j in range(p, n - (stages - p) + 1):
            for i in range(p - 1, j):
                if best[p - 1][i] == inf or (fits is not None and not fits(p - 1, i, j)):
                    continue
                value = max(best[p - 1][i], prefix[j] - prefix[i])
                if value < best[p][j]:
                    best[p][j], cut[p][j] = value, i
    if best[stages][n] == inf:
        raise ValueError(f"no split of the {n} layers into {stages} stages fits the memory limit")
    bounds, j = [n], n
    for p in range(stages, 0, -1):
        j = cut[p][j]
        bounds.append(j)
    bounds.reverse()
    return [b - a for a, b in zip(bounds[:-1], bounds[1:])]


def stage_bytes(sizes, lo, hi, rows, dtype, strategy, order, transport="native", threads=1):
    """Predicted bytes of the stage holding layers ``lo .. hi-1``, by part (see :class:`PipelineTrainer`).

    ``rows``: the largest micro-batch; ``order``: the stage's schedule.
    """
    dtype = np.dtype(dtype)
    item = dtype.itemsize
    sub = tuple(sizes[lo:hi + 1])
    first, last = lo == 0, hi == len(sizes) - 1
    p = make_plan(sub, rows, dtype, strategy, blas_threads=threads)
    live = sum(b - a for a, b in live_ranges(p, loss=last))
    params = param_layout(sub, item)[1] * item
    flight = in_flight(order)
    out_codec = None if last else Codec(transport, dtype, rows, sub[-1])
    in_codec = None if first else Codec(transport, dtype, rows, sub[0])
    parts = {
        "parameters": params,
        "gradients": params,                                  # their sum over the micro-batches
        "workspace": p.arena_elems * item,                    # activations, and each micro-batch's gradients
        "deltas": workspace_delta_elems(sub, rows, not first) * item,
        "scratch": max(sub[1:]) * 8,
        "stored_micro_batches": storage_slots(order) * live * item,
        "stage_inputs": 0 if first else flight * rows * sub[0] * item,
        "send_buffers": SEND_BUFFERS * sum(c.nbytes for c in (out_codec, in_codec) if c is not None),
        "receive_buffers": sum(c.nbytes for c in (out_codec, in_codec) if c is not None and transport != "native"),
        "blas": blas_bytes(sub, rows, threads),
    }
    parts["total"] = sum(parts.values())
    return parts


class PipelineTrainer:
    """Train ``sizes`` with its layers split into one stage per rank of ``comm``.

    Parameters
    ----------
    sizes : sequence of int
        The whole net, input first.
    micro_batches : int
        ``M``: each minibatch is split into ``M`` micro-batches (sizes differ by at most one).
    schedule : {"gpipe", "1f1b"}, optional
    strategy : str or Strategy, optional
        Checkpointing inside every stage (e.g. ``"sqrt"``, ``"revolve(2)"``); default ``"plain"``.
    dtype, loss, l2
        As for :class:`~fastckpt.network.Network`.
    comm : mpi4py communicator, optional
        ``MPI.COMM_WORLD`` by default; rank ``s`` is stage ``s``.
    partition : sequence of int, optional
        Layers per stage (summing to ``len(sizes) - 1``).  By default the
        layers are split so that the stages' predicted time (GEMM FLOPs plus
        elementwise work, :func:`fastckpt.costs.layer_costs`) is balanced, each
        within ``memory_limit`` bytes when that is given.
    transport : {"native", "float16", "bfloat16", "int8"}, optional
        How activations and deltas travel between stages.
    memory_limit : int, optional
        Bytes per rank for the automatic partition (needs ``batch_size``).
    batch_size : int, optional
        The minibatch size the workspace and the memory prediction are for;
        default: that of the first update.

    Every rank makes the trainer after the same ``np.random.seed``; the initial
    weights are those of ``Network(sizes)`` from that seed, each rank keeping
    only its own layers.  See NOTE [ Pipeline errors ] for what happens when
    something goes wrong.
    """

    def __init__(self, sizes, micro_batches, *, schedule="gpipe", strategy="plain", dtype=np.float64,
                 loss="quadratic", l2=0.0, comm=None, partition=None, transport="native", memory_limit=None,
                 batch_size=None):
        self.MPI, world = mpi_world()
        self.comm = world if comm is None else comm
        self.rank, self.ranks = self.comm.Get_rank(), self.comm.Get_size()
        mine = {"sizes": sizes, "micro_batches": micro_batches, "schedule": schedule, "strategy": strategy,
                "dtype": dtype, "loss": loss, "l2": l2, "partition": partition, "transport": transport,
                "memory_limit": memory_limit, "batch_size": batch_size}
        check_same_settings(self.comm.allgather({k: repr(v) for k, v in mine.items()}))
        self.sizes = list(check_sizes(sizes))
        n_layers = len(self.sizes) - 1
        self.micro_batches = check_positive_int(micro_batches, "micro_batches")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        if loss not in ("quadratic", "cross_entropy"):
            raise ValueError(f"loss must be 'quadratic' (sigmoid output) or 'cross_entropy' (softmax output), "
                             f"got {loss!r}")
        self.schedule, self.transport, self.loss = schedule, transport, loss
        self.strategy = parse_strategy(strategy)
        self.dtype = check_dtype(dtype)
        self.l2 = check_l2(l2, n_layers)
        self.batch_size = None if batch_size is None else check_positive_int(batch_size, "batch_size")
        self.blas_threads = share_cores(self.comm, self.MPI)
        self.partition = self._partition(partition, memory_limit)
        for stage, n in enumerate(self.partition):
            lo = sum(self.partition[:stage])
            try:
                self.strategy.check(self.sizes[lo:lo + n + 1])
            except ValueError as exc:
                raise ValueError(f"strategy {self.strategy} does not fit stage {stage} (layers {lo}..{lo + n - 1}): "
                                 f"{exc}") from None
        self.lo = sum(self.partition[:self.rank])
        self.hi = self.lo + self.partition[self.rank]
        self.stage_sizes = self.sizes[self.lo:self.hi + 1]
        self.first, self.last = self.rank == 0, self.rank == self.ranks - 1
        self.params = Parameters(self.stage_sizes, self.dtype)
        self._draw()
        self._acc = self.params.new_buffer()
        self._stage = None
        self.accuracies = []
        self.last_loss = None
        self.stats = {"updates": 0, "busy": 0.0, "wall": 0.0, "bytes_sent": 0, "copied_bytes": 0}

    # -- setup ------------------------------------------------------------------------------
    def _partition(self, partition, memory_limit):
        n_layers = len(self.sizes) - 1
        if partition is not None:
            parts = [check_positive_int(p, "partition[i]") for p in partition]
            if len(parts) != self.ranks or sum(parts) != n_layers:
                raise ValueError(f"partition must give the layers of each of the {self.ranks} stages, summing to "
                                 f"{n_layers}, got {list(partition)}")
            return parts
        fits = None
        if memory_limit is not None:
            limit = check_positive_int(memory_limit, "memory_limit")
            if self.batch_size is None:
                raise ValueError("memory_limit needs batch_size: the memory of a stage depends on it")

            def fits(stage, lo, hi):
                order = schedule(self.schedule, stage, self.ranks, self.micro_batches)
                return stage_bytes(self.sizes, lo, hi, self._rows(self.batch_size),
                                   self.dtype, self.strategy, order, self.transport,
                                   self.blas_threads)["total"] <= limit
        return balance(layer_costs(self.sizes, self.batch_size or 1), self.ranks, fits)

    def _draw(self):
        """The draws of ``Network(sizes)`` in its order (every bias, then every weight), keeping ours."""
        weights, biases = self.params.layers()
        for kind in ("biases", "weights"):
            for layer, (n_in, n_out) in enumerate(zip(self.sizes[:-1], self.sizes[1:])):
                if self.lo <= layer < self.hi:
                    mine = (biases if kind == "biases" else weights)[layer - self.lo]
                    _draw_normal(mine.reshape(-1))
                else:
                    _skip_normal(n_out if kind == "biases" else n_out * n_in)

    def _rows(self, batch):
        return -(-batch // self.micro_batches)

    def order(self, stage=None):
        """This stage's (or ``stage``'s) schedule of passes for one minibatch."""
        return schedule(self.schedule, self.rank if stage is None else stage, self.ranks, self.micro_batches)

    def predicted_bytes(self, batch_size=None):
        """This rank's predicted bytes by part for minibatches of ``batch_size`` (default: the planned one)."""
        batch = batch_size or self.batch_size or (self._stage.plan.batch_size * self.micro_batches
                                                   if self._stage else None)
        if batch is None:
            raise ValueError("predicted_bytes needs batch_size (or a first update)")
        return stage_bytes(self.sizes, self.lo, self.hi, self._rows(batch),
                           self.dtype, self.strategy, self.order(), self.transport, self.blas_threads)

    def _ensure(self, rows):
        """The stage, its links and buffers, planned for micro-batches of ``rows`` (made once)."""
        if self._stage is not None and self._stage.plan.batch_size >= rows:
            return
        self._stage = None
        order = self.order()
        p = make_plan(self.stage_sizes, rows, self.dtype, self.strategy, blas_threads=self.blas_threads)
        self._stage = Stage(p, first_stage=self.first, last_stage=self.last, softmax=self.loss == "cross_entropy",
                            l2=self.l2[self.lo:self.hi], slots=storage_slots(order))
        flight = in_flight(order)
        self._inputs = [] if self.first else \
            [np.empty((rows, self.stage_sizes[0]), dtype=self.dtype) for _ in range(flight)]
        self._up = None if self.first else _Link(self, self.rank - 1, rows, self.stage_sizes[0])
        self._down = None if self.last else _Link(self, self.rank + 1, rows, self.stage_sizes[-1])

    # -- training ---------------------------------------------------------------------------
    def update_mini_batch(self, x, y, eta):
        """One SGD step on the minibatch ``(x, y)``, the same on every rank; returns the mean loss.

        The minibatch is split into the micro-batches, which flow through the
        stages in the schedule's order; the gradients are summed over them and
        every stage updates its own layers.
        """
        shared = ()                                          # see NOTE [ Pipeline errors ]
        try:
            names = ("x", "y")
            shared = (ValueError, TypeError)                  # the same on every rank once compared
            check_same_minibatch(self.comm, x, y, eta)
            eta = check_eta(eta)
            xb = as_batch(x, self.sizes[0], names[0], "input")
            yb = as_targets(y, self.sizes[-1], names[1])
            if yb.ndim == 1:                                 # integer labels: their one-hot rows
                yb = one_hot_into(yb, np.empty((yb.shape[0], self.sizes[-1]), dtype=self.dtype))
            batch = xb.shape[0]
            if yb.shape[0] != batch:
                raise ValueError(f"x has {batch} samples but y has {yb.shape[0]}")
            if batch < self.micro_batches:
                raise ValueError(f"a minibatch of {batch} samples cannot make {self.micro_batches} micro-batches")
            xb = np.ascontiguousarray(xb, dtype=self.dtype) if self.first else xb
            yb = np.ascontiguousarray(yb, dtype=self.dtype) if self.last else yb
            for arr, name, used in ((xb, "x", self.first), (yb, "y", self.last)):
                if used and not all_finite(arr):
                    raise ValueError(f"{name} holds NaN or inf")
            shared = ()
            status = self._step(xb, yb, batch)
            total = np.zeros(3)
            self.comm.Allreduce(status, total, op=self.MPI.SUM)
            self.last_loss = float(total[1] + total[2])
            shared = FloatingPointError
            if total[0]:
                raise FloatingPointError(f"the loss is {self.last_loss} or a gradient is NaN or inf; "
                                         "weights left unchanged on every stage")
            shared = ()
            self.params.update(self._acc, eta)
            return self.last_loss
        except shared:
            raise
        except BaseException as exc:
            if self.ranks > 1:
                abort_job(self.comm, exc)
            raise

    def _step(self, xb, yb, batch):
        """Every micro-batch's forward and backward pass on this stage, in the schedule's order.
        Returns (bad, loss sum, penalty) of this stage, for the Allreduce."""
        edges = [batch * k // self.micro_batches for k in range(self.micro_batches + 1)]   # sizes differ by <= 1
        self._ensure(max(b - a for a, b in zip(edges[:-1], edges[1:])))
        stage, params, scale = self._stage, self.params.flat, 1.0 / batch
        start = time.perf_counter()
        busy, bad, loss_sum, first_backward = 0.0, False, 0.0, True
        inputs, free = {}, list(range(len(self._inputs)))
        with self.params.lock:
            for op, k in self.order():
                lo, hi = edges[k], edges[k + 1]
                if op == "F":
                    if self.first:
                        x = xb[lo:hi]
                    else:
                        x = self._inputs[free.pop()][:hi - lo]
                        self._up.recv(x, 2 * k)
                    inputs[k] = x
                    t0 = time.perf_counter()
                    out = stage.forward(params, x, k)
                    busy += time.perf_counter() - t0
                    if not self.last:
                        self._down.send(out, 2 * k)
                    continue
                x = inputs.pop(k)
                if not self.last:
                    self._down.recv(stage.output_delta(hi - lo), 2 * k + 1)
                t0 = time.perf_counter()
                status, loss = stage.backward(params, x, yb[lo:hi] if self.last else None, k, self._acc, scale,
                                              first_backward)
                busy += time.perf_counter() - t0
                first_backward = False
                if status == BAD_LOSS:
                    bad = True
                    if not self.first:
                        stage.input_delta(hi - lo)[...] = 0.0      # the others' gradients are thrown away
                if self.last:
                    loss_sum += loss * (hi - lo) / batch
                if not self.first:
                    self._up.send(stage.input_delta(hi - lo), 2 * k + 1)
                    free.append(next(i for i, buf in enumerate(self._inputs) if np.shares_memory(buf, x)))
            for link in (self._up, self._down):
                if link is not None:
                    link.wait()
        bad = bad or not all_finite(self._acc)
        penalty = sum(0.5 * c * float(np.vdot(w, w)) for c, w in zip(self.l2[self.lo:self.hi], self.params.layers()[0])
                      if c)
        stats = self.stats
        stats["updates"] += 1
        stats["busy"] += busy
        stats["wall"] += time.perf_counter() - start
        stats["copied_bytes"] = stage.copied_bytes
        stats["bytes_sent"] = sum(link.sent for link in (self._up, self._down) if link is not None)
        return np.array([float(bad), loss_sum if self.last else 0.0, penalty])

    @property
    def bytes_per_update(self):
        """Bytes this rank sent per update so far (activations and deltas, as encoded)."""
        return self.stats["bytes_sent"] / max(1, self.stats["updates"])

    def bubble_fraction(self):
        """The share of the updates' time that the stages spent not computing, averaged over the
        ranks (a collective: every rank calls it).  A balanced pipeline idles ``(P-1)/(M+P-1)``."""
        parts = self.comm.allgather((self.stats["busy"], self.stats["wall"]))
        return float(np.mean([1.0 - busy / wall for busy, wall in parts if wall > 0]))

    def gather(self):
        """The whole net's ``(weights, biases)`` in the lab's shapes, on every rank."""
        with self.params.lock:
            parts = self.comm.allgather(self.params.flat)
        weights, biases = [], []
        for stage, flat in enumerate(parts):
            lo = sum(self.partition[:stage])
            p = Parameters(self.sizes[lo:lo + self.partition[stage] + 1], self.dtype)
            p.flat[...] = flat
            w, b = p.layers()
            weights += [v.copy() for v in w]
            biases += [v.reshape(-1, 1).copy() for v in b]
        return weights, biases

    def evaluate(self, x_test_data, y_test_data):
        """Fraction of samples whose arg-max output matches the label, on every rank (same data on each)."""
        x = as_batch(x_test_data, self.sizes[0], "x_test_data", "input")
        labels = as_labels(y_test_data, self.sizes[-1], x.shape[0], ("x_test_data", "y_test_data"))
        softmax = self.loss == "cross_entropy" and self.last
        hits = 0
        with self.params.lock:
            for i in range(0, x.shape[0], _EVAL_CHUNK):
                rows = min(_EVAL_CHUNK, x.shape[0] - i)
                if self.first:
                    a = np.ascontiguousarray(x[i:i + rows], dtype=self.dtype)
                else:
                    a = np.empty((rows, self.stage_sizes[0]), dtype=self.dtype)
                    self.comm.Recv(a, source=self.rank - 1, tag=3)
                out = forward(self.params, softmax, a, 0, len(self.stage_sizes) - 1)[-1]
                if self.last:
                    hits += int(np.count_nonzero(out.argmax(axis=1) == labels[i:i + rows]))
                else:
                    self.comm.Send(np.ascontiguousarray(out), dest=self.rank + 1, tag=3)
        return self.comm.bcast(hits, root=self.ranks - 1) / x.shape[0]

    def SGD(self, training_data, epochs, mini_batch_size, eta, test_data=None, *, verbose=True):
        """The lab's loop; every rank passes the same data (checked first).  Returns (memusage, updatetime)
        of this rank; rank 0 prints."""
        return lab_loop(self, training_data, epochs, mini_batch_size, eta, test_data, verbose, self.params.lock)


class _Link:
    """The messages of one direction to or from one neighbour stage, in ``transport``'s encoding."""

    def __init__(self, trainer, peer, rows, width, pool=SEND_BUFFERS):
        self.comm, self.peer, self.MPI = trainer.comm, peer, trainer.MPI
        self.codec = Codec(trainer.transport, trainer.dtype, rows, width)
        self.native = trainer.transport == "native"
        self.pool = [self.codec.buffer() for _ in range(pool)]
        self.requests = [None] * pool
        self.inbox = None if self.native else self.codec.buffer()
        self.next = 0
        self.sent = 0

    def send(self, arr, tag):
        """Encode ``arr`` into the next pool buffer (waiting for that buffer's last send) and send it."""
        i, self.next = self.next, (self.next + 1) % len(self.pool)
        if self.requests[i] is not None:
            self.requests[i].Wait()
        msg = self.codec.encode(arr, self.pool[i], arr.shape[0])
        self.requests[i] = self.comm.Isend(msg, dest=self.peer, tag=tag)
        self.sent += msg.nbytes

    def recv(self, out, tag):
        """Receive the message ``tag`` into ``out`` (rows, width), decoding it."""
        if self.native:
            self.comm.Recv(out, source=self.peer, tag=tag)
            return
        status = self.MPI.Status()
        self.comm.Recv(self.inbox, source=self.peer, tag=tag, status=status)
        self.codec.decode(self.inbox[:status.Get_count(self.MPI.BYTE)], out)

    def wait(self):
        """Wait until every send has left its buffer."""
        self.MPI.Request.Waitall([r for r in self.requests if r is not None])
        self.requests = [None] * len(self.pool)
