"""The same training step in JAX (CPU): sigmoid layers, the lab's quadratic loss, SGD, under ``jax.jit``.

Optional: used only when jax is installed (``pip install jax``, the CPU build).
"""
import functools

import numpy as np


def available():
    try:
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _jax():
    """jax and its jitted step, made once so that every net reuses the compiled executables."""
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)        # float64 arrays stay float64; float32 ones stay float32

    def forward(layers, a):
        for w, b in layers:
            a = jax.nn.sigmoid(a @ w.T + b)           # (batch, fan_out)
        return a

    def loss(params, x, y, spans):
        a = x
        for start, end, remat in spans:
            a = (jax.checkpoint(forward) if remat else forward)(params[start:end], a)
        return 0.5 * jnp.sum((a - y) ** 2) / x.shape[0]

    def step(params, x, y, eta, spans):
        value, grads = jax.value_and_grad(loss)(params, x, y, spans)
        return [(w - eta * gw, b - eta * gb) for (w, b), (gw, gb) in zip(params, grads)], value

    return jax, jax.jit(step, static_argnames="spans", donate_argnums=0)


def spans_of(n_layers, kept=None):
    """``(start, end, remat)`` per run of layers: one plain run, or a segment between kept inputs.

    ``kept``: the layers whose input the checkpointed net keeps (fastckpt's
    ``checkpoints_layer_idx``).  A run of two or more layers between kept inputs
    is recomputed (``jax.checkpoint``); a single layer is not, as in fastckpt's
    plan, where the last segment of ``segments(k)`` is kept layer by layer.
    """
    if kept is None:
        return ((0, n_layers, False),)
    bounds = sorted(set(kept) | {0, n_layers})
    return tuple((s, e, e - s > 1) for s, e in zip(bounds[:-1], bounds[1:]))


class JaxNet:
    """``sigmoid(a @ W.T + b)`` per layer, one jitted step (value_and_grad + SGD, donated parameters).

    ``kept``: train with ``jax.checkpoint`` around each segment between these
    layers' inputs (see :func:`spans_of`); None trains plainly.  ``like``: a
    network whose weights and biases to start from (else the lab's draw after
    the caller's seed, as fastckpt's).
    """

    def __init__(self, sizes, dtype=np.float64, kept=None, like=None):
        self.jax, self._step = _jax()
        self.dtype = np.dtype(dtype)
        if like is None:
            biases = [np.random.randn(n, 1) for n in sizes[1:]]
            weights = [np.random.randn(n_out, n_in) for n_in, n_out in zip(sizes[:-1], sizes[1:])]
        else:
            weights, biases = like.weights, like.biases
        self.spans = spans_of(len(sizes) - 1, kept)
        self.set_params(weights, biases)

    def set_params(self, weights, biases):
        """Copy lab-shaped ``weights[i]`` (n_out, n_in) and ``biases[i]`` (n_out, 1) in."""
        put = self.jax.device_put
        self.params = [(put(np.array(w, self.dtype)), put(np.array(b, self.dtype).reshape(-1)))
                       for w, b in zip(weights, biases)]

    @property
    def weights(self):
        return [np.asarray(w) for w, _ in self.params]

    @property
    def biases(self):
        return [np.asarray(b).reshape(-1, 1) for _, b in self.params]

    def update_mini_batch(self, x, y, eta):
        """One SGD step, waited for; returns the loss before it."""
        self.params, loss = self._step(self.params, x.astype(self.dtype, copy=False),
                                       y.astype(self.dtype, copy=False), eta, spans=self.spans)
        self.jax.block_until_ready(self.params)
        return float(loss)
