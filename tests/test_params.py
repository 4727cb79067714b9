"""One owner of the parameters: copies, pickles, swaps, threads and overflowing updates never train wrong weights."""
import copy
import pickle
import threading

import naive
import numpy as np
import pytest

from fastckpt import Network, NetworkWithCheckpointing
from fastckpt.parallel import DataParallel

NETS = [
    (Network, dict(sizes=[12, 9, 9, 4])),
    (NetworkWithCheckpointing, dict(sizes=[12, 9, 9, 4], strategy="revolve(1)")),
    (NetworkWithCheckpointing, dict(sizes=[12, 9, 9, 4], strategy="sqrt", dtype=np.float32)),
    (Network, dict(sizes=[12, 9, 9, 4], optimizer_in_backward=True, loss="cross_entropy", l2=0.01)),
]
COPIES = {"copy": copy.copy, "deepcopy": copy.deepcopy, "pickle": lambda n: pickle.loads(pickle.dumps(n))}


def _train(net, x, y, steps=4):
    for k in range(steps):
        net.update_mini_batch(x[k::steps], y[k::steps], 0.9)


def _params(net):
    return [a.copy() for a in net.weights + net.biases]


@pytest.mark.parametrize("how", COPIES)
@pytest.mark.parametrize("cls, kw", NETS, ids=lambda v: str(v) if isinstance(v, dict) else v.__name__)
def test_a_copy_trains_exactly_like_the_original_and_independently(rng, cls, kw, how):
    x, y = rng.random((40, 12)), rng.random((40, 4))
    y = (y == y.max(axis=1, keepdims=True)).astype(float)
    np.random.seed(3)
    reference = cls(**kw)
    _train(reference, x, y)                      # the original's own training, the reference
    np.random.seed(3)
    original = cls(**kw)
    original.update_mini_batch(x[:5], y[:5], 0.0)   # a workspace exists before the copy
    start = _params(original)
    twin = COPIES[how](original)
    _train(twin, x, y)
    for got, ref, init in zip(_params(twin), _params(reference), start):
        np.testing.assert_array_equal(got, ref)
        assert not np.array_equal(got, init) or got.size == 0
    for got, init in zip(_params(original), start):  # training the copy left the original alone
        np.testing.assert_array_equal(got, init)
    _train(original, x, y)
    for got, ref in zip(_params(original), _params(reference)):
        np.testing.assert_array_equal(got, ref)
    assert twin.dtype == original.dtype and twin.strategy == original.strategy


def test_swapping_two_layers_exchanges_their_values(rng):
    net = Network([5, 5, 5, 5])
    w0, w1, b0, b2 = (a.copy() for a in (net.weights[0], net.weights[1], net.biases[0], net.biases[2]))
    net.weights[0], net.weights[1] = net.weights[1], net.weights[0]
    net.biases[0], net.biases[2] = net.biases[2], net.biases[0]
    np.testing.assert_array_equal(net.weights[0], w1)
    np.testing.assert_array_equal(net.weights[1], w0)
    np.testing.assert_array_equal(net.biases[0], b2)
    np.testing.assert_array_equal(net.biases[2], b0)
    x = rng.random((3, 5))
    ref = naive.forward([w1, w0, net.weights[2].copy()], [b2, net.biases[1].copy(), b0], x)[-1]
    np.testing.assert_allclose(net.feedforward(x), ref, rtol=1e-13)
    net.weights = net.weights[::-1]                  # the whole list at once, reversed
    np.testing.assert_array_equal(net.weights[2], w1)
    np.testing.assert_array_equal(net.weights[1], w0)


def test_assignment_copies_values_in_and_views_write_through(rng):
    net = Network([3, 4, 2], dtype=np.float32)
    value = rng.random((4, 3))
    expected = value.astype(np.float32)
    net.weights[0] = value
    value[...] = 7.0                                   # the net holds a copy, cast to its dtype
    np.testing.assert_array_equal(net.weights[0], expected)
    assert net.weights[0].dtype == np.float32
    net.biases[1] = np.array([0.5, -0.5])              # (n,) is accepted for an (n, 1) bias
    np.testing.assert_array_equal(net.biases[1], [[0.5], [-0.5]])
    net.weights[1][0, 0] = 3.0                         # in place, as the lab's finite-difference checks do
    assert net.params.layers()[0][1][0, 0] == 3.0
    with pytest.raises(ValueError, match=r"weights\[1\] \(as float32\) contains NaN or inf"):
        net.weights[1] = np.full((2, 4), 1e39)            # finite in float64, inf in float32
    assert net.weights[1][0, 0] == 3.0
    best = copy.deepcopy(net.weights)                  # a plain list of independent arrays
    net.weights[0][...] = 0.0
    assert isinstance(best, list) and best[0].any()
    net.weights = best
    np.testing.assert_array_equal(net.weights[0], best[0])


def test_two_threads_on_one_net_give_the_sequential_results(rng):
    sizes = [64, 48, 48, 10]
    x, y = rng.random((256, 64)), rng.random((256, 10))
    np.random.seed(5)
    net = NetworkWithCheckpointing(sizes, strategy="sqrt")
    expected = [net.backprop(x[k::4], y[k::4]) for k in range(4)]
    np.random.seed(5)
    solo = NetworkWithCheckpointing(sizes, strategy="sqrt")
    for _ in range(30):
        solo.update_mini_batch(x, y, 0.5)

    got, errors = {}, []

    def grads(k):
        try:
            for _ in range(30):
                got[k] = net.backprop(x[k::4], y[k::4])
                for a, b in zip(sum(got[k], []), sum(expected[k], [])):
                    np.testing.assert_array_equal(a, b)
        except Exception as exc:                      # surfaced below
            errors.append(exc)
    threads = [threading.Thread(target=grads, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    # one thread trains while another asks for gradients: training is unaffected
    np.random.seed(5)
    shared = NetworkWithCheckpointing(sizes, strategy="sqrt")
    stop = threading.Event()

    def poke():
        while not stop.is_set():
            shared.backprop(x[:7], y[:7])
            shared.feedforward(x[:3])
    side = threading.Thread(target=poke)
    side.start()
    try:
        for _ in range(30):
            shared.update_mini_batch(x, y, 0.5)
    finally:
        stop.set()
        side.join()
    for a, b in zip(_params(shared), _params(solo)):
        np.testing.assert_array_equal(a, b)


def test_an_engine_refuses_a_second_thread_at_once(rng):
    net = Network([200, 300, 10])
    engine = net.engine(512)
    x, y = rng.random((512, 200)), rng.random((512, 10))
    barrier, seen = threading.Barrier(2), []

    def run():
        barrier.wait()
        for _ in range(20):
            try:
                engine.gradients(net.params, x, y)
            except RuntimeError as exc:
                seen.append(str(exc))
    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen and all("already running a step in another thread" in s for s in seen)


@pytest.mark.parametrize("dtype, eta, l2", [(np.float32, 1e40, 0.0), (np.float64, 1e308, 1e3)])
def test_an_update_that_overflows_the_stored_dtype_is_refused_and_changes_nothing(rng, dtype, eta, l2):
    """float32: finite in the float64 the update is computed in, inf once stored.  float64: the L2
    term makes eta * gradient overflow."""
    x, y = rng.random((8, 6)), rng.random((8, 3)) * 0
    for make in (lambda: Network([6, 5, 3], dtype=dtype, l2=l2),
                 lambda: NetworkWithCheckpointing([6, 5, 3], 1, dtype, l2=l2)):
        net = make()
        before = _params(net)
        with pytest.raises(FloatingPointError, match="weights left unchanged"):
            net.update_mini_batch(x, y, eta)
        for a, b in zip(before, _params(net)):
            np.testing.assert_array_equal(a, b)
        with DataParallel(net, threads=2) as dp, pytest.raises(FloatingPointError, match="weights left unchanged"):
            dp.update_mini_batches(x.reshape(2, 4, 6), y.reshape(2, 4, 3), eta)
        for a, b in zip(before, _params(net)):
            np.testing.assert_array_equal(a, b)


def test_checkpointing_net_takes_the_labs_positional_arguments():
    net = NetworkWithCheckpointing([4, 3, 3, 2], 2, np.float32)
    assert net.dtype == np.float32 and net.checkpoint_every_nth_layer == 2 and str(net.strategy) == "every_nth(2)"
    assert Network([4, 2], np.float32).dtype == np.float32


def test_a_searching_strategy_runs_once_at_the_batch_size_of_the_step(rng, monkeypatch):
    from fastckpt import strategies
    calls = []
    real = strategies.Budget.step_search
    monkeypatch.setattr(strategies.Budget, "step_search", lambda self, sizes, batch, *more: calls.append(batch) or
                        real(self, sizes, batch, *more))
    net = NetworkWithCheckpointing([10] + [8] * 6 + [3], strategy="budget(6KiB)")
    assert calls == []                                 # the constructor parses, it does not search
    net.update_mini_batch(rng.random((16, 10)), rng.random((16, 3)), 0.1)
    net.update_mini_batch(rng.random((16, 10)), rng.random((16, 3)), 0.1)
    assert calls == [16]
    tight = NetworkWithCheckpointing([10] + [8] * 6 + [3], strategy="budget(2KiB)")
    before = _params(tight)
    with pytest.raises(ValueError, match=r"budget\(2KiB\).*needs at least"):
        tight.update_mini_batch(rng.random((64, 10)), rng.random((64, 3)), 0.1)
    for a, b in zip(before, _params(tight)):
        np.testing.assert_array_equal(a, b)
    state = np.random.get_state()[1].copy()
    with pytest.raises(ValueError, match=r"segments\(k\): k must be <= the 2 layers"):
        NetworkWithCheckpointing([4, 3, 2], strategy="segments(3)")
    np.testing.assert_array_equal(np.random.get_state()[1], state)     # refused before drawing any weight


def test_plans_compare_and_hash_by_value():
    from fastckpt import plan
    a = plan([10, 8, 8, 3], 16, np.float64, "revolve(1)")
    b = plan([10, 8, 8, 3], 16, np.float64, "revolve(1)")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != plan([10, 8, 8, 3], 16, np.float32, "revolve(1)")
    assert a != plan([10, 8, 8, 3], 8, np.float64, "revolve(1)")
    assert a != plan([10, 8, 8, 3], 16, np.float64, "plain")
    assert str(a.strategy) == "revolve(1)" and a.strategy.slots == 1     # the checked object, not a string
    with pytest.raises(ValueError):
        a.forward_counts[0] = 9                                            # a plan is immutable


def test_no_module_reads_another_objects_private_attributes():
    """The STYLE rule behind the engine surface: ``x._name`` only on ``self``, ``cls`` or ``other``
    (a same-class comparison)."""
    import ast
    import pathlib

    import fastckpt
    paths = sorted(pathlib.Path(fastckpt.__file__).parent.rglob("*.py"))
    assert len(paths) > 10, paths                       # the package's modules, wherever it is installed
    offenders = []
    for path in paths:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls", "other"))
                    and ast.unparse(node) not in ("os._exit", "_os._exit")):   # documented, not private
                offenders.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, offenders


def test_the_engine_surface_refuses_buffers_and_parameters_of_another_layout(rng):
    net, other = Network([6, 5, 3]), Network([6, 4, 3])
    x, y = rng.random((4, 6)), rng.random((4, 3))
    before = _params(net)
    for bad in (np.zeros(7), net.params.new_buffer().astype(np.float32), net.params.new_buffer()[::2], [0.0]):
        with pytest.raises(ValueError, match=r"grad must be a flat float64 buffer of \d+ numbers"):
            net.params.update(bad, 0.1)
    with pytest.raises(ValueError, match=r"out must be a flat float64 buffer"):
        net.engine(4).gradients(net.params, x, y, out=np.zeros(3))
    with pytest.raises(ValueError, match=r"params are for \[6, 4, 3\] in float64, but this engine's plan is for "
                                         r"\[6, 5, 3\]"):
        net.engine(4).gradients(other.params, x, y)
    with pytest.raises(ValueError, match=r"x has 9 samples, more than the 4 this engine's plan is for"):
        net.engine(4).gradients(net.params, rng.random((9, 6)), rng.random((9, 3)))
    for a, b in zip(before, _params(net)):
        np.testing.assert_array_equal(a, b)


def _in_thread(target, seconds=60):
    """Run ``target`` in a thread; fail (not hang) if it has not ended within ``seconds``."""
    errors = []

    def run():
        try:
            target()
        except BaseException as exc:                   # surfaced below
            errors.append(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s"
    if errors:
        raise errors[0]


def test_data_parallel_after_a_swap_and_after_close(rng):
    net = Network([3, 3, 3])
    net.weights[0], net.weights[1] = net.weights[1], net.weights[0]     # pending until the next access
    xs, ys = rng.random((2, 5, 3)), rng.random((2, 5, 3))
    dp = DataParallel(net, threads=2)
    _in_thread(lambda: dp.update_mini_batches(xs, ys, 0.1))              # used to deadlock on the flush
    dp.close()
    with pytest.raises(RuntimeError, match="this DataParallel is closed"):
        dp.update_mini_batches(xs, ys, 0.1)                              # used to skip every odd minibatch


def test_evaluate_and_sgd_are_each_one_call_for_other_threads(rng):
    net = Network([2, 2])
    net.biases[0] = np.zeros(2)
    x, y = rng.random((3 * 4096, 2)) + 0.01, np.zeros(3 * 4096, dtype=int)
    sure = [np.array([[5., 5.], [-5., -5.]]), np.array([[-5., -5.], [5., 5.]])]   # every sample right / wrong
    stop, seen = threading.Event(), set()

    def flip():
        k = 0
        while not stop.is_set():
            net.weights[0] = sure[k]
            k ^= 1
    side = threading.Thread(target=flip)
    side.start()
    try:
        for _ in range(20):
            seen.add(net.evaluate(x, y))
    finally:
        stop.set()
        side.join()
    assert seen <= {0.0, 1.0}, seen                                     # chunks never see two weights
    d1, d2 = (rng.random((6, 2)), rng.random((6, 2))), (rng.random((6, 2)), rng.random((6, 2)))
    orders = []
    for first, second in ((d1, d2), (d2, d1)):
        np.random.seed(1)
        solo = Network([2, 2])
        solo.SGD(first, 1, 2, 1.0, verbose=False)
        solo.SGD(second, 1, 2, 1.0, verbose=False)
        orders.append(_params(solo))
    for _ in range(5):
        np.random.seed(1)
        shared = Network([2, 2])
        threads = [threading.Thread(target=shared.SGD, args=(d, 1, 2, 1.0), kwargs={"verbose": False})
                   for d in (d1, d2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = _params(shared)
        assert any(all(np.array_equal(a, b) for a, b in zip(got, order)) for order in orders)


def test_an_engine_step_is_one_call_from_gradients_to_update(rng, monkeypatch):
    net = Network([4, 3, 2])
    engine = net.engine(5)
    x, y = rng.random((5, 4)), rng.random((5, 2))
    real = type(net.params).update

    def meddle(params, grad, eta):                       # another caller, between the gradients and the update
        engine.gradients(Network([4, 3, 2]).params, x, y)
        real(params, grad, eta)
    monkeypatch.setattr(type(net.params), "update", meddle)
    with pytest.raises(RuntimeError, match="already running a step"):
        engine.sgd(net.params, x, y, 0.5)


def test_more_misuse_is_refused_before_anything_changes(rng):
    net = Network([3, 4, 2], dtype=np.float32, l2=1e-3)
    x, y = rng.random((5, 3)), rng.random((5, 2))
    engine = net.engine(5)
    for bad in (None, "fast", float("nan"), -1.0):
        with pytest.raises((TypeError, ValueError), match="eta must be"):
            net.params.update(net.params.new_buffer(), bad)
        with pytest.raises((TypeError, ValueError), match="eta must be"):
            engine.sgd(net.params, x, y, bad)
    for alias in (net.params.flat, engine.grad):
        with pytest.raises(ValueError, match="out must be a buffer of its own"):
            engine.gradients(net.params, x, y, out=alias)
    with pytest.raises(ValueError, match=r"l2 must be one number or one per layer \(2\), got 1 values"):
        type(engine)(net.plan(5), l2=(0.1,))
    with pytest.raises(ValueError, match=r"y_test_data holds labels from 0 to 100, but the net has 2 outputs"):
        net.evaluate(x, np.array([0, 1, 1, 0, 100]))
    with pytest.raises(ValueError, match="y_test_data contains NaN"):
        net.evaluate(x, np.full((5, 2), np.nan))
    with pytest.raises(TypeError, match="masked array"):
        net.evaluate(np.ma.array(x, mask=x > 0.5), y.argmax(axis=1))
    with pytest.raises(TypeError, match=r"weights\[0\] is a masked array"):
        net.weights[0] = np.ma.array(np.ones((4, 3)), mask=True)
    before = _params(net)
    x_bad = rng.random((20, 3))
    x_bad[13, 1] = np.nan
    with pytest.raises(ValueError, match=r"training_data\[0\] contains NaN or inf \(first at index \(13, 1\)"):
        net.SGD((x_bad, rng.random((20, 2))), 1, 2, 0.5, verbose=False)
    for a, b in zip(before, _params(net)):                     # refused before the first update
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="minibatches of samples"):
        DataParallel(net, threads=1).update_mini_batches([1.0], [2.0], 0.1)
    state = net.params.__getstate__()
    state["flat"][0] = np.inf
    with pytest.raises(ValueError, match="pickled parameters of .* hold NaN or inf"):
        net.params.copy().__setstate__(state)


def test_a_float32_penalty_is_summed_where_it_cannot_overflow(rng):
    net = Network([3, 4, 2], dtype=np.float32, l2=1e-3)
    net.weights[0] = np.full((4, 3), 1e20)                      # squares overflow float32, not float64
    net.backprop(rng.random((5, 3)), rng.random((5, 2)))
    assert np.isfinite(net.last_loss) and net.last_loss == pytest.approx(0.5e-3 * 12 * 1e40, rel=1e-5)


def test_a_deep_copy_while_another_thread_trains_is_of_one_moment():
    """Parameters and Adam's state of a copy come from the same step (the state was copied outside the lock:
    5 of 85 copies had it steps ahead of the parameters)."""
    import hashlib

    from fastckpt.engine.sharing import fix_threads

    def make():
        np.random.seed(5)
        return Network([100, 200, 200, 10], optimizer="adam")
    rng = np.random.default_rng(2)
    x, y = rng.random((64, 100)), np.eye(10)[rng.integers(0, 10, 64)]
    digest = lambda a: hashlib.sha1(a.tobytes()).hexdigest()              # noqa: E731
    fix_threads(1)                                      # one trajectory, bit for bit, whatever the load
    try:
        _copies_of_one_moment(make, x, y, digest)
    finally:
        fix_threads(None)


def _copies_of_one_moment(make, x, y, digest):
    import copy

    twin = make()
    at = {digest(twin.params.flat): 0, digest(twin.optimizer_state.buffers[0]): 0}
    for k in range(1, 151):
        twin.update_mini_batch(x, y, 0.001)
        at[digest(twin.params.flat)], at[digest(twin.optimizer_state.buffers[0])] = k, k
    net = make()
    trainer = threading.Thread(target=lambda: [net.update_mini_batch(x, y, 0.001) for _ in range(150)])
    trainer.start()
    seen = []
    while trainer.is_alive():
        c = copy.deepcopy(net)
        seen.append((at.get(digest(c.params.flat), -1), at.get(digest(c.optimizer_state.buffers[0]), -2),
                     c.optimizer_state.steps))
    trainer.join()
    assert seen and all(p == m == s for p, m, s in seen), [t for t in seen if len(set(t)) > 1][:3]


def test_one_engine_across_batch_sizes_rates_and_verbs_equals_a_fresh_engine_each_step(rng):
    # the engine writes its record values only when they change (NOTE [ A short step ]): a step after
    # another batch size, rate, scale or verb must see its own values, as a net built for it does
    a = Network([5, 4, 3], l2=1e-2)
    b = copy.deepcopy(a)
    for batch, eta in [(7, 0.5), (3, 0.1), (7, 0.0), (1, 2.0), (3, 0.1), (3, 0.3)]:
        x, y = rng.random((batch, 5)), rng.random((batch, 3))
        a.update_mini_batch(x, y, eta)
        a.engine(7).gradients(a.params, x[:2], y[:2], scale=0.25)            # another verb in between
        b = copy.deepcopy(b)                                                 # a copy has no engine yet
        b.update_mini_batch(x, y, eta)
        np.testing.assert_array_equal(a.params.flat, b.params.flat)
        assert a.last_loss == b.last_loss


def test_a_scale_given_as_an_array_and_changed_in_place_is_read_again(rng):
    # the engine compares the values it last wrote: an array changed in place must not pass for the old value
    net = Network([6, 5, 3])
    x, y = rng.random((10, 6)), rng.random((10, 3))
    ref = copy.deepcopy(net)
    ref.engine(10).gradients(ref.params, x, y, scale=2.0)
    want = ref.engine(10).grad.copy()
    engine, scale = net.engine(10), np.array(1.0)
    engine.gradients(net.params, x, y, scale=scale)
    scale[...] = 2.0
    engine.gradients(net.params, x, y, scale=scale)
    blocks = [slice(a, b) for a, b in net.params.blocks]
    for block in blocks:
        np.testing.assert_array_equal(engine.grad[block], want[block])
    engine.gradients(net.params, x, y, scale=2.0)
    for block in blocks:
        np.testing.assert_array_equal(engine.grad[block], want[block])
    for bad in ("2", float("nan"), -1.0, np.array([1.0, 2.0])):
        with pytest.raises((TypeError, ValueError), match="scale must be"):
            engine.gradients(net.params, x, y, scale=bad)


def test_an_optimizer_state_of_another_net_is_refused_before_any_step(rng):
    net = Network([6, 5, 3], optimizer="momentum")
    x, y = rng.random((10, 6)), rng.random((10, 3))
    before = net.params.flat.copy()
    for other in (Network([6, 4, 3], optimizer="momentum"), Network([6, 5, 3], optimizer="adam", dtype=np.float32)):
        for fused in (False, True):
            engine = Network([6, 5, 3], optimizer="momentum", optimizer_in_backward=fused).engine(10)
            with pytest.raises(ValueError, match="state is for .* parameters .* give each net its own"):
                engine.step(net.params, x, y, 0.1, other.optimizer_state)
        with pytest.raises(ValueError, match="give each net its own optimizer state"):
            other.optimizer_state.apply(net.params, net.params.new_buffer(), 0.1)
    np.testing.assert_array_equal(net.params.flat, before)
    with pytest.raises(TypeError, match="params must be a net's Parameters .* got str"):
        net.engine(10).sgd("params", x, y, 0.1)


@pytest.mark.parametrize("fused", [False, True])
def test_a_step_whose_input_is_a_view_of_what_it_writes_steps_as_on_a_copy(rng, fused):
    net = Network([4, 6, 5, 4], optimizer_in_backward=fused)
    x_all, y_all = rng.random((10, 4)), rng.random((10, 4))
    engine = net.engine(10)
    engine.gradients(net.params, x_all, y_all)
    with pytest.raises(ValueError, match="out must be a buffer of its own"):
        engine.gradients(net.params, x_all, y_all, out=engine.grad)
    for x in (engine.grad[:8].reshape(2, 4), engine.workspace.work[:8].reshape(2, 4)):
        ref = copy.deepcopy(net)
        ref.update_mini_batch(x.copy(), y_all[:2], 0.5)
        net.update_mini_batch(x, y_all[:2], 0.5)
        np.testing.assert_array_equal(net.params.flat, ref.params.flat)
    y = engine.workspace.work[:8].reshape(2, 4)                 # the targets too
    ref = copy.deepcopy(net)
    ref.update_mini_batch(x_all[:2], y.copy(), 0.5)
    net.update_mini_batch(x_all[:2], y, 0.5)
    np.testing.assert_array_equal(net.params.flat, ref.params.flat)
    out = net.params.new_buffer()                              # an accumulator whose memory is the input
    x = out[:8].reshape(2, 4)
    x[...] = x_all[:2]
    want = copy.deepcopy(net).engine(10)
    want.gradients(net.params, x.copy(), y_all[:2])
    engine.gradients(net.params, x, y_all[:2], out=out)
    for a, b in net.params.blocks:
        np.testing.assert_array_equal(out[a:b], want.grad[a:b])
