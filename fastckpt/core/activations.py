"""The hidden layers' activations by name, and the codes the kernels take.

* ``"sigmoid"`` (the lab's): ``1 / (1 + e^{-z})``, derivative ``a (1 - a)``;
* ``"tanh"``: derivative ``1 - a^2``;
* ``"relu"``: ``max(z, 0)``, derivative ``[a > 0]`` (0 at 0, as PyTorch's);
* ``"identity"``: ``z``, derivative 1 (scikit-learn's ``activation="identity"``).

Each derivative is a function of the layer's output ``a``, so backprop needs only the stored
(or recomputed) output of every layer, whatever the activation: every checkpoint strategy,
the planner's byte counts and bit-identical recomputation hold as for the sigmoid.  The output
layer is not among these: the loss picks it, a sigmoid with the quadratic loss, a log-softmax with
cross-entropy, the identity with the squared error (:mod:`fastckpt.core.losses`).
"""
import numpy as np

from fastckpt.kernels import IDENTITY, LOG_SOFTMAX, RELU, SIGMOID, TANH

ACTIVATIONS = {"sigmoid": SIGMOID, "tanh": TANH, "relu": RELU, "identity": IDENTITY}
OUTPUTS = {"quadratic": SIGMOID, "cross_entropy": LOG_SOFTMAX, "squared_error": IDENTITY}   # the loss's output


def check_activation(activation, n_layers):
    """One activation name per hidden layer, as a tuple, from one name or a sequence of them.

    A net of ``n_layers`` layers has ``n_layers - 1`` hidden layers.
    """
    n_hidden = n_layers - 1
    if isinstance(activation, str):
        names = [activation] * n_hidden
    else:
        try:
            names = list(activation)
        except TypeError:
            raise TypeError(f"activation must be a name such as 'relu' or a list of names, one per hidden layer, "
                            f"got {activation!r}") from None
        if len(names) != n_hidden:
            raise ValueError(f"activation must be one name or a list of one per hidden layer ({n_hidden}), "
                             f"got {len(names)}: {activation!r}")
    for name in names:
        if not isinstance(name, str) or name not in ACTIVATIONS:
            raise ValueError(f"activation must be 'sigmoid', 'tanh', 'relu' or 'identity' (one name, or one per "
                             f"hidden layer), got {name!r}")
    return tuple(names)


def state_codes(activation, loss):
    """(L + 1,) int64: the code of the activation that makes each state ``a[j]``, as
    a run kernel (:mod:`fastckpt.kernels.runs`) takes it; ``a[0]``, the input, is given ``SIGMOID``.

    ``activation`` holds the L - 1 hidden layers' names; the output is ``LOG_SOFTMAX``
    with ``loss="cross_entropy"``, ``IDENTITY`` with ``"squared_error"``, else the sigmoid of the quadratic loss.
    """
    output = OUTPUTS[loss]
    return np.array([SIGMOID] + [ACTIVATIONS[name] for name in activation] + [output], dtype=np.int64)
