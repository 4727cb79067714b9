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
