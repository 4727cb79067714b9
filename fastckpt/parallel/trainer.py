"""The one trainer over MPI: data, pipeline and tensor parallelism in one :class:`~.grid.Grid`.

Every rank holds one part of the net: stage ``s`` of a replica (a contiguous range of layers, all of
them with one stage), split over tensor shards or not, as one :class:`~fastckpt.core.params.Parameters`
of its own widths with the optimizer's state beside it, and runs it with one
:class:`~fastckpt.engine.engine.Engine` (NOTE [ One engine for every part ]), inside a
:class:`~.pipeline.stage.Stage` that keeps its micro-batches in flight.  An update takes a mini-batch per
replica (NOTE [ One meaning of data parallelism ] in :mod:`.grid`): each replica runs its own through
its stages in the schedule's order (a pipeline of one stage and one micro-batch is one engine step),
each rank sums its part's gradient over the replicas (in buckets that overlap the backward pass, for
whole nets), and every rank applies the optimizer to its part.  So the weights equal one process's
trained on the replicas' mini-batches together, up to the order of summation.

NOTE [ Errors on every rank ]
As NOTE [ No rank waits forever ] in :mod:`fastckpt.parallel.mpi` says, an error is either shared or
ends the job:

* the settings are compared across ranks when the trainer is made, and ``eta`` and the mini-batches per
  update at every update; a mismatch or a bad value is the same ValueError on every rank;
* a mini-batch is checked by the ranks that read it; one that fails is refused on every rank, through
  one ``Allreduce`` after the passes that also gives every rank the loss: a loss that is NaN or inf
  on any replica, or a gradient that is (a refused update), is FloatingPointError on every rank, with no
  weights changed;
* anything else on one rank (an update refused on one shard alone, MemoryError, SIGINT, an MPI error)
  prints the rank's error and calls ``MPI_Abort``.
"""
import gc
import hashlib
import zlib

import numpy as np

from fastckpt.core.activations import check_activation, state_codes
from fastckpt.core.checks import as_batch, as_labels, check_dtype, check_eta, check_l2, check_positive_int, check_sizes
from fastckpt.core.init import check_init, draw
from fastckpt.core.layout import column_widths, layer_views, tensor_split
from fastckpt.core.losses import check_loss, l2_penalty
from fastckpt.core.optimizers import OptimizerState, parse_optimizer
from fastckpt.core.params import Parameters
from fastckpt.engine.batches import Staging
from fastckpt.engine.inference import EVAL_CHUNK, ChunkedForward, count_correct
from fastckpt.engine.loop import check_training, run_epochs
from fastckpt.kernels import all_finite
from fastckpt.nets import Network
from fastckpt.planner import parse_strategy
from fastckpt.planner.strategies import Fit

from .buckets import Buckets
from .grid import Grid
from .mpi import Group, describe_data, mpi_world, random_state
from .pipeline.partition import check_stages, choose_partition, stage_bytes, stage_plan
from .pipeline.runner import StageRunner
from .pipeline.schedules import check_schedule, pending_weights, schedule, storage_slots
from .pipeline.stage import Stage
from .pipeline.transport import check_transport
from .tensor import ShardSums, pieces, take

MODE = "Trainer"


class Trainer:
    """Train ``sizes`` over the ranks of ``grid`` (NOTE [ One meaning of data parallelism ] in :mod:`.grid`).

    Parameters
    ----------
    sizes : sequence of int
        The whole net, input first (or ``net=``).
    grid : Grid, optional
        ``Grid(data=D, pipeline=P, tensor=T)`` (:class:`~.grid.Grid`); default: every rank of
        ``MPI.COMM_WORLD`` a data-parallel replica.
    micro_batches : int, optional
        ``M``: each replica's mini-batch is split into ``M`` micro-batches (sizes differ by at most one).
    schedule : {"gpipe", "1f1b", "zb1"}, optional
        The stages' order of passes (NOTE [ Zero bubble ] in :mod:`~.pipeline.schedules` for ``zb1``).
    strategy : str or Strategy, optional
        Checkpointing inside every part (any strategy: ``"sqrt"``, ``"revolve(2)"``, ``"fit(bytes)"``, which
        bounds all a rank holds); default ``"plain"``.
    dtype, loss, l2, activation, init, optimizer
        As for :class:`~fastckpt.nets.network.Network`; each rank keeps the optimizer's state of its part.
    optimizer_in_backward : bool, optional
        Each layer's update as soon as its gradient is final: on one replica, one stage and one micro-batch
        (tensor shards or not), where no gradient waits for a sum.
    partition : sequence of int, optional
        Layers per stage (summing to ``len(sizes) - 1``).  By default the layers are split so that the
        stages' predicted time is balanced, each within ``memory_limit`` bytes when that is given.
    transport : {"native", "float16", "bfloat16", "int8"}, optional
        How activations and deltas travel between stages.
    memory_limit : int, optional
        Bytes per rank for the automatic partition (needs ``batch_size``).
    batch_size : int, optional
        The mini-batch size the partition and the bound are checked for; default: the first update's.
    bucket_bytes : int, optional
        Sum a whole net's gradient over the replicas in buckets of about this many bytes, each started
        while the backward pass goes on (NOTE [ Overlapped buckets ] in :mod:`.buckets`).
    net : Network, optional
        Train this net in place instead (a whole net on each rank: no pipeline or tensor axis), from its
        weights, which must be the same on every rank; its settings are the trainer's (but the optimizer
        in backward, with several replicas: it steps after their sum).

    Every rank makes the trainer after the same ``np.random.seed``: the initial weights are those of
    ``Network(sizes, init=init)`` from that seed, each rank keeping its part.  NOTE [ Errors on every
    rank ] says what happens when something goes wrong.
    """

    def __init__(self, sizes=None, *, grid=None, micro_batches=1, schedule="gpipe", strategy="plain",
                 dtype=np.float64, loss="quadratic", l2=0.0, activation="sigmoid", init="lab", optimizer="sgd",
                 optimizer_in_backward=False, partition=None, transport="native", memory_limit=None,
                 batch_size=None, bucket_bytes=None, net=None):
        given = dict(sizes=sizes, micro_batches=micro_batches, schedule=schedule, strategy=strategy, dtype=dtype,
                     loss=loss, l2=l2, activation=activation, init=init, optimizer=optimizer,
                     optimizer_in_backward=optimizer_in_backward, transport=transport, batch_size=batch_size,
                     bucket_bytes=bucket_bytes, partition=partition, memory_limit=memory_limit)
        grid, wrong = _grid(grid)
        self.group = Group(grid.comm)                    # _grid gives a grid even when refusing one
        self.MPI, self.comm = self.group.MPI, self.group.comm
        self.group.agree(wrong or self._checked(grid, net, given), "Trainer arguments")
        self.grid, self.net = grid, net
        self._staged = (True, True)                      # whether x, y go into staging rows: until seen, yes
        self.places = places = grid.places()
        with self.group.errors() as errors:
            self.blas_threads = self.group.share_cores()
            errors.shared = (ValueError, TypeError)           # agreed settings: every rank finds the same
            self._place(partition, memory_limit)
            errors.shared = ()
            self._hold()
        self.sums = ShardSums(places.tensor, self.MPI) if grid.tensor > 1 else None
        self._acc = None if self.fused else self.params.new_buffer()     # each layer steps in its backward
        self._buckets = None if self.bucket_bytes is None else Buckets(
            places.data, self.MPI, self.sizes, self.dtype.itemsize, self.bucket_bytes, self._acc,
            self.params.new_buffer())
        self._runner = None
        self._staging = Staging(0, self.dtype)
        self.accuracies, self.last_loss = [], None
        self.stats = {"updates": 0, "busy": 0.0, "wall": 0.0, "bytes_sent": 0, "copied_bytes": 0}

    # -- settings --------------------------------------------------------------------------
    def _checked(self, grid, net, given):
        """The arguments checked on this rank: the settings every rank must share (compared by the first
        collective), or the error."""
        try:
            if net is not None:
                given.update(_from_net(net, grid, given))
            self.sizes = list(check_sizes(given["sizes"]))
            self.micro_batches = check_positive_int(given["micro_batches"], "micro_batches")
            self.schedule, self.transport = check_schedule(given["schedule"]), check_transport(given["transport"])
            self.loss, self.strategy = check_loss(given["loss"]), parse_strategy(given["strategy"])
            self.dtype, self.l2 = check_dtype(given["dtype"]), check_l2(given["l2"], len(self.sizes) - 1)
            self.activation = check_activation(given["activation"], len(self.sizes) - 1)
            self.init, self.optimizer = check_init(given["init"]), parse_optimizer(given["optimizer"])
            self.batch_size = None if given["batch_size"] is None else \
                check_positive_int(given["batch_size"], "batch_size")
            self.fused = _check_fused(given["optimizer_in_backward"], grid, self.micro_batches, self.schedule)
            self.bucket_bytes = _check_buckets(given["bucket_bytes"], grid)
            if grid.pipeline > len(self.sizes) - 1:
                raise ValueError(f"{grid!r}: {grid.pipeline} stages need at least {grid.pipeline} layers, the net "
                                 f"has {len(self.sizes) - 1}")
        except (ValueError, TypeError) as exc:
            return exc
        start = {"initial weights": "sha256 " + _digest([net.params.flat])} if net is not None else \
            {"np.random state (seed every rank alike)": random_state()}
        return {"mode": MODE, "grid": repr(grid), **{k: _shown(v) for k, v in given.items()}, **start}

    def _place(self, partition, memory_limit):
        """This rank's stage and shard: its layers, widths and the splits of both."""
        grid, places = self.grid, self.places
        self.partition = [len(self.sizes) - 1] if grid.pipeline == 1 else choose_partition(
            self.sizes, grid.pipeline, partition, memory_limit, self.batch_size,
            lambda stage, lo, hi: self._stage_bytes(stage, lo, hi, self.batch_size),
            self.strategy, None if grid.tensor == 1 else self._splits)
        check_stages(self.strategy, self.sizes, self.partition, grid.tensor, places.shard)
        if self.batch_size is not None:                       # a bound the stages cannot hold: refused on every rank
            for stage, n in enumerate(self.partition):
                lo = sum(self.partition[:stage])
                self._stage_bytes(stage, lo, lo + n, self.batch_size)
        self.lo = sum(self.partition[:places.stage])
        self.hi = self.lo + self.partition[places.stage]
        self.first, self.last = places.stage == 0, places.stage == grid.pipeline - 1
        self.stage_sizes = self.sizes[self.lo:self.hi + 1]
        self.local, split, self.slices = tensor_split(self.stage_sizes, grid.tensor, places.shard, first=self.lo)
        self.row_split = split if grid.tensor > 1 else ()                   # split: the plan's and the forward's
        self.cols = self.slices[0][1] if self.row_split and split[0] else None  # of the input, a row-split layer 0's
        self.stage_acts = state_codes(self.activation, self.loss)[self.lo:self.hi + 1]

    def _hold(self):
        """The parameters of this rank's part, drawn as ``Network(sizes, init=...)`` draws the whole net (or the
        net's own, with ``net=``), and the optimizer's state beside them."""
        if self.net is not None:
            self.params, self.optimizer_state = self.net.params, self.net.optimizer_state
            return
        self.params = Parameters(self.local, self.dtype)
        weights, biases = self.params.layers()
        blocks = {"weights": [(w, rows, cols) for w, (rows, cols) in zip(weights, self.slices)],
                  "biases": [(b.reshape(1, -1), (0, 1), rows) for b, (rows, _) in zip(biases, self.slices)]}
        draw(self.init, self.sizes, lambda kind, layer: blocks[kind][layer - self.lo]
             if self.lo <= layer < self.hi else None)
        self.optimizer_state = OptimizerState(self.optimizer, self.params)

    def _splits(self, lo, hi):
        """Whether layers ``lo .. hi-1`` are wide enough to split over the tensor shards."""
        try:
            tensor_split(self.sizes[lo:hi + 1], self.grid.tensor, 0)
        except ValueError:
            return False
        return True

    # -- plans and bytes -------------------------------------------------------------------
    def order(self, stage=None):
        """This stage's (or ``stage``'s) schedule of passes for one mini-batch."""
        return schedule(self.schedule, self.places.stage if stage is None else stage, self.grid.pipeline,
                        self.micro_batches)

    def _rows(self, batch):
        return -(-batch // self.micro_batches)

    def _options(self, stage, batch):
        """What a stage's plan and bytes for mini-batches of ``batch`` depend on besides its layers and rows."""
        return dict(transport=self.transport, threads=self.blas_threads, slots=self.optimizer.slots,
                    replicated=self.grid.data > 1, staged=tuple(batch * flag for flag in self._staged),
                    buckets=self.bucket_bytes is not None,
                    tensor=None if self.grid.tensor == 1 else (self.grid.tensor, self.places.shard),
                    fused=self.optimizer if self.fused else None)

    def _stage_bytes(self, stage, lo, hi, batch):
        """Predicted bytes of stage ``stage`` holding layers ``lo .. hi-1``, for mini-batches of ``batch``."""
        return stage_bytes(self.sizes, lo, hi, self._rows(batch), self.dtype, self.strategy, self.order(stage),
                           **self._options(stage, batch))

    def plan(self, batch_size=None):
        """The plan this rank's part runs for mini-batches of ``batch_size`` (default: the one its buffers were
        made for, else the ``batch_size`` given): a stage's micro-batches, a shard's own widths."""
        batch = self._batch(batch_size)
        return stage_plan(self.sizes, self.lo, self.hi, self._rows(batch), self.dtype, self.strategy, self.order(),
                          **self._options(self.places.stage, batch))

    def _batch(self, batch_size):
        if batch_size is not None:
            return check_positive_int(batch_size, "batch_size")
        batch = self._runner.batch if self._runner is not None else self.batch_size
        if batch is None:
            raise ValueError("give batch_size (or make a first update)")
        return batch

    def predicted_bytes(self, batch_size=None):
        """This rank's predicted bytes by part for mini-batches of ``batch_size`` (default: the one its buffers
        were last made for, else the ``batch_size`` given); ``staging``: the rows the last mini-batch's x or
        y was converted into (before any, as if they are)."""
        return self._stage_bytes(self.places.stage, self.lo, self.hi, self._batch(batch_size))

    def _runner_for(self, batch):
        """The stage runner for micro-batches of mini-batches of ``batch`` rows, made anew when they grow (or,
        under ``fit(bytes)``, when the staging rows a bound leaves room for change)."""
        rows, staged = self._rows(batch), tuple(batch * flag for flag in self._staged)
        if self._runner is not None and self._runner.rows >= rows and (self._runner.staged == staged or
                                                                        not isinstance(self.strategy, Fit)):
            return self._runner
        self._runner, order = None, self.order()                        # free the old buffers first
        plan = self.plan(batch)
        gc.collect()                       # the candidate plans' garbage, not to sit beside the step's buffers
        shard = None if self.sums is None else \
            (self.sums, self.cols, column_widths(self.stage_sizes[0], self.grid.tensor))
        stage = Stage(plan, first_stage=self.first, last_stage=self.last, loss=self.loss,
                      l2=self.l2[self.lo:self.hi], acts=self.stage_acts, slots=storage_slots(order),
                      deferred=pending_weights(order), shard=shard)
        self._runner = StageRunner(stage, rows, order, self.places.pipe, self.places.stage, self.grid.pipeline,
                                   self.transport, (self.stage_sizes[0], self.stage_sizes[-1]), self.lo)
        self._runner.staged, self._runner.batch = staged, batch
        return self._runner

    # -- an update -------------------------------------------------------------------------
    def update_mini_batch(self, x, y, eta):
        """One step of the optimizer on this replica's mini-batch ``(x, y)`` and every other replica's (each gives
        its own; every rank of a replica the same); returns the mean loss, the same on every rank."""
        return self.update_many([x], [y], eta)

    update = update_mini_batch                         # MPITrainer's name in 0.3

    def update_many(self, xs, ys, eta, count=None):
        """One step of the optimizer on the mean gradient of every replica's mini-batches, ``len(xs)`` of this
        replica's (NOTE [ One meaning of data parallelism ]); returns the mean loss, on every rank.

        ``count`` is the number of mini-batches of all replicas together (default ``len(xs)`` times the
        replicas); a replica with none (the last update of an epoch) adds zeros.  NOTE [ Errors on every
        rank ] says which errors every rank raises.
        """
        with self.group.errors() as errors:
            errors.shared = (ValueError, TypeError)           # agreed: raised on every rank alike
            eta, count = self._agree_update(xs, eta, count)
            errors.shared = ()
            with self.params.lock:
                bad, loss, penalty, refused = self._gradients(xs, ys, eta if self.fused else None)
                total = None if self.fused else self._sum_replicas(bool(xs) and refused is None and not bad)
                bad = bad or total is not None and not all_finite(total)
                status = np.array([float(bad), loss, penalty, float(refused is not None)])
                self.comm.Allreduce(self.MPI.IN_PLACE, status, op=self.MPI.SUM)
                errors.shared = (ValueError, TypeError, FloatingPointError)
                self._raise_refused(status[3], refused)
                self.last_loss = float(status[1] + status[2]) / count
                if status[0] or not np.isfinite(self.last_loss):          # an L2 penalty of inf alone too
                    raise FloatingPointError(f"the loss is {self.last_loss} or a gradient is NaN or inf; weights "
                                             "left unchanged on every rank")
                # a whole net on every rank: the same sum and weights everywhere, refused on all or none
                errors.shared = FloatingPointError if self.grid.pipeline == self.grid.tensor == 1 else ()
                if not self.fused:
                    self.optimizer_state.apply_mean(self.params, total, count, eta)
                self.stats["updates"] += 1
        return self.last_loss

    def _agree_update(self, xs, eta, count):
        """``eta`` and ``count`` checked and the same on every rank (a ValueError on every rank if not)."""
        try:
            eta = check_eta(eta)
            count = self.grid.data * len(xs) if count is None else check_positive_int(count, "count")
            if count < len(xs):
                raise ValueError(f"count={count} mini-batches in all, but this replica alone has {len(xs)}")
            if self.fused and (len(xs) != 1 or count != 1):
                raise ValueError(f"the optimizer in backward steps on one mini-batch's gradient: give update_many "
                                 f"one mini-batch and count=1, got {len(xs)} and count={count}")
            mine = {"eta and mini-batches per update": f"eta {eta!r}, {count} mini-batches in all"}
        except (ValueError, TypeError) as exc:
            mine = exc
        self.group.agree(mine, "the update")
        return eta, count

    def _minibatch(self, x, y):
        """A mini-batch of this replica's as its stages take it, staged (into the trainer's staging rows, which
        the next one's overwrite) and checked where read, and the runner for its size: ``(x, y, runner)``; a
        ValueError or TypeError (InfeasiblePlan under ``fit(bytes)``) when refused."""
        xb, yb = self._staging.minibatch(x, y, self.sizes[0], self.sizes[-1], grow=True, use=(self.first, self.last))
        self._staged = (self.first and self._staging.holds(xb), self.last and self._staging.holds(yb))
        if xb.shape[0] < self.micro_batches:
            raise ValueError(f"micro_batches={self.micro_batches}: a mini-batch of {xb.shape[0]} samples cannot make "
                             f"{self.micro_batches} micro-batches")
        for arr, name, used in ((xb, "x", self.first), (yb, "y", self.last)):
            if used and not all_finite(arr):
                raise ValueError(f"{name} holds NaN or inf")
        return xb, yb, self._runner_for(xb.shape[0])     # a bound its plan cannot keep: refused here

    def _gradients(self, xs, ys, eta=None):
        """This replica's mini-batches through its stages, the sum of their mean gradients in the gradient
        buffer (or, with the optimizer in backward, one mini-batch's step at ``eta``): ``(bad, loss, penalty,
        refused)``, the loss summed over them on the output's rank, the L2 penalty of this rank's part (of the
        weights before the step) once for each (the stages' own passes leave it out), and the error of a
        mini-batch refused (the others are not run then)."""
        bad, loss, penalty = False, 0.0, 0.0
        if self.grid.pipeline > 1 or self.micro_batches > 1 or self.fused:
            penalty = len(xs) * l2_penalty(self.l2[self.lo:self.hi], self.params.layers()[0])
        comm = self.places.replica_comm
        if eta is not None and np.any(self.l2) and not np.isfinite(penalty if comm is None else
                                                                   comm.allreduce(penalty)):
            return True, 0.0, penalty, None                    # a loss of inf: no layer steps (as one process)
        for k, (x, y) in enumerate(zip(xs, ys)):
            try:
                xb, yb, runner = self._minibatch(x, y)
                refused = None
            except (ValueError, TypeError) as exc:
                refused = exc
            differs = self._same_on_shards(None if refused else (x, y))          # every rank calls it
            refused = refused or differs
            if refused is not None:              # on every rank of the replica alike: no pass runs
                return False, 0.0, 0.0, refused
            if self.grid.pipeline == 1 and self.micro_batches == 1 and not self.fused:
                failed, part = self._whole_step(runner.stage, xb, yb, k, last=k == len(xs) - 1)
            else:
                edges = [xb.shape[0] * j // self.micro_batches for j in range(self.micro_batches + 1)]
                failed, part = runner.run(self.params, self._acc, xb, yb, edges, self.stats, add=k > 0,
                                          step=None if eta is None else (eta, self.optimizer_state))
            bad, loss = bad or failed, loss + (part if self.last and self.places.shard == 0 else 0.0)
        return bad, loss, penalty, None

    def _same_on_shards(self, given):
        """None, or a ValueError on every rank of this replica when its ranks were given different mini-batches
        (every stage and shard is given the whole ``x`` and ``y``; the first stage reads ``x``, the last ``y``):
        a CRC-32 of the ``(x, y)`` each was given, one ``Allreduce`` of two integers over the replica's ranks;
        "refused on another rank" when another rank refused its own.  ``given``: ``(x, y)``, None if refused.
        So every rank of the replica knows whether any refused: its stages and shards exchange activations, so
        they run a mini-batch's passes together or not at all."""
        comm = self.places.replica_comm
        if comm is None:
            return None
        crc = -1 if given is None else _crc32(given[1], _crc32(given[0], 0))     # of x, then y
        seen = np.array([crc, -crc], dtype=np.int64)
        comm.Allreduce(self.MPI.IN_PLACE, seen, op=self.MPI.MAX)
        most, least = seen[0], -seen[1]
        if given is None or most == least:
            return None
        if least == -1:
            return ValueError("refused on another rank")
        return ValueError(f"the {comm.Get_size()} ranks of replica {self.places.replica} were given different "
                          "mini-batches (every stage and tensor shard of a replica is given the whole x and y, in "
                          "the same dtype): give each the same")

    def _whole_step(self, stage, xb, yb, k, last):
        """One mini-batch through a whole part (one stage, one micro-batch) in one engine step, its gradient
        copied or added to the gradient buffer (its last through the buckets): ``(bad, loss)``."""
        engine, x = stage.engine, stage.columns(xb)
        buckets = self._buckets if last else None
        sent = stage.sent_bytes
        try:
            if buckets is None:
                loss = engine.gradients(self.params, x, yb, out=self._acc, add=k > 0)
            else:
                after = buckets.start(engine.workspace, engine.grad, add=k > 0)
                loss = engine.gradients(self.params, x, yb, cuts=buckets.cuts(engine.workspace), after=after)
        except FloatingPointError:                            # the loss: weights unchanged on every rank
            return True, np.inf
        finally:
            self.stats["bytes_sent"] += stage.sent_bytes - sent
        return False, loss

    def _sum_replicas(self, mine):
        """The gradient buffer summed over this part's replicas, in place (or the buckets' sum); ``mine``: this
        replica's own gradient is in it (else it adds zeros: no mini-batch, or one refused)."""
        if not mine:
            self._acc[...] = 0.0
        if self._buckets is not None:
            if not mine and not self._buckets.requests:       # none posted yet: the loss was refused first
                self._buckets.start_zeros()
            self._buckets.wait()
            total = self._buckets.total
        else:
            self.places.sum_replicas(self._acc, self.MPI)
            total = self._acc
        count = self.grid.data                                 # as a ring sends it: 2 (D - 1) / D per byte
        self.stats["bytes_sent"] += total.nbytes * 2 * (count - 1) // count
        return total

    def _raise_refused(self, refused, error):
        """A mini-batch refused on some rank: the first such rank's error, raised on every rank (its own where
        a rank found one)."""
        if not refused:
            return
        own = error is not None and str(error) != "refused on another rank"
        said = self.comm.allgather(f"{type(error).__name__}: {error}" if own else None)
        rank, first = next((r, e) for r, e in enumerate(said) if e is not None)
        if own:
            raise error
        raise (TypeError if first.startswith("TypeError") else ValueError)(f"the mini-batch refused on rank {rank}: "
                                                                            f"{first}")

    # -- the whole net ---------------------------------------------------------------------
    def evaluate(self, x_test_data, y_test_data):
        """Fraction of samples whose arg-max output matches the label, on every rank (the same data on each;
        every replica's stages run it)."""
        if self.net is not None:
            return self.net.evaluate(x_test_data, y_test_data)
        try:
            x = as_batch(x_test_data, self.sizes[0], "x_test_data", "input")
            labels = as_labels(y_test_data, self.sizes[-1], x.shape[0], ("x_test_data", "y_test_data"))
            crc = zlib.crc32(np.ascontiguousarray(x), zlib.crc32(np.ascontiguousarray(labels)))
            mine = {"test data": f"{x.shape[0]} rows, crc32 {crc:08x}"}
        except (ValueError, TypeError) as exc:
            mine = exc
        self.group.agree(mine, "evaluate", "were given different test data (every rank evaluates the same rows)")
        run = ChunkedForward(self.params, self.stage_acts, min(EVAL_CHUNK, max(1, x.shape[0])), self.row_split,
                             self.sums)
        pipe = self.places.pipe

        def predict(rows):
            a = rows
            if not self.first:
                a = np.empty((rows.shape[0], self.stage_sizes[0]), dtype=self.dtype)
                pipe.comm.Recv(a, source=self.places.stage - 1, tag=3)
            out = run(a if self.cols is None else np.ascontiguousarray(a[:, self.cols[0]:self.cols[1]]))
            if self.last:
                return out
            pipe.comm.Send(np.ascontiguousarray(out), dest=self.places.stage + 1, tag=3)
            return None
        with self.params.lock:
            hits, error = count_correct(x, labels, self.dtype, predict)
        if pipe is not None:                    # the last stage has the answer: every stage raises or returns it
            hits, error = pipe.comm.bcast((hits, None if error is None else str(error)), root=self.grid.pipeline - 1)
            error = None if error is None else ValueError(error)
        if error is not None:
            raise error
        return hits / x.shape[0]

    def SGD(self, training_data, epochs, mini_batch_size, eta, test_data=None, *, parallel_batches=None,
            verbose=True, progress=None, on_epoch=None, lr_schedule=None, first_epoch=0):
        """The lab's loop with ``parallel_batches`` mini-batches per update (default: one per replica, NOTE [ One
        meaning of data parallelism ]); ``lr_schedule`` and ``first_epoch`` as in
        :meth:`Network.SGD <fastckpt.nets.network.Network.SGD>`, ``on_epoch(epoch, updates)`` after each epoch
        on every rank.

        ``parallel_batches`` must be a multiple of the replicas; replica ``d`` takes mini-batches ``d, d + D,
        ...`` of each group, and the last group of an epoch averages the mini-batches left (as threads do).
        Returns (memusage, updatetime) of this rank; rank 0 prints.  First checks that every rank has the
        same settings, data and initial weights (a ValueError on every rank if not).
        """
        model = self.net or self
        with self.group.errors() as errors:
            errors.shared = (ValueError, TypeError)       # the same values everywhere: checks fail on all alike
            self.group.agree({"training data": describe_data(training_data, "training_data"),
                              "test data": None if test_data is None else describe_data(test_data, "test_data"),
                              "epochs": epochs, "batch size": mini_batch_size, "eta": eta,
                              "lr_schedule": str(lr_schedule), "first epoch": first_epoch,
                              "parallel_batches": parallel_batches or self.grid.data})
            x, y, epochs, mini_batch_size, eta = check_training(model, training_data, epochs, mini_batch_size, eta)
            starts = self._groups(len(x), mini_batch_size, parallel_batches or self.grid.data)

            def update(group, rate):
                count, mine = group
                self.update_many([x[s:s + mini_batch_size] for s in mine], [y[s:s + mini_batch_size] for s in mine],
                                 rate, count)
            errors.shared = (FloatingPointError, ValueError, TypeError)   # an update ends the job on the rest
            return run_epochs(model, epochs, starts, update, test_data, verbose and self.group.rank == 0,
                              lock=self.params.lock, on_epoch=on_epoch, progress=progress, eta=eta,
                              lr_schedule=lr_schedule, first_epoch=first_epoch)

    def _groups(self, n, mini_batch_size, per_update):
        """Per update, the mini-batches of every replica together and the starts this replica takes: replica
        ``d`` the ``d``-th, ``d + D``-th, ... of each group (an epoch's last group may give some none)."""
        replicas, replica = self.grid.data, self.places.replica
        per_update = check_positive_int(per_update, "parallel_batches")
        if per_update % replicas:
            raise ValueError(f"parallel_batches must be a multiple of the {replicas} replicas, got {per_update}")
        if self.fused and per_update > 1:
            raise ValueError(f"parallel_batches={per_update}: the optimizer in backward steps on one mini-batch's "
                             "gradient")
        batches = n // mini_batch_size
        self._stage_bytes(self.places.stage, self.lo, self.hi, mini_batch_size)    # a bound that cannot hold
        return [(min(per_update, batches - first),
                 [k * mini_batch_size for k in range(first + replica, min(first + per_update, batches), replicas)])
                for first in range(0, batches, per_update)]

    def gather(self, buf=None):
        """The whole net's ``(weights, biases)`` in the lab's shapes, on every rank (a collective): weights[i]
        (sizes[i+1], sizes[i]), biases[i] (sizes[i+1], 1); of ``buf`` in this rank's parameter layout (an
        optimizer state buffer) when given."""
        with self.params.lock:
            weights, biases = layer_views(self.params.flat if buf is None else buf, self.local)
            parts = pieces(self.stage_sizes, self.grid.tensor, self.places.shard, weights, biases, first=self.lo)
        with self.group.errors():
            return self.group.gather_net(self.sizes, parts)

    def gather_state(self):
        """The optimizer's state of the whole net on every rank (a collective), as a saved file keeps it:
        ``{"steps": t, "arrays": {name: (weights, biases)}}`` in the lab's shapes."""
        state = self.optimizer_state
        return {"steps": state.steps, "arrays": {name: self.gather(buf) for name, buf in
                                                 zip(state.optimizer.state_names, state.buffers)}}

    def load_net(self, net):
        """Take this rank's part of ``net``'s parameters and optimizer state (a whole net of the same sizes,
        dtype, loss, activations and optimizer: a saved run's), so training goes on as that net would.  A
        collective: every rank gives the same net (compared by digest), or every rank raises."""
        try:
            if not all(hasattr(net, key) for key in ("sizes", "weights", "biases", "optimizer_state")):
                raise TypeError(f"load_net: net must be a fastckpt Network (fastckpt.load(path), say), got "
                                f"{type(net).__name__}")
            mine = {"sizes": list(self.sizes), "dtype": self.dtype.name, "loss": self.loss, "l2": list(self.l2),
                    "activation": list(self.activation), "optimizer": self.optimizer}
            theirs = {"sizes": list(net.sizes), "dtype": net.dtype.name, "loss": net.loss, "l2": list(net.l2),
                      "activation": list(net.activation), "optimizer": net.optimizer}
            differ = [f"{key} {theirs[key]} (the trainer's: {mine[key]})" for key in mine if mine[key] != theirs[key]]
            if differ:
                raise ValueError(f"load_net: the net differs from this Trainer: {'; '.join(differ)}")
            sent = {"the net given to load_net": f"{net.optimizer_state.steps} steps, sha256 " + _digest(
                [np.ascontiguousarray(a) for a in net.weights + net.biases + net.optimizer_state.buffers])}
        except (TypeError, ValueError) as exc:
            sent = exc
        self.group.agree(sent, "load_net")
        arrays = net.optimizer_state.arrays(net.sizes)
        with self.params.lock:
            self._take(self.params.flat, net.weights, net.biases)
            for name, buf in zip(self.optimizer.state_names, self.optimizer_state.buffers):
                self._take(buf, *arrays[name])
            self.optimizer_state.steps = net.optimizer_state.steps

    def _take(self, buf, weights, biases):
        """Set this rank's part of ``buf`` (in its parameter layout) from the whole net's lab-shaped arrays."""
        mine_w, mine_b = layer_views(buf, self.local)
        take(self.slices, mine_w, mine_b, weights, biases, first=self.lo)

    @property
    def bytes_per_update(self):
        """Bytes this rank sent per update so far: activations and deltas to its neighbour stages, as encoded,
        its part's sums over its tensor shards (2 (T - 1) / T per byte summed, (T - 1) / T gathered), and
        with ``D`` replicas the gradient's sum over them (``2 (D - 1) / D`` times its bytes)."""
        return self.stats["bytes_sent"] / max(1, self.stats["updates"])

    def bubble_fraction(self):
        """The share of the updates' time that the stages spent not computing, averaged over the
        ranks (a collective: every rank calls it).  A balanced pipeline idles ``(P-1)/(M+P-1)``."""
        parts = self.comm.allgather((self.stats["busy"], self.stats["wall"]))
        return float(np.mean([1.0 - busy / wall for busy, wall in parts if wall > 0] or [0.0]))

    def __reduce__(self):
        raise TypeError("a Trainer holds MPI communicators and cannot be pickled or copied; save the net instead "
                        "(gather() gives its weights)")


def _grid(grid):
    """``(grid, error)``: the grid given (a :class:`~.grid.Grid`, or :meth:`Grid.fill`'s arguments), or every rank
    of ``MPI.COMM_WORLD`` a replica; a grid that cannot be is returned as the error (with the world's), to be
    refused on every rank through the settings' agreement."""
    if isinstance(grid, Grid):
        return grid, None
    world = Grid(data=mpi_world()[1].Get_size())
    if grid is None:
        return world, None
    if isinstance(grid, dict):
        try:
            return Grid.fill(**grid), None
        except (ValueError, TypeError) as exc:
            return world, exc
    if isinstance(grid, Exception):
        return world, grid
    return world, TypeError(f"grid must be a fastckpt.distributed.Grid, got {type(grid).__name__}")


def _from_net(net, grid, given):
    """The settings of ``net=`` (a Network trained in place), refused with a pipeline or tensor axis or with
    settings of its own given too."""
    if not isinstance(net, Network):
        raise TypeError(f"net must be a fastckpt Network, got {type(net).__name__}")
    if grid.pipeline > 1 or grid.tensor > 1:
        raise ValueError(f"net= trains a whole net on each rank; {grid!r} splits it: give sizes instead")
    if given["sizes"] is not None and list(given["sizes"]) != list(net.sizes):
        raise ValueError(f"give net= or sizes, not both (sizes {list(given['sizes'])}, net {list(net.sizes)})")
    return {"sizes": net.sizes, "strategy": net.strategy, "dtype": net.dtype, "loss": net.loss, "l2": list(net.l2),
            "activation": list(net.activation), "optimizer": net.optimizer,     # replicas sum before they step
            "optimizer_in_backward": net.optimizer_in_backward and grid.data == 1}


def _check_fused(fused, grid, micro, schedule):
    """``optimizer_in_backward`` checked: one replica, one micro-batch (each stage steps in its backward)."""
    if not isinstance(fused, (bool, np.bool_)):
        raise TypeError(f"optimizer_in_backward must be True or False, got {fused!r}")
    if fused and schedule == "zb1" and grid.pipeline > 1:
        raise ValueError("optimizer_in_backward (--optimizer-in-backward) steps each layer as its gradient is final, "
                         "but schedule 'zb1' puts the weight gradients off; give '1f1b' or 'gpipe' (the same with "
                         "one micro-batch)")
    if fused and (grid.data > 1 or micro > 1):
        raise ValueError(f"optimizer_in_backward (--optimizer-in-backward) steps each layer as its gradient is final, "
                         f"but with {grid!r} and micro_batches={micro} (--micro-batches) gradients are summed over "
                         "replicas or micro-batches first; leave it out, or train on one replica with one "
                         "micro-batch")
    return bool(fused)


def _check_buckets(bucket_bytes, grid):
    """``bucket_bytes`` checked: the sum of a whole net's gradient over its replicas (None with one replica,
    which sums nothing)."""
    if bucket_bytes is None:
        return None
    bucket_bytes = check_positive_int(bucket_bytes, "bucket_bytes")
    if grid.pipeline > 1 or grid.tensor > 1:
        raise ValueError(f"bucket_bytes sums a whole net's gradient in buckets; {grid!r} splits the net")
    return bucket_bytes if grid.data > 1 else None


def _digest(buffers):
    """The first 16 hex digits of the SHA-256 of the buffers' bytes, in order."""
    found = hashlib.sha256()
    for buf in buffers:
        found.update(buf)
    return found.hexdigest()[:16]


def _crc32(a, crc):
    """CRC-32 of a mini-batch's shape, dtype and values after ``crc``, without copying a contiguous array (any
    other array, or a list, is read a row at a time)."""
    if not isinstance(a, np.ndarray):
        crc = zlib.crc32(f"list of {len(a)}".encode(), crc)
        for row in a:
            crc = _crc32(np.asarray(row), crc)
        return crc
    crc = zlib.crc32(repr((a.shape, a.dtype.str)).encode(), crc)
    if a.flags.c_contiguous:
        return zlib.crc32(a.reshape(-1).view(np.uint8), crc)
    for row in a:
        crc = zlib.crc32(np.ascontiguousarray(row).reshape(-1).view(np.uint8), crc)
    return crc


def _shown(value):
    """A setting as the ranks compare it."""
    return "[" + ", ".join(_shown(v) for v in value) + "]" if isinstance(value, (list, tuple)) else \
        np.dtype(value).name if isinstance(value, type) and issubclass(value, np.generic) else str(value)


def PipelineTrainer(sizes, micro_batches, *, comm=None, data_parallel=1, tensor_parallel=1, grid=None, **options):
    """The name of 0.3: a :class:`Trainer` of ``micro_batches`` over ``grid``, by default ``Grid(data=data_parallel,
    pipeline=P, tensor=tensor_parallel)`` on every rank of ``comm`` (``MPI.COMM_WORLD``); ``options`` as
    :class:`Trainer` takes them."""
    if grid is None:
        grid = dict(data=data_parallel, tensor=tensor_parallel, comm=comm)
    elif comm is not None or data_parallel != 1 or tensor_parallel != 1:
        grid = ValueError(f"give grid={grid!r} or comm, data_parallel and tensor_parallel, not both")
    return Trainer(sizes, grid=grid, micro_batches=micro_batches, **options)


def TensorParallelTrainer(sizes, *, comm=None, data_parallel=1, grid=None, **options):
    """The name of 0.3: a :class:`Trainer` over ``grid``, by default ``Grid(data=data_parallel, tensor=T)`` on every
    rank of ``comm`` (``MPI.COMM_WORLD``); ``options`` as :class:`Trainer` takes them."""
    if grid is None:
        grid = dict(data=data_parallel, pipeline=1, comm=comm)
    elif comm is not None or data_parallel != 1:
        grid = ValueError(f"give grid={grid!r} or comm and data_parallel, not both")
    return Trainer(sizes, grid=grid, **options)


def MPITrainer(net, comm=None, bucket_bytes=None, *, grid=None):
    """The name of 0.3: a :class:`Trainer` of ``net`` (trained in place) over ``grid``, by default every rank of
    ``comm`` (``MPI.COMM_WORLD``) a replica."""
    if grid is None:
        grid = dict(pipeline=1, tensor=1, comm=comm)
    elif comm is not None:
        grid = ValueError(f"give grid={grid!r} or comm, not both")
    return Trainer(net=net, grid=grid, bucket_bytes=bucket_bytes)
