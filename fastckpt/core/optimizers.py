"""Optimizers and their state: what a training step does with the gradient, after the lab's plain SGD.

The learning rate is the lab's ``eta``, given to every step (``update_mini_batch``,
``SGD``); an optimizer holds the rest of its hyper-parameters.  The update formulas
are PyTorch's, for a gradient ``g_t`` at step ``t`` (from 1) and learning rate ``eta``:

* :class:`SGD` (``"sgd"``, the lab's): ``p -= eta * g``
  (https://pytorch.org/docs/stable/generated/torch.optim.SGD.html with ``momentum=0``).
* :class:`Momentum` (``"momentum"``): ``torch.optim.SGD`` with ``momentum=mu`` and no
  dampening: ``b_t = mu * b_{t-1} + g_t`` (``b_1 = g_1``), then ``p -= eta * b_t``, or with
  ``nesterov=True`` ``p -= eta * (g_t + mu * b_t)``.
* :class:`Adam` (``"adam"``): https://pytorch.org/docs/stable/generated/torch.optim.Adam.html
  (``amsgrad=False``): ``g_t += weight_decay * p``; ``m_t = beta1 m_{t-1} + (1 - beta1) g_t``;
  ``v_t = beta2 v_{t-1} + (1 - beta2) g_t^2``; ``p -= eta * (m_t / (1 - beta1^t)) /
  (sqrt(v_t / (1 - beta2^t)) + eps)``.
* :class:`AdamW` (``"adamw"``): https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html:
  ``p -= eta * weight_decay * p`` first (decoupled), then Adam's step without the decay term.

Weight decay applies to every parameter, biases too, as in PyTorch; the net's ``l2`` is
separate and adds ``l2 * W`` to the weights' gradients only, for every optimizer.

The state (the velocity ``b``, or ``m`` and ``v``, and the step count) lives in flat
buffers in the parameter layout and the parameters' dtype, one per :attr:`Optimizer.slots`,
owned by :class:`OptimizerState` beside the net's :class:`~fastckpt.core.params.Parameters`;
the plan counts its bytes (``optimizer_state``).  A step that would make a parameter or a
state value NaN or inf changes nothing and raises FloatingPointError.
"""
import numpy as np

from fastckpt.kernels import ADAM, MOMENTUM, counted_adam_step, counted_momentum_step

from .checks import check_bool, check_nonnegative, check_positive_int
from .layout import layer_views

MAX_STEPS = 2**63 - 2                  # the step kernels count in an int64, and the next step must fit it too


class Optimizer:
    """Base class: the hyper-parameters of an update rule, and ``slots`` state buffers it needs."""

    name = ""
    state_names = ()                   # one state buffer each, e.g. Adam's ("m", "v")
    nonnegative_states = ()            # those no step can make negative (Adam's v, a mean of squares)

    @property
    def slots(self):
        """How many state buffers the size of the parameters the optimizer keeps."""
        return len(self.state_names)

    def settings(self):
        """The hyper-parameters, as a dict (saved files keep it)."""
        return {}

    def to_dict(self):
        return {"name": self.name, **self.settings()}

    def __str__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings().items())
        return f"{self.name}({args})"

    __repr__ = __str__

    def __eq__(self, other):
        """The same rule with the same hyper-parameters, compared as the instances hold them: a step compares
        its optimizer with its plan's, and :meth:`settings` would make a list each time (NOTE [ The whole run ])."""
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self):
        return hash(str(self))


class SGD(Optimizer):
    """The lab's update, ``p -= eta * g``; no state."""

    name = "sgd"


class Momentum(Optimizer):
    """SGD with momentum ``momentum`` (0.9 by default), Nesterov's when ``nesterov``; one velocity buffer."""

    name = "momentum"
    state_names = ("velocity",)

    def __init__(self, momentum=0.9, nesterov=False):
        self.momentum = _fraction(momentum, "momentum", closed=True)     # 1: no decay, as scikit-learn allows
        self.nesterov = check_bool(nesterov, "nesterov")

    def settings(self):
        return {"momentum": self.momentum, "nesterov": self.nesterov}


class Adam(Optimizer):
    """Adam (Kingma and Ba, 2015) as PyTorch computes it; ``m`` and ``v`` buffers.  ``weight_decay``
    is added to the gradient (L2), as ``torch.optim.Adam`` does."""

    name = "adam"
    state_names = ("m", "v")
    nonnegative_states = ("v",)
    decoupled = False

    def __init__(self, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        try:
            beta1, beta2 = betas
        except (TypeError, ValueError):
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}") from None
        self.betas = (_fraction(beta1, "betas[0]"), _fraction(beta2, "betas[1]"))
        self.eps = check_nonnegative(eps, "eps")
        self.weight_decay = check_nonnegative(weight_decay, "weight_decay")

    def settings(self):
        return {"betas": list(self.betas), "eps": self.eps, "weight_decay": self.weight_decay}


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter, 2019), 0.01 by default as in PyTorch."""

    name = "adamw"
    decoupled = True

    def __init__(self, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(betas, eps, weight_decay)


OPTIMIZERS = {cls.name: cls for cls in (SGD, Momentum, Adam, AdamW)}


def parse_optimizer(spec):
    """An :class:`Optimizer` from itself, a name (``"sgd"``, ``"momentum"``, ``"adam"``, ``"adamw"``,
    with PyTorch's defaults) or a dict of :meth:`Optimizer.to_dict`."""
    if isinstance(spec, Optimizer):
        return spec
    if isinstance(spec, dict):
        settings = dict(spec)
        name = settings.pop("name", None)
        cls = OPTIMIZERS.get(name) if isinstance(name, str) else None
        if cls is None:
            raise ValueError(f"optimizer must name one of {', '.join(OPTIMIZERS)}, got {spec!r}")
        try:
            return cls(**settings)
        except TypeError as exc:
            raise ValueError(f"optimizer {spec!r}: {exc}") from None
    if isinstance(spec, str) and spec in OPTIMIZERS:
        return OPTIMIZERS[spec]()
    raise ValueError(f"optimizer must be 'sgd', 'momentum', 'adam', 'adamw' or an optimizer such as "
                     f"fastckpt.optimizers.Adam(betas=(0.9, 0.99)), got {spec!r}")


class OptimizerState:
    """The state of an optimizer over one :class:`~fastckpt.core.params.Parameters`: ``buffers``
    (``optimizer.slots`` flat buffers in the parameter layout, zero at first) and ``steps`` taken.

    Copying or pickling the net copies it; :meth:`apply` is the one way it changes.
    """

    def __init__(self, optimizer, params):
        self.optimizer = parse_optimizer(optimizer)
        self.state = np.zeros((self.optimizer.slots, params.flat.shape[0]), dtype=params.flat.dtype)   # a row each
        self._steps = np.zeros(1, dtype=np.int64)      # counted by the step kernel itself (apply)

    def reset(self):
        """Start again, in place: every state value 0 and no step taken (a new optimizer's state, without a
        second one held beside this one while it is made)."""
        self.state[...] = 0
        self.steps = 0

    @property
    def buffers(self):
        """The state buffers, one per slot (Adam's ``m`` and ``v``): views of the rows of :attr:`state`."""
        return list(self.state)

    @property
    def steps(self):
        """The optimizer steps taken."""
        return int(self._steps[0])

    @steps.setter
    def steps(self, value):
        self._steps[0] = value

    def __setstate__(self, state):
        if "steps" in state:                            # pickled before the count was an array
            state = dict(state, _steps=np.array([state.pop("steps")], dtype=np.int64))
        if "buffers" in state:                          # pickled before the buffers were rows of one array
            buffers = state.pop("buffers")
            state["state"] = np.array(buffers) if buffers else np.zeros((0, 0))
        self.__dict__.update(state)

    @property
    def nbytes(self):
        return sum(b.nbytes for b in self.buffers)

    def apply(self, params, grad, eta):
        """One update of ``params`` from the flat gradient ``grad`` with learning rate ``eta``.

        Nothing changes, and FloatingPointError is raised, if a parameter or a state value
        would become NaN or inf in the stored dtype.
        """
        opt = self.optimizer
        if opt.slots == 0:
            params.update(grad, eta)
            return
        self.check_fits(params)
        params.check_buffer(grad, "grad")
        eta = check_nonnegative(eta, "eta")
        with params.lock:
            if isinstance(opt, Momentum):
                ok = counted_momentum_step(params.flat, grad, self.state[0], eta, opt.momentum, opt.nesterov,
                                           params.blocks, self._steps)
            else:
                t = self.steps + 1
                beta1, beta2 = opt.betas
                ok = counted_adam_step(params.flat, grad, self.state[0], self.state[1], eta, beta1, beta2,
                                       opt.eps, opt.weight_decay, opt.decoupled, 1.0 - beta1 ** t, 1.0 - beta2 ** t,
                                       params.blocks, self._steps)
            if not ok:
                raise FloatingPointError(f"the {opt.name} update would make a parameter or its state NaN or inf, "
                                         "or overflow on its way; weights and state left unchanged")

    def check_fits(self, params):
        """Refuse ``params`` unless this state is in their layout and dtype (the kernels index both alike)."""
        n, dtype = self.state.shape[1], self.state.dtype
        if n != params.flat.shape[0] or dtype != params.dtype:
            raise ValueError(f"this {self.optimizer.name} state is for {n} parameters in {dtype.name}, but the "
                             f"parameters are {params.flat.shape[0]} in {params.dtype.name} (sizes "
                             f"{list(params.sizes)}): give each net its own optimizer state")

    def apply_mean(self, params, total, count, eta):
        """:meth:`apply` with the mean of ``count`` gradients whose sum is ``total``: the lab's SGD folds the
        mean into its step, any other optimizer scales ``total`` in place first."""
        if self.optimizer.slots == 0:
            self.apply(params, total, eta / count)
            return
        if count != 1:
            total *= 1.0 / count
        self.apply(params, total, eta)

    def kernel_args(self):
        """``(hyper, state)`` of the next step, for a run kernel's optimizer in the backward pass
        (:mod:`fastckpt.kernels.runs`): the hyper-parameters (:func:`fastckpt.kernels.optimizers.layer_step`;
        none for SGD) and the (slots, n) state."""
        opt = self.optimizer
        if opt.slots == 0:
            return (), self.state
        if isinstance(opt, Momentum):
            return (MOMENTUM, opt.momentum, float(opt.nesterov)), self.state
        t = self.steps + 1
        beta1, beta2 = opt.betas
        return (ADAM, beta1, beta2, opt.eps, opt.weight_decay, float(opt.decoupled), 1.0 - beta1 ** t,
                1.0 - beta2 ** t), self.state

    def arrays(self, sizes, copy=True):
        """``{state name: (weights, biases)}``: each buffer in the lab's shapes, (n_out, n_in) and (n_out, 1)
        per layer, for a saved file: copies, or (``copy=False``) views of the buffers themselves, for a writer
        that holds the state still while it writes (NOTE [ The whole run ]: a save adds no copy of the net)."""
        out = {}
        for name, buf in zip(self.optimizer.state_names, self.buffers):
            w, b = layer_views(buf, sizes)
            out[name] = ([v.copy() if copy else v for v in w],
                         [v.reshape(-1, 1).copy() if copy else v.reshape(-1, 1) for v in b])
        return out

    def restore(self, sizes, steps, arrays):
        """Set the state from :meth:`arrays`' layout and the step count (a saved file's), after checking
        that every array is there in its shape."""
        steps = check_positive_int(steps, "optimizer steps", minimum=0, maximum=MAX_STEPS)
        if set(arrays) != set(self.optimizer.state_names):
            raise ValueError(f"the {self.optimizer.name} optimizer's state is {', '.join(self.optimizer.state_names)}"
                             f", got {', '.join(sorted(arrays)) or 'nothing'}")
        for name, buf in zip(self.optimizer.state_names, self.buffers):
            for views, given in zip(layer_views(buf, sizes), arrays[name]):
                if len(given) != len(views):
                    raise ValueError(f"{name} needs {len(views)} arrays, one per layer, got {len(given)}")
                for view, arr in zip(views, given):
                    arr = np.asarray(arr)
                    if arr.size != view.size or arr.shape[0] != view.shape[0]:
                        raise ValueError(f"{name}: an array of shape {arr.shape} for a layer of {view.shape}")
                    view[...] = arr.reshape(view.shape)
        self.steps = steps


def _fraction(value, name, closed=False):
    """``value`` as a float in [0, 1), or [0, 1] when ``closed``."""
    v = check_nonnegative(value, name)
    if v > 1 or v == 1 and not closed:
        raise ValueError(f"{name} must be in [0, 1{']' if closed else ')'}, got {value!r}")
    return v
