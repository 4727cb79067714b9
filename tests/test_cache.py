"""The kernel cache: damage is discarded and recompiled, an unusable directory means no disk cache, never another.

Every run is a subprocess with its own FASTCKPT_CACHE_DIR.  One cold compile
fills a cache shared by the module; each test damages a copy of it.
"""
import json
import os
import pickle
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
from fastckpt.kernels import CompileNotice

# One SGD step on a tiny net; prints its weights' sum, the kernels' disk-cache hits and misses and where they cache.
WORKLOAD = """
import json, numpy as np, fastckpt
from fastckpt.kernels import activations, dense, elementwise, runs
np.random.seed(1)
net = fastckpt.Network([3, 4, 2])
x = np.random.default_rng(0).random((8, 3)); y = np.random.default_rng(1).random((8, 2))
net.update_mini_batch(x, y, 0.5)
kernels = {id(v): v for m in (activations, dense, elementwise, runs) for v in vars(m).values() if hasattr(v, "stats")}
kernels[0] = runs.runner([runs.SIGMOID])           # the run kernel of the step above
stats = [k.stats for k in kernels.values()]
print(json.dumps({"weights": repr(float(sum(w.sum() for w in net.weights))), "source": fastckpt.__file__,
                  "hits": sum(sum(s.cache_hits.values()) for s in stats),
                  "misses": sum(sum(s.cache_misses.values()) for s in stats),
                  "paths": sorted({str(s.cache_path) for s in stats})}))
"""


NOTICE = "fastckpt: compiling its kernels for this CPU, once (they are cached in "


def run(cache_dir, tmp_path, cwd=None, **env):
    """Run WORKLOAD with the kernel cache in *cache_dir*; (its json, its stderr lines but the compile notice);
    the json's ``notices`` counts those."""
    fallback = tmp_path / "numba-default-cache"        # where Numba's own locators would write first
    env = dict(os.environ, FASTCKPT_CACHE_DIR=str(cache_dir), NUMBA_CACHE_DIR=str(fallback),
               FASTCKPT_COMPILE_NOTICE="1", **env)
    proc = subprocess.run([sys.executable, "-c", WORKLOAD], capture_output=True, text=True, env=env, timeout=600,
                          cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not fallback.exists() or not any(fallback.rglob("*.nb[ic]")), "kernels fell through to Numba's cache"
    lines = proc.stderr.strip().splitlines()
    out = json.loads(proc.stdout.splitlines()[-1])
    out["notices"] = [line for line in lines if line.startswith(NOTICE)]
    return out, [line for line in lines if not line.startswith(NOTICE)]


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A cache filled by one cold compile, and what the workload printed cold and then warm."""
    tmp = tmp_path_factory.mktemp("warm")
    cold, err = run(tmp / "cache", tmp)
    assert cold["misses"] > 0 and cold["hits"] == 0 and err == []
    # the cold compile took more than a second, and the process said so once, naming where the kernels go
    assert cold["notices"] == [NOTICE + f"{next((tmp / 'cache').glob('numba/*'))}): ~{CompileNotice.estimate} s"]
    assert cold["paths"] == [str(next((tmp / "cache").glob("numba/*")))]
    warm, err = run(tmp / "cache", tmp)
    assert warm["hits"] > 0 and warm["misses"] == 0 and warm["weights"] == cold["weights"] and err == []
    assert warm["notices"] == []                     # loading from the cache says nothing
    return SimpleNamespace(dir=tmp / "cache", warm=warm, cold=cold)


@pytest.fixture
def cache(warm, tmp_path):
    """A copy of the warm cache, and the directory holding the kernels' files."""
    copy = tmp_path / "cache"
    shutil.copytree(warm.dir, copy)
    (entries,) = copy.glob("numba/*")
    return copy, entries


def overwrite_middle(path):
    body = bytearray(path.read_bytes())
    mid = len(body) // 2
    body[mid:mid + 16] = bytes(range(16))            # same length: pickle may well accept it
    path.write_bytes(bytes(body))


DAMAGE = {
    "truncated-nbi": lambda nbi, nbc: os.truncate(nbi, nbi.stat().st_size // 2),
    "truncated-nbc": lambda nbi, nbc: os.truncate(nbc, nbc.stat().st_size // 2),
    "empty-nbi": lambda nbi, nbc: os.truncate(nbi, 0),
    "empty-nbc": lambda nbi, nbc: os.truncate(nbc, 0),
    "garbage-nbi": lambda nbi, nbc: overwrite_middle(nbi),
    "garbage-nbc": lambda nbi, nbc: overwrite_middle(nbc),
    "missing-nbc": lambda nbi, nbc: nbc.unlink(),
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
@pytest.mark.sweep('truncated-nbc', 'garbage-nbi')
def test_a_damaged_entry_is_discarded_recompiled_and_reported_once(damage, warm, cache, tmp_path):
    cache_dir, entries = cache
    (nbi,) = entries.glob("runs._make.locals.run-*.nbi")
    (nbc,) = entries.glob("runs._make.locals.run-*.1.nbc")
    signatures = len(list(entries.glob("runs._make.locals.run-*.nbc")))
    damage(nbi, nbc)

    out, err = run(cache_dir, tmp_path)
    assert out["weights"] == warm.warm["weights"]
    assert out["misses"] == signatures               # only the damaged kernel was compiled again
    assert len(err) == 1, err
    assert "KernelCacheWarning" in err[0] and str(entries) in err[0] and "runs._make.locals.run" in err[0]
    assert "discarded it and recompiling" in err[0]

    out, err = run(cache_dir, tmp_path)              # repaired: served from disk, silently
    assert (out["weights"], out["misses"], err) == (warm.warm["weights"], 0, [])


def a_file(tmp_path):
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file"


UNUSABLE = {
    "a-file": a_file,
    "beneath-a-file": lambda tmp_path: a_file(tmp_path) / "cache",
}


@pytest.mark.parametrize("where", UNUSABLE.values(), ids=UNUSABLE.keys())
@pytest.mark.sweep('a-file')
def test_an_unusable_directory_means_no_disk_cache_and_says_so(where, warm, tmp_path):
    cache_dir = where(tmp_path)
    out, err = run(cache_dir, tmp_path)
    assert out["weights"] == warm.warm["weights"]
    assert out["paths"] == ["None"]                  # Numba's NullCache: no disk cache at all
    assert len(err) == 1, err
    assert "KernelCacheWarning" in err[0] and f"{cache_dir}" in err[0] and "without a disk cache" in err[0]


@pytest.mark.slow
def test_a_file_in_place_of_the_sources_directory_means_no_disk_cache(warm, cache, tmp_path):
    cache_dir, entries = cache
    shutil.rmtree(entries)
    entries.write_text("")
    out, err = run(cache_dir, tmp_path)
    assert out["weights"] == warm.warm["weights"]
    assert out["paths"] == ["None"]
    assert len(err) == 1 and "without a disk cache" in err[0], err


def cpu_names(nbi):
    """The CPU names in a kernel's index keys: (signature, (triple, cpu, features), code hashes)."""
    version, stamp, overloads = pickle.loads(nbi.read_bytes()[32:])
    return sorted({key[1][1] for key in overloads})


@pytest.mark.slow
def test_the_cache_keys_on_the_target_cpu(warm, cache, tmp_path):
    """Code compiled for one CPU is never served to another (NUMBA_CPU_NAME makes Numba target it)."""
    llvm = pytest.importorskip("llvmlite.binding")
    host = os.environ.get("NUMBA_CPU_NAME") or llvm.get_host_cpu_name()
    avx2 = llvm.get_host_cpu_features().get("avx2", False)
    other = "znver3" if avx2 and host != "znver3" else "generic"    # code this CPU can run
    cache_dir, entries = cache
    (nbi,) = entries.glob("runs._make.locals.run-*.nbi")
    assert cpu_names(nbi) == [host]

    out, err = run(cache_dir, tmp_path, NUMBA_CPU_NAME=other)
    assert (out["hits"], out["misses"], err) == (0, warm.cold["misses"], [])
    assert cpu_names(nbi) == sorted([host, other])   # both kept side by side, each under its own key

    out, _ = run(cache_dir, tmp_path, NUMBA_CPU_NAME=other)
    assert (out["hits"], out["misses"]) == (warm.warm["hits"], 0)
    out, _ = run(cache_dir, tmp_path)
    assert (out["hits"], out["misses"]) == (warm.warm["hits"], 0)


def test_disable_jit_imports_without_touching_the_cache(tmp_path):
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", FASTCKPT_CACHE_DIR=str(tmp_path / "never"))
    code = "import fastckpt, fastckpt.kernels as k; print(k.dense_forward)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert not (tmp_path / "never").exists()


def test_another_install_of_the_same_sources_compiles_nothing(warm, cache, tmp_path):
    """The README installs twice (``pip install .``, then ``pip install -e .``): a copy of the package at another
    path, its files written anew (other times), finds every kernel that the first compiled."""
    import fastckpt.kernels

    import fastckpt
    cache_dir, _ = cache
    copy = tmp_path / "elsewhere" / "fastckpt"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(os.path.dirname(fastckpt.__file__), copy, ignore=ignore, copy_function=shutil.copyfile)
    if not (copy / "kernels" / "runs.py").exists():        # an editable install maps the kernels from kernels/
        shutil.copytree(os.path.dirname(fastckpt.kernels.__file__), copy / "kernels", ignore=ignore,
                        copy_function=shutil.copyfile, dirs_exist_ok=True)
    out, err = run(cache_dir, tmp_path, PYTHONPATH=str(copy.parent), cwd=str(tmp_path))
    assert out["source"] == str(copy / "__init__.py")
    assert (out["weights"], out["hits"], out["misses"], err) == (warm.warm["weights"], warm.warm["hits"], 0, [])


class _Event:
    def __init__(self, module):
        self.data = {"dispatcher": SimpleNamespace(py_func=SimpleNamespace(__module__=module))}


@pytest.mark.parametrize("seconds, said", [(0.3, True), (0.0, False)])
def test_the_notice_comes_once_when_a_compile_lasts_past_its_second(monkeypatch, seconds, said):
    """A compile of fastckpt's kernels (nested ones too) that lasts past ``after`` is said once; a shorter one, a
    compile of other code, or FASTCKPT_COMPILE_NOTICE=0 says nothing."""
    import io
    import time
    monkeypatch.setenv("FASTCKPT_COMPILE_NOTICE", "1")
    out = io.StringIO()
    notice = CompileNotice(stream=out)
    notice.after = 0.1
    ours, theirs = _Event("fastckpt.kernels.runs"), _Event("numba.np.arrayobj")
    for _ in range(2):                                   # a second compile in the same process: said only once
        notice.on_start(theirs)
        notice.on_start(ours)
        notice.on_start(ours)                            # a kernel it calls, compiled inside it
        time.sleep(seconds)
        notice.on_end(ours)
        notice.on_end(ours)
        notice.on_end(theirs)
        time.sleep(0.2)                                  # past the timer: nothing more comes
    assert out.getvalue() == (notice.message() + "\n" if said else "")
    monkeypatch.setenv("FASTCKPT_COMPILE_NOTICE", "0")
    quiet = CompileNotice(stream=out)
    quiet.after = 0.0
    quiet.on_start(ours)
    time.sleep(0.1)
    quiet.on_end(ours)
    assert out.getvalue() == (notice.message() + "\n" if said else "")
