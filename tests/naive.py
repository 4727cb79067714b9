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
