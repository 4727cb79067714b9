"""The records a plan runs in: one buffer for the activations (with the gradients at the arena's
top), the deltas, one layer's gradient (for an optimizer with state applied in the backward
pass) and the stash slots of deferred weight gradients; the op table; the net's per-state facts;
and the run's settings (:mod:`kernels.runs`).

Allocated once per plan; a smaller batch uses the leading rows of the same
buffers.  :attr:`Workspace.table` is the plan's ops as the offsets of their
operands in :attr:`Workspace.work`, for a run kernel (:func:`fastckpt.kernels.runner`), and
:attr:`Workspace.runs` cuts it into one run per segment.
"""
import numpy as np

from fastckpt.core.layout import param_layout
from fastckpt.kernels import N_INTS, Table, float_record_elems
from fastckpt.planner.costs import delta_elems

from .batches import Staging


class Workspace:
    """Buffers sized from a plan, and per-batch-size views of them for each op.

    A pipeline stage (:mod:`fastckpt.parallel.pipeline.stage`) runs a plan of its own layers
    with two changes: with ``input_delta`` the first layer's backward also
    gives the delta of its input ``a[0]`` (for the stage before), and with
    ``given_delta`` there is no loss op: the delta of the last state ``a[L]``
    is written into :meth:`delta` before the backward pass (it comes from the
    stage after).  ``stash_slots`` slots hold the inputs and deltas of layers whose weight
    gradients are put off (``zb1``).

    A tensor shard's plan (``plan.row_split``) runs each row-split layer's forward op as
    :data:`~fastckpt.kernels.Table` ``LINEAR`` then ``ACTIVATE``; :attr:`sums` names the rows after which
    a buffer is summed over the shards (NOTE [ One engine for every part ] in :mod:`.engine`).
    """

    def __init__(self, plan, acts, *, input_delta=False, given_delta=False, stash_slots=0):
        self.plan = plan
        self.input_delta, self.given_delta = bool(input_delta), bool(given_delta)
        sizes, batch = plan.sizes, plan.batch_size
        stateful = plan.optimizer_in_backward and plan.optimizer.slots
        self.stash_elems = stash_elems(sizes, batch) if stash_slots else 0
        parts = [plan.arena_elems, workspace_delta_elems(sizes, batch, self.input_delta),
                 plan.bytes()["gradients"] // plan.itemsize if stateful else 0, stash_slots * self.stash_elems]
        starts = np.cumsum([0] + parts)
        self.work = np.empty(int(starts[-1]), dtype=plan.dtype)
        self.activations = self.work[:starts[1]]                    # and the gradients at its top
        self.deltas = self.work[starts[1]:starts[2]]
        self.layer_grad_at, self.stash_at = int(starts[2]), int(starts[3])
        self.floats = np.zeros(float_record_elems(plan.n_layers, max(sizes[1:])))
        self.scratch = self.floats[-max(sizes[1:]):]
        self.ints = np.zeros(N_INTS, dtype=np.int64)
        self.net = net_table(sizes, plan.itemsize, acts, stash=bool(stash_slots), batch=batch)
        self._odd_rows = max(sizes[1::2]) * batch          # deltas of a[1], a[3], ... first
        self.staging = Staging(batch, plan.dtype)           # minibatches of another dtype or layout
        self._gradients = self.activations[plan.grad_offset:]
        self.sums = {}                   # table row -> (offset in work, width): summed over the shards after it
        self.table = self._table()
        self.runs = self._runs()
        # the first row after the forward pass: the loss's, or where it would be with ``given_delta`` (a
        # recomputation may follow it at once)
        self.forward_end = self.op_rows[plan.ops.index(("loss", plan.n_layers))]

    def gradients(self):
        """The flat gradients at the arena's top, in the parameters' layout."""
        return self._gradients

    def delta(self, index, rows):
        """The (rows, sizes[index]) delta of state ``a[index]`` in ``deltas``."""
        at, width = self._delta_at(index), self.plan.sizes[index]
        if at < 0:
            raise ValueError(f"a[{index}] has no delta in this workspace")
        return self.deltas[at:at + rows * width].reshape(rows, width)

    def slot_at(self, slot):
        """Offset in :attr:`work` of stash slot ``slot``."""
        return self.stash_at + slot * self.stash_elems

    def weights_table(self):
        """One ``WEIGHTS`` op per layer: the weight gradients from a stash slot."""
        return np.array([(Table.WEIGHTS, layer, 0, 0, 0, 0, 0) for layer in range(self.plan.n_layers)],
                        dtype=np.int64).reshape(-1, 7)

    def output(self, rows):
        """The (rows, sizes[L]) output of the forward pass, in the arena."""
        at, width = self.table[self.forward_end - 1, Table.WRITE], self.plan.sizes[-1]
        return self.activations[at:at + rows * width].reshape(rows, width)

    def _delta_at(self, index):
        """Offset of a[index]'s delta in ``deltas`` (-1 for the input, unless ``input_delta``)."""
        if index == 0 and not self.input_delta:
            return -1
        return 0 if index % 2 == 1 else self._odd_rows

    def _table(self):
        """(n_ops, 7) int64 rows ``kind, layer, read, write, d_out, d_in, ran`` (-1: x, or none); offsets
        into :attr:`work`.  Fills :attr:`sums` and :attr:`op_rows` (each plan op's first row).  Written into
        the array row by row: a list of rows beside it held some 100 bytes an op more (2 MB at 20,000 ops)."""
        base, split, sizes = self.plan.arena_elems, self.plan.row_split, self.plan.sizes
        table = np.empty((sum(self._rows_of(kind, layer) for kind, layer in self.plan.ops), 7), dtype=np.int64)
        self.op_rows, row = [], 0

        def delta(index):
            at = self._delta_at(index)
            return at if at < 0 else base + at
        for (kind, layer), read, write in zip(self.plan.ops, self.plan.reads, self.plan.writes):
            self.op_rows.append(row)
            read = -1 if read is None else read
            if kind == "fwd" and split and split[layer]:          # partial products, summed, then f(. + b)
                self.sums[row] = (write, sizes[layer + 1])
                table[row] = (Table.LINEAR, layer, read, write, -1, -1, 0)
                table[row + 1] = (Table.ACTIVATE, layer, read, write, -1, -1, 0)
            elif kind == "fwd":
                table[row] = (Table.FWD, layer, read, write, -1, -1, 0)
            elif kind == "loss":
                if not self.given_delta:
                    table[row] = (Table.LOSS, layer, read, -1, delta(layer), -1, 0)
            else:
                if split and not split[layer] and delta(layer) >= 0:     # the input delta's parts, summed
                    self.sums[row] = (delta(layer), sizes[layer])
                table[row] = (Table.BWD, layer, read, -1, delta(layer + 1), delta(layer), 0)
            row += self._rows_of(kind, layer)
        return table

    def _rows_of(self, kind, layer):
        """The table rows of one plan op: two for a row-split forward, none for the loss when it is given."""
        if kind == "fwd":
            return 2 if self.plan.row_split and self.plan.row_split[layer] else 1
        return 0 if kind == "loss" and self.given_delta else 1

    def _runs(self):
        """[lo, hi) op ranges: a new run at every forward op that follows a backward one, so a
        plain plan is one run and a checkpointed one a run per recomputed segment."""
        kinds = self.table[:, 0]
        starts = [0] + [i for i in range(1, len(kinds)) if kinds[i] in (Table.FWD, Table.LINEAR)
                        and kinds[i - 1] == Table.BWD]
        return list(zip(starts, starts[1:] + [len(kinds)]))


def net_table(sizes, itemsize, acts, *, stash=False, batch=0):
    """The (L + 1, 7) int64 ``net`` record of :mod:`kernels.runs`: each state's size and activation code
    (``acts``), each layer's weight and bias offsets in the parameter layout and, with ``stash``, where its
    input and delta go in a stash slot of ``batch`` rows."""
    net = np.zeros((len(sizes), 7), dtype=np.int64)
    net[:, 0] = sizes
    net[:, 1] = acts
    net[:-1, 2:4] = param_layout(sizes, itemsize)[0]
    net[-1, 2:4] = -1
    if stash:
        net[:-1, 4:6] = stash_layout(sizes, batch)
    return net


def stash_layout(sizes, rows):
    """Where each layer's input and delta go in a ``zb1`` stash slot: (L, 2) int64 element offsets for
    micro-batches of up to ``rows`` rows."""
    at, pos = np.zeros((len(sizes) - 1, 2), dtype=np.int64), 0
    for layer in range(len(sizes) - 1):
        at[layer] = pos, pos + rows * sizes[layer]
        pos += rows * (sizes[layer] + sizes[layer + 1])
    return at


def stash_elems(sizes, rows):
    """Elements of one stash slot: every layer's input and delta for ``rows`` rows."""
    return rows * (sum(sizes[:-1]) + sum(sizes[1:]))


def workspace_delta_elems(sizes, batch_size, input_delta=False):
    """Elements of the two ping-pong delta buffers; with ``input_delta`` the even one holds a[0]'s too."""
    if not input_delta:
        return delta_elems(sizes, batch_size)
    return batch_size * (max(sizes[1::2]) + max(sizes[0::2]))
