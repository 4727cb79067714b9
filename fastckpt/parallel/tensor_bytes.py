"""What a :class:`~fastckpt.parallel.tensor.TensorParallelTrainer` rank sends and holds: its bytes by part."""
from fastckpt.core.checks import check_positive_int


class TensorBytes:
    """The tensor-parallel trainer's accounts: bytes sent per update and bytes held, as its module counts them."""

    def _messages(self, batch):
        """Elements of each Allreduce of an update of ``batch`` samples (forward, backward with its
        recomputation: NOTE [ Checkpoints in tensor parallelism ])."""
        n_layers = len(self.row_split)
        again = [j - 1 for run in self._runs[:-1] for j in run]          # layers computed a second time
        return ([batch * self.sizes[layer + 1] for layer in range(n_layers) if self.row_split[layer]]
                + [batch * self.sizes[layer + 1] for layer in again if self.row_split[layer]]
                + [batch * self.sizes[layer] for layer in range(1, n_layers) if not self.row_split[layer]])

    @property
    def bytes_per_update(self):
        """Bytes this rank sends in an update at the last update's batch size (0 before the first):
        ``2 (R - 1) / R`` times each Allreduce's bytes, as the module docstring counts them; with ``D``
        replicas, on each replica's rows, plus ``2 (D - 1) / D`` times the gradient and the loss's float64."""
        if not self._batch_size:
            return 0
        payload = sum(self._messages(self.replicas.largest(self._batch_size))) * self.dtype.itemsize
        payload += 8 if any(self.l2) else 0
        sent = payload * 2 * (self.ranks - 1) // self.ranks
        count = self.data_parallel
        return sent + (self._grad.nbytes + 8) * 2 * (count - 1) // count

    def predicted_bytes(self, batch_size=None):
        """This rank's memory (bytes) by part at ``batch_size`` (default: the last update's): its
        ``parameters`` and ``gradients``; ``activations``, for its replica's rows (the kept states and the
        run buffer of the others, layer 0's input slice, both delta buffers, the scratch; not the buffers
        staging inputs of another dtype or layout); ``comm buffers``, MPI's temporary for the largest
        Allreduce (the gradient's over the replicas too), estimated as its size; ``total``."""
        batch = self._batch_size if batch_size is None else check_positive_int(batch_size, "batch_size")
        rows, item = self.replicas.largest(batch), self.dtype.itemsize
        dropped = {j for run in self._runs for j in run}
        shared = max([sum(self._widths[j] for j in run) for run in self._runs] + [0])
        kept = sum(w for j, w in enumerate(self._widths) if j and j not in dropped)
        elems = rows * (kept + shared + 2 * max(self._widths[1:]))
        if self.row_split[0]:
            elems += rows * self._w[0].shape[1]
        comm = max(self._messages(rows)) * item if self.ranks > 1 else 0
        parts = {"parameters": self._flat.nbytes, "gradients": self._grad.nbytes,
                 "optimizer_state": self.optimizer.slots * self._flat.nbytes,
                 "activations": elems * item + self._scratch.nbytes,
                 "comm buffers": max(comm, self._grad.nbytes if self.data_parallel > 1 else 0)}
        parts["total"] = sum(parts.values())
        return parts
