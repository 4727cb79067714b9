"""Compiled loops of the byte budget's bounded search (:mod:`fastckpt.planner.bounded` decides and proves the bounds).

The chain has states ``a[0] .. a[L]`` and ``n = L + 1`` reverse steps.  Each
sub-chain ``(s, t)`` keeps the Pareto front of its trees (peak bytes above the
stack that holds ``a[s]``, forward FLOPs), merged split by split, but only the
part a tree of at most ``budget`` FLOPs can use:

* a *spine* node ``(s, n)`` (on the root's right spine: the forward pass keeps
  ``a[s]``) keeps a point ``(p, c)`` when ``prefix[s] + c`` plus the largest of
  the lines ``slopes[k] p + offsets[k, s]`` (if positive), a bound on what the
  tree spends before ``a[s]``, is at most ``budget``;
* any other node ``(s, t)`` exists for ``t <= ends[s]`` only, and keeps the
  points that cost at most its cap (:func:`node_caps_of`);
* no point of ``(s, t)`` peaks above ``cap - w[s]``: ``a[s]`` is on the stack.

Points are five flat arrays: ``peak``, ``cost``, ``split`` (-1: a leaf) and the
``right`` and ``left`` points each is made of.  Node ``(s, t)`` holds points
``start[k] .. stop[k]``, ``k = offsets[s] + t - s - 1``; spine node ``s`` is
``k = offsets[n] + s``, and spine node ``L`` is the loss's leaf.  Ties between
equal points go to the earlier split, as in the full search, so the trees are
its trees.  No ``fastmath``: FLOP sums are exact integers in float64.
"""
import numpy as np

from ._jit import kernel
from .schedules import grow

NO_ROOM = -1             # the points outgrew their allowance
OUT_OF_STEPS = -2        # the inner steps did


@kernel
def band_ends(base, duals, excess, slopes, kept, wsum, w, cap):
    """``ends[s]``: the last ``t <= L`` for which a non-spine node ``(s, t)`` may hold a point, ``L + 1`` for
    ``s = L``.

    Node ``(s, t)`` is kept while ``max_k (duals[k] + excess[k] over s+1..t-1) + max(0, max_k slopes[k]
    (wsum over s+1..t-1 + w[s] - cap) - kept[k] over s+1..t-1) <= base``; sums over states are differences
    of the prefix sums given.  Both terms grow with ``t``, so the scan stops at the first ``t`` that fails.
    """
    lines, n = excess.shape
    last = n - 1
    ends = np.empty(n, dtype=np.int64)
    for s in range(n):
        t = s + 1
        while t < last:
            worst, inner = -np.inf, 0.0
            for k in range(lines):
                worst = max(worst, duals[k] + excess[k, t] - excess[k, s])
                inner = max(inner, slopes[k] * (wsum[t] - wsum[s] + w[s] - cap) - kept[k, t] + kept[k, s])
            if worst + inner > base:
                break
            t += 1
        ends[s] = t if s < last else n
    return ends


@kernel
def envelope(slopes, offsets, keep):
    """Of the lines ``slopes[k] x + offsets[k]`` (slopes rising), the indices of the upper envelope into
    ``keep``; returns how many."""
    m = 0
    for k in range(slopes.shape[0]):
        if m > 0 and slopes[keep[m - 1]] == slopes[k]:
            if offsets[keep[m - 1]] >= offsets[k]:
                continue
            m -= 1
        while m >= 2:
            a, b = keep[m - 2], keep[m - 1]
            rise_b, rise_k = (offsets[b] - offsets[a]) * (slopes[k] - slopes[a]), offsets[k] - offsets[a]
            if rise_k * (slopes[b] - slopes[a]) >= rise_b:      # k overtakes a no later than b does: b is useless
                m -= 1
            else:
                break
        keep[m] = k
        m += 1
    return m


@kernel
def merge_points(front, nf, cand, m, out):
    """The Pareto front of ``front[:nf]`` (earlier splits: first on ties) and ``cand[:m]`` into ``out``.

    Each of the three is a tuple of arrays (peak, cost, split, right, left), peaks rising.  A point that
    an earlier one matches or beats in both peak and cost is dropped.  Returns the size of ``out``.
    """
    fp, fc, fs, fr, fl = front
    cp, cc, cs, cr, cl = cand
    op, oc, os_, orr, ol = out
    j = k = size = 0
    last = np.inf
    while j < nf or k < m:
        if k == m or (j < nf and (fp[j] < cp[k] or (fp[j] == cp[k] and fc[j] <= cc[k]))):
            p, c, s, r, left = fp[j], fc[j], fs[j], fr[j], fl[j]
            j += 1
        else:
            p, c, s, r, left = cp[k], cc[k], cs[k], cr[k], cl[k]
            k += 1
        if c < last:
            last = c
            op[size], oc[size], os_[size], orr[size], ol[size] = p, c, s, r, left
            size += 1
    return size


@kernel
def split_points(peak, cost, i, region, base, wi, right, left, pcap, ccap, lines, cand):
    """The points of one split into ``cand``: for each peak ``p`` (rising) the cheapest right part whose
    ``wi + peak <= p`` and left part whose ``peak <= p``, kept when their cost is at most ``ccap[0]`` and
    at most ``ccap[1] - max(0, max_k slopes[k] p + offsets[k])`` (``lines = (slopes, offsets, m)``, the
    upper envelope; ``m = 0``: no lines).  Returns (points, steps)."""
    rs, re = right
    ls, le = left
    ceiling, budget = ccap
    slopes, offsets, m_lines = lines
    cp, cc, cs, cr, cl = cand
    floor = max(region, wi + peak[rs], peak[ls])
    r, k, next_r, next_k, last, m, line = rs, ls, rs, ls, -1, 0, 0
    steps = 0
    while next_r < re or next_k < le:
        steps += 1
        if next_k == le or (next_r < re and max(floor, wi + peak[next_r]) <= max(floor, peak[next_k])):
            p = max(floor, wi + peak[next_r])
            next_r += 1
        else:
            p = max(floor, peak[next_k])
            next_k += 1
        if p == last:
            continue
        if p > pcap:
            break
        last = p
        while r + 1 < re and wi + peak[r + 1] <= p:
            r += 1
        while k + 1 < le and peak[k + 1] <= p:
            k += 1
        c = base + cost[r] + cost[k]
        bound = 0.0
        if m_lines > 0:
            while line + 1 < m_lines and slopes[line + 1] * p + offsets[line + 1] >= slopes[line] * p + offsets[line]:
                line += 1
            bound = max(0.0, slopes[line] * p + offsets[line])
        if c > ceiling or c + bound > budget:
            continue
        cp[m], cc[m], cs[m], cr[m], cl[m] = p, c, i, r, k
        m += 1
    return m, steps


@kernel
def grown_points(points, size):
    """The five arrays of ``points``, each with room for ``size`` entries."""
    p, c, s, r, left = points
    return grow(p, size), grow(c, size), grow(s, size), grow(r, size), grow(left, size)


@kernel
def new_points(size):
    """Five empty arrays (peak, cost, split, right, left) for ``size`` points."""
    return (np.empty(size, dtype=np.int64), np.empty(size), np.empty(size, dtype=np.int64),
            np.empty(size, dtype=np.int64), np.empty(size, dtype=np.int64))


@kernel
def child_range(layout, s, t):
    """The point range of node ``(s, t)`` (``t = n``: the spine node), empty if the node does not exist."""
    offsets, ends, start, stop, _ = layout
    n = ends.shape[0]
    if t == n:
        k = offsets[n] + s if s < n - 1 else offsets[s]       # spine node L is the loss's leaf
    elif t <= ends[s]:
        k = offsets[s] + t - s - 1
    else:
        return 0, 0
    return start[k], stop[k]


@kernel
def node_front(s, t, last, layout, prefix, w, after, pcap, ccap, lines, store, work, steps):
    """The front of node ``(s, t)`` over its splits ``s < i <= last`` whose children exist, into ``work[0]``;
    returns (size, work, steps).  ``store`` holds the points so far.

    Below a node off the spine, a left child ``(s, i)`` is deeper still: of its points, only those within
    its cap there (``caps`` in ``layout``, :func:`node_caps_of`) are of use."""
    peak, cost = store[0], store[1]
    caps = layout[4]
    front, cand, out = work
    nf = 0
    region = 0
    for i in range(s + 1, last + 1):
        region = w[i] if i == s + 1 else max(region, w[i - 1] + w[i])
        if region + after[t] > pcap:
            break                                            # regions only widen with i
        steps += 1
        rs, re = child_range(layout, i, t)
        ls, le = child_range(layout, s, i)
        if t < w.shape[0] and ls < le and i > s + 1:
            third = caps[layout[0][s] + i - s - 1]
            hi = le
            while ls < hi:                                    # costs fall along a front: the first that fits
                mid = (ls + hi) // 2
                if cost[mid] > third:
                    ls = mid + 1
                else:
                    hi = mid
        if rs == re or ls == le:
            continue
        wi, base = w[i], prefix[i] - prefix[s]
        floor = max(region + after[t], wi + peak[rs], peak[ls])
        least = base + cost[re - 1] + cost[le - 1]            # fronts' costs fall along them
        if floor > pcap:
            continue
        j = np.searchsorted(front[0][:nf], floor, side="right")
        if j > 0 and front[1][j - 1] <= least:
            continue                                          # an earlier split already does better
        cand = grown_points(cand, (re - rs) + (le - ls))
        m, walked = split_points(peak, cost, i, region + after[t], base, wi, (rs, re), (ls, le), pcap, ccap,
                                 lines, cand)
        steps += walked + nf + m
        out = grown_points(out, nf + m)
        nf = merge_points(front, nf, cand, m, out)
        front, out = out, front
    return nf, (front, cand, out), steps


@kernel
def keep_best(front, nf, keys, beam):
    """Of the ``nf`` points of ``front``, the ``beam`` of least ``keys`` compacted in place, peaks still
    rising; returns how many are left."""
    if nf <= beam:
        return nf
    order = np.sort(np.argsort(keys[:nf], kind="mergesort")[:beam])
    front[0][:beam] = front[0][order]
    front[1][:beam] = front[1][order]
    front[2][:beam] = front[2][order]
    front[3][:beam] = front[3][order]
    front[4][:beam] = front[4][order]
    return beam


@kernel
def append_points(store, size, front, nf):
    """``front[:nf]`` appended to the points of ``store`` (grown if need be); returns (store, size)."""
    store = grown_points(store, size + nf)
    for a, b in ((store[0], front[0]), (store[2], front[2]), (store[3], front[3]), (store[4], front[4])):
        a[size:size + nf] = b[:nf]
    store[1][size:size + nf] = front[1][:nf]
    return store, size + nf


@kernel
def node_caps_of(bounds, rooted, prefix, w, cap, s, t, lines):
    """The caps of the non-spine node ``(s, t)``: ``((ceiling, budget), deep)`` with the envelope of its
    lines in ``lines`` (NOTE [ Knapsack bound ] in ``fastckpt/planner/bounds.py``).

    ``bounds = (base, duals, mins, kept, mu, wsum, best)``, sums over states as prefix sums.  Directly
    below the spine the node ends at a spine state ``a[t]``, and what the rest of a tree costs is at least
    ``rooted[0][k, t]`` less ``mins[k]`` over ``s+1 .. t-1`` (``a[s+1] .. a[t-1]`` are the node's own);
    deeper, it is inside a left child that ends at some spine state past ``a[t]`` (``rooted[1][k, t+1]``,
    the least of those), and ``a[s+1] .. a[t-1]`` are computed once more than the node counts (``deep``,
    the cap there).  The kept states before ``a[s]`` fit beside a point's peak ``p``: at price ``mu[best]``
    for the rest and ``mu[j] >= mu[best]`` for them, a line in ``p``, to which the weaker way adds.
    """
    base, duals, mins, kept, mu, wsum, best = bounds
    at, past = rooted
    slopes, offsets, keep = lines
    below, deeper = -np.inf, -np.inf
    for k in range(duals.shape[0]):
        own = mins[k, t - 1] - mins[k, s]
        below, deeper = max(below, at[k, t] - own), max(deeper, past[k, t + 1] - own)
    inside = prefix[t - 1] - prefix[s]
    deep = base - deeper - inside if deeper < np.inf else -np.inf       # inf - inf: no such tree
    ceiling = max(base - below if below < np.inf else -np.inf, deep)
    own = mins[best, t - 1] - mins[best, s]
    first = min(at[best, t] - own, past[best, t + 1] - own + inside)
    held = (wsum[s - 1] if s > 0 else 0.0) + w[s] - cap
    lines_n = 0
    for j in range(best, mu.shape[0]):
        slopes[lines_n] = mu[j] - mu[best]
        offsets[lines_n] = first + slopes[lines_n] * held - ((kept[j, s - 1] - kept[best, s - 1]) if s > 0 else 0.0)
        lines_n += 1
    m = envelope(slopes[:lines_n], offsets[:lines_n].copy(), keep)
    for q in range(m):
        slopes[q], offsets[q] = slopes[keep[q]], offsets[keep[q]]
    return (ceiling, base), deep, (slopes, offsets, m)


@kernel
def root_bounds(front, nf, bounds, spine, prefix, s, rooted):
    """``rooted[0][k, s]``: what a tree whose spine holds ``a[s]`` costs beyond one forward pass, but the
    left children before ``a[s]`` that a caller counts, at least; from spine node ``s``'s points (the rest
    exact) and the knapsack bound of the states before ``a[s]``.  ``rooted[1]``: its least from ``s`` on."""
    base, duals, mins, kept, mu, wsum, best = bounds
    offsets = spine[2]
    at, past = rooted
    L = prefix.shape[0] - 1
    for k in range(duals.shape[0]):
        least = np.inf
        for j in range(nf):
            least = min(least, front[1][j] - (prefix[L] - prefix[s]) + mu[k] * front[0][j] + offsets[k, s])
        floor = duals[k] + kept[k, s] - (kept[k, s - 1] if s > 0 else 0.0)
        at[k, s] = max(least, floor) if nf > 0 else np.inf
        past[k, s] = min(at[k, s], past[k, s + 1])


@kernel
def spine_lines(slopes, offsets, s, keep, env_slopes, env_offsets):
    """The upper envelope of spine node ``s``'s lines ``slopes[k] p + offsets[k, s]``, as (slopes, offsets, m)."""
    column = offsets[:, s].copy()
    m = envelope(slopes, column, keep)
    for j in range(m):
        env_slopes[j], env_offsets[j] = slopes[keep[j]], column[keep[j]]
    return env_slopes, env_offsets, m


@kernel
def beam_keys(front, nf, lines, keys):
    """``keys[j]``: point ``j``'s cost plus its spine bound (lines of :func:`spine_lines`)."""
    slopes, offsets, m = lines
    for j in range(nf):
        bound = 0.0
        for k in range(m):
            bound = max(bound, slopes[k] * front[0][j] + offsets[k])
        keys[j] = front[1][j] + bound
    return keys


@kernel
def held_bytes(fixed, store, work, keys, beam, most):
    """The most of ``most`` and the bytes held now by :func:`bounded_fronts`' arrays: ``fixed`` bytes, the point
    store, the three work fronts and the beam's keys, with the old copy of whichever grows next (at most half
    its new size: arrays only grow, to twice what they need) and :func:`keep_best`'s index arrays.  Checked
    after every node, so a bound on every moment between: arrays only grow."""
    stored = 40 * store[0].shape[0]
    worked = 40 * max(work[0][0].shape[0], work[1][0].shape[0], work[2][0].shape[0])
    now = fixed + stored + 40 * (work[0][0].shape[0] + work[1][0].shape[0] + work[2][0].shape[0]) \
        + 8 * keys.shape[0] + max(stored, worked, 8 * keys.shape[0]) // 2 + (16 * keys.shape[0] if beam > 0 else 0)
    return max(most, now)


@kernel
def bounded_fronts(prefix, w, after, cap, ends, node_caps, spine, beam, spread, limits):
    """Every node's bounded front (the module's docstring).

    ``node_caps = (base, duals, mins, kept, mu, wsum, best)`` bound the non-spine nodes
    (:func:`node_caps_of`); ``spine = (budget, slopes, offsets)`` the spine nodes: a point ``(p, c)`` of
    spine node ``s`` stays when ``c + max(0, max_k slopes[k] p + offsets[k, s]) <= budget - prefix[s]``.
    With ``beam > 0`` a spine node keeps only the ``beam`` points of least such sum, and a non-spine node
    only the points that recompute at most
    ``spread`` FLOPs inside it (``inf``: all; 0: its keep-all alone).  ``limits = (max_steps, max_points)``.

    Returns ``(points, size, (offsets, ends, start, stop, caps), status, held)``; ``status`` is the inner steps
    taken, or :data:`OUT_OF_STEPS` or :data:`NO_ROOM` when a limit stopped the search unfinished; ``held``
    bounds the bytes of the arrays it made that were alive at once (:func:`held_bytes`).
    """
    n = w.shape[0]
    L = n - 1
    lines_k = node_caps[1].shape[0]
    if (prefix.shape[0] != n or after.shape[0] != n + 1 or ends.shape[0] != n or node_caps[2].shape != (lines_k, n)
            or node_caps[3].shape != (lines_k, n) or node_caps[4].shape[0] != lines_k or node_caps[5].shape[0] != n
            or spine[2].shape != (spine[1].shape[0], n)):
        raise ValueError("bounded_fronts: the chain's arrays and the bounds' do not match")
    max_steps, max_points = limits
    offsets = np.zeros(n + 1, dtype=np.int64)
    for s in range(n):
        offsets[s + 1] = offsets[s] + ends[s] - s
    start = np.zeros(offsets[n] + n, dtype=np.int64)
    stop = np.zeros(offsets[n] + n, dtype=np.int64)
    caps = np.full(offsets[n], np.inf)
    layout = (offsets, ends, start, stop, caps)
    store = new_points(max(1024, 2 * n))
    for s in range(n):                                   # the leaves: reverse step s, after[s] bytes, no FLOPs
        store[0][s], store[1][s], store[2][s], store[3][s], store[4][s] = after[s], 0.0, -1, -1, -1
        start[offsets[s]], stop[offsets[s]] = s, s + 1
    size = n
    work = (new_points(64), new_points(64), new_points(64))
    node_lines = (np.empty(lines_k), np.empty(lines_k), np.empty(lines_k, dtype=np.int64))
    steps = 0
    rooted = (np.full((lines_k, n + 1), np.inf), np.full((lines_k, n + 2), np.inf))
    rooted[0][:, L] = node_caps[1]                       # the loss's leaf: the knapsack bound itself
    rooted[1][:, L] = node_caps[1]
    budget, slopes, line_offsets = spine
    keep = np.empty(slopes.shape[0], dtype=np.int64)
    env = (np.empty(slopes.shape[0]), np.empty(slopes.shape[0]))
    keys = np.empty(64)
    fixed = 8 * (offsets.size + 2 * start.size + caps.size + rooted[0].size + rooted[1].size + 3 * lines_k
                 + 3 * slopes.shape[0])
    held = held_bytes(fixed, store, work, keys, beam, 0)
    for s in range(L, -1, -1):
        for t in range(s + 2, min(ends[s], L) + 1):
            ccap, deep, lines = node_caps_of(node_caps, rooted, prefix, w, cap, s, t, node_lines)
            inside = prefix[t - 1] - prefix[s]
            ccap = (min(ccap[0], inside + spread), ccap[1])
            caps[offsets[s] + t - s - 1] = min(deep, inside + spread)
            last = s + 1 if spread == 0 else t - 1           # spread 0: only keep-all, which splits at s + 1
            nf = 0
            if ccap[0] >= inside:
                nf, work, steps = node_front(s, t, last, layout, prefix, w, after, cap - w[s], ccap, lines, store,
                                             work, steps)
            start[offsets[s] + t - s - 1] = size
            store, size = append_points(store, size, work[0], nf)
            stop[offsets[s] + t - s - 1] = size
            held = held_bytes(fixed, store, work, keys, beam, held)
            if steps > max_steps or size > max_points:
                return store, size, layout, OUT_OF_STEPS if steps > max_steps else NO_ROOM, held
        if s == L:
            continue
        lines = spine_lines(slopes, line_offsets, s, keep, env[0], env[1])
        nf, work, steps = node_front(s, n, min(ends[s], L), layout, prefix, w, after, cap - w[s],
                                     (np.inf, budget - prefix[s]), lines, store, work, steps)
        if 0 < beam < nf:
            keys = beam_keys(work[0], nf, lines, grow(keys, nf))
            nf = keep_best(work[0], nf, keys, beam)
        root_bounds(work[0], nf, node_caps, spine, prefix, s, rooted)
        start[offsets[n] + s] = size
        store, size = append_points(store, size, work[0], nf)
        stop[offsets[n] + s] = size
        held = held_bytes(fixed, store, work, keys, beam, held)
        if steps > max_steps or size > max_points:
            return store, size, layout, OUT_OF_STEPS if steps > max_steps else NO_ROOM, held
    return store, size, layout, steps, held
