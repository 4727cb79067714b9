"""The same training step in PyTorch (CPU): sigmoid layers, the lab's quadratic loss, SGD.

Optional: used only when torch is installed (``pip install torch==2.13.0`` on CPU).
"""
import numpy as np


def available():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


class TorchNet:
    """``Linear + Sigmoid`` per layer; ``segments`` > 0 trains with ``checkpoint_sequential``.

    ``keep_grads=False`` is PyTorch's default (``zero_grad`` frees the gradients, and
    backward allocates them again as it goes); ``True`` keeps them between steps.
    ``like``: a network whose weights and biases to start from (else PyTorch's own
    initialisation, whose small weights keep the deltas far from subnormal).
    """

    def __init__(self, sizes, dtype=np.float64, segments=0, threads=None, keep_grads=False, like=None):
        import torch
        if threads is not None:
            torch.set_num_threads(threads)
        self.torch = torch
        self.dtype = torch.float64 if np.dtype(dtype) == np.float64 else torch.float32
        layers = []
        for n_in, n_out in zip(sizes[:-1], sizes[1:]):
            layers += [torch.nn.Linear(n_in, n_out, dtype=self.dtype), torch.nn.Sigmoid()]
        self.model = torch.nn.Sequential(*layers)
        if like is not None:
            with torch.no_grad():
                for linear, w, b in zip(layers[0::2], like.weights, like.biases):
                    linear.weight.copy_(torch.from_numpy(np.asarray(w)))
                    linear.bias.copy_(torch.from_numpy(np.asarray(b).reshape(-1)))
        self.segments = segments
        self.keep_grads = keep_grads
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.0)

    def update_mini_batch(self, x, y, eta):
        torch = self.torch
        xb = torch.from_numpy(x).to(self.dtype)
        yb = torch.from_numpy(y).to(self.dtype)
        for group in self.opt.param_groups:
            group["lr"] = eta
        self.opt.zero_grad(set_to_none=not self.keep_grads)
        if self.segments:
            out = torch.utils.checkpoint.checkpoint_sequential(
                self.model, self.segments, xb, use_reentrant=False)
        else:
            out = self.model(xb)
        loss = 0.5 * ((out - yb) ** 2).sum() / xb.shape[0]
        loss.backward()
        self.opt.step()
        return float(loss.detach())
