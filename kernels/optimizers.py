"""Optimizer steps with state, in place on flat buffers in the parameter layout: momentum and Adam.

Each step reads and writes only the index ranges ``blocks`` (k, 2) (the gaps are alignment
padding), computes in float64 and stores in the buffers' dtype.  A step that would make a
parameter or a state value NaN or inf in that dtype, or whose Adam denominator overflows
float64 (the update would silently be 0), changes nothing and returns False (a first pass
checks, a second writes).  The formulas are PyTorch's (``torch.optim.SGD`` with momentum
and no dampening, ``torch.optim.Adam``, ``torch.optim.AdamW``); :mod:`fastckpt.core.optimizers`
documents them.

NOTE [ The check before an update ]
The check pass must not let through a step that would write NaN or inf, and must
not refuse one that would not.  Computing the whole step twice does both, but
Adam's square root and divisions make that pass as dear as the step itself.  So
the check first asks a cheaper question: is every input element (parameter,
gradient, state) finite and at most ``safe`` in magnitude, a number from the
hyper-parameters alone (:func:`_adam_safe`, :func:`_momentum_safe`) below which
each intermediate and result of the formula stays under an eighth of the largest
finite value of the stored dtype?  Then no result can be NaN or inf (float64
rounding moves a value by far less than the factor of 8 left spare) and the
update is written without the full check.  An element beyond ``safe`` (or a NaN
in the inputs, or hyper-parameters for which no such number exists: ``safe``
is then -1) sends the check to the whole computation, as before.  Either way
the written numbers are the same: the cheap question only decides which check
runs.  ``tests/test_optimizers.py`` checks the bounds at their edges.
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
def _largest(like):
    """An eighth of the largest finite value of ``like``'s dtype (NOTE [ The check before an update ])."""
    return 3.4028234663852886e38 / 8.0 if like.itemsize == 4 else 1.7976931348623157e308 / 8.0


@inline
def _usable(safe):
    """``safe``, or -1 (no element is within it) when it is not a positive finite number."""
    return safe if safe > 1e-300 and safe < np.inf else -1.0


@inline
def _momentum_safe(eta, mu, top):
    """The magnitude below which every input keeps the momentum step finite under ``top``: ``|b| <= (1 + |mu|) s``,
    ``|d| <= (1 + |mu|)^2 s`` and ``|eta d| <= |eta| (1 + |mu|)^2 s``."""
    if not (abs(eta) < np.inf and abs(mu) < np.inf):
        return -1.0
    grow = (1.0 + abs(mu)) * (1.0 + abs(mu))
    return _usable(top / (grow * (1.0 + abs(eta))))


@inline
def _adam_safe(eta, beta1, beta2, eps, weight_decay, correction1, correction2, top):
    """The magnitude below which every input keeps the Adam step finite under ``top``: with ``k = 1 + |lambda|``,
    ``|g + lambda p| <= k s``, ``|m| <= k s``, ``v <= max(s, k^2 s^2)``, ``v / c2`` under ``top`` when
    ``s <= sqrt(top c2) / k`` and ``s <= top c2``, and the update ``eta (m / c1) / (sqrt(v / c2) + eps)`` with
    its intermediates under ``top`` when ``s <= top / (1 + |eta lambda| + (1 + |eta|) k / (c1 min(eps, 1)))``."""
    finite = (abs(eta) < np.inf and abs(weight_decay) < np.inf and eps > 0.0 and eps < np.inf
              and correction1 > 0.0 and correction1 <= 1.0 and correction2 > 0.0 and correction2 <= 1.0
              and beta1 >= 0.0 and beta1 <= 1.0 and beta2 >= 0.0 and beta2 <= 1.0)
    if not finite:
        return -1.0
    k = 1.0 + abs(weight_decay)
    step = 1.0 + abs(eta * weight_decay) + (1.0 + abs(eta)) * k / (correction1 * min(eps, 1.0))
    return _usable(min(math.sqrt(top * correction2) / k, top * correction2, top / k / step))


@inline
def _within(a, b, c, n, safe):
    """True when the first ``n`` elements of ``a``, ``b`` and ``c`` are at most ``safe`` in magnitude (NaN is
    not); branch-free, so the loop vectorises."""
    out = 0
    for i in range(n):
        out |= (np.int64(abs(np.float64(a[i])) <= safe) & np.int64(abs(np.float64(b[i])) <= safe)
                & np.int64(abs(np.float64(c[i])) <= safe)) ^ 1
    return out == 0


@inline
def _within_adam(a, b, c, v, n, safe):
    """:func:`_within` of ``a``, ``b`` and ``c``, and ``v`` (Adam's second moment) between 0 and ``safe``."""
    out = 0
    for i in range(n):
        out |= (np.int64(abs(np.float64(a[i])) <= safe) & np.int64(abs(np.float64(b[i])) <= safe)
                & np.int64(abs(np.float64(c[i])) <= safe) & np.int64(np.float64(v[i]) >= 0.0)
                & np.int64(np.float64(v[i]) <= safe)) ^ 1
    return out == 0


@inline
def _momentum(p, g, b, eta, mu, nesterov):
    """(new parameter, new velocity) of one element."""
    gi = np.float64(g)
    bi = mu * np.float64(b) + gi                       # b_1 = g_1: the buffer starts at 0
    d = gi + mu * bi if nesterov else bi
    return np.float64(p) - eta * d, bi


@inline
def _momentum_range(p, g, buf, lo, g_lo, n, eta, mu, nesterov, write):
    """``n`` elements of the momentum step from ``p[lo]``, ``buf[lo]`` and ``g[g_lo]``: written when
    ``write``, else only checked; returns 1 when a result would be NaN or inf."""
    pp, gg, bb = p[lo:lo + n], g[g_lo:g_lo + n], buf[lo:lo + n]    # indexed from 0: the loops vectorise
    if write:
        for i in range(n):
            pp[i], bb[i] = _momentum(pp[i], gg[i], bb[i], eta, mu, nesterov)
        return 0
    if _within(pp, gg, bb, n, _momentum_safe(eta, mu, min(_largest(p), _largest(buf)))):
        return 0                                       # NOTE [ The check before an update ]
    bad = 0
    for i in range(n):
        new_p, new_b = _momentum(pp[i], gg[i], bb[i], eta, mu, nesterov)
        bad |= _bad(new_p, p) | _bad(new_b, buf)
    return bad


@kernel
def momentum_step(p, g, buf, eta, mu, nesterov, blocks):
    """SGD with momentum ``mu`` (Nesterov's if ``nesterov``), in place on ``p`` and the velocity ``buf``.

    .. math::  b_t = \\mu b_{t-1} + g_t, \\quad p_t = p_{t-1} - \\eta (g_t + \\mu b_t \\text{ (Nesterov) or } b_t)

    Returns True when applied, False (nothing changed) when a result would be NaN or inf.
    """
    for write in (False, True):
        bad = 0
        for k in range(blocks.shape[0]):
            lo, hi = blocks[k, 0], blocks[k, 1]
            bad |= _momentum_range(p, g, buf, lo, lo, hi - lo, eta, mu, nesterov, write)
        if bad != 0:
            return False
    return True


@inline
def _adam(p, g, m, v, eta, beta1, beta2, eps, coupled, decoupled, correction1, correction2):
    """(new parameter, new m, new v, the update's denominator) of one element.  The denominator is checked too:
    ``v / correction2`` past float64's range makes it inf and the update 0, a finite but wrong result."""
    pi = np.float64(p)
    gi = np.float64(g) + coupled * pi
    mi = beta1 * np.float64(m) + (1.0 - beta1) * gi
    vi = beta2 * np.float64(v) + (1.0 - beta2) * gi * gi
    pi = pi - eta * decoupled * pi
    denominator = math.sqrt(vi / correction2) + eps
    return pi - eta * (mi / correction1) / denominator, mi, vi, denominator


@inline
def _adam_range(p, g, m, v, lo, g_lo, n, eta, beta1, beta2, eps, weight_decay, decoupled, correction1,
                correction2, write):
    """``n`` elements of the Adam step from ``p[lo]``, ``m[lo]``, ``v[lo]`` and ``g[g_lo]``: written when
    ``write``, else only checked; returns 1 when a result would be NaN or inf."""
    coupled = 0.0 if decoupled else weight_decay
    decay = weight_decay if decoupled else 0.0
    pp, gg, mm, vv = p[lo:lo + n], g[g_lo:g_lo + n], m[lo:lo + n], v[lo:lo + n]   # indexed from 0: vectorises
    if write:
        for i in range(n):
            pp[i], mm[i], vv[i], _ = _adam(pp[i], gg[i], mm[i], vv[i], eta, beta1, beta2, eps, coupled, decay,
                                           correction1, correction2)
        return 0
    top = min(_largest(p), _largest(m), _largest(v))
    if _within_adam(pp, gg, mm, vv, n, _adam_safe(eta, beta1, beta2, eps, weight_decay, correction1, correction2, top)):
        return 0                                       # NOTE [ The check before an update ]
    bad = 0
    for i in range(n):
        new_p, new_m, new_v, denominator = _adam(pp[i], gg[i], mm[i], vv[i], eta, beta1, beta2, eps, coupled, decay,
                                                 correction1, correction2)
        bad |= _bad(new_p, p) | _bad(new_m, m) | _bad(new_v, v) | np.int64((denominator - denominator) != 0.0)
    return bad


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
    for write in (False, True):
        bad = 0
        for k in range(blocks.shape[0]):
            lo, hi = blocks[k, 0], blocks[k, 1]
            bad |= _adam_range(p, g, m, v, lo, lo, hi - lo, eta, beta1, beta2, eps, weight_decay, decoupled,
                               correction1, correction2, write)
        if bad != 0:
            return False
    return True


MOMENTUM, ADAM = 1, 2          # codes of the stateful optimizers in ``hyper[0]``


@inline
def layer_step(hyper, p, g, s1, s2, lo, g_lo, n, eta, write):
    """The optimizer of ``hyper`` on ``n`` parameters from ``p[lo]`` with gradients from ``g[g_lo]``:
    ``hyper`` = (MOMENTUM, mu, nesterov) or (ADAM, beta1, beta2, eps, weight_decay, decoupled,
    1 - beta1**t, 1 - beta2**t); ``s1``/``s2`` the state buffers.  Checks (``write`` False) or writes."""
    if hyper[0] == MOMENTUM:
        return _momentum_range(p, g, s1, lo, g_lo, n, eta, hyper[1], hyper[2] != 0.0, write)
    return _adam_range(p, g, s1, s2, lo, g_lo, n, eta, hyper[1], hyper[2], hyper[3], hyper[4], hyper[5] != 0.0,
                       hyper[6], hyper[7], write)


@kernel
def counted_momentum_step(p, g, buf, eta, mu, nesterov, blocks, steps):
    """:func:`momentum_step`, then ``steps[0] += 1`` if it updated: one call, so that an interrupt cannot
    fall between an update and its count."""
    ok = momentum_step(p, g, buf, eta, mu, nesterov, blocks)
    if ok:
        steps[0] += 1
    return ok


@kernel
def counted_adam_step(p, g, m, v, eta, beta1, beta2, eps, weight_decay, decoupled, correction1, correction2, blocks,
                      steps):
    """:func:`adam_step` (the corrections of step ``steps[0] + 1``), then ``steps[0] += 1`` if it updated, in
    one call as :func:`counted_momentum_step`."""
    ok = adam_step(p, g, m, v, eta, beta1, beta2, eps, weight_decay, decoupled, correction1, correction2, blocks)
    if ok:
        steps[0] += 1
    return ok
