"""The data a command trains on: ``--data`` or the embedded digits, refused when ``--sizes`` do not fit it."""
from fastckpt.data import load_mnist


def load_data(path, sizes):
    """``load_mnist(path)``, after checking that a net of ``sizes`` takes its images and gives its classes."""
    (x_train, y_train), (x_test, y_test) = load_mnist(path)
    if x_train.shape[1] != sizes[0] or y_train.shape[1] != sizes[-1]:
        raise ValueError(f"--sizes {','.join(map(str, sizes))} do not fit the data: it has "
                         f"{x_train.shape[1]} inputs and {y_train.shape[1]} classes")
    return (x_train, y_train), (x_test, y_test)
