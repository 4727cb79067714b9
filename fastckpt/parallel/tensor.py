"""Tensor (model) parallelism over MPI: every layer's units are split across the ranks.

Megatron-LM's split, in (column, row) pairs counted from the output: layer ``l`` of ``L`` is
*row-split* when ``L - 1 - l`` is even, else *column-split*; units split as np.array_split does.

* Column-split: rank ``r`` holds ``W[rows_r, :]`` and ``b[rows_r]``; its output slice
  ``f(a W_r^T + b_r)`` is complete, the activation ``f`` being elementwise.
* Row-split: rank ``r`` holds ``W[:, cols_r]``, the slice its input arrives in (the column-split
  layer's output, or ``x[:, cols_r]`` for layer 0), and the whole bias; the partial ``a_r W_r^T``
  are summed by an ``Allreduce``, then every rank adds the bias and applies ``f``.

So each pair needs one ``Allreduce`` forward, and as the last layer is row-split the output and
loss (a softmax too) are complete and identical on every rank, with no gather.  Backward: a
row-split layer has its whole delta and gives its input slice's delta locally; a column-split
layer ``l > 0`` gives ``(dz_r W_r) * f'(a)`` of its whole input, summed by an ``Allreduce``:
``f'`` is applied before the sum, in ``dense_backward`` as in one process, which moves the
result by one rounding (and flushes subnormal parts, not a subnormal sum).

Bytes this rank sends per update of ``B`` samples (:attr:`TensorParallelTrainer.bytes_per_update`):

.. math::  S = \\frac{2 (R - 1)}{R} \\Big( s B \\big( n_L + 2 \\sum_{l\\ \\mathrm{row}, l < L-1} n_{l+1} \\big)
           + 8\\, [\\ell_2 > 0] \\Big)

with itemsize ``s``: forward an ``Allreduce`` of (B, n_{l+1}) per row-split layer ``l``, backward
one as wide per column-split layer above one, and a float64 for the L2 penalty.  An ``Allreduce``
of N bytes counts as a bandwidth-optimal one (ring, Rabenseifner) sends: ``2 (R - 1) / R * N``,
N on 2 ranks (MPICH's recursive doubling, for small messages on more ranks, sends ``log2(R) N``).
The lab's [784, 40, 30, 10] at B = 10 on 2 ranks sends 7,200 bytes; data parallelism sends its 263,520 bytes twice.

NOTE [ Tensor x data ]
With ``data_parallel=D`` the ``D x T`` ranks hold ``D`` replicas of the net split ``T`` ways: world rank
``r`` is shard ``r % T`` of replica ``r // T`` (the numbering of pipeline replicas,
:mod:`fastckpt.parallel.pipeline.replicas`).  The shards of a replica split the layers over their own
communicator; replica ``d`` takes rows ``[B d / D, B (d + 1) / D)`` of every minibatch, scales its gradients
by ``1 / B`` and adds the L2 term on replica 0 only; then each shard sums its gradient over its replicas
(one ``Allreduce`` on the same shard of every replica) and steps.  The loss is the replicas' row-weighted
sum, one more ``Allreduce`` of a float64, so it is the same on every rank.

NOTE [ Errors on every rank ]
As in NOTE [ No rank waits forever ] (:mod:`fastckpt.parallel.mpi`), an error is shared (raised
on every rank at one point) or this rank's alone, which ends the job.
Shared: the constructor's arguments, checked on each rank and then compared, with the
``np.random`` state (the draw needs one seed everywhere); the update's ``x``'s and ``y``'s shapes
and ``eta``, compared across ranks first, then checked on each; a non-finite loss
(FloatingPointError, weights unchanged), as output and penalty are complete everywhere.
Alone: anything else, such as an update refused because this rank's slice would become NaN or
inf (sharing it would cost an ``Allreduce`` per update).
"""
from contextlib import nullcontext

import numpy as np

from fastckpt.core.activations import check_activation, state_codes
from fastckpt.core.checks import (
    as_batch,
    as_labels,
    check_dtype,
    check_eta,
    check_finite,
    check_l2,
    check_sizes,
)
from fastckpt.core.init import check_init, draw
from fastckpt.core.losses import check_loss
from fastckpt.core.optimizers import OptimizerState, parse_optimizer
from fastckpt.engine.batches import Staging
from fastckpt.engine.inference import count_correct
from fastckpt.kernels import (
    sgd_step,
)
from fastckpt.planner.strategies import Fit

from .grid import grid_args
from .mpi import Group, lab_loop, random_state
from .pipeline.replicas import Replicas, check_replicas, place
from .rank_trainer import RankTrainer
from .shards import Shard, split_layers
from .tensor_bytes import TensorBytes
from .tensor_layers import TensorLayers, check_tensor_strategy, kept_states

MODE = "tensor parallel (--tensor-parallel)"


class TensorParallelTrainer(TensorLayers, TensorBytes, RankTrainer):
    """An MLP whose layers are split across the ranks of ``comm``, trained by its optimizer (the lab's SGD).

    Made on every rank after the same ``np.random.seed``, it starts from the weights
    ``fastckpt.Network(sizes, init=init)`` draws after that seed; each rank keeps only its slices,
    and the optimizer's state of those slices.

    Parameters
    ----------
    sizes : sequence of int
        Units per layer, input first.  Every split width needs at least one unit per rank.
    dtype : {numpy.float64, numpy.float32}, optional
        Precision of parameters and activations.
    loss : {"quadratic", "cross_entropy"}, optional
        Sigmoid output and ``0.5 * ||a - y||^2``, or softmax output and cross-entropy.
    l2 : float or sequence of float, optional
        L2 penalty ``0.5 * l2 * ||W||^2``, one number or one per layer; biases carry none.
    comm : mpi4py communicator, optional
        ``MPI.COMM_WORLD`` by default.
    activation, init, optimizer
        As for :class:`~fastckpt.nets.network.Network`.
    data_parallel : int, optional
        ``D`` replicas of the split net on ``D x T`` ranks (NOTE [ Tensor x data ]); ``rank`` and ``ranks``
        are then this rank's shard and the shards of one replica.
    strategy : str or Strategy, optional
        ``"plain"`` (default), ``"every_nth(n)"``, ``"segments(k)"`` or ``"sqrt"``: the states each rank
        keeps after the forward pass, the others computed again during the backward pass (NOTE
        [ Checkpoints in tensor parallelism ]); the weights are plain tensor parallelism's, bit for bit.
        ``"fit(bytes)"``: of those, the least recomputation whose :meth:`predicted_bytes` fits on every
        rank, chosen per batch size (:meth:`step_strategy`); InfeasiblePlan on every rank at the first
        update when none fits.
    grid : Grid, optional
        ``Grid(data=D, tensor=T)`` (:class:`~fastckpt.parallel.grid.Grid`), instead of ``comm`` and
        ``data_parallel``.
    """

    def __init__(self, sizes, *, dtype=np.float64, loss="quadratic", l2=0.0, comm=None, activation="sigmoid",
                 init="lab", optimizer="sgd", data_parallel=1, strategy="plain", grid=None):
        comm, data_parallel, wrong = grid_args(grid, "tensor", comm, data_parallel)
        self.group = Group(comm)
        self.MPI = self.group.MPI
        self.group.agree(wrong or self._checked(sizes, dtype, loss, l2, (activation, init, optimizer, data_parallel,
                                                                         strategy)), "TensorParallelTrainer arguments")
        self.replicas = Replicas(self.group, self.data_parallel)       # NOTE [ Tensor x data ]
        self.comm = self.replicas.pipe.comm                             # this replica's shards
        with self.group.errors():                             # NOTE [ Errors on every rank ]
            self.blas_threads = self.group.share_cores()
            self._init_params()
        self._scratch = np.empty(max(self.sizes[1:]), dtype=np.float64)
        self._penalty_sum, self._loss_sum = np.zeros(1, dtype=np.float64), np.zeros(1, dtype=np.float64)
        self._no_delta = np.empty((0, 1), dtype=self.dtype)  # layer 0 has no delta below it
        self._cap = self._batch_size = 0                     # buffers' batch size; last update's
        self._staging = Staging(0, self.dtype)
        self.last_loss = None
        self.accuracies = []

    def _checked(self, sizes, dtype, loss, l2, net):
        """The arguments checked on this rank: the settings every rank must share, or the error."""
        activation, init, optimizer, data_parallel, strategy = net
        try:
            self.data_parallel = check_replicas(data_parallel, self.group.size)
            _, self.rank, self.ranks = place(self.group.rank, self.group.size, self.data_parallel)
            self.sizes, self.dtype = list(check_sizes(sizes)), check_dtype(dtype)
            self.loss, self.l2 = check_loss(loss), check_l2(l2, len(self.sizes) - 1)
            self.activation = check_activation(activation, len(self.sizes) - 1)
            self.init, self.optimizer = check_init(init), parse_optimizer(optimizer)
            self.row_split, self._slices = split_layers(self.sizes, self.ranks, self.rank)
            self.strategy = check_tensor_strategy(strategy)
            self._kept, self._runs = kept_states(self.sizes, "plain" if isinstance(self.strategy, Fit) else
                                                 self.strategy)         # fit(bytes): chosen per batch size
        except (ValueError, TypeError) as exc:
            return exc
        self._acts = state_codes(self.activation, self.loss)
        self._widths = [0] + [r1 - r0 for (r0, r1), _ in self._slices]      # this rank's width of a[1..L]
        return {"mode": MODE, "sizes": self.sizes, "dtype": self.dtype.name, "loss": loss, "l2": list(self.l2),
                "activation": list(self.activation), "init": self.init, "optimizer": self.optimizer,
                "data_parallel": self.data_parallel, "strategy": str(self.strategy),
                "np.random state (seed every rank alike)": random_state()}

    def _init_params(self):
        """This rank's slices (:class:`~fastckpt.parallel.shards.Shard`), drawn as ``Network(sizes, init=...)``
        draws the whole net, their gradients and the optimizer's state beside them."""
        self.shard = Shard(self._slices, self.dtype)
        self._flat, self._grad = self.shard.flat, self.shard.new_buffer()
        self._blocks = self.shard.blocks
        (self._w, self._b), (self._gw, self._gb) = self.shard.views(self._flat), self.shard.views(self._grad)
        pieces = {"weights": [(w, rows, cols) for w, (rows, cols) in zip(self._w, self._slices)],
                  "biases": [(b.reshape(1, -1), (0, 1), rows) for b, (rows, _) in zip(self._b, self._slices)]}
        draw(self.init, self.sizes, lambda kind, layer: pieces[kind][layer])
        self.optimizer_state = OptimizerState(self.optimizer, self.shard)

    def update_mini_batch(self, x, y, eta):
        """One SGD step on the batch-mean gradient; returns the mean loss, the same on every rank.

        Every rank passes the same whole minibatch, x (batch, sizes[0]) and y (batch, sizes[-1]),
        and the same ``eta`` (NOTE [ Errors on every rank ]).
        """
        with self.group.errors() as errors:
            errors.shared = (ValueError, TypeError)           # agreed: raised on every rank alike
            x, y, eta = self.group.minibatch(self._minibatch, x, y, eta)
            batch = x.shape[0]
            r0, r1 = self.replicas.rows(batch)
            self._buffers(self.replicas.largest(batch))
            errors.shared = ()
            a0, loss = self._forward(x[r0:r1], y[r0:r1], batch)
            if not np.isfinite(loss):
                errors.shared = FloatingPointError            # output and penalty are the same on every rank
                raise FloatingPointError(f"the loss is {loss} (non-finite); weights left unchanged")
            self._backward(a0, r1 - r0, batch)
            self.replicas.sum(self._grad, self.MPI)          # each shard over its replicas
            if self.optimizer.slots:                          # the state of this rank's slices beside them
                self.optimizer_state.apply(self.shard, self._grad, eta)
            elif not sgd_step(self._flat, self._grad, eta, self._blocks):
                raise FloatingPointError(f"the update would make rank {self.rank}'s parameters NaN or inf")
        self._batch_size, self.last_loss = batch, loss
        return loss

    def _minibatch(self, x, y, eta):
        x, y = self._staging.minibatch(x, y, self.sizes[0], self.sizes[-1], grow=True)
        if x.shape[0] < self.data_parallel:
            raise ValueError(f"x has {x.shape[0]} samples, fewer than data_parallel={self.data_parallel}: each "
                             "replica needs at least one row of every minibatch")
        for arr, name in ((x, "x"), (y, "y")):
            check_finite(arr, name)
        return x, y, check_eta(eta)

    def evaluate(self, x_test_data, y_test_data):
        """Fraction of samples whose arg-max output matches the label; every rank passes the same data."""
        x = as_batch(x_test_data, self.sizes[0], "x_test_data", "input")
        labels = as_labels(y_test_data, self.sizes[-1], x.shape[0], ("x_test_data", "y_test_data"))
        chunk = self._cap or min(1024, max(1, x.shape[0]))  # the training buffers, not a set of their own
        self._buffers(chunk)
        zeros = np.zeros((chunk, self.sizes[-1]), dtype=self.dtype)

        def predict(rows):
            self._forward(rows, zeros[:rows.shape[0]])
            return self._a[-1][:rows.shape[0]]
        hits, error = count_correct(x, labels, self.dtype, predict, chunk=chunk)
        if error is not None:                   # every rank holds the same output: raised on every rank alike
            raise error
        return hits / x.shape[0]

    def SGD(self, training_data, epochs, mini_batch_size, eta, test_data=None, *, verbose=True, **hooks):
        """The lab's loop (:func:`~fastckpt.parallel.mpi.lab_loop`, with its hooks); returns (memusage, updatetime)."""
        return lab_loop(self, training_data, epochs, mini_batch_size, eta, test_data, verbose, nullcontext(),
                        **hooks)

    def _take(self, buf, weights, biases):
        """Set this rank's slices of ``buf`` (default: the parameters) from the whole net's lab-shaped arrays."""
        ws, bs = self.shard.views(self._flat if buf is None else buf)
        for layer, (w, b, ((r0, r1), (c0, c1))) in enumerate(zip(ws, bs, self._slices)):
            w[...], b[...] = weights[layer][r0:r1, c0:c1], np.asarray(biases[layer]).reshape(-1)[r0:r1]

    def gather(self, buf=None):
        """``(weights, biases)`` of the whole net on every rank, in the lab's shapes: weights[i]
        (sizes[i+1], sizes[i]), biases[i] (sizes[i+1], 1); of ``buf`` in the parameters' layout (an
        optimizer state buffer) when given.  A collective: every rank calls it."""
        ws, bs = self.shard.views(self._flat if buf is None else buf)
        pieces = [(layer, rows, cols, w, b if not row or self.rank == 0 else None)
                  for layer, (w, b, (rows, cols), row) in enumerate(zip(ws, bs, self._slices, self.row_split))]
        with self.group.errors():
            return self.group.gather_net(self.sizes, pieces)
