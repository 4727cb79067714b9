"""Slow, obvious NumPy twins of what fastckpt computes, written from the formulas."""
import numpy as np


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def forward(weights, biases, x):
    """All activations [x, a1, ..., aL] of a batch-major x (batch, n_in)."""
    acts = [x]
    for w, b in zip(weights, biases):
        acts.append(sigmoid(acts[-1] @ w.T + b.reshape(1, -1)))
    return acts


def loss(weights, biases, x, y):
    """Mean over the batch of 0.5 * ||a_L - y||^2 (the lab's quadratic cost)."""
    out = forward(weights, biases, x)[-1]
    return 0.5 * np.sum((out - y) ** 2) / x.shape[0]


def backprop(weights, biases, x, y):
    """Batch-mean gradients (nabla_b as (n_out, 1), nabla_w as (n_out, n_in)), like the lab."""
    return backward(weights, forward(weights, biases, x), y)


def backward(weights, acts, y):
    """The gradients of ``backprop`` from given activations [x, a1, ..., aL]."""
    x = acts[0]
    nabla_b, nabla_w = [None] * len(weights), [None] * len(weights)
    d = acts[-1] - y
    for layer in reversed(range(len(weights))):
        a = acts[layer + 1]
        dz = d * a * (1 - a)
        nabla_w[layer] = dz.T @ acts[layer] / x.shape[0]
        nabla_b[layer] = dz.mean(axis=0).reshape(-1, 1)
        d = dz @ weights[layer]
    return nabla_b, nabla_w


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def forward_softmax(weights, biases, x):
    """Activations of a sigmoid net whose output layer is a softmax."""
    acts = forward(weights[:-1], biases[:-1], x)
    acts.append(softmax(acts[-1] @ weights[-1].T + biases[-1].reshape(1, -1)))
    return acts


def cross_entropy_loss(weights, biases, x, y, l2):
    """Mean categorical cross-entropy plus sum of 0.5 * l2_l * ||W_l||^2, as in the seed."""
    p = forward_softmax(weights, biases, x)[-1]
    return -np.sum(y * np.log(p)) / x.shape[0] + sum(0.5 * c * np.sum(w ** 2) for c, w in zip(l2, weights))


def cross_entropy_backprop(weights, biases, x, y, l2):
    """Gradients of ``cross_entropy_loss``: the seed's backpropogate, for any depth."""
    acts = forward_softmax(weights, biases, x)
    nabla_b, nabla_w = [None] * len(weights), [None] * len(weights)
    dz = acts[-1] - y
    for layer in reversed(range(len(weights))):
        nabla_w[layer] = dz.T @ acts[layer] / x.shape[0] + l2[layer] * weights[layer]
        nabla_b[layer] = dz.mean(axis=0).reshape(-1, 1)
        if layer:
            a = acts[layer]
            dz = (dz @ weights[layer]) * a * (1 - a)
    return nabla_b, nabla_w


# -- any hidden activation, either loss: written from the formulas, f' from the output -------------
ACTIVATIONS = {
    "sigmoid": (sigmoid, lambda a: a * (1 - a)),
    "tanh": (np.tanh, lambda a: 1 - a ** 2),
    "relu": (lambda z: np.maximum(z, 0), lambda a: (a > 0).astype(a.dtype)),
    "identity": (lambda z: z, np.ones_like),
}
OUTPUTS = {"quadratic": sigmoid, "cross_entropy": softmax, "squared_error": lambda z: z}


def forward_net(weights, biases, x, hidden, loss="quadratic"):
    """Activations [x, a1, ..., aL]: ``hidden[l]`` names layer l's activation (l < L - 1); the
    output is a sigmoid (quadratic loss), a softmax (cross-entropy), as probabilities, or z itself
    (squared error)."""
    acts = [x]
    for layer, (w, b) in enumerate(zip(weights, biases)):
        z = acts[-1] @ w.T + b.reshape(1, -1)
        if layer < len(weights) - 1:
            acts.append(ACTIVATIONS[hidden[layer]][0](z))
        else:
            acts.append(OUTPUTS[loss](z))
    return acts


def loss_net(weights, biases, x, y, hidden, loss="quadratic", l2=None):
    """The mean loss of ``forward_net`` plus the L2 penalty."""
    out = forward_net(weights, biases, x, hidden, loss)[-1]
    value = -np.sum(y * np.log(out)) if loss == "cross_entropy" else 0.5 * np.sum((out - y) ** 2)
    l2 = l2 or [0.0] * len(weights)
    return value / x.shape[0] + sum(0.5 * c * np.sum(w ** 2) for c, w in zip(l2, weights))


def backprop_net(weights, biases, x, y, hidden, loss="quadratic", l2=None):
    """Batch-mean gradients of ``loss_net`` (nabla_b as (n_out, 1), nabla_w as (n_out, n_in))."""
    acts = forward_net(weights, biases, x, hidden, loss)
    l2 = l2 or [0.0] * len(weights)
    out = acts[-1]
    dz = (out - y) * out * (1 - out) if loss == "quadratic" else out - y
    nabla_b, nabla_w = [None] * len(weights), [None] * len(weights)
    for layer in reversed(range(len(weights))):
        nabla_w[layer] = dz.T @ acts[layer] / x.shape[0] + l2[layer] * weights[layer]
        nabla_b[layer] = dz.mean(axis=0).reshape(-1, 1)
        if layer:
            dz = (dz @ weights[layer]) * ACTIVATIONS[hidden[layer - 1]][1](acts[layer])
    return nabla_b, nabla_w


# -- optimizers: PyTorch's documented update formulas, one array at a time ------------------------
def momentum_update(p, g, b, lr, mu, nesterov):
    """torch.optim.SGD(momentum=mu, dampening=0): returns (p, b); b starts at 0, so b_1 = g_1."""
    b = mu * b + g
    return p - lr * (g + mu * b if nesterov else b), b


def adam_update(p, g, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False):
    """torch.optim.Adam (or AdamW when ``decoupled``) at step t >= 1: returns (p, m, v)."""
    beta1, beta2 = betas
    if decoupled:
        p = p - lr * weight_decay * p
    else:
        g = g + weight_decay * p
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g ** 2
    m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v
