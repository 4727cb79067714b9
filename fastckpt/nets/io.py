"""Saved nets back as nets: :func:`load`, and :func:`save_arrays` for trainers that hold no net."""
from fastckpt.core import fileformat
from fastckpt.core.checks import shown_value
from fastckpt.planner.strategies import Plain, parse_strategy

from .checkpointing import NetworkWithCheckpointing
from .network import Network


def load(path):
    """The net saved at ``path`` by :meth:`Network.save <fastckpt.nets.network.Network.save>` or ``train --save``.

    Returns a :class:`~fastckpt.nets.checkpointing.NetworkWithCheckpointing`
    when the file names a strategy other than ``plain``, else a
    :class:`~fastckpt.nets.network.Network`, with the saved parameters bit for
    bit, and the optimizer with its state.  If the file holds a training state
    it is in ``net.training_state`` (a dict; ``rng`` is a tuple for
    ``numpy.random.set_state``), else that is None.  ``numpy.random``'s own
    state is not touched.

    Raises
    ------
    ValueError
        A file that is not a fastckpt net, of an unknown format version, with
        missing arrays, shapes that do not match its sizes, or NaN or inf.
    """
    saved = fileformat.read(path)
    try:
        net = blank(**saved.net)
        net.weights, net.biases = saved.weights, saved.biases
        net.optimizer_state.restore(net.sizes, saved.optimizer_state["steps"], saved.optimizer_state["arrays"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"path {path!r}: {exc}") from None
    net.training_state = saved.training
    return net


def save_arrays(path, sizes, dtype, weights, biases, *, loss="quadratic", l2=0.0, strategy="plain",
                training=None, exclusive=False, activation="sigmoid", optimizer="sgd", optimizer_state=None,
                optimizer_in_backward=False):
    """Save a net known by its arrays (a distributed trainer's gathered ones), with the optimizer's state as
    ``gather_state()`` gives it."""
    net = blank(sizes, dtype, loss=loss, l2=l2, strategy=strategy, optimizer_in_backward=optimizer_in_backward,
                activation=activation, optimizer=optimizer)
    net.weights, net.biases = weights, biases
    if optimizer_state is not None:
        net.optimizer_state.restore(sizes, optimizer_state["steps"], optimizer_state["arrays"])
    return net.save(path, training=training, exclusive=exclusive)


def blank(sizes, dtype, *, loss, l2, strategy, optimizer_in_backward, activation, optimizer):
    """A net with zero parameters, made without drawing from ``numpy.random``: a
    :class:`NetworkWithCheckpointing` unless ``strategy`` is plain."""
    try:
        strategy = parse_strategy(strategy)
    except ValueError as exc:                       # a file's: named as its field
        raise ValueError(f"strategy {shown_value(strategy)}: {exc}") from None
    kwargs = {"optimizer_in_backward": optimizer_in_backward, "loss": loss, "l2": l2, "activation": activation,
              "optimizer": optimizer}
    if isinstance(strategy, Plain):
        return Network.blank(sizes, dtype, **kwargs)
    return NetworkWithCheckpointing.blank(sizes, dtype, strategy=strategy, **kwargs)
