"""Checkpoint schedules as trees, the op lists they run, and a workspace layout that meets their peak.

The chain has states ``a[0] .. a[L]`` (``a[0]`` is the caller's input, never in
the workspace) and ``L + 1`` reverse steps: step ``L`` is the loss, which reads
``a[L]`` and writes the output delta; step ``l < L`` back-propagates through
layer ``l`` and reads ``a[l]`` only (see ``kernels/dense.py``).

A schedule for the reverse steps ``s .. t-1``, given ``a[s]`` and the delta of
step ``t``, is a tree:

* ``None`` (a leaf, when ``t == s + 1``): run reverse step ``s``;
* ``(i, right, left)`` with ``s < i < t``: forward from ``a[s]`` to ``a[i]``,
  keep ``a[i]``, run ``right`` for ``i .. t-1``, drop ``a[i]``, then run
  ``left`` for ``s .. i-1``.

NOTE [ Recompute ]
Plain backprop is the tree that splits at ``s + 1`` everywhere: every state is
kept once it is computed.  The lab's rule keeps ``a[0], a[n], a[2n], ...``: its
tree splits at those checkpoints along the right spine, and each left child
recomputes its segment once, keeping everything inside it.  The last segment is
not recomputed: it is what the forward pass has just produced and the backward
pass needs first.  Trees whose left children split again recompute a layer
several times (revolve, budget).  Kept states form a stack: a state is pushed
when a split keeps it and popped when its right child is done.

NOTE [ Gradients in the arena ]
Layer ``l``'s gradient exists from its reverse step to the SGD update at the
end, and the reverse steps run from the top layer down.  So the gradients are
stacked from the top of the workspace downwards, layer ``L-1`` highest, and
end up contiguous in layer order, in the parameters' own layout: the SGD
kernel takes them as one flat array.  They take memory that activations no
longer need: plain backprop frees ``a[l]`` as it writes layer ``l``'s
gradient.  The arena is the largest sum, over the schedule, of the bytes the
activations use and the gradients already written.

The layout puts the stack at the bottom of the workspace.  While forwarding
from ``a[s]`` to ``a[i]`` the intermediate states alternate between the two
ends of the free region above the stack, ending with ``a[i]`` at its bottom,
where the stack continues.  Two neighbouring states sit at opposite ends, so
the region needs only the largest pair, and the workspace is exactly the peak
of live bytes: nothing is lost to fragmentation.
"""
def keep_all(s, t):
    """The tree that keeps every state from ``a[s+1]`` on: no recomputation."""
    tree = None
    for i in range(t - 1, s, -1):
        tree = (i, tree, None)
    return tree


def spine(checkpoints, n_layers):
    """Keep ``checkpoints`` (starting at 0) and the last segment; recompute each other segment once."""
    if list(checkpoints[:1]) != [0] or any(b <= a for a, b in zip(checkpoints, checkpoints[1:])) \
            or checkpoints[-1] > n_layers:
        raise ValueError(f"checkpoints must rise from 0 to at most {n_layers}, got {list(checkpoints)}")
    tree = keep_all(checkpoints[-1], n_layers + 1)
    for s, i in reversed(list(zip(checkpoints[:-1], checkpoints[1:]))):
        tree = (i, tree, keep_all(s, i))
    return tree


def forward_region(w, s, i):
    """Bytes above the stack while forwarding from a[s] to a[i]: the largest live pair."""
    region = w[s + 1]
    for j in range(s + 1, i):
        region = max(region, w[j] + w[j + 1])
    return region


def walk(tree, n_layers, w, grads=None):
    """Ops of a tree with the byte offset of every state they touch, and the peaks.

    Returns (ops, reads, writes, kept, peak, arena) with offsets in bytes; ``w``
    from :func:`state_bytes`.  ``peak`` is the activations' peak.  ``arena``
    also holds the gradients: ``grads[l]`` bytes for layer ``l`` from its
    reverse step to the end, stacked down from the arena's top (see NOTE
    [ Gradients in the arena ]).
    """
    after = suffix_sums(grads or [0] * n_layers)          # after[t]: gradient bytes once step t is done
    ops, reads, writes = [], [], []
    kept = None
    peak = arena = 0
    stack = [(tree, 0, n_layers + 1, 0, None, None)]     # (tree, s, t, top, offset of a[s], held states)
    while stack:
        node, s, t, top, at_s, held = stack.pop()
        if node is None:
            if t != s + 1:
                raise ValueError(f"a leaf must reverse one step, got steps {s}..{t - 1}")
            if s == n_layers:
                kept = (0,) + _unlinked(held)
            arena = max(arena, top + after[s])
            ops.append(("loss" if s == n_layers else "bwd", s))
            reads.append(at_s)
            writes.append(None)
            continue
        i, right, left = node
        if not s < i < t:
            raise ValueError(f"split at {i} outside the steps {s}..{t - 1}")
        region = forward_region(w, s, i)
        peak = max(peak, top + region)
        arena = max(arena, top + region + after[t])
        src = at_s
        for j in range(s + 1, i + 1):                    # a[j]: low end if (i - j) is even
            dst = top if (i - j) % 2 == 0 else top + region - w[j]
            ops.append(("fwd", j - 1))
            reads.append(src)
            writes.append(dst)
            src = dst
        stack.append((left, s, i, top, at_s, held))
        stack.append((right, i, t, top + w[i], top, (i, held)))     # a linked stack: O(1) per push
    return ops, reads, writes, kept, peak, arena


def _unlinked(held):
    """The states of the linked stack ``(i, (j, ... None))``, bottom first."""
    out = []
    while held is not None:
        i, held = held
        out.append(i)
    return tuple(reversed(out))


def suffix_sums(grads):
    """``out[t]`` = bytes of the gradients of layers t .. L-1, for t = 0 .. L+1."""
    out = [0] * (len(grads) + 2)
    for t in range(len(grads) - 1, -1, -1):
        out[t] = out[t + 1] + grads[t]
    return out


def tree_cost(tree, n_layers, flops):
    """Forward FLOPs a tree computes (the first forward pass included), and its stack depth."""
    cost, depth = 0.0, 0
    stack = [(tree, 0, 0)]
    while stack:
        node, s, d = stack.pop()
        depth = max(depth, d)
        if node is not None:
            i, right, left = node
            cost += sum(flops[s:i])
            stack.append((right, i, d + 1))
            stack.append((left, s, d))
    return cost, depth


def points_tree(points, root):
    """The tree of point ``root`` of a search's points (peak, cost, split, right, left; split -1 at a leaf),
    built without recursion."""
    split, right, left = points[2], points[3], points[4]
    built, stack = {}, [root]
    while stack:
        g = stack[-1]
        if split[g] < 0:
            built[g] = None
            stack.pop()
            continue
        missing = [k for k in (int(right[g]), int(left[g])) if k not in built]
        if missing:
            stack.extend(missing)
            continue
        built[g] = (int(split[g]), built[int(right[g])], built[int(left[g])])
        stack.pop()
    return built[root]
