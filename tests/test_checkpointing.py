"""Checkpointed backprop: bit-identical to plain, each layer computed at most twice, the lab's rule."""
import numpy as np
import pytest

from fastckpt import Network, NetworkWithCheckpointing

NETS = [[784, 40, 30, 10], [5, 3], [7, 1, 9, 2, 4], [13] * 9, [3, 11, 2, 8, 5, 6, 9, 4, 7, 2, 3]]


def _cases():
    for sizes in NETS:
        for n in range(1, len(sizes)):
            yield sizes, n


def _expected(n_layers, n):
    """The lab's checkpoints and, independently, how often each layer must run."""
    checkpoints = list(range(0, n_layers, n))
    last = checkpoints[-1]
    counts = [1] * n_layers
    for start, end in zip(checkpoints[:-1], checkpoints[1:]):
        for layer in range(start, end - 1):      # recompute strictly inside the segment
            counts[layer] = 2
    kept = sorted(set(checkpoints) | set(range(last + 1, n_layers + 1)))
    return checkpoints, counts, tuple(kept)


@pytest.mark.parametrize("sizes,n", list(_cases()), ids=str)
def test_bit_identical_to_plain_and_follows_the_rule(rng, sizes, n):
    np.random.seed(1)
    plain = Network(sizes)
    np.random.seed(1)
    ckpt = NetworkWithCheckpointing(sizes, checkpoint_every_nth_layer=n)
    x, y = rng.random((9, sizes[0])), rng.random((9, sizes[-1]))
    pb, pw = plain.backprop(x, y)
    cb, cw = ckpt.backprop(x, y)
    for a, b in zip(pb + pw, cb + cw):
        np.testing.assert_array_equal(a, b)
    n_layers = len(sizes) - 1
    checkpoints, counts, kept = _expected(n_layers, n)
    assert ckpt.checkpoints_layer_idx == checkpoints
    assert ckpt.engine(1).forward_counts == counts
    assert max(counts) <= 2
    assert ckpt.plan(9).kept == kept
    assert list(ckpt.plan(9).forward_counts) == counts
    assert plain.engine(1).forward_counts == [1] * n_layers
    # the whole training step too: identical weights after a few updates
    for _ in range(3):
        plain.update_mini_batch(x, y, 0.5)
        ckpt.update_mini_batch(x, y, 0.5)
    for a, b in zip(plain.weights + plain.biases, ckpt.weights + ckpt.biases):
        np.testing.assert_array_equal(a, b)


def test_recompute_happens_during_backprop_and_segments_walk_down(rng):
    ckpt = NetworkWithCheckpointing([4] * 8, checkpoint_every_nth_layer=3)
    ckpt.engine(2).trace = []
    ckpt.backprop(rng.random((2, 4)), rng.random((2, 4)))
    trace = ckpt.engine(2).trace
    assert trace[:7] == [("fwd", layer) for layer in range(7)]
    # checkpoints 0, 3, 6: last segment [6, 7) kept, then [3, 6) and [0, 3) recomputed
    assert trace[7:] == [("loss", 7), ("bwd", 6),
                         ("fwd", 3), ("fwd", 4), ("bwd", 5), ("bwd", 4), ("bwd", 3),
                         ("fwd", 0), ("fwd", 1), ("bwd", 2), ("bwd", 1), ("bwd", 0)]


def test_checkpointing_uses_less_activation_memory():
    sizes = [64] * 17
    plain = Network(sizes).plan(32).bytes()
    ckpt = NetworkWithCheckpointing(sizes, checkpoint_every_nth_layer=4).plan(32).bytes()
    workspace = {k: v["kept_activations"] + v["recompute_buffers"] for k, v in
                 (("plain", plain), ("ckpt", ckpt))}
    assert workspace["plain"] == plain["kept_activations"] == 16 * 32 * 64 * 8   # every activation
    # checkpoints a0 (input), a4, a8, a12 kept, plus the last segment a13..a16
    assert ckpt["kept_activations"] == workspace["ckpt"] == (3 + 4) * 32 * 64 * 8
    assert plain["deltas"] == ckpt["deltas"] == 2 * 32 * 64 * 8


@pytest.mark.parametrize("sizes,n", [([784, 40, 30, 10], 2), ([9, 7, 5, 3, 6], 2)], ids=str)
def test_forward_between_checkpoints_gives_the_stored_values(rng, sizes, n):
    ckpt = NetworkWithCheckpointing(sizes, checkpoint_every_nth_layer=n)
    x = rng.random((5, sizes[0]))
    acts = ckpt.forward_between_checkpoints(x[:, :, None], 0, len(sizes) - 1)
    assert acts[0] is not None and len(acts) == len(sizes)
    mid = ckpt.forward_between_checkpoints(acts[n], n, len(sizes) - 1)
    for a, b in zip(acts[n:], mid):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(acts[-1][:, :, 0], ckpt.feedforward(x))
