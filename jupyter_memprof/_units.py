"""Units for people: bytes and durations, formatted and parsed in one place."""

from __future__ import annotations

import math
import re

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: int | float) -> str:
    """``4000`` -> ``'3.9 KiB'``; binary units (1 KiB = 1024 B), bytes shown exactly."""
    n = int(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return f"{sign}{n} B"
    exp = min(int(math.log(n, 1024)), len(_UNITS) - 1)
    value = n / 1024**exp
    if round(value, 1) >= 1024 and exp < len(_UNITS) - 1:  # 1023.96 KiB reads as 1.0 MiB
        exp += 1
        value = n / 1024**exp
    return f"{sign}{value:.1f} {_UNITS[exp]}"


def format_seconds(s: float | None) -> str:
    """A duration for people: ``'1.23 s'``, ``'45.2 ms'``, ``'310 µs'``."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "?"
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_FACTORS = {"": 1, "b": 1}
for _i, _p in enumerate("kmgtp", start=1):
    _FACTORS[f"{_p}ib"] = _FACTORS[f"{_p}i"] = 1024**_i
    _FACTORS[f"{_p}b"] = _FACTORS[_p] = 1000**_i


def parse_bytes(value: int | float | str) -> int:
    """``"24GiB"`` -> ``25769803776``; ``"1.5 GB"`` -> ``1500000000``; ints pass through.

    Binary suffixes (KiB, MiB, GiB, TiB, PiB; also Ki, Mi, ...) are powers of 1024, decimal
    ones (KB, MB, GB, ... and bare K, M, G) powers of 1000, as their names say. Raises
    ValueError with one line for anything else, including negative sizes.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size in bytes: {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"not a size in bytes: {value!r}")
        return int(value)
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"not a size in bytes: {value!r} (use e.g. 24GiB, 512MiB or 8000000000)")
    number, suffix = m.groups()
    factor = _FACTORS.get((suffix or "").lower())
    if factor is None:
        raise ValueError(f"unknown unit in {value!r} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
    return int(float(number) * factor)
