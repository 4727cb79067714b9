"""The data a command trains on: ``--data`` or the embedded digits, refused when ``--sizes`` do not fit it."""
from fastckpt.core.resources import check_fits
from fastckpt.data import load_mnist
from fastckpt.planner import plan as make_plan

CLASSES = 10                # what every MNIST file holds


def load_data(path, sizes):
    """``load_mnist(path, compact=True)`` (images as bytes, labels as class indices), after checking that a
    net of ``sizes`` takes its images and gives its classes."""
    (x_train, y_train), (x_test, y_test) = load_mnist(path, compact=True)
    if x_train.shape[1] != sizes[0] or sizes[-1] != CLASSES:
        raise ValueError(f"--sizes {','.join(map(str, sizes))} do not fit the data: it has "
                         f"{x_train.shape[1]} inputs and {CLASSES} classes")
    return (x_train, y_train), (x_test, y_test)


def check_trainable(sizes, batch_size, dtype, strategy, *, optimizer_in_backward=False, optimizer="sgd"):
    """The plan of a training step, refused (naming --sizes) when this process could not hold it."""
    plan = make_plan(sizes, batch_size, dtype, strategy, optimizer_in_backward=optimizer_in_backward,
                     optimizer=optimizer)
    check_fits(plan.bytes()["total"], f"a training step of {','.join(map(str, sizes))} at batch {batch_size} "
               f"({strategy})", f"--sizes {','.join(map(str, sizes))} with --batch-size {batch_size}")
    return plan
