"""Bytes as people spell them: ``"24MiB"``, ``"1.5 GB"``, ``4096``, read exactly and shown back."""
import re
from fractions import Fraction

import numpy as np

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_TOO_MANY = 2**63                             # bytes no plan could count past


def parse_bytes(value, where):
    """Bytes from an int or a string like ``"24MiB"``, ``"1.5 GB"``, ``"4096"``."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value, flags=re.ASCII)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{where}: cannot read {value!r} as bytes (e.g. 24MiB, 1.5GB, 4096)")
        if len(m.group(1)) > 40:                      # more digits than any count of bytes (and than int() takes)
            raise ValueError(f"{where}: a number of {len(m.group(1))} digits is too many bytes to count")
        exact = Fraction(m.group(1)) * _UNITS[m.group(2).lower()]        # no float rounding
        if exact >= _TOO_MANY:
            shown = m.group(0).strip()
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise ValueError(f"{where}: {shown!r} is too many bytes to count")
        if exact.denominator != 1:
            raise ValueError(f"{where}: {m.group(0).strip()!r} is not a whole number of bytes")
        value = int(exact)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{where}: bytes must be a positive integer, got {value!r}")
    return int(value)


def format_bytes(n):
    """``25165824`` -> ``"24MiB"`` when exact, else the plain integer."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if n % _UNITS[unit.lower()] == 0:
            return f"{n // _UNITS[unit.lower()]}{unit}"
    return str(n)
