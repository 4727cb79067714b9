"""scikit-learn's door: ``MLPClassifier`` and ``MLPRegressor`` with scikit-learn's parameters, trained by
fastckpt's engine, its checkpointing strategies and a bound on the whole fit (``pip install
"fastckpt[sklearn]"``).  See ``docs/sklearn.md``."""
from .classifier import MLPClassifier
from .regressor import MLPRegressor

__all__ = ["MLPClassifier", "MLPRegressor"]
