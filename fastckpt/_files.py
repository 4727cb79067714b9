"""The command's files: ``--data``, ``--out`` and ``--save`` checked before any work, ``--save`` written atomically.

Each check raises a ValueError naming the flag and the path, so a bad path
costs a second, not a training run.
"""
import os
import tempfile


def check_paths(args):
    """Refuse a missing ``--data`` or ``--resume``, an unusable ``--out`` folder or ``--save`` file;
    create ``--out``."""
    resume = getattr(args, "resume", None)
    if resume is not None and not os.path.isfile(resume) and not os.path.isfile(npz_name(resume)):
        raise ValueError(f"--resume {resume!r}: no such file")
    data = getattr(args, "data", None)
    if data is not None and not os.path.exists(data):
        raise ValueError(f"--data {data!r}: no such file or folder")
    out = getattr(args, "out", None)
    if out is not None:
        if os.path.exists(out) and not os.path.isdir(out):
            raise ValueError(f"--out {out!r}: exists and is not a folder")
        try:
            os.makedirs(out, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--out {out!r}: cannot create the folder: {exc.strerror}") from None
        _probe(out, "--out")
    save = getattr(args, "save", None)
    if save is not None and not save.strip():
        raise ValueError(f"--save {save!r}: name the .npz file to write")
    if save is not None:
        target = npz_name(save)
        folder = os.path.dirname(target) or "."
        if not os.path.isdir(folder):
            raise ValueError(f"--save {save!r}: no such folder {folder!r}")
        if os.path.isdir(save) or os.path.isdir(target):
            raise ValueError(f"--save {save!r}: is a folder; name the .npz file to write")
        resume = getattr(args, "resume", None)
        same = resume is not None and os.path.exists(target) and os.path.samefile(target, npz_name(resume)
                                                                                   if not os.path.exists(resume)
                                                                                   else resume)
        if os.path.exists(target) and not getattr(args, "force", False) and not same:
            raise ValueError(f"--save {save!r}: {target!r} exists; pass --force to overwrite it")
        _probe(folder, "--save")


def npz_name(path):
    """The file ``np.savez(path)`` writes: ``path`` with ``.npz`` appended unless it ends so."""
    path = os.fspath(path)
    return path if path.endswith(".npz") else path + ".npz"


def _probe(folder, flag):
    """Create and remove a file in ``folder``: the one test of writability that also holds for root."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".fastckpt-probe-")
    except OSError as exc:
        raise ValueError(f"{flag}: cannot write in {folder!r}: {exc.strerror}") from None
    os.close(fd)
    os.unlink(probe)


def atomic_write(path, write):
    """Call ``write(f)`` on a temporary file in the folder of ``path`` (``.npz`` appended unless it
    ends so), flush it to disk and rename it over the target: the file there is the old one or
    the whole new one, never half of one.  A symlink's target is replaced, keeping the link,
    and a replaced file keeps its permissions.  Returns the path written."""
    target = os.path.realpath(npz_name(path))                # through a symlink: replace what it points to
    mode = os.stat(target).st_mode & 0o777 if os.path.exists(target) else None
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target) or ".", prefix=f".{os.path.basename(target)}.",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask                                 # as np.savez(path) would create it
        os.chmod(tmp, mode)                                       # or as the file it replaces was
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target
