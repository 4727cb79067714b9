"""What a :class:`~fastckpt.parallel.tensor.TensorParallelTrainer` rank sends and holds: its bytes by part,
and ``fit(bytes)``'s choice of what to keep (:func:`~fastckpt.parallel.tensor_layers.fit_strategy`)."""
import numpy as np

from fastckpt.core.checks import check_positive_int
from fastckpt.planner.strategies import Fit

from .shards import shard_nbytes, split_layers
from .tensor_layers import fit_strategy, kept_states


def messages(sizes, row_split, runs, rows):
    """Elements of each Allreduce of an update of ``rows`` samples (forward, backward with its
    recomputation: NOTE [ Checkpoints in tensor parallelism ])."""
    n_layers = len(row_split)
    again = [j - 1 for run in runs[:-1] for j in run]                # layers computed a second time
    return ([rows * sizes[layer + 1] for layer in range(n_layers) if row_split[layer]]
            + [rows * sizes[layer + 1] for layer in again if row_split[layer]]
            + [rows * sizes[layer] for layer in range(1, n_layers) if not row_split[layer]])


def tensor_bytes(sizes, ranks, shard, strategy, rows, dtype, slots=0, replicated=False):
    """Shard ``shard`` of ``ranks``'s memory (bytes) by part for ``rows`` rows of each minibatch under
    ``strategy`` (see :meth:`TensorBytes.predicted_bytes`)."""
    item = np.dtype(dtype).itemsize
    row_split, slices = split_layers(sizes, ranks, shard)
    widths = [0] + [r1 - r0 for (r0, r1), _ in slices]
    _, runs = kept_states(sizes, strategy)
    dropped = {j for run in runs for j in run}
    shared = max([sum(widths[j] for j in run) for run in runs] + [0])
    kept = sum(w for j, w in enumerate(widths) if j and j not in dropped)
    elems = rows * (kept + shared + 2 * max(widths[1:]))
    if row_split[0]:
        elems += rows * (slices[0][1][1] - slices[0][1][0])
    params = shard_nbytes(slices, dtype)
    comm = max(messages(sizes, row_split, runs, rows)) * item if ranks > 1 else 0
    parts = {"parameters": params, "gradients": params, "optimizer_state": slots * params,
             "activations": elems * item + 8 * max(sizes[1:]),
             "comm buffers": max(comm, params if replicated else 0)}
    parts["total"] = sum(parts.values())
    return parts


class TensorBytes:
    """The tensor-parallel trainer's accounts: bytes sent per update and bytes held, as its module counts them."""

    @property
    def bytes_per_update(self):
        """Bytes this rank sends in an update at the last update's batch size (0 before the first):
        ``2 (R - 1) / R`` times each Allreduce's bytes, as the module docstring counts them; with ``D``
        replicas, on each replica's rows, plus ``2 (D - 1) / D`` times the gradient and the loss's float64."""
        if not self._batch_size:
            return 0
        rows = self.replicas.largest(self._batch_size)
        payload = sum(messages(self.sizes, self.row_split, self._runs, rows)) * self.dtype.itemsize
        payload += 8 if any(self.l2) else 0
        sent = payload * 2 * (self.ranks - 1) // self.ranks
        count = self.data_parallel
        return sent + (self._grad.nbytes + 8) * 2 * (count - 1) // count

    def predicted_bytes(self, batch_size=None):
        """This rank's memory (bytes) by part at ``batch_size`` (default: the last update's): its
        ``parameters`` and ``gradients``; ``activations``, for its replica's rows (the kept states and the
        run buffer of the others, layer 0's input slice, both delta buffers, the scratch; not the buffers
        staging inputs of another dtype or layout); ``comm buffers``, MPI's temporary for the largest
        Allreduce (the gradient's over the replicas too), estimated as its size; ``total``.  Under
        ``fit(bytes)``, for what it keeps at that batch size (:meth:`step_strategy`)."""
        batch = self._batch_size if batch_size is None else check_positive_int(batch_size, "batch_size")
        rows = self.replicas.largest(batch)
        return tensor_bytes(self.sizes, self.ranks, self.rank, self.step_strategy(rows), rows, self.dtype,
                            self.optimizer.slots, self.data_parallel > 1)

    def step_strategy(self, rows):
        """The strategy an update of ``rows`` rows per replica runs: the trainer's, or under ``fit(bytes)`` the
        one :func:`~fastckpt.parallel.tensor_layers.fit_strategy` chooses for the widest shard (shard 0: every
        shard then runs the same recomputation, and its messages)."""
        if not isinstance(self.strategy, Fit):
            return self.strategy
        return fit_strategy(self.sizes, self.strategy, lambda s: tensor_bytes(
            self.sizes, self.ranks, 0, s, rows, self.dtype, self.optimizer.slots, self.data_parallel > 1)["total"],
            f"{rows} rows a replica", top_free=True)
