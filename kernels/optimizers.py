"""Optimizer steps with state, in place on flat buffers in the parameter layout: momentum and Adam.

Each step reads and writes only the index ranges ``blocks`` (k, 2) (the gaps are alignment
padding), computes in float64 and stores in the buffers' dtype.  A step that would make a
parameter or a state value NaN or inf in that dtype changes nothing and returns False (a first
pass computes and checks, a second writes: both compute the same numbers).  The formulas are
PyTorch's (``torch.optim.SGD`` with momentum and no dampening, ``torch.optim.Adam``,
``torch.optim.AdamW``); :mod:`fastckpt.core.optimizers` documents them.
"""
import math

import numpy as np

from ._jit import inline, kernel
from .elementwise import stored


@inline
def _bad(v, like):
    """1 when ``v`` is NaN or inf once stored in the dtype of ``like``, else 0."""
    s = stored(v, like)
    return np.int64((s - s) != 0.0)


@inline
def _momentum(p, g, b, eta, mu, nesterov):
    """(new parameter, new velocity) of one element."""
    gi = np.float64(g)
    bi = mu * np.float64(b) + gi                       # b_1 = g_1: the buffer starts at 0
    d = gi + mu * bi if nesterov else bi
    return np.float64(p) - eta * d, bi


@kernel
def momentum_step(p, g, buf, eta, mu, nesterov, blocks):
    """SGD with momentum ``mu`` (Nesterov's if ``nesterov``), in place on ``p`` and the velocity ``buf``.

    .. math::  b_t = \\mu b_{t-1} + g_t, \\quad p_t = p_{t-1} - \\eta (g_t + \\mu b_t \\text{ (Nesterov) or } b_t)

    Returns True when applied, False (nothing changed) when a result would be NaN or inf.
    """
    bad = 0
    for k in range(blocks.shape[0]):
        lo, hi = blocks[k, 0], blocks[k, 1]
        pk, gk, bk = p[lo:hi], g[lo:hi], buf[lo:hi]
        for i in range(pk.shape[0]):
            new_p, new_b = _momentum(pk[i], gk[i], bk[i], eta, mu, nesterov)
            bad |= _bad(new_p, p) | _bad(new_b, buf)
    if bad != 0:
        return False
    for k in range(blocks.shape[0]):
        lo, hi = blocks[k, 0], blocks[k, 1]
        pk, gk, bk = p[lo:hi], g[lo:hi], buf[lo:hi]
        for i in range(pk.shape[0]):
            new_p, new_b = _momentum(pk[i], gk[i], bk[i], eta, mu, nesterov)
            pk[i] = new_p
            bk[i] = new_b
    return True


@inline
def _adam(p, g, m, v, eta, beta1, beta2, eps, coupled, decoupled, correction1, correction2):
    """(new parameter, new m, new v) of one element."""
    pi = np.float64(p)
    gi = np.float64(g) + coupled * pi
    mi = beta1 * np.float64(m) + (1.0 - beta1) * gi
    vi = beta2 * np.float64(v) + (1.0 - beta2) * gi * gi
    pi = pi - eta * decoupled * pi
    return pi - eta * (mi / correction1) / (math.sqrt(vi / correction2) + eps), mi, vi


@kernel
def adam_step(p, g, m, v, eta, beta1, beta2, eps, weight_decay, decoupled, correction1, correction2, blocks):
    """Adam (``decoupled`` False) or AdamW (True) in place on ``p``, ``m`` and ``v``; at step ``t`` (from 1)
    the bias corrections are ``correction1 = 1 - beta1**t`` and ``correction2 = 1 - beta2**t``.

    .. math::

        g_t \\leftarrow g_t + \\lambda p_{t-1} \\text{ (Adam)}, \\quad
        p_{t-1} \\leftarrow p_{t-1} - \\eta \\lambda p_{t-1} \\text{ (AdamW)},

        m_t = \\beta_1 m_{t-1} + (1 - \\beta_1) g_t, \\quad v_t = \\beta_2 v_{t-1} + (1 - \\beta_2) g_t^2,

        p_t = p_{t-1} - \\eta \\, \\frac{m_t / (1 - \\beta_1^t)}{\\sqrt{v_t / (1 - \\beta_2^t)} + \\epsilon}

    with ``lambda`` = ``weight_decay``.  Returns True when applied, False (nothing changed)
    when a result would be NaN or inf.
    """
    coupled = 0.0 if decoupled else weight_decay
    decay = weight_decay if decoupled else 0.0
    bad = 0
    for k in range(blocks.shape[0]):
        lo, hi = blocks[k, 0], blocks[k, 1]
        pk, gk, mk, vk = p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi]
        for i in range(pk.shape[0]):
            new_p, new_m, new_v = _adam(pk[i], gk[i], mk[i], vk[i], eta, beta1, beta2, eps, coupled, decay,
                                        correction1, correction2)
            bad |= _bad(new_p, p) | _bad(new_m, m) | _bad(new_v, v)
    if bad != 0:
        return False
    for k in range(blocks.shape[0]):
        lo, hi = blocks[k, 0], blocks[k, 1]
        pk, gk, mk, vk = p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi]
        for i in range(pk.shape[0]):
            new_p, new_m, new_v = _adam(pk[i], gk[i], mk[i], vk[i], eta, beta1, beta2, eps, coupled, decay,
                                        correction1, correction2)
            pk[i] = new_p
            mk[i] = new_m
            vk[i] = new_v
    return True
