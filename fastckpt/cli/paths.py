"""The command's files: ``--data``, ``--resume``, ``--out``, ``--save``, ``--save-best`` and ``--output`` checked
before any work.

Each check raises a ValueError naming the flag and the path, so a bad path
costs a second, not a training run.
"""
import os
import tempfile

from fastckpt.core.files import npz_name
from fastckpt.nets import load

from .data import EMBEDDED


def check_paths(args):
    """Refuse a missing ``--data`` or ``--resume``, an unusable ``--out`` folder, ``--save`` (``--save-best``) or
    ``--output`` file; create ``--out``."""
    resume = getattr(args, "resume", None)
    if resume is not None and not os.path.isfile(resume) and not os.path.isfile(npz_name(resume)):
        raise ValueError(f"--resume {resume!r}: no such file")
    data = getattr(args, "data", None)
    if data is not None and data != EMBEDDED and not os.path.exists(data):
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
    for flag in ("--save", "--save-best"):
        _check_save(args, flag)
    save, best = getattr(args, "save", None), getattr(args, "save_best", None)
    if save is not None and best is not None and npz_name(save) == npz_name(best):
        raise ValueError(f"--save-best {best!r} is the --save file: the last epoch's net would overwrite the best "
                         "one's; name another file")
    if getattr(args, "output", None) is not None:
        check_output(args.output, args.force)


def _check_save(args, flag):
    """Refuse a ``--save`` (``--save-best``) FILE that cannot be written, or that exists without ``--force``."""
    save = getattr(args, flag[2:].replace("-", "_"), None)
    if save is not None and not save.strip():
        raise ValueError(f"{flag} {save!r}: name the .npz file to write")
    if save is not None:
        target = npz_name(save)
        folder = os.path.dirname(target) or "."
        if not os.path.isdir(folder):
            raise ValueError(f"{flag} {save!r}: no such folder {folder!r}")
        if os.path.isdir(save) or os.path.isdir(target):
            raise ValueError(f"{flag} {save!r}: is a folder; name the .npz file to write")
        resume = getattr(args, "resume", None)
        same = flag == "--save" and resume is not None and os.path.exists(target) and os.path.samefile(
            target, npz_name(resume) if not os.path.exists(resume) else resume)
        if os.path.exists(target) and not getattr(args, "force", False) and not same:
            raise ValueError(f"{flag} {save!r}: {target!r} exists; pass --force to overwrite it")
        _probe(folder, flag)


def check_output(output, force):
    """Refuse a ``predict --output`` file that cannot be written, or that exists without ``--force``."""
    if not output.strip():
        raise ValueError(f"--output {output!r}: name the file to write")
    folder = os.path.dirname(output) or "."
    if os.path.isdir(output):
        raise ValueError(f"--output {output!r}: is a folder; name the file to write")
    if not os.path.isdir(folder):
        raise ValueError(f"--output {output!r}: no such folder {folder!r}")
    if os.path.exists(output) and not force:
        raise ValueError(f"--output {output!r} exists; pass --force to overwrite it")
    if os.path.exists(output) and not os.access(output, os.W_OK):
        raise ValueError(f"--output {output!r}: exists and cannot be written")
    _probe(folder, f"--output {output!r}")


def _probe(folder, flag):
    """Create and remove a file in ``folder``: the one test of writability that also holds for root."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".fastckpt-probe-")
    except OSError as exc:
        raise ValueError(f"{flag}: cannot write in {folder!r}: {exc.strerror}") from None
    os.close(fd)
    os.unlink(probe)


def load_named(path, flag):
    """The net saved at ``path``, its errors naming ``flag`` (``--resume``, ``FILE``) where the loader says
    ``path``."""
    try:
        return load(path)
    except ValueError as exc:
        said = str(exc)
        if said.startswith("path "):
            raise ValueError(flag + said[len("path"):]) from None
        raise
