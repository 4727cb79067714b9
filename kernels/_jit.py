"""JIT flags for every kernel, and where their compiled code is cached.

No ``fastmath``: recomputed activations must be bit-identical to the first
forward pass, and NaN/inf checks must survive optimisation.

The cache lives in the user's cache directory (``$FASTCKPT_CACHE_DIR``, else
``$XDG_CACHE_HOME/fastckpt`` or ``~/.cache/fastckpt``), not in ``__pycache__``
next to the kernels: files there are unknown to pip, survive an uninstall and
leave a ``fastckpt`` directory behind that shadows a later install.  Only
fastckpt's kernels use this locator; other Numba code keeps its own caches.

Numba checks a cached function against its own file only, but kernels call and
inline kernels from other files.  So the cache directory is named after a
digest of every kernel source file: change any of them and all are compiled
afresh, never mixed with code compiled from the old sources.
"""
import hashlib
import os

import numba

_KERNEL_DIR = os.path.dirname(os.path.abspath(__file__))


def _sources_digest():
    digest = hashlib.sha256(numba.__version__.encode())
    for name in sorted(os.listdir(_KERNEL_DIR)):
        if name.endswith(".py"):
            with open(os.path.join(_KERNEL_DIR, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()[:16]


def _cache_root():
    root = os.environ.get("FASTCKPT_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "fastckpt")
    return os.path.join(root, "numba", _SOURCES)


def _register_locator():
    from numba.core import caching
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    _CacheLocator = getattr(caching, "_CacheLocator", None)
    _SourceFileBackedLocatorMixin = getattr(caching, "_SourceFileBackedLocatorMixin", None)
    if impl is None or _CacheLocator is None or _SourceFileBackedLocatorMixin is None:
        return                                # another Numba layout: fall back to its default caches

    class KernelCacheLocator(_SourceFileBackedLocatorMixin, _CacheLocator):
        """Caches fastckpt's kernels under the user's cache directory."""

        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = os.path.join(_cache_root(), self.get_suitable_cache_subpath(py_file))

        def get_cache_path(self):
            return self._cache_path

        @classmethod
        def from_function(cls, py_func, py_file):
            if os.path.dirname(os.path.abspath(py_file)) != _KERNEL_DIR:
                return None
            return super().from_function(py_func, py_file)

    if not any(c.__name__ == "KernelCacheLocator" for c in impl._locator_classes):
        impl._locator_classes = [KernelCacheLocator, *impl._locator_classes]


_SOURCES = _sources_digest()
_register_locator()

#: Compiled once and cached on disk, GIL released so threads can run kernels at once.
kernel = numba.njit(nogil=True, cache=True, error_model="numpy", boundscheck=False)

#: Small helpers that are inlined into the kernels that call them.
inline = numba.njit(nogil=True, cache=True, error_model="numpy", inline="always")
