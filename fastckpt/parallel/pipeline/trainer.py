"""Pipeline parallelism over MPI: each rank holds a contiguous range of layers, a stage.

A minibatch is split into ``M`` micro-batches.  Stage ``s`` receives each
micro-batch's activations from stage ``s - 1``, runs its layers forward and
sends its output on; later it receives the delta of that output from stage
``s + 1``, runs its backward pass (recomputing inside the stage as its
strategy says) and sends the delta of its input back.  Gradients are summed
over the micro-batches and each stage applies one SGD step to its own layers:
the same update as one process on the whole minibatch, up to the order of
summation (the net's optimizer steps each stage's own layers, with that stage's
share of the state).  Beside this module: ``schedules``, ``stage`` (micro-batches in
flight), ``links`` (messages), ``partition`` and ``transport``.

NOTE [ Pipeline errors ]
As for data parallelism (NOTE [ No rank waits forever ] in
:mod:`fastckpt.parallel.mpi`), an error is either shared or ends the job:

* the settings are compared across ranks when the trainer is made, and the
  minibatch's shape and eta at every update; a mismatch or a bad value is the
  same ValueError on every rank;
* one ``Allreduce`` of three numbers after the backward passes gives every rank
  the loss and whether the loss or any stage's gradient is NaN or inf; then
  every rank raises FloatingPointError and no weights change;
* anything else on one rank (an update refused on that stage alone, MemoryError,
  SIGINT, an MPI error) prints the rank's error and calls ``MPI_Abort``.
"""
import numpy as np

from fastckpt.core.activations import check_activation, state_codes
from fastckpt.core.checks import check_dtype, check_eta, check_l2, check_positive_int, check_sizes
from fastckpt.core.init import check_init
from fastckpt.core.losses import check_loss, l2_penalty
from fastckpt.core.optimizers import OptimizerState, parse_optimizer
from fastckpt.engine.batches import Staging
from fastckpt.kernels import all_finite
from fastckpt.planner import parse_strategy
from fastckpt.planner.strategies import Fit

from ..grid import Grid, grid_args
from ..mpi import Group, lab_loop, random_state
from ..rank_trainer import RankTrainer
from ..shards import split_layers
from ..tensor_layers import check_tensor_strategy
from .holding import StageHolding
from .partition import check_stages, choose_partition, stage_bytes, stage_plan, tensor_stage
from .replicas import Replicas, check_replicas
from .runner import StageRunner
from .schedules import check_schedule, schedule
from .tensor_layout import TensorLayout
from .transport import check_transport

MODE = "pipeline (--pipeline)"


class PipelineTrainer(StageHolding, RankTrainer):
    """Train ``sizes`` with its layers split into one stage per rank of ``comm``.

    Parameters
    ----------
    sizes : sequence of int
        The whole net, input first.
    micro_batches : int
        ``M``: each minibatch is split into ``M`` micro-batches (sizes differ by at most one).
    schedule : {"gpipe", "1f1b", "zb1"}, optional
        ``zb1`` puts each micro-batch's weight gradients off into 1F1B's bubble
        (NOTE [ Zero bubble ] in :mod:`~fastckpt.parallel.pipeline.schedules`).
    strategy : str or Strategy, optional
        Checkpointing inside every stage (e.g. ``"sqrt"``, ``"revolve(2)"``); default ``"plain"``.
    dtype, loss, l2, activation, init, optimizer
        As for :class:`~fastckpt.nets.network.Network`; each stage keeps the optimizer's state of
        its own layers.
    comm : mpi4py communicator, optional
        ``MPI.COMM_WORLD`` by default; rank ``s`` is stage ``s``.
    partition : sequence of int, optional
        Layers per stage (summing to ``len(sizes) - 1``).  By default the
        layers are split so that the stages' predicted time (GEMM FLOPs plus
        elementwise work, :func:`fastckpt.planner.costs.layer_costs`) is balanced, each
        within ``memory_limit`` bytes when that is given.
    transport : {"native", "float16", "bfloat16", "int8"}, optional
        How activations and deltas travel between stages.
    memory_limit : int, optional
        Bytes per rank for the automatic partition (needs ``batch_size``).
    batch_size : int, optional
        The minibatch size the workspace and the memory prediction are for;
        default: that of the first update.
    data_parallel : int, optional
        ``D`` replicas of the pipeline on ``D x P`` ranks (:mod:`~fastckpt.parallel.pipeline.replicas`).
    tensor_parallel : int, optional
        ``T``: each stage's layers split over ``T`` ranks (NOTE [ Tensor-parallel stages ] in
        :mod:`~fastckpt.parallel.pipeline.tensor_stage`), ``D x P x T`` ranks; the strategy then
        ``plain``, ``every_nth(n)``, ``segments(k)`` or ``sqrt``.
    grid : Grid, optional
        ``Grid(data=D, pipeline=P, tensor=T)`` (:class:`~fastckpt.parallel.grid.Grid`), instead of ``comm``,
        ``data_parallel`` and ``tensor_parallel``.

    Every rank makes the trainer after the same ``np.random.seed``; the initial
    weights are those of ``Network(sizes, init=init)`` from that seed, each rank keeping
    only its own layers.  See NOTE [ Pipeline errors ] for what happens when
    something goes wrong.
    """

    def __init__(self, sizes, micro_batches, *, schedule="gpipe", strategy="plain", dtype=np.float64,
                 loss="quadratic", l2=0.0, comm=None, partition=None, transport="native", memory_limit=None,
                 batch_size=None, activation="sigmoid", init="lab", optimizer="sgd", data_parallel=1,
                 tensor_parallel=1, grid=None):
        comm, data_parallel, wrong = grid_args(grid, "pipeline", comm, data_parallel)
        if isinstance(grid, Grid):
            wrong = wrong or (ValueError(f"give grid={grid!r} or tensor_parallel, not both") if tensor_parallel != 1
                              else None)
            tensor_parallel = grid.tensor
        self.group = Group(comm)
        self.MPI, self.comm = self.group.MPI, self.group.comm
        self.group.agree(wrong or self._checked(sizes, micro_batches, schedule, strategy, dtype, loss, l2, transport,
                                                batch_size, (activation, init, optimizer, data_parallel,
                                                             tensor_parallel), partition, memory_limit),
                          "PipelineTrainer arguments")
        self._staged = (True, True)            # whether x, y go into staging rows: until a minibatch shows, yes
        self.fit, self._fits = isinstance(self.strategy, Fit), set()    # fit(bytes): minibatch sizes checked
        self.replicas = Replicas(self.group, self.data_parallel, self.shards)   # NOTE in pipeline/replicas.py
        self.pipe, self.rank, self.ranks = self.replicas.pipe, self.replicas.stage, self.replicas.stages
        self.blas_threads = self.group.share_cores()
        self.partition = choose_partition(self.sizes, self.ranks, partition, memory_limit, self.batch_size,
                                          lambda stage, lo, hi: self._stage_bytes(stage, lo, hi, self.batch_size),
                                          self.strategy, None if self.shards == 1 else self._splits)
        check_stages(self.strategy, self.sizes, self.partition, self.shards, self.replicas.shard)
        if self.batch_size is not None:                       # a bound the stages cannot hold: refused on every rank
            for stage, n in enumerate(self.partition):
                lo = sum(self.partition[:stage])
                self._stage_bytes(stage, lo, lo + n, self.batch_size)
        self.lo = sum(self.partition[:self.rank])
        self.hi = self.lo + self.partition[self.rank]
        self.stage_sizes = self.sizes[self.lo:self.hi + 1]
        self.first, self.last = self.rank == 0, self.rank == self.ranks - 1
        self.stage_acts = state_codes(self.activation, self.loss)[self.lo:self.hi + 1]
        self._hold()                                          # self.params: the stage's layers, or a shard's slices
        self.optimizer_state = OptimizerState(self.optimizer, self.params)
        self._acc = self.params.new_buffer()
        self._runner = None
        self._staging = Staging(0, self.dtype)
        self.accuracies = []
        self.last_loss = None
        self.stats = {"updates": 0, "busy": 0.0, "wall": 0.0, "bytes_sent": 0, "copied_bytes": 0}

    def _checked(self, sizes, micro_batches, schedule, strategy, dtype, loss, l2, transport, batch_size, net,
                 *limits):
        """The arguments checked on this rank: the settings every rank must share (the first collective
        of every trainer compares them, with the mode), or the error."""
        try:
            self.sizes = list(check_sizes(sizes))
            self.micro_batches = check_positive_int(micro_batches, "micro_batches")
            self.schedule, self.transport = check_schedule(schedule), check_transport(transport)
            self.loss, self.strategy = check_loss(loss), parse_strategy(strategy)
            self.dtype, self.l2 = check_dtype(dtype), check_l2(l2, len(self.sizes) - 1)
            self.batch_size = None if batch_size is None else check_positive_int(batch_size, "batch_size")
            activation, init, optimizer, data_parallel, tensor = net
            self.shards = check_positive_int(tensor, "tensor_parallel")
            self.data_parallel = check_replicas(data_parallel, self.group.size, self.shards)
            self.activation = check_activation(activation, len(self.sizes) - 1)
            self.init, self.optimizer = check_init(init), parse_optimizer(optimizer)
            if self.shards > 1:
                check_tensor_strategy(self.strategy)
        except (ValueError, TypeError) as exc:
            return exc
        return {"mode": MODE, "sizes": self.sizes, "micro_batches": self.micro_batches, "schedule": schedule,
                "activation": list(self.activation), "init": self.init, "optimizer": self.optimizer,
                "data_parallel": self.data_parallel, "tensor_parallel": self.shards, "transport": transport,
                "loss": loss, "strategy": self.strategy,
                "dtype": self.dtype.name,
                "l2": list(self.l2), "batch_size": self.batch_size, "partition and memory_limit": repr(limits),
                "np.random state (seed every rank alike)": random_state()}

    def _splits(self, lo, hi):
        """Whether layers ``lo .. hi-1`` are wide enough to split over the tensor shards."""
        try:
            split_layers(self.sizes[lo:hi + 1], self.shards, 0)
        except ValueError:
            return False
        return True

    def _rows(self, batch):
        return -(-self.replicas.largest(batch) // self.micro_batches)

    def order(self, stage=None):
        """This stage's (or ``stage``'s) schedule of passes for one minibatch."""
        return schedule(self.schedule, self.rank if stage is None else stage, self.ranks, self.micro_batches)

    def predicted_bytes(self, batch_size=None):
        """This rank's predicted bytes by part for minibatches of ``batch_size`` (default: the one its buffers
        were last made for, else the ``batch_size`` given); ``staging``: the rows the last minibatch's x or
        y was converted into (before any, as if they are)."""
        if batch_size is not None:
            batch = check_positive_int(batch_size, "batch_size")
        else:
            batch = self._runner.batch if self._runner is not None else self.batch_size
        if batch is None:
            raise ValueError("predicted_bytes needs batch_size (or a first update)")
        return self._stage_bytes(self.rank, self.lo, self.hi, batch)

    def _stage_bytes(self, stage, lo, hi, batch):
        """Predicted bytes of stage ``stage`` holding layers ``lo .. hi-1``, for minibatches of ``batch``."""
        return stage_bytes(self.sizes, lo, hi, self._rows(batch), self.dtype, self.strategy, self.order(stage),
                           self.transport, self.blas_threads, self.optimizer.slots, self.data_parallel > 1,
                           tuple(batch * flag for flag in self._staged),
                           (self.shards, self.replicas.shard) if self.shards > 1 else None)

    def update_mini_batch(self, x, y, eta):
        """One step of the optimizer on the minibatch ``(x, y)``, the same on every rank; returns the mean loss.

        The minibatch is split into the micro-batches, which flow through the
        stages in the schedule's order; the gradients are summed over them and
        every stage updates its own layers.
        """
        with self.group.errors() as errors:                  # see NOTE [ Pipeline errors ]
            errors.shared = (ValueError, TypeError)           # agreed: raised on every rank alike
            xb, yb, eta = self.group.minibatch(self._minibatch, x, y, eta)
            r0, r1 = self.replicas.rows(xb.shape[0])
            errors.shared = ()
            status = self._step(xb[r0:r1], yb[r0:r1], xb.shape[0])
            total = np.zeros(3)
            self.comm.Allreduce(status, total, op=self.MPI.SUM)
            self.last_loss = float(total[1] + total[2])
            errors.shared = FloatingPointError
            if total[0]:
                raise FloatingPointError(f"the loss is {self.last_loss} or a gradient is NaN or inf; "
                                         "weights left unchanged on every stage")
            errors.shared = ()
            self.optimizer_state.apply(self.params, self._acc, eta)     # this stage's layers (SGD: the lab's)
            return self.last_loss

    def _minibatch(self, x, y, eta):
        """``(x, y, eta)`` checked as this stage uses them (the first reads x, the last y)."""
        eta = check_eta(eta)
        xb, yb = self._staging.minibatch(x, y, self.sizes[0], self.sizes[-1], grow=True, use=(self.first, self.last))
        self._staged = (self.first and self._staging.holds(xb), self.last and self._staging.holds(yb))
        if xb.shape[0] // self.data_parallel < self.micro_batches:
            raise ValueError(f"micro_batches={self.micro_batches}: a minibatch of {xb.shape[0]} samples cannot make "
                             f"{self.micro_batches} micro-batches"
                             + (f" on each of {self.data_parallel} replicas" if self.data_parallel > 1 else ""))
        for arr, name, used in ((xb, "x", self.first), (yb, "y", self.last)):
            if used and not all_finite(arr):
                raise ValueError(f"{name} holds NaN or inf")
        if self.fit and (xb.shape[0], self._staged) not in self._fits:   # refused here, agreed: not in one stage
            self._stage_bytes(self.rank, self.lo, self.hi, xb.shape[0])
            self._fits.add((xb.shape[0], self._staged))
        return xb, yb, eta

    def _step(self, xb, yb, total):
        """Every micro-batch's passes of this replica's rows on this stage, in the schedule's order, scaled
        for a minibatch of ``total`` and summed over the replicas; returns (bad, loss part, penalty) of
        this stage, for the Allreduce."""
        batch = xb.shape[0]
        edges = [batch * k // self.micro_batches for k in range(self.micro_batches + 1)]   # sizes differ by <= 1
        rows = max(b - a for a, b in zip(edges[:-1], edges[1:]))
        staged = tuple(self._staging.rows * flag for flag in self._staged)     # a bound leaves room for them
        if self._runner is None or self._runner.rows < rows or (self._runner.staged != staged and self.fit):
            self._runner = None                                                # free the old buffers first
            args = (self.sizes, self.lo, self.hi, rows, self.dtype, self.strategy, self.order(), self.transport,
                    self.blas_threads, self.optimizer.slots, self.data_parallel > 1, staged)
            if self.shards > 1:                              # NOTE [ Tensor-parallel stages ]: its layout
                kind = tensor_stage(*args, (self.shards, self.replicas.shard))[0]
                plan = TensorLayout(self.stage_sizes, kind, self.shards, self.replicas.shard, self.last)
            else:
                plan = stage_plan(*args)
            self._runner = StageRunner(self, rows, self.order(), plan)
            self._runner.staged, self._runner.batch = staged, total
        with self.params.lock:
            bad, loss_sum = self._runner.run(self.params.flat, self._acc, xb, yb, edges, self.stats, total)
            self.replicas.sum(self._acc, self.MPI)
            count = self.data_parallel                      # the gradient's sum over the replicas, as a ring sends it
            self.stats["bytes_sent"] += self._acc.nbytes * 2 * (count - 1) // count
        bad = bad or not all_finite(self._acc)
        penalty = l2_penalty(self.replicas.own_l2(self.l2[self.lo:self.hi]), self.params.layers()[0])
        return np.array([float(bad), loss_sum if self.last and self.replicas.shard == 0 else 0.0, penalty])

    @property
    def bytes_per_update(self):
        """Bytes this rank sent per update so far: activations and deltas to its neighbour stages, as encoded, a
        tensor-parallel stage's sums over its shards (2 (T - 1) / T per byte summed, (T - 1) / T gathered), and
        with ``D`` replicas the gradient's sum over them (``2 (D - 1) / D`` times its bytes)."""
        return self.stats["bytes_sent"] / max(1, self.stats["updates"])

    def bubble_fraction(self):
        """The share of the updates' time that the stages spent not computing, averaged over the
        ranks (a collective: every rank calls it).  A balanced pipeline idles ``(P-1)/(M+P-1)``."""
        parts = self.comm.allgather((self.stats["busy"], self.stats["wall"]))
        return float(np.mean([1.0 - busy / wall for busy, wall in parts if wall > 0]))

    def SGD(self, training_data, epochs, mini_batch_size, eta, test_data=None, *, verbose=True, on_epoch=None,
            progress=None, lr_schedule=None, first_epoch=0):
        """The lab's loop; every rank passes the same data (checked first); ``on_epoch(epoch, updates)`` after
        each epoch on every rank; ``lr_schedule`` and ``first_epoch`` as in ``Network.SGD``.  Returns (memusage,
        updatetime) of this rank; rank 0 prints."""
        return lab_loop(self, training_data, epochs, mini_batch_size, eta, test_data, verbose, self.params.lock,
                        on_epoch=on_epoch, progress=progress, lr_schedule=lr_schedule, first_epoch=first_epoch)
