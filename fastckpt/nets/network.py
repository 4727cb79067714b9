"""Drop-in replacements for the lab's ``Network`` and ``NetworkWithCheckpointing``."""
import copy

import numpy as np

from fastckpt.core import fileformat
from fastckpt.core.activations import check_activation, state_codes
from fastckpt.core.checks import as_batch, check_bool, check_dtype, check_eta, check_l2, check_sizes
from fastckpt.core.init import check_init, draw, whole
from fastckpt.core.losses import check_loss
from fastckpt.core.optimizers import OptimizerState, parse_optimizer
from fastckpt.core.params import Parameters
from fastckpt.engine import Engine
from fastckpt.engine.loop import EpochOrder, batch_starts, check_training, held_arrays, run_epochs, split_validation
from fastckpt.engine.stopping import check_early_stopping
from fastckpt.planner import plan as make_plan
from fastckpt.planner.run import bound_the_run
from fastckpt.planner.strategies import Plain

from .predicting import Predicting


class Network(Predicting):
    """A fully connected network trained by SGD, as the lab's ``Network`` (sigmoid by default).

    Parameters
    ----------
    sizes : sequence of int
        Units per layer, input first, e.g. ``[784, 40, 30, 10]``.
    dtype : {numpy.float64, numpy.float32}, optional
        Precision of parameters and activations.  Parameters are drawn in
        float64, then cast.
    optimizer_in_backward : bool, optional
        Apply each layer's update as soon as its gradient is final (default
        False): with SGD no gradient buffers at all, with another optimizer one
        layer's (the largest), so less memory; momentum and Adam give the same
        numbers bit for bit as after the backward pass.  An update that would
        go NaN or inf is then caught at its layer, after the layers above it
        were updated (SGD's layer may hold the NaN or inf; another optimizer
        leaves that layer unchanged); the default mode refuses it whole.
    loss : {"quadratic", "cross_entropy", "squared_error"}, optional
        ``"quadratic"`` (default, the lab's): sigmoid output and
        ``0.5 * ||a - y||^2``.  ``"cross_entropy"``: softmax output and
        ``-sum(y * log p)``; ``feedforward`` then gives probabilities.
        ``"squared_error"``: identity (linear) output and ``0.5 * ||a - y||^2``,
        for regression on real targets (``feedforward`` gives the predictions).
    l2 : float or sequence of float, optional
        L2 weight penalty ``0.5 * l2 * ||W||^2``, one number for every layer or
        one per layer (default 0).  Biases carry none.
    activation : {"sigmoid", "tanh", "relu", "identity"} or sequence of them, optional
        The hidden layers' activation (default ``"sigmoid"``, the lab's), one
        name for all or one per hidden layer.  The output layer follows ``loss``.
    init : {"lab", "xavier", "glorot", "he", "kaiming"}, optional
        How the parameters are drawn from ``numpy.random``.  ``"lab"`` (default):
        as the lab does (biases, then weights, with ``np.random.randn``), so the
        same ``np.random.seed`` gives the same starting network.  ``"xavier"``
        (``"glorot"``): weights uniform in ``+-sqrt(6 / (fan_in + fan_out))``,
        Keras' default.  ``"he"`` (``"kaiming"``): weights normal with standard
        deviation ``sqrt(2 / fan_in)``, PyTorch's ``kaiming_normal_``.  Biases are
        0 for both (:mod:`fastckpt.core.init`).
    optimizer : {"sgd", "momentum", "adam", "adamw"} or Optimizer, optional
        The update rule of ``update_mini_batch`` and ``SGD``, whose learning rate is their ``eta``:
        ``"sgd"`` (default, the lab's), ``"momentum"`` (0.9), ``"adam"`` or ``"adamw"`` with PyTorch's
        defaults, or an object of :mod:`fastckpt.optimizers` for other hyper-parameters, e.g.
        ``Momentum(0.8, nesterov=True)`` or ``Adam(betas=(0.9, 0.99))``.  Its state
        (:attr:`optimizer_state`) is kept with the parameters and counted in the plan's bytes.

    Attributes
    ----------
    num_layers, sizes : int, list of int
    weights : sequence of numpy.ndarray
        ``weights[i]`` has shape (sizes[i+1], sizes[i]).  Each is a view of the net's parameters
        (:attr:`params`): changing it in place changes the net, and ``net.weights[i] = value`` copies
        ``value`` in after checking its shape and that it is finite.  A swap ``w[0], w[1] = w[1], w[0]``
        exchanges the values.
    biases : sequence of numpy.ndarray
        ``biases[i]`` has shape (sizes[i+1], 1); the same rules.
    params : Parameters
        The one owner of the weights and biases (:mod:`fastckpt.core.params`).
    optimizer, optimizer_state : Optimizer, OptimizerState
        The update rule, and its state: buffers in the parameters' layout
        (velocity, or Adam's ``m`` and ``v``) and the steps taken
        (:mod:`fastckpt.core.optimizers`).

    Notes
    -----
    ``copy.copy``, ``copy.deepcopy`` and ``pickle`` give an independent net that trains exactly as the
    original would.  One net may be used from several threads: each call that reads or writes its
    parameters (``backprop``, ``update_mini_batch``, ``feedforward``, ``evaluate``, a whole ``SGD`` run,
    ...) holds its lock, so concurrent calls run one after the other, with the result of some sequential order.
    """

    strategy = Plain()
    training_state = None            # set by fastckpt.load when the file holds one

    def __init__(self, sizes, dtype=np.float64, *, optimizer_in_backward=False, loss="quadratic", l2=0.0,
                 activation="sigmoid", init="lab", optimizer="sgd"):
        init = check_init(init)
        self._configure(sizes, dtype, optimizer_in_backward=optimizer_in_backward, loss=loss, l2=l2,
                        activation=activation, optimizer=optimizer)
        weights, biases = self.params.layers()
        blocks = {"weights": weights, "biases": [b.reshape(1, -1) for b in biases]}
        draw(init, self.sizes, lambda kind, layer: whole(blocks[kind][layer]))

    @classmethod
    def blank(cls, sizes, dtype=np.float64, *, optimizer_in_backward=False, loss="quadratic", l2=0.0,
              activation="sigmoid", optimizer="sgd"):
        """A net with zero parameters, made without drawing from ``numpy.random``: for filling in
        known values (:func:`fastckpt.load` does)."""
        self = cls.__new__(cls)
        self._configure(sizes, dtype, optimizer_in_backward=optimizer_in_backward, loss=loss, l2=l2,
                        activation=activation, optimizer=optimizer)
        return self

    def _configure(self, sizes, dtype, *, optimizer_in_backward, loss, l2, activation, optimizer):
        """Everything but the parameters' values (zeros): shared by ``__init__`` and :meth:`blank`."""
        sizes = check_sizes(sizes)
        dtype = check_dtype(dtype)
        self.loss = check_loss(loss)
        self._l2 = check_l2(l2, len(sizes) - 1)
        self.activation = check_activation(activation, len(sizes) - 1)      # one name per hidden layer
        self._acts = state_codes(self.activation, self.loss)
        self.optimizer_in_backward = check_bool(optimizer_in_backward, "optimizer_in_backward")
        self.optimizer = parse_optimizer(optimizer)
        self.num_layers = len(sizes)
        self.sizes = list(sizes)
        self.params = Parameters(sizes, dtype)
        self.optimizer_state = OptimizerState(self.optimizer, self.params)
        self._engine = None
        self.last_loss = None

    @property
    def dtype(self):
        return self.params.dtype

    def release_workspace(self):
        """Let go of the training workspace now (its engine is made again at the next step): its bytes are free
        before something else, another net, is made."""
        with self.params.lock:
            self._engine = None

    @property
    def l2(self):
        """The L2 penalty of each layer; ``net.l2 = value`` (one number or one per layer) holds from the next step."""
        return self._l2

    @l2.setter
    def l2(self, value):
        with self.params.lock:
            self._l2, self._engine = check_l2(value, self.num_layers - 1), None     # a workspace holds the old

    @property
    def weights(self):
        return self.params.weights

    @weights.setter
    def weights(self, values):
        self.params.assign_all("weights", values)

    @property
    def biases(self):
        return self.params.biases

    @biases.setter
    def biases(self, values):
        self.params.assign_all("biases", values)

    # -- copying ----------------------------------------------------------------------------
    def __getstate__(self):
        state = dict(self.__dict__)
        state["_engine"] = None                           # a workspace is rebuilt on first use
        return state

    __copy__ = copy.deepcopy

    def __deepcopy__(self, memo):                       # under the lock: parameters and state of one moment
        new = memo[id(self)] = type(self).__new__(type(self))
        with self.params.lock:
            new.__dict__.update(copy.deepcopy(self.__getstate__(), memo))
        return new

    # -- the schedule -----------------------------------------------------------------------
    def plan(self, batch_size, *, optimizer_in_backward=None, strategy=None, blas_threads=None):
        """The :class:`~fastckpt.planner.plan.Plan` a training step of ``batch_size`` samples follows (with the
        net's own strategy and update mode unless given, and the BLAS threads of now unless given)."""
        fused = self.optimizer_in_backward if optimizer_in_backward is None else optimizer_in_backward
        return make_plan(self.sizes, batch_size, self.dtype, self.strategy if strategy is None else strategy,
                         optimizer_in_backward=fused, blas_threads=blas_threads, optimizer=self.optimizer)

    def engine(self, batch_size, plan=None):
        """The net's own :class:`~fastckpt.engine.engine.Engine`, planned for at least ``batch_size`` samples:
        made on first need and again when a larger batch comes; a smaller batch uses its workspace's first rows.
        ``plan``: :meth:`step_plan`'s, already made (a plan is made once: a second search's tables would meet
        what the first left on CPython's free lists)."""
        engine = self._engine
        if engine is None or engine.plan.batch_size < batch_size:
            self._engine = None                                # free the old workspace first
            if plan is not None and not self._plans(plan):
                raise ValueError(f"plan: {plan!r} is not of this net ({self.sizes}, dtype {self.dtype.name}, strategy "
                                 f"{self.strategy}, optimizer {self.optimizer}); give its step_plan(batch_size)")
            plan = plan if plan is not None and plan.batch_size == batch_size else self.plan(batch_size)
            self._engine = engine = Engine(plan, self.loss, self.l2, self.activation)
        return engine

    def _plans(self, plan):
        """Whether ``plan`` is of this net: its sizes, dtype, strategy, update mode and optimizer."""
        return (list(plan.sizes), plan.dtype, str(plan.strategy), plan.optimizer_in_backward, str(plan.optimizer)) \
            == (list(self.sizes), self.dtype, str(self.strategy), self.optimizer_in_backward, str(self.optimizer))

    def step_plan(self, batch_size):
        """The plan a step of ``batch_size`` samples runs with: the engine's, when it holds that many rows, else
        a new one (for :meth:`engine`)."""
        engine = self._engine
        return engine.plan if engine is not None and engine.plan.batch_size >= batch_size else self.plan(batch_size)

    def _engine_for(self, x, name):
        return self.engine(as_batch(x, self.sizes[0], name, "input").shape[0])

    # -- training ---------------------------------------------------------------------------
    def backprop(self, x_batch, y_batch):
        """Batch-mean gradients ``(nabla_b, nabla_w)`` in the lab's shapes (fresh arrays); ``x_batch`` is
        (batch, n_in) or the lab's (batch, n_in, 1), ``y_batch`` likewise."""
        names = ("x_batch", "y_batch")
        with self.params.lock:
            engine = self._engine_for(x_batch, names[0])
            self.last_loss = engine.gradients(self.params, x_batch, y_batch, names=names)
            gw, gb = engine.grad_layers()
            return [b.reshape(-1, 1).copy() for b in gb], [w.copy() for w in gw]

    def update_mini_batch(self, x_mini_batch, y_mini_batch, eta):
        """One step of the net's optimizer (the lab's SGD by default) on the batch-mean gradient, with
        learning rate ``eta``; parameters and the optimizer's state are updated in place.

        An update that would make a parameter (or a state value) NaN or inf raises
        FloatingPointError and leaves the parameters (and the state) as they were.
        """
        eta = check_eta(eta)
        with self.params.lock:
            engine = self._engine
            if engine is None or not engine.takes(x_mini_batch):
                engine = self._engine_for(x_mini_batch, "x_mini_batch")
            self.last_loss = engine.step(self.params, x_mini_batch, y_mini_batch, eta, self.optimizer_state,
                                         names=("x_mini_batch", "y_mini_batch"))

    def cost_derivative(self, output_activations, y):
        return output_activations - y

    def SGD(self, training_data, epochs, mini_batch_size, eta, test_data=None, *,
            drop_last=True, verbose=True, progress="auto", on_epoch=None, first_epoch=0, shuffle=False,
            validation=None, lr_schedule=None, max_memory=None, early_stopping=None):
        """The lab's loop: mini-batches in order, accuracy per epoch; returns (memusage, updatetime).

        ``memusage`` is the process RSS (bytes) before each update and ``updatetime`` its duration (s), as
        in the lab.  Like the lab, ``drop_last=True`` skips the samples after the last full mini-batch (with
        a warning saying how many); ``drop_last=False`` trains on them too.  The accuracies are kept in
        ``self.accuracies``.  ``progress``: ``"auto"`` (default) draws a bar on stderr while each epoch trains
        when stderr is a terminal, and wipes it before the epoch's line; ``True`` draws it whatever stderr is
        (a notebook), ``False`` never; a callable is called as ``progress(epoch, updates_done,
        updates_per_epoch)`` after every update.  ``on_epoch(epoch, updates_done)`` is called after every
        epoch (``fastckpt train --save`` saves there).  ``first_epoch`` numbers the epochs from there.

        ``shuffle``: False (default) takes the mini-batches in order, as the lab;
        True draws a new order every epoch from ``numpy.random`` (``np.random.seed``
        makes it reproducible); an integer seeds each epoch's order from the seed
        and the epoch's number alone, so a resumed run shuffles as an unbroken one.
        ``validation``: a fraction in (0, 1) holds out that share of the training
        samples, the last ones (as Keras' ``validation_split``, before shuffling), or a
        pair ``(x, y)``; its loss and accuracy (R² for ``loss="squared_error"``) and the mean training loss are
        then printed every epoch.  ``self.history`` keeps per epoch the mean training loss (``"loss"``, the
        mean over the samples of the mini-batches' losses before their updates), the test accuracy
        (``"accuracy"``), the validation loss (``"val_loss"``) and accuracy (``"val_accuracy"``; ``"val_r2"``)
        and the learning rate (``"eta"``).  ``early_stopping``: an :class:`~fastckpt.engine.stopping.EarlyStopping`
        (or its ``n_iter_no_change``) stops the run once the validation score, or without validation the
        training loss, stops improving, and restores the best epoch's weights (NOTE [ Early stopping ]).
        ``lr_schedule``: ``"constant"`` (default), ``"step(N[, gamma])"`` or ``"cosine[(T[, eta_min])]"``,
        PyTorch's ``StepLR``/``CosineAnnealingLR`` per epoch from ``first_epoch`` (:mod:`fastckpt.core.lr`).
        ``max_memory`` (bytes or ``"256MiB"``) refuses, before training, a run whose predicted whole-run peak
        (:func:`fastckpt.planner.run.run_bytes`) is above it, naming the parts and a ``fit`` that keeps to it.
        Before the first update too, the training, test and validation data are checked finite, and within
        the net's dtype (float64 data past float32's range, for a float32 net): a ValueError names the
        argument, the index and the value.
        """
        given, (training_data, val_data) = training_data, split_validation(self, training_data, validation)
        x_train, y_train, epochs, mini_batch_size, eta = check_training(
            self, training_data, epochs, mini_batch_size, eta)
        starts, stopping = batch_starts(len(x_train), mini_batch_size, drop_last), check_early_stopping(early_stopping)
        planned = self.step_plan(mini_batch_size)
        if max_memory is not None:
            bound_the_run(planned, (x_train, y_train), test_data, validation=val_data,
                          updates=epochs * len(starts), epochs=epochs, bound=max_memory, shuffled=shuffle is not False,
                          held=held_arrays(given, test_data, validation, val_data),
                          best=bool(stopping and stopping.restore_best_weights))
        self.engine(mini_batch_size, planned)     # planned before the run makes anything else (an epoch's order)
        order = EpochOrder(x_train, y_train, mini_batch_size, shuffle)

        def update(start, rate):
            self.update_mini_batch(*order.minibatch(start), rate)
            return self.last_loss
        return run_epochs(self, epochs, starts, update, test_data, verbose, progress,
                          on_epoch=on_epoch, first_epoch=first_epoch, validation=val_data, start_epoch=order.start,
                          eta=eta, lr_schedule=lr_schedule, stopping=stopping,
                          rows=lambda start: min(mini_batch_size, len(x_train) - start))

    # -- files ------------------------------------------------------------------------------
    def save(self, path, *, training=None, exclusive=False):
        """Write the net to ``path`` (``.npz`` appended if missing), atomically; :func:`fastckpt.load` reads it.

        The format (versioned, documented in :mod:`fastckpt.core.fileformat`)
        keeps the sizes, dtype, loss, l2, activation, strategy, optimizer mode, and the
        optimizer with its state, with the parameters bit for bit, so training goes on
        after :func:`fastckpt.load` exactly as if never stopped.  ``training``, a dict, is stored beside them
        (``fastckpt train`` keeps its epoch, update count, accuracies and ``numpy.random`` state there).
        ``exclusive``: never replace a file (one another process wrote meanwhile, say).  Returns the path.
        """
        with self.params.lock:          # one consistent set of parameters and state, written from where they are
            state = {"steps": self.optimizer_state.steps,
                     "arrays": self.optimizer_state.arrays(self.sizes, copy=False)}
            return fileformat.write(path, self.fields(), self.weights, self.biases, training=training,
                                    exclusive=exclusive, optimizer_state=state)

    def fields(self):
        """What a saved file records besides the parameters (:data:`fastckpt.core.fileformat.NET_FIELDS`)."""
        return {"sizes": list(self.sizes), "dtype": self.dtype.name, "loss": self.loss, "l2": list(self.l2),
                "strategy": str(self.strategy), "optimizer_in_backward": self.optimizer_in_backward,
                "activation": list(self.activation), "optimizer": self.optimizer.to_dict()}
