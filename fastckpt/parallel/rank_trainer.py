"""What every trainer over MPI shares (:class:`RankTrainer`): no pickling, and for the model-parallel
ones, their parts of a whole net and of its optimizer's state, gathered or taken."""
import hashlib

import numpy as np


def digest(buffers):
    """The first 16 hex digits of the SHA-256 of the buffers' bytes, in order."""
    found = hashlib.sha256()
    for buf in buffers:
        found.update(buf)
    return found.hexdigest()[:16]


class RankTrainer:
    """What every trainer over MPI shares: it holds communicators, which no pickle can carry; a model-parallel
    one gathers its parts of the net (``gather(buf)``) and of the optimizer's state, and takes them from a
    whole net (``_take(buf, weights, biases)``, for :meth:`load_net`)."""

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
                raise ValueError(f"load_net: the net differs from this {type(self).__name__}: {'; '.join(differ)}")
            sent = {"the net given to load_net": f"{net.optimizer_state.steps} steps, sha256 " + digest(
                [np.ascontiguousarray(a) for a in net.weights + net.biases + net.optimizer_state.buffers])}
        except (TypeError, ValueError) as exc:
            sent = exc
        self.group.agree(sent, "load_net")
        arrays = net.optimizer_state.arrays(net.sizes)
        self._take(None, net.weights, net.biases)
        for name, buf in zip(self.optimizer.state_names, self.optimizer_state.buffers):
            self._take(buf, *arrays[name])
        self.optimizer_state.steps = net.optimizer_state.steps

    def gather_state(self):
        """The optimizer's state of the whole net on every rank (a collective), as a saved file keeps it:
        ``{"steps": t, "arrays": {name: (weights, biases)}}`` in the lab's shapes."""
        state = self.optimizer_state
        return {"steps": state.steps, "arrays": {name: self.gather(buf) for name, buf in
                                                 zip(state.optimizer.state_names, state.buffers)}}

    def __reduce__(self):
        raise TypeError(f"a {type(self).__name__} holds MPI communicators and cannot be pickled or copied; "
                        "save the net instead (gather() gives its weights)")
