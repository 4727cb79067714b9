"""Bad input gets a clear error naming the argument and the value."""
import numpy as np
import pytest

from fastckpt import Network, NetworkWithCheckpointing


@pytest.mark.parametrize("sizes,exc,msg", [
    ([784], ValueError, r"at least two layer sizes.*\[784\]"),
    ([], ValueError, "at least two"),
    ([784, 0, 10], ValueError, r"sizes\[1\] must be >= 1, got 0"),
    ([784, -3, 10], ValueError, r"sizes\[1\] must be >= 1, got -3"),
    ([784, 2.5, 10], TypeError, "sequence of integers"),
    (784, TypeError, "sequence of integers"),
    ([True, 10], TypeError, r"sequence of integers, got \[True, 10\]"),        # an index to Python, not a width
    ({784: 1, 10: 2}, TypeError, r"sequence of integers, got dict \{784: 1, 10: 2\}"),     # keys: no layer order
    ({784, 10}, TypeError, "sequence of integers, got set"),
    (b"\x05\x03", TypeError, "sequence of integers, got bytes"),                  # bytes, not widths
    ([10, 2**40], MemoryError, r"sizes \[10, 1099511627776\]: the parameters alone take 96757023244288 bytes "
                               r"\(88.00 TiB\) in float64, more than this machine's memory"),
    ([10, 2**70], MemoryError, r"sizes \[10, 1180591620717411303424\]: the parameters alone take"),
])
def test_bad_sizes(sizes, exc, msg):
    with pytest.raises(exc, match=msg):
        Network(sizes)


@pytest.mark.parametrize("n,exc,msg", [(0, ValueError, "checkpoint_every_nth_layer must be >= 1, got 0"),
                                       (-2, ValueError, "got -2"),
                                       (1.5, TypeError, "checkpoint_every_nth_layer must be an integer"),
                                       (True, TypeError, "checkpoint_every_nth_layer must be an integer, got True"),
                                       (np.True_, TypeError, "checkpoint_every_nth_layer must be an integer")])
def test_bad_checkpoint_every_nth_layer(n, exc, msg):
    with pytest.raises(exc, match=msg):
        NetworkWithCheckpointing([4, 3, 2], checkpoint_every_nth_layer=n)


def test_bad_dtype():
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        Network([4, 2], dtype=np.int32)


@pytest.mark.parametrize("x_shape,y_shape,msg", [
    ((5, 3), (5, 2), r"x_batch has shape \(5, 3\): 3 values per sample, but the network's input layer has 4"),
    ((5, 4), (5, 3), r"y_batch has shape \(5, 3\).*output layer has 2"),
    ((5, 4), (6, 2), "x_batch has 5 samples but y_batch has 6"),
    ((0, 4), (0, 2), "x_batch has no samples"),
    ((4,), (2,), r"x_batch must have shape \(batch, 4\)"),
    ((5, 4, 2), (5, 2), r"x_batch must have shape"),
])
def test_bad_batch_shapes(x_shape, y_shape, msg):
    net = Network([4, 3, 2])
    with pytest.raises(ValueError, match=msg):
        net.backprop(np.zeros(x_shape), np.zeros(y_shape))


def test_bad_batch_dtypes():
    net = Network([4, 3, 2])
    with pytest.raises(TypeError, match="x_mini_batch must hold real numbers, got dtype <U1"):
        net.update_mini_batch(np.full((2, 4), "a"), np.zeros((2, 2)), 0.1)
    with pytest.raises(TypeError, match="y_batch must hold real numbers, got dtype complex128"):
        net.backprop(np.zeros((2, 4)), np.zeros((2, 2), dtype=complex))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_inputs(bad):
    net = Network([4, 3, 2])
    x = np.zeros((3, 4))
    x[1, 2] = bad
    before = [w.copy() for w in net.weights]
    with pytest.raises(ValueError, match=r"x_mini_batch contains NaN or inf \(first at index \(1, 2\)"):
        net.update_mini_batch(x, np.zeros((3, 2)), 0.1)
    y = np.zeros((3, 2))
    y[2, 1] = bad
    with pytest.raises(ValueError, match=r"y_batch contains NaN or inf \(first at index \(2, 1\)"):
        net.backprop(np.zeros((3, 4)), y)
    with pytest.raises(ValueError, match=r"x_test_data contains NaN or inf"):
        net.evaluate(x, np.zeros(3, dtype=int))
    for a, b in zip(before, net.weights):
        np.testing.assert_array_equal(a, b)


def test_float32_overflowing_input_is_caught():
    net = Network([4, 2], dtype=np.float32)
    with pytest.raises(ValueError, match="x_batch contains NaN or inf"):
        net.backprop(np.full((2, 4), 1e39), np.zeros((2, 2)))


@pytest.mark.parametrize("where", ["training_data", "labels", "test_data", "validation", "listed"])
def test_float64_data_past_a_float32_net_s_range_is_refused_before_anything_trains(where):
    """A float32 net given float64 data that overflows float32 used to train, then stop at the minibatch (or, for
    the test set, after the epoch) that held it, naming the minibatch and ``inf``; now SGD refuses before its first
    update, naming the argument, the index and the value as given."""
    rng = np.random.default_rng(0)
    x, y, xt = rng.random((9000, 4)), rng.integers(0, 2, 9000), rng.random((50, 4))
    targets, kwargs = np.eye(2)[y], {}
    if where == "labels":
        targets[5000, 1] = -1e300
        data, said = (x, targets), r"training_data\[1\] holds -1e\+300 at index \(5000, 1\)"
    elif where == "test_data":
        xt[3, 2] = 1e39
        data, kwargs, said = (x, y), {"test_data": (xt, y[:50])}, r"test_data\[0\] holds 1e\+39 at index \(3, 2\)"
    elif where == "validation":
        x[8500, 0] = 1e39                                    # in the last tenth, held out for validation
        data, kwargs, said = (x, y), {"validation": 0.1}, r"validation\[0\] holds 1e\+39 at index \(400, 0\)"
    else:
        x[5000, 3] = -3.5e38                                 # float32's largest is 3.4028235e+38
        data = ([r for r in x], y) if where == "listed" else (x, y)
        said = r"training_data\[0\] holds -3.5e\+38 at index \(5000, 3\)"
    net = Network([4, 3, 2], dtype=np.float32)
    before = [w.copy() for w in net.weights]
    with pytest.raises(ValueError, match=said + r", past the range of the net's float32 \(magnitudes up to "
                       r"3.402823e\+38\): converted to float32 it would be inf; .* nothing was trained"):
        net.SGD(data, 1, 100, 0.1, verbose=False, **kwargs)
    assert all(np.array_equal(a, b) for a, b in zip(before, net.weights))
    x[np.abs(x) > 1] = 3.4028234e38                          # the largest float32, as float64: still in range
    targets[np.abs(targets) > 1] = 1
    xt[np.abs(xt) > 1] = 0.5
    Network([4, 3, 2], dtype=np.float32).SGD(data if where == "listed" else (x, targets), 1, 100, 0.0,
                                             verbose=False, **{"test_data": (xt, y[:50])} if kwargs else {})


def test_listed_training_rows_are_checked_a_chunk_at_a_time_and_named_as_their_slice():
    net = Network([4, 3, 2])
    rows = [np.zeros(4)] * 5000 + [np.zeros(3)] + [np.zeros(4)] * 10          # 4096 rows of 4 a check
    with pytest.raises(ValueError, match=r"training_data\[0\]\[4096:8192\] must have shape \(batch, 4\)"):
        net.SGD((rows, np.zeros(5011, dtype=int)), 1, 10, 0.1, verbose=False)
    rows[5000] = np.array([0.0, np.nan, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"training_data\[0\] contains NaN or inf \(first at index \(5000, 1\)"):
        net.SGD((rows, np.zeros(5011, dtype=int)), 1, 10, 0.1, verbose=False)


@pytest.mark.parametrize("eta,exc", [(np.nan, ValueError), (-1.0, ValueError), ("fast", TypeError)])
def test_bad_eta(eta, exc):
    with pytest.raises(exc, match="eta"):
        Network([4, 2]).update_mini_batch(np.zeros((1, 4)), np.zeros((1, 2)), eta)


def test_bad_sgd_arguments():
    net = Network([4, 2])
    x, y = np.zeros((10, 4)), np.zeros((10, 2))
    with pytest.raises(ValueError, match="mini_batch_size must be >= 1, got 0"):
        net.SGD((x, y), 1, 0, 0.1)
    with pytest.raises(ValueError, match="mini_batch_size must be <= the 10 training samples, got 11"):
        net.SGD((x, y), 1, 11, 0.1)
    with pytest.raises(ValueError, match="epochs must be >= 0, got -1"):
        net.SGD((x, y), -1, 2, 0.1)
    with pytest.raises(TypeError, match="training_data must be a pair"):
        net.SGD(x, 1, 2, 0.1)
    with pytest.raises(ValueError, match=r"training_data\[0\] has 10 samples but training_data\[1\] has 9"):
        net.SGD((x, y[:9]), 1, 2, 0.1)


@pytest.mark.parametrize("first_epoch, exc, message", [(-1, ValueError, "first_epoch must be >= 0, got -1"),
                                                       (True, TypeError, "first_epoch must be an integer, got True"),
                                                       (1.5, TypeError, "first_epoch must be an integer, got 1.5")])
def test_a_bad_first_epoch_is_refused_before_anything_trains(first_epoch, exc, message):
    """An epoch "-1" used to train (at cosine's rate of the epoch before the first), and True was taken as 1."""
    net = Network([4, 2])
    before = [w.copy() for w in net.weights]
    with pytest.raises(exc) as info:
        net.SGD((np.zeros((10, 4)), np.zeros((10, 2))), 1, 2, 0.1, first_epoch=first_epoch, lr_schedule="cosine",
                verbose=False)
    assert str(info.value) == message
    assert all(np.array_equal(a, b) for a, b in zip(before, net.weights)) and not hasattr(net, "history")


def test_bad_assigned_parameters_are_refused_at_once_and_change_nothing():
    net = Network([4, 3, 2])
    before = [a.copy() for a in net.weights + net.biases]
    with pytest.raises(ValueError, match=r"weights\[1\] must have shape \(2, 3\), got \(3, 2\)"):
        net.weights[1] = np.zeros((3, 2))
    with pytest.raises(ValueError, match=r"weights\[1\] \(as float64\) contains NaN or inf"):
        net.weights[1] = np.full((2, 3), np.nan)
    with pytest.raises(TypeError, match=r"biases\[0\] must hold real numbers"):
        net.biases[0] = ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"weights must hold 2 arrays \(one per layer\), got 1"):
        net.weights = [np.zeros((3, 4))]
    with pytest.raises(ValueError, match=r"weights\[1\] must have shape"):       # all checked before any written
        net.weights = [np.zeros((3, 4)), np.zeros((3, 2))]
    with pytest.raises(IndexError, match=r"weights\[2\] out of range: the net has 2 layers"):
        net.weights[2] = np.zeros((2, 3))
    for a, b in zip(before, net.weights + net.biases):
        np.testing.assert_array_equal(a, b)


def test_bad_forward_between_checkpoints_indices():
    net = NetworkWithCheckpointing([4, 3, 2], 1)
    with pytest.raises(ValueError, match=r"0 <= layer_idx_start <= layer_idx_end <= 2, got 2 and 1"):
        net.forward_between_checkpoints(np.zeros((1, 2)), 2, 1)
    with pytest.raises(ValueError, match=r"a has shape \(1, 4\): 4 values per sample"):
        net.forward_between_checkpoints(np.zeros((1, 4)), 1, 2)


def test_a_nan_in_a_later_chunk_of_the_test_data_is_named_at_its_own_row():
    """evaluate() checks its rows chunk by chunk; the error names the row in the whole array."""
    net = Network([4, 3, 2])
    x = np.random.default_rng(0).random((3000, 4))
    x[1500, 2] = np.nan
    with pytest.raises(ValueError, match=r"x_test_data contains NaN or inf \(first at index \(1500, 2\)"):
        net.evaluate(x, np.zeros(3000, dtype=int))


def _softmax_relu_forward(weights, biases, x):
    """A ReLU net with a softmax output, in plain NumPy float64: the reference for where overflow makes NaN."""
    a = x
    for i, (w, b) in enumerate(zip(weights, biases)):
        z = a @ w.T + b.reshape(1, -1)
        if i < len(weights) - 1:
            a = np.maximum(z, 0.0)
        else:
            e = np.exp(z - z.max(axis=1, keepdims=True))
            a = e / e.sum(axis=1, keepdims=True)
    return a


def test_finite_inputs_that_overflow_inside_the_net_get_no_class():
    """Row 1 is finite, but 6 x 1e308 overflows to inf in every hidden unit, and the softmax of inf is NaN (as NumPy
    computes it too): predict used to answer class 0 for it, and evaluate to count it right against label 0."""
    net = Network([6, 5, 3], activation="relu", loss="cross_entropy")
    net.weights = [np.ones((5, 6)), np.ones((3, 5))]
    x = np.vstack([np.zeros(6), np.full(6, 1e308), np.ones(6)])
    with np.errstate(all="ignore"):
        out = _softmax_relu_forward(net.weights, net.biases, x)
    assert np.isfinite(out[[0, 2]]).all() and np.isnan(out[1]).all()
    for call in (lambda: net.predict(x), lambda: net.evaluate(x, np.zeros(3, int)), lambda: net.feedforward(x)):
        with pytest.raises(ValueError, match=r"^(a|x|x_test_data) row 1 makes the net's output nan: a value overflowed "
                                             r"float64 inside the net \(the input is finite"):
            call()
    np.testing.assert_array_equal(net.predict(x[[0, 2]]), out[[0, 2]].argmax(axis=1))
    sigmoid = Network([6, 5, 3])                                 # sigmoid(inf) is 1: an output, and a class
    sigmoid.weights = net.weights
    assert sigmoid.predict(x).shape == (3,)


@pytest.mark.parametrize("kwargs, exc, message", [
    ({"eta": "0.1"}, TypeError, "eta must be a real number, got '0.1'"),
    ({"eta": b"0.1"}, TypeError, "eta must be a real number, got b'0.1'"),
    ({"drop_last": "no"}, TypeError, "drop_last must be True or False, got 'no'"),
    ({"drop_last": 0}, TypeError, "drop_last must be True or False, got 0"),
    ({"drop_last": None}, TypeError, "drop_last must be True or False, got None"),
])
def test_a_string_is_no_rate_and_drop_last_is_a_bool(kwargs, exc, message):
    """``float("0.1")`` reads a string, so eta="0.1" used to train at 0.1; "no" is truthy, so drop_last="no" used
    to drop the samples as True does.  Both are refused before anything trains."""
    net = Network([4, 2])
    before = [w.copy() for w in net.weights + net.biases]
    x, y = np.zeros((11, 4)), np.zeros((11, 2))
    args = {"eta": 0.1, **kwargs}
    eta = args.pop("eta")
    with pytest.raises(exc) as info:
        net.SGD((x, y), 1, 2, eta, verbose=False, **args)
    assert str(info.value) == message
    assert all(np.array_equal(a, b) for a, b in zip(before, net.weights + net.biases))
    with pytest.raises(TypeError, match="eta must be a real number, got '0.1'"):
        net.update_mini_batch(x[:2], y[:2], "0.1")


def test_numpy_numbers_and_bools_are_taken():
    """What the checks above must not refuse: NumPy's scalars are numbers and np.bool_ is a bool."""
    x, y = np.ones((11, 4)), np.zeros((11, 2))
    _, kept = Network([4, 2]).SGD((x, y), 1, 2, np.float32(0.5), verbose=False, drop_last=np.bool_(False))
    with pytest.warns(UserWarning, match="the last 1 of 11 training samples"):
        _, dropped = Network([4, 2]).SGD((x, y), 1, 2, np.float64(0.5), verbose=False, drop_last=np.bool_(True))
    assert (len(kept), len(dropped)) == (6, 5)          # 11 samples in minibatches of 2: the last one kept or not


def test_sizes_may_be_any_iterable_of_integers():
    assert list(Network(iter([10, 5, 3])).sizes) == [10, 5, 3]
    assert list(Network(int(s) for s in "10 5 3".split()).sizes) == [10, 5, 3]
