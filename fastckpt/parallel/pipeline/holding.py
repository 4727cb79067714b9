"""What a :class:`~fastckpt.parallel.pipeline.PipelineTrainer` rank holds of the whole net: its stage's layers,
or its shard's slices of them (NOTE [ Tensor-parallel stages ]), drawn, taken, gathered and evaluated."""
import numpy as np

from fastckpt.core.checks import as_batch, as_labels
from fastckpt.core.init import draw, whole
from fastckpt.core.layout import layer_views
from fastckpt.core.params import Parameters
from fastckpt.engine.inference import count_correct, forward

from ..shards import Shard
from .tensor_layout import TensorLayout, tensor_infer


class StageHolding:
    """The parameters of this rank's stage (``lo .. hi - 1``) as one process's layers, or a shard's slices."""

    def _hold(self):
        """Make the parameters and draw them as ``Network(sizes, init=...)`` draws the whole net."""
        if self.shards == 1:
            self.layout = None
            self.params = Parameters(self.stage_sizes, self.dtype)
            weights, biases = self.params.layers()
            blocks = {"weights": [whole(w) for w in weights], "biases": [whole(b.reshape(1, -1)) for b in biases]}
        else:
            self.layout = TensorLayout(self.stage_sizes, "plain", self.shards, self.replicas.shard, self.last)  # slices
            self.params = Shard(self.layout.slices, self.dtype)
            weights, biases = self.params.layers()
            blocks = {"weights": [(w, rows, cols) for w, (rows, cols) in zip(weights, self.layout.slices)],
                      "biases": [(b.reshape(1, -1), (0, 1), rows) for b, (rows, _) in zip(biases, self.layout.slices)]}
        draw(self.init, self.sizes, lambda kind, layer: blocks[kind][layer - self.lo]
             if self.lo <= layer < self.hi else None)

    def _pieces(self, buf):
        """This rank's ``(layer, rows, cols, w, b)`` of ``buf`` (default: the parameters), as
        :meth:`~fastckpt.parallel.mpi.Group.gather_net` takes them; a row-split bias from shard 0 alone."""
        flat = self.params.flat if buf is None else buf
        if self.layout is None:
            weights, biases = layer_views(flat, self.stage_sizes)
            return [(self.lo + i, (0, w.shape[0]), (0, w.shape[1]), w.copy(), b.copy())
                    for i, (w, b) in enumerate(zip(weights, biases))]
        weights, biases = self.params.views(flat)
        return [(self.lo + i, rows, cols, w.copy(), b.copy() if not row or self.replicas.shard == 0 else None)
                for i, (w, b, (rows, cols), row) in enumerate(zip(weights, biases, self.layout.slices,
                                                                  self.layout.row_split))]

    def _take(self, buf, weights, biases):
        """Set this rank's part of ``buf`` (default: the parameters) from the whole net's lab-shaped arrays."""
        with self.params.lock:
            flat = self.params.flat if buf is None else buf
            if self.layout is None:
                ws, bs = layer_views(flat, self.stage_sizes)
                slices = [((0, w.shape[0]), (0, w.shape[1])) for w in ws]
            else:
                (ws, bs), slices = self.params.views(flat), self.layout.slices
            for i, (w, b, ((r0, r1), (c0, c1))) in enumerate(zip(ws, bs, slices)):
                w[...] = weights[self.lo + i][r0:r1, c0:c1]
                b[...] = np.asarray(biases[self.lo + i]).reshape(-1)[r0:r1]

    def gather(self, buf=None):
        """The whole net's ``(weights, biases)`` in the lab's shapes, on every rank (a collective); of ``buf``
        in this rank's parameter layout (an optimizer state buffer) when given."""
        with self.params.lock:
            pieces = self._pieces(buf)
        return self.group.gather_net(self.sizes, pieces)

    def _infer(self, a):
        """The stage's output of ``a`` for evaluation."""
        if self.layout is None:
            return forward(self.params, self.stage_acts, a, 0, len(self.stage_sizes) - 1)[-1]
        return tensor_infer(self.layout, self.params, self.params.flat, self.stage_acts, self.replicas.tensor,
                            self.MPI, a)

    def evaluate(self, x_test_data, y_test_data):
        """Fraction of samples whose arg-max output matches the label, on every rank (same data on each; each
        replica's stages run it)."""
        x = as_batch(x_test_data, self.sizes[0], "x_test_data", "input")
        labels = as_labels(y_test_data, self.sizes[-1], x.shape[0], ("x_test_data", "y_test_data"))

        def predict(rows):
            a = rows
            if not self.first:
                a = np.empty((rows.shape[0], self.stage_sizes[0]), dtype=self.dtype)
                self.pipe.comm.Recv(a, source=self.rank - 1, tag=3)
            out = self._infer(a)
            if self.last:
                return out
            self.pipe.comm.Send(np.ascontiguousarray(out), dest=self.rank + 1, tag=3)
            return None
        with self.params.lock:
            hits, error = count_correct(x, labels, self.dtype, predict)
        hits, error = self.pipe.comm.bcast((hits, None if error is None else str(error)), root=self.ranks - 1)
        if error is not None:                   # the last stage found it: raised on every rank together
            raise ValueError(error)
        return hits / x.shape[0]
