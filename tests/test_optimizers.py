"""optimizer=: momentum, Nesterov, Adam and AdamW against NumPy twins of PyTorch's formulas, their state in the
plan, checkpointed steps bit-identical to plain ones, copies, refused updates and bad settings."""
import copy
import pickle

import naive
import numpy as np
import pytest

import fastckpt
from fastckpt import Network, NetworkWithCheckpointing
from fastckpt.core.layout import layer_views
from fastckpt.optimizers import SGD, Adam, AdamW, Momentum

OPTIMIZERS = {
    "sgd": SGD(),
    "momentum": Momentum(),
    "nesterov": Momentum(0.8, nesterov=True),
    "adam": Adam(),
    "adam-l2": Adam(betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05),
    "adamw": AdamW(),
    "adamw-strong": AdamW(betas=(0.5, 0.9), eps=1e-4, weight_decay=0.3),
}
STRATEGIES = ["plain", "every_nth(2)", "sqrt", "revolve(1)", "budget(6KiB)", "fit(96KiB)"]


class Twin:
    """The parameters of a net as plain arrays, stepped by naive's formulas."""

    def __init__(self, net, opt):
        self.opt = opt
        self.params = [np.array(p, dtype=np.float64) for p in list(net.weights) + list(net.biases)]
        self.state = [[np.zeros_like(p) for p in self.params] for _ in range(opt.slots)]
        self.t = 0

    def step(self, grads, lr):
        self.t += 1
        opt = self.opt
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if opt.slots == 0:
                self.params[i] = p - lr * g
            elif opt.slots == 1:
                self.params[i], self.state[0][i] = naive.momentum_update(p, g, self.state[0][i], lr, opt.momentum,
                                                                         opt.nesterov)
            else:
                self.params[i], self.state[0][i], self.state[1][i] = naive.adam_update(
                    p, g, self.state[0][i], self.state[1][i], self.t, lr, opt.betas, opt.eps, opt.weight_decay,
                    isinstance(opt, AdamW))


def _assert_close(got, ref, rtol=1e-12):
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * (np.abs(b).max() + 1e-300))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_twenty_steps_of_given_gradients_follow_the_formula(rng, name):
    """The update alone: 20 random gradients (the padding between blocks full of NaN, never read)."""
    opt = OPTIMIZERS[name]
    np.random.seed(6)
    net = Network([7, 5, 3], optimizer=opt)
    twin = Twin(net, opt)
    for _ in range(20):
        grad = np.full_like(net.params.flat, np.nan)
        ws, bs = layer_views(grad, net.sizes)
        grads = [rng.standard_normal(w.shape) * 10.0 ** rng.integers(-3, 2) for w in ws + bs]
        for view, g in zip(ws + bs, grads):
            view[...] = g
        lr = float(rng.uniform(0.001, 0.2))
        net.optimizer_state.apply(net.params, grad, lr)
        twin.step([g.reshape(p.shape) for g, p in zip(grads, twin.params)], lr)
        _assert_close(list(net.weights) + list(net.biases), twin.params)
    assert net.optimizer_state.steps == (20 if opt.slots else 0)
    state = [[np.array(v) for v in layer_views(buf, net.sizes)[0] + layer_views(buf, net.sizes)[1]]
             for buf in net.optimizer_state.buffers]
    for got, ref in zip(state, twin.state):
        _assert_close(got, [r.reshape(g.shape) for g, r in zip(got, ref)])


@pytest.mark.parametrize("fused", [False, True], ids=["after", "in-backward"])
@pytest.mark.parametrize("loss", ["quadratic", "cross_entropy"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_twenty_training_steps_follow_the_twin(rng, name, loss, fused):
    """Whole steps, with the gradients of the NumPy twin at the twin's own parameters; the optimizer
    applied after the backward pass or inside it, layer by layer."""
    opt = OPTIMIZERS[name]
    sizes, hidden = [8, 6, 5, 4], ["relu", "tanh"]
    np.random.seed(7)
    net = NetworkWithCheckpointing(sizes, strategy="sqrt", optimizer=opt, loss=loss, activation=hidden, l2=0.01,
                                   init="he", optimizer_in_backward=fused)
    twin = Twin(net, opt)
    x = rng.standard_normal((10, 8))
    y = np.eye(4)[rng.integers(0, 4, 10)]
    n = len(sizes) - 1
    for _ in range(20):
        net.update_mini_batch(x, y, 0.05)
        nabla_b, nabla_w = naive.backprop_net(twin.params[:n], twin.params[n:], x, y, hidden, loss, net.l2)
        twin.step(nabla_w + nabla_b, 0.05)
    _assert_close(list(net.weights) + list(net.biases), twin.params)


@pytest.mark.parametrize("fused", [False, True], ids=["after", "in-backward"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_strategy_is_bit_identical_to_plain(rng, name, fused):
    opt = OPTIMIZERS[name]
    sizes = [9, 8, 7, 6, 8, 5, 7, 4]
    x, y = rng.standard_normal((6, 9)), np.eye(4)[rng.integers(0, 4, 6)]
    kwargs = {"optimizer": opt, "optimizer_in_backward": fused, "activation": "relu", "init": "he"}
    np.random.seed(4)
    plain = Network(sizes, **kwargs)
    for _ in range(4):
        plain.update_mini_batch(x, y, 0.05)
    for strategy in STRATEGIES:
        np.random.seed(4)
        net = NetworkWithCheckpointing(sizes, strategy=strategy, **kwargs)
        for _ in range(4):
            net.update_mini_batch(x, y, 0.05)
        for a, b in zip(plain.weights + plain.biases, net.weights + net.biases):
            np.testing.assert_array_equal(a, b, err_msg=strategy)
        for a, b in zip(plain.optimizer_state.buffers, net.optimizer_state.buffers):
            np.testing.assert_array_equal(a, b, err_msg=strategy)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", [name for name in OPTIMIZERS if OPTIMIZERS[name].slots])
def test_an_optimizer_in_backward_is_bit_identical_to_one_after_it(rng, name, dtype):
    """Each layer's gradient is the same, and so is each element's update: only when it runs differs."""
    sizes = [9, 8, 7, 6, 8, 5, 7, 4]
    x, y = rng.standard_normal((6, 9)), np.eye(4)[rng.integers(0, 4, 6)]
    nets = []
    for fused in (False, True):
        np.random.seed(4)
        net = NetworkWithCheckpointing(sizes, dtype=dtype, strategy="revolve(2)", optimizer=OPTIMIZERS[name],
                                       optimizer_in_backward=fused, activation="tanh", init="xavier", l2=0.02)
        for _ in range(6):
            net.update_mini_batch(x, y, 0.05)
        nets.append(net)
    after, fused = nets
    assert after.optimizer_state.steps == fused.optimizer_state.steps == 6
    for a, b in zip(after.weights + after.biases + after.optimizer_state.buffers,
                    fused.weights + fused.biases + fused.optimizer_state.buffers):
        np.testing.assert_array_equal(a, b)


def test_a_refused_layer_in_backward_is_left_unchanged_and_the_layers_above_are_updated(rng):
    np.random.seed(3)
    net = Network([5, 4, 3, 2], optimizer="momentum", optimizer_in_backward=True)
    x, y = rng.random((4, 5)), rng.random((4, 2))
    net.update_mini_batch(x, y, 0.1)
    net.optimizer_state.buffers[0][:] = 0.0
    w0, b0 = layer_views(net.optimizer_state.buffers[0], net.sizes)
    w0[0][0, 0] = np.inf                                     # the velocity goes inf in layer 0 only
    before = [np.array(a) for a in list(net.weights) + list(net.biases)]
    with pytest.raises(FloatingPointError, match="layer 0's parameters or state NaN or inf, so that layer was left "
                                                 "unchanged; with the optimizer in backward, layers 1..2 are already "
                                                 "updated"):
        net.update_mini_batch(x, y, 0.1)
    after = list(net.weights) + list(net.biases)
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[3], before[3])
    assert not np.array_equal(after[2], before[2]) and net.optimizer_state.steps == 2


def test_the_default_is_the_labs_sgd(rng):
    np.random.seed(1)
    lab = Network([6, 5, 3])
    np.random.seed(1)
    sgd = Network([6, 5, 3], optimizer="sgd")
    x, y = rng.random((4, 6)), rng.random((4, 3))
    for net in (lab, sgd):
        net.update_mini_batch(x, y, 0.5)
    assert lab.optimizer == SGD() and lab.optimizer_state.buffers == []
    for a, b in zip(lab.weights + lab.biases, sgd.weights + sgd.biases):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["momentum", "adam", "adamw"])
def test_the_plan_counts_the_state_as_its_own_line(name):
    sizes, batch = [784, 256, 64, 10], 100
    net = Network(sizes, optimizer=name)
    slots = {"momentum": 1, "adam": 2, "adamw": 2}[name]
    got, sgd = net.plan(batch).bytes(), fastckpt.plan(sizes, batch).bytes()
    assert sgd["optimizer_state"] == 0
    assert got["optimizer_state"] == slots * got["parameters"] == net.optimizer_state.nbytes
    assert got["total"] - sgd["total"] == got["optimizer_state"]
    assert got["total"] == sum(v for k, v in got.items() if k not in ("total", "activation_memory"))
    assert f", {name}\n" in net.plan(batch).describe().split("kept")[0]
    assert fastckpt.plan(sizes, batch, optimizer=name) == net.plan(batch) != fastckpt.plan(sizes, batch)


def test_fit_leaves_room_for_the_state():
    """Adam's fit(L) is SGD's fit(L - the state's bytes): the same schedule, the state on top."""
    sizes, batch = [64] * 12, 512
    plain = fastckpt.plan(sizes, batch, strategy="plain", optimizer="adam", blas_threads=1).bytes()
    with pytest.raises(fastckpt.InfeasiblePlan, match="optimizer state") as info:
        fastckpt.plan(sizes, batch, strategy="fit(1)", optimizer="adam", blas_threads=1)
    limit = (plain["total"] + info.value.minimum_bytes) // 2
    adam = fastckpt.plan(sizes, batch, strategy=f"fit({limit})", optimizer="adam", blas_threads=1)
    sgd = fastckpt.plan(sizes, batch, strategy=f"fit({limit - plain['optimizer_state']})", blas_threads=1)
    assert adam.bytes()["total"] <= limit and adam.recompute_factor > 1 and adam.tree == sgd.tree
    assert adam.bytes()["total"] - sgd.bytes()["total"] == plain["optimizer_state"] == 2 * plain["parameters"]
    assert fastckpt.plan(sizes, batch, strategy=f"fit({limit})", blas_threads=1).recompute_factor \
        < adam.recompute_factor


@pytest.mark.parametrize("name", ["momentum", "adam", "adamw"])
def test_copies_and_pickles_carry_the_state(rng, name):
    np.random.seed(2)
    net = NetworkWithCheckpointing([6, 5, 4, 3], strategy="sqrt", optimizer=name)
    x, y = rng.random((5, 6)), rng.random((5, 3))
    for _ in range(3):
        net.update_mini_batch(x, y, 0.1)
    copies = [copy.deepcopy(net), copy.copy(net), pickle.loads(pickle.dumps(net))]
    for other in [net] + copies:
        other.update_mini_batch(x, y, 0.1)
    for other in copies:
        assert other.optimizer_state.steps == 4 and other.optimizer == net.optimizer
        assert other.optimizer_state.buffers[0] is not net.optimizer_state.buffers[0]
        for a, b in zip(net.weights + net.biases + net.optimizer_state.buffers,
                        other.weights + other.biases + other.optimizer_state.buffers):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["momentum", "adam", "adamw"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_an_update_that_would_go_non_finite_changes_nothing(rng, name, dtype):
    np.random.seed(3)
    net = Network([4, 3, 2], optimizer=name, dtype=dtype)
    x, y = rng.random((3, 4)), rng.random((3, 2))
    net.update_mini_batch(x, y, 0.1)
    big = np.finfo(dtype).max
    net.optimizer_state.buffers[0][:] = big / 4           # a velocity, or an m, that the next step overflows
    before = [np.array(a) for a in list(net.weights) + list(net.biases) + net.optimizer_state.buffers]
    with pytest.raises(FloatingPointError, match=f"the {name} update would make a parameter or its state NaN or inf"):
        net.update_mini_batch(x, y, 10.0)
    grad = net.params.new_buffer()
    grad[0] = big
    net.optimizer_state.buffers[0][:] = before[-net.optimizer_state.optimizer.slots]
    with pytest.raises(FloatingPointError):              # p - 10 g, or v = g^2, overflows
        net.optimizer_state.apply(net.params, grad, 10.0)
    assert net.optimizer_state.steps == 1
    for a, b in zip(before, list(net.weights) + list(net.biases) + net.optimizer_state.buffers):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"optimizer": "rmsprop"}, ValueError, "optimizer must be 'sgd', 'momentum', 'adam', 'adamw' or an optimizer "
                                           "such as fastckpt.optimizers.Adam(betas=(0.9, 0.99)), got 'rmsprop'"),
    ({"optimizer": None}, ValueError, "got None"),
])
def test_bad_optimizers_are_refused(kwargs, error, message):
    for cls in (Network, NetworkWithCheckpointing):
        with pytest.raises(error) as info:
            cls([4, 3, 2], **kwargs)
        assert message in str(info.value)


@pytest.mark.parametrize("make, message", [
    (lambda: Momentum(1.5), "momentum must be in [0, 1], got 1.5"),
    (lambda: Momentum(-0.1), "momentum must be finite and >= 0, got -0.1"),
    (lambda: Momentum(nesterov="yes"), "nesterov must be True or False, got 'yes'"),
    (lambda: Adam(betas=(0.9,)), "betas must be a pair (beta1, beta2), got (0.9,)"),
    (lambda: Adam(betas=(0.9, 1.5)), "betas[1] must be in [0, 1), got 1.5"),
    (lambda: Adam(eps=-1), "eps must be finite and >= 0, got -1"),
    (lambda: AdamW(weight_decay=float("nan")), "weight_decay must be finite and >= 0, got nan"),
    (lambda: Adam(eps=True), "eps must be a real number, got True"),      # it used to be eps=1.0
    (lambda: Adam(betas=(True, 0.9)), "betas[0] must be a real number, got True"),
    (lambda: Momentum(True), "momentum must be a real number, got True"),
    (lambda: AdamW(weight_decay=False), "weight_decay must be a real number, got False"),
])
def test_bad_hyper_parameters_are_refused_with_their_names(make, message):
    with pytest.raises((ValueError, TypeError)) as info:
        make()
    assert message in str(info.value)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", ["nesterov", "adam-l2", "adamw"])
def test_threads_step_the_optimizer_on_the_mean_gradient(rng, name, threads):
    """DataParallel: the mean of the minibatches' gradients (summed in minibatch order), then the step."""
    from fastckpt.parallel import DataParallel
    sizes = [12, 9, 7, 4]
    np.random.seed(2)
    net = Network(sizes, optimizer=OPTIMIZERS[name], activation="tanh", init="xavier")
    ref = copy.deepcopy(net)
    xs, ys = rng.random((3, 5, 12)), np.eye(4)[rng.integers(0, 4, (3, 5))]
    with DataParallel(net, threads=threads) as dp:
        for _ in range(4):
            dp.update_mini_batches(xs, ys, 0.05)
            mean = ref.params.new_buffer()
            for x, y in zip(xs, ys):
                ref.engine(5).gradients(ref.params, x, y, out=mean, add=True)
            mean *= 1.0 / 3
            ref.optimizer_state.apply(ref.params, mean, 0.05)
        parts = dp.predicted_bytes(5)
    assert net.optimizer_state.steps == 4
    assert parts["optimizer_state"] == OPTIMIZERS[name].slots * net.params.flat.nbytes
    for a, b in zip(net.weights + net.biases + net.optimizer_state.buffers,
                    ref.weights + ref.biases + ref.optimizer_state.buffers):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_an_interrupt_right_after_the_step_kernel_leaves_its_count_with_the_update(rng, monkeypatch, optimizer):
    """Ctrl-C as the step kernel returned left the parameters updated and the count not (Adam's next steps then
    used the wrong bias correction): the kernel now counts its own step."""
    import fastckpt.core.optimizers as optimizers
    from fastckpt.parallel import DataParallel

    xs, ys = rng.random((2, 8, 12)), rng.random((2, 8, 4))
    nets = []
    for _ in range(2):
        np.random.seed(0)
        nets.append(Network([12, 9, 4], optimizer=optimizer))
    with DataParallel(nets[0], threads=2, adapt=False) as dp:
        for _ in range(3):
            dp.update_mini_batches(xs, ys, 0.05)
    name = f"counted_{optimizer}_step"
    real = getattr(optimizers, name)

    def interrupted(*args):
        real(*args)
        raise KeyboardInterrupt
    with DataParallel(nets[1], threads=2, adapt=False) as dp:
        monkeypatch.setattr(optimizers, name, interrupted)
        with pytest.raises(KeyboardInterrupt):
            dp.update_mini_batches(xs, ys, 0.05)
        monkeypatch.setattr(optimizers, name, real)
        assert nets[1].optimizer_state.steps == 1
        for _ in range(2):
            dp.update_mini_batches(xs, ys, 0.05)
    np.testing.assert_array_equal(nets[1].params.flat, nets[0].params.flat)
    state = nets[1].optimizer_state
    old = dict(state.__dict__, steps=state.steps)              # a pickle made when the count was an int
    del old["_steps"]
    again = pickle.loads(pickle.dumps(state))
    again.__setstate__(old)
    assert again.steps == 3


def _twin_finite(results, dtypes):
    """True when every result is finite once stored in its array's dtype (the check's own question)."""
    with np.errstate(all="ignore"):
        return all(np.isfinite(np.asarray(r, dtype=np.float64).astype(d)).all() for r, d in zip(results, dtypes))


def _kernel_case(rng, name, dtype, scale):
    """Random hyper-parameters (some extreme) and inputs of magnitude ``scale``, for one kernel step."""
    from fastckpt.kernels.optimizers import _adam_safe, _largest, _momentum_safe
    n = 37
    eta = float(10.0 ** rng.uniform(-8, 8))
    p, g, s1, s2 = (rng.uniform(-1, 1, n) * scale for _ in range(4))
    s2 = np.abs(s2)
    arrays = [np.array(a, dtype=dtype) for a in (p, g, s1, s2)]
    if name == "momentum":
        mu = float(rng.uniform(0, 3))
        safe = _momentum_safe(eta, mu, _largest(arrays[0]))
        return arrays[:3], (eta, mu, bool(rng.integers(2))), safe
    beta1, beta2 = float(rng.uniform(0, 1)), float(rng.uniform(0, 1))
    eps, decay, t = float(10.0 ** rng.uniform(-12, 2)), float(10.0 ** rng.uniform(-6, 3)), int(rng.integers(1, 5))
    hyper = (eta, beta1, beta2, eps, decay, bool(rng.integers(2)), 1 - beta1 ** t, 1 - beta2 ** t)
    return arrays, hyper, _adam_safe(*hyper[:5], *hyper[6:], _largest(arrays[0]))


@pytest.mark.parametrize("name", ["momentum", "adam"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_step_kernels_refuse_exactly_the_updates_that_go_non_finite(rng, name, dtype):
    """NOTE [ The check before an update ]: inputs at the shortcut's own bound, just past it and anywhere up to the
    dtype's largest value; the kernel updates exactly when the NumPy twin's results are all finite, and then to the
    twin's numbers."""
    from fastckpt.kernels import adam_step, momentum_step
    top = float(np.finfo(dtype).max)
    seen = {"short": 0, "refused": 0, "applied": 0}
    for case in range(600):
        kind = case % 3
        arrays, hyper, safe = _kernel_case(rng, name, dtype, 1.0)
        if safe > 0:
            seen["short"] += 1
        scale = safe if kind == 0 and safe > 0 else (safe * 1.5 if kind == 1 and safe > 0
                                                       else top * 10.0 ** rng.uniform(-4, 0))
        arrays = [np.array(np.clip(a / max(np.abs(a).max(), 1e-300) * scale, -top, top), dtype=dtype) for a in arrays]
        if kind == 0 and safe > 0:
            for a in arrays:
                a[0] = np.copysign(np.array(safe, dtype=dtype), a[0])
        before = [a.copy() for a in arrays]
        blocks = np.array([[0, arrays[0].size]], dtype=np.int64)
        wide = [a.astype(np.float64) for a in before]
        with np.errstate(all="ignore"):
            if name == "momentum":
                ok = momentum_step(*arrays, *hyper, blocks)
                want = naive.momentum_update(*wide, *hyper)
            else:
                eta, beta1, beta2, eps, decay, decoupled, c1, c2 = hyper
                ok = adam_step(*arrays, *hyper, blocks)
                t = next(k for k in range(1, 5) if 1 - beta1 ** k == c1 and 1 - beta2 ** k == c2)
                want = naive.adam_update(*wide, t, eta, (beta1, beta2), eps, decay, decoupled)
        written = [arrays[0]] + arrays[2:]                # the parameters and the state: g is only read
        finite = _twin_finite(want, [a.dtype for a in written])
        if name == "adam":                                # and the denominator: inf would make the update 0
            with np.errstate(all="ignore"):
                finite = finite and bool(np.isfinite(np.sqrt(want[2] / hyper[7]) + hyper[3]).all())
        assert ok == finite, (case, hyper, scale, safe)
        seen["applied" if ok else "refused"] += 1
        if not ok:
            for a, b in zip(arrays, before):
                np.testing.assert_array_equal(a, b)
        else:
            for a, b in zip(written, want):
                np.testing.assert_allclose(a, np.asarray(b).astype(a.dtype), rtol=1e-5 if dtype == np.float32
                                           else 1e-12, atol=0)
    assert seen["short"] > 300 and seen["refused"] > 50 and seen["applied"] > 300, seen


def test_an_adam_step_whose_denominator_overflows_is_refused_not_zero():
    """``v / (1 - beta2**t)`` past float64's range: the denominator is inf and the update would be 0, every result
    finite and wrong (PyTorch's sqrt(v) / sqrt(c2) gives p = 0.99684 here)."""
    from fastckpt.kernels import adam_step
    p, g, m, v = (np.array([x]) for x in (1.0, 1e153, 0.0, 1e306))
    before = [a.copy() for a in (p, g, m, v)]
    assert not adam_step(p, g, m, v, 0.1, 0.9, 0.999, 1e-8, 0.0, False, 0.1, 0.001, np.array([[0, 1]]))
    for a, b in zip((p, g, m, v), before):
        np.testing.assert_array_equal(a, b)
    net = Network([1, 1], optimizer="adam")
    net.optimizer_state.buffers[1][:] = 1e306
    state = [np.array(a) for a in list(net.weights) + list(net.biases) + net.optimizer_state.buffers]
    with pytest.raises(FloatingPointError, match="the adam update would make a parameter or its state NaN or inf, "
                                                 "or overflow on its way; weights and state left unchanged"):
        net.update_mini_batch(np.ones((1, 1)), np.ones((1, 1)), 0.1)
    for a, b in zip(state, list(net.weights) + list(net.biases) + net.optimizer_state.buffers):
        np.testing.assert_array_equal(a, b)
