"""JIT flags for every kernel, and where their compiled code is cached.

No ``fastmath``: recomputed activations must be bit-identical to the first
forward pass, and NaN/inf checks must survive optimisation.

The cache lives in the user's cache directory (``$FASTCKPT_CACHE_DIR``, else
``$XDG_CACHE_HOME/fastckpt`` or ``~/.cache/fastckpt``), not in ``__pycache__``
next to the kernels: files there are unknown to pip, survive an uninstall and
leave a ``fastckpt`` directory behind that shadows a later install.  Only
fastckpt's kernels use this cache; other Numba code keeps its own caches.

Numba checks a cached function against its own file only (its path, time and
size), but kernels call and inline kernels from other files.  So the cache
directory is named after a digest of every kernel source file, and that digest,
not a file's path or time, is the entries' stamp: change any kernel and all are
compiled afresh, never mixed with code compiled from the old sources, while two
installs of the same sources (a copy in site-packages and an editable checkout)
share one set of entries.

NOTE [ Kernel cache ]
A cache must never break a run or hand back the wrong code:

- Damaged entry (truncated, zero-length or overwritten ``.nbi``/``.nbc``, or an
  index naming a missing ``.nbc``): the kernel's files are deleted, it is
  compiled afresh and saved again, and a ``KernelCacheWarning`` names the
  directory.  Data files carry a SHA-256 of their payload, so bytes overwritten
  in place are caught too, not run as machine code.
- Unusable directory (not writable, a file in its place, an impossible path):
  kernels are compiled without a disk cache and a ``KernelCacheWarning`` says
  so.  They never fall through to Numba's other locators, whose caches in
  ``kernels/__pycache__`` or the user-wide Numba directory are keyed on one
  source file only and served stale kernels after another file was edited.
- Target CPU: Numba's index key holds ``codegen.magic_tuple()``, the LLVM
  triple, CPU name (``NUMBA_CPU_NAME``) and feature string, so code compiled for
  one CPU is never served to another (``tests/test_cache.py`` checks it).
"""
import hashlib
import os
import pickle
import re
import tempfile
import warnings

import numba

_KERNEL_DIR = os.path.dirname(os.path.abspath(__file__))


class KernelCacheWarning(RuntimeWarning):
    """The on-disk kernel cache was damaged or unusable; kernels were compiled afresh."""


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
    return os.path.join(os.path.abspath(root), "numba", _SOURCES)


def _reason(exc):
    """``Type: message`` of an exception, in one line."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}" + (f": {exc.filename}" if exc.filename else "")
    return f"{type(exc).__name__}: {exc}"


def _why_unusable(path):
    """None if *path* can hold the cache (created if need be), else the reason it cannot."""
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except (OSError, ValueError) as exc:
        return _reason(exc)
    return None


_said = set()


def _say(message):
    """One line on stderr per distinct message, as a KernelCacheWarning attributed to ``fastckpt``."""
    if message not in _said:
        _said.add(message)
        warnings.warn_explicit(message, KernelCacheWarning, "fastckpt", 0, module="fastckpt.kernels")


def _say_uncached(path, why):
    _say(f"kernel cache directory {path} is unusable ({why}); compiling kernels without a disk cache "
         "this run (set FASTCKPT_CACHE_DIR to a writable directory)")


def _read_checked(path):
    """The body of a file written as SHA-256 then body; UnpicklingError if they disagree."""
    with open(path, "rb") as f:
        digest, body = f.read(32), f.read()
    if hashlib.sha256(body).digest() != digest:
        raise pickle.UnpicklingError(f"checksum mismatch in {os.path.basename(path)}")
    return body


def _cache_class():
    """The Cache subclass for fastckpt's kernels, or None if this Numba's caching internals differ."""
    try:
        from numba.core import caching
        bases = (caching.UserProvidedCacheLocator, caching.CompileResultCacheImpl, caching.IndexDataCacheFile,
                 caching.FunctionCache)
    except (ImportError, AttributeError):
        return None
    locator_base, impl_base, file_base, cache_base = bases

    class KernelCacheLocator(locator_base):
        """Places a kernel's files in the digest-named cache directory, keyed by nothing of where the sources
        are installed: the same sources in another install (``pip install .``, then ``pip install -e .``) find
        the same entries."""

        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = _CACHE_DIR

        def get_cache_path(self):
            return self._cache_path

        def get_source_stamp(self):
            return _SOURCES                   # not the file's path and time: the digest of every kernel's source

        @classmethod
        def from_function(cls, py_func, py_file):
            self = cls(py_func, py_file)
            self.ensure_cache_path()          # OSError: _cached() compiles this kernel without a disk cache
            return self

    class KernelCacheImpl(impl_base):
        _locator_classes = [KernelCacheLocator]     # no fall-through to __pycache__ or the user-wide cache

    class KernelCacheFile(file_base):
        """A kernel's index and data files, each a SHA-256 of its body then the body.

        Damage raises instead of passing for a miss: a missing ``.nbc``, a short
        file, or bytes changed in place (which pickle may well accept).
        """

        def load(self, key):
            name = self._load_index().get(key)
            return None if name is None else self._load_data(name)

        def _load_index(self):
            try:
                body = _read_checked(self._index_path)
            except FileNotFoundError:
                return {}
            version, stamp, overloads = pickle.loads(body)
            return overloads if (version, stamp) == (self._version, self._source_stamp) else {}

        def _save_index(self, overloads):
            self._write_checked(self._index_path, self._dump((self._version, self._source_stamp, overloads)))

        def _load_data(self, name):
            return pickle.loads(_read_checked(self._data_path(name)))

        def _save_data(self, name, data):
            self._write_checked(self._data_path(name), self._dump(data))

        def _write_checked(self, path, body):
            with self._open_for_write(path) as f:
                f.write(hashlib.sha256(body).digest() + body)

    class KernelCache(cache_base):
        """Numba's per-function cache that discards a damaged entry and recompiles."""

        _impl_class = KernelCacheImpl

        def __init__(self, py_func):
            super().__init__(py_func)
            self._cache_file = KernelCacheFile(self._cache_path, self._impl.filename_base,
                                               self._impl.locator.get_source_stamp())

        def load_overload(self, sig, target_context):
            try:
                return super().load_overload(sig, target_context)
            except Exception as exc:          # any failure to read an entry back means it is damaged
                self._discard(exc)
                return None

        def save_overload(self, sig, data):
            try:
                super().save_overload(sig, data)
            except Exception as exc:
                self.disable()
                _say(f"could not save kernel {self._impl.filename_base} in cache directory {self._cache_path} "
                     f"({_reason(exc)}); it stays compiled in memory only this run")

        def _discard(self, exc):
            base = re.escape(self._impl.filename_base)
            try:
                for name in os.listdir(self._cache_path):
                    if re.fullmatch(base + r"(\.\d+\.nbc|\.nbi)", name):
                        os.remove(os.path.join(self._cache_path, name))
            except OSError as why:
                self.disable()
                _say_uncached(self._cache_path, f"cannot discard a damaged entry: {_reason(why)}")
                return
            _say(f"kernel cache directory {self._cache_path} had a damaged entry for {self._impl.filename_base} "
                 f"({_reason(exc)}); discarded it and recompiling")

    return KernelCache


def _cached(**flags):
    """``numba.njit(**flags)`` whose kernels are cached by KernelCache, or not at all."""
    compile_ = numba.njit(**flags)

    def decorate(py_func):
        dispatcher = compile_(py_func)
        if numba.config.DISABLE_JIT or _KernelCache is None:
            return dispatcher
        try:
            dispatcher._cache = _KernelCache(py_func)       # what Dispatcher.enable_caching() sets
        except OSError as exc:
            _say_uncached(_CACHE_DIR, _reason(exc))
        return dispatcher
    return decorate


class CompileNotice:
    """Says once per process, on stderr, that fastckpt's kernels are being compiled, when a compile has run for
    :attr:`after` seconds: a first run on a machine (or after an upgrade) is otherwise silent for many seconds.

    A listener of Numba's ``numba:compile`` events, which fire only when a kernel is compiled (not when it is
    loaded from the cache); only fastckpt's kernels count.  The line is the same on a terminal and in a pipe;
    ``FASTCKPT_COMPILE_NOTICE=0`` leaves it out.
    """

    after = 1.0
    estimate = 15          # seconds the kernels of a first training step took to compile on a 2-core Zen 3

    def __init__(self, stream=None):
        import threading
        self.stream = stream
        self._lock = threading.Lock()
        self.said = False
        self._depth = 0
        self._timer = None

    def message(self):
        return (f"fastckpt: compiling its kernels for this CPU, once (they are cached in {_CACHE_DIR}): "
                f"~{self.estimate} s")

    def on_start(self, event):
        import threading
        if not _is_ours(event) or self.said or os.environ.get("FASTCKPT_COMPILE_NOTICE", "1") == "0":
            return
        with self._lock:
            self._depth += 1
            if self._timer is None:
                self._timer = threading.Timer(self.after, self._say)
                self._timer.daemon = True
                self._timer.start()

    def on_end(self, event):
        if not _is_ours(event):
            return
        with self._lock:
            self._depth = max(self._depth - 1, 0)
            if self._depth == 0 and self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _say(self):
        import sys
        with self._lock:
            if self._depth == 0 or self.said:
                return
            self.said = True
        stream = self.stream or sys.stderr
        print(self.message(), file=stream, flush=True)

    def forget_threads(self):
        """In a forked child: the timer thread is the parent's alone (and the lock may be held by a parent's thread
        that the child does not have)."""
        import threading
        self._lock = threading.Lock()
        self._depth, self._timer = 0, None


def _is_ours(event):
    dispatcher = event.data.get("dispatcher")
    module = getattr(getattr(dispatcher, "py_func", None), "__module__", "") or ""
    return module.startswith(("fastckpt.kernels", "kernels."))


def _listen(notice):
    from numba.core import event

    class Listener(event.Listener):
        def on_start(self, ev):
            notice.on_start(ev)

        def on_end(self, ev):
            notice.on_end(ev)
    event.register("numba:compile", Listener())
    os.register_at_fork(after_in_child=notice.forget_threads)


_SOURCES = _sources_digest()
_CACHE_DIR = _cache_root()
_KernelCache = None
if not numba.config.DISABLE_JIT:
    _why = _why_unusable(_CACHE_DIR)
    if _why is not None:
        _say_uncached(_CACHE_DIR, _why)
    else:
        _KernelCache = _cache_class()
        if _KernelCache is None:
            _say_uncached(_CACHE_DIR, f"numba {numba.__version__} caches differently than fastckpt expects")

NOTICE = CompileNotice()
if not numba.config.DISABLE_JIT:
    _listen(NOTICE)

#: Compiled once and cached on disk, GIL released so threads can run kernels at once.
kernel = _cached(nogil=True, error_model="numpy", boundscheck=False)

#: Small helpers and steps shared by kernels: each compiled once and linked into the kernels that call it,
#: where LLVM inlines it (and vectorises the loops it is called in).  Numba's own ``inline="always"`` copied
#: and typed a helper's IR at every call site, which tripled the kernels' compile time.
inline = _cached(nogil=True, error_model="numpy")
