"""Files written whole or not at all, and the name ``np.savez`` gives a file."""
import os
import tempfile


def npz_name(path):
    """The file ``np.savez(path)`` writes: ``path`` with ``.npz`` appended unless it ends so."""
    path = os.fspath(path)
    return path if path.endswith(".npz") else path + ".npz"


def atomic_write(path, write, exclusive=False):
    """Call ``write(f)`` on a temporary file in the folder of ``path`` (``.npz`` appended unless it
    ends so), flush it to disk and rename it over the target: the file there is the old one or
    the whole new one, never half of one.  A symlink's target is replaced, keeping the link,
    and a replaced file keeps its permissions.  With ``exclusive`` the target must not exist: the
    file is linked into place, which fails if another process made one meanwhile (FileExistsError),
    instead of renamed over it.  Returns the path written."""
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
        if exclusive:
            os.link(tmp, target)                                  # atomic, and never over another's file
            os.unlink(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target
