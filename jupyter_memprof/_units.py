"""Units for people: bytes and durations, formatted and parsed."""

from __future__ import annotations

import math
import re

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def _fixed(x: float, digits: int) -> tuple[int, str]:
    """``x >= 0`` to ``digits`` decimals, rounded half up as ``floor(x * 10**digits + 0.5)``.

    The browser's formatters (``_views/js/units.js``) do exactly these float operations, so
    Python and JavaScript print the same text for the same number (``str.format`` rounds half
    to even and ``toFixed`` half up: they differ on ties such as 1.25). Returns the scaled
    integer too, for the callers' roll-over checks."""
    scale = 10**digits
    k = math.floor(x * scale + 0.5)
    if not digits:
        return k, str(k)
    return k, f"{k // scale}.{k % scale:0{digits}d}"


def format_bytes(n: int | float) -> str:
    """``4000`` -> ``'3.9 KiB'``; binary units (1 KiB = 1024 B), bytes shown exactly.

    One decimal above 1023 B, rounded half up (1280 B is ``'1.3 KiB'``); a value that rounds
    to 1024.0 of a unit is shown in the next one (1023.96 KiB reads ``'1.0 MiB'``)."""
    n = int(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return f"{sign}{n} B"
    exp = 0
    while n >= 1024 ** (exp + 1) and exp < len(_UNITS) - 1:
        exp += 1
    k, text = _fixed(n / 1024**exp, 1)
    if k >= 10240 and exp < len(_UNITS) - 1:
        exp += 1
        k, text = _fixed(n / 1024**exp, 1)
    return f"{sign}{text} {_UNITS[exp]}"


def format_ms(ms: float | None) -> str:
    """A time in milliseconds on the capture's clock, to the microsecond: ``'12.345 ms'``,
    ``'1.234 s'``, ``'250.0 µs'``; ``''`` for NaN or None.

    The dashboard and lineage place events relative to each other with it, so it keeps more
    digits than :func:`format_seconds`, which is for headline durations."""
    if ms is None or not math.isfinite(ms):
        return ""
    sign = "-" if ms < 0 else ""
    a = abs(ms)
    if a < 1:
        k, text = _fixed(a * 1000, 1)
        if k < 10000:
            return f"{sign}{text} µs"
    if a < 1000:
        k, text = _fixed(a, 3)
        if k < 1000000:
            return f"{sign}{text} ms"
    return f"{sign}{_fixed(a / 1000, 3)[1]} s"


def format_records(ms: float | None, *, span: bool = False) -> str:
    """A place on an estimate's clock, which counts records, not time (one record per "ms":
    ``_producers/fake/recorder.CLOCK_STEP_NS``): ``'record #1,234'``, or with ``span=True`` a
    distance, ``'1,234 records'``; ``''`` for NaN or None. Never a unit of time."""
    if ms is None or not math.isfinite(ms):
        return ""
    n = math.floor(abs(ms) + 0.5) * (-1 if ms < 0 else 1)
    if span:
        return f"{n:,} record" + ("" if abs(n) == 1 else "s")
    return f"record #{n:,}"


def format_time(ms: float | None, *, records: bool = False, span: bool = False) -> str:
    """A place on a profile's clock (``span=True``: a distance), in ms since its start:
    :func:`format_ms` for a capture, :func:`format_records` for an estimate (``records=True``:
    ``meta["estimate"]``), whose clock counts records, not time."""
    return format_records(ms, span=span) if records else format_ms(ms)


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


#: The largest size an option may give (1 EiB): larger is a typo, and sizes stay int64.
MAX_BYTES = 2**60
#: Text longer than this is no size (and is quoted only by its start in an error).
_MAX_SIZE_TEXT = 64


def shown(value: object, limit: int = 40) -> str:
    """``repr(value)`` for a one-line error, cut to its first ``limit`` characters (a
    100,000-character setting is quoted by its start and its length)."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value):,} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"a number of {value.bit_length():,} bits"
    text = repr(value)
    return text if len(text) <= limit + 2 else text[:limit] + "..."


def parse_bytes(value: int | float | str) -> int:
    """``"24GiB"`` -> ``25769803776``; ``"1.5 GB"`` -> ``1500000000``; ints pass through.

    Binary suffixes (KiB, MiB, GiB, TiB, PiB; also Ki, Mi, ...) are powers of 1024, decimal
    ones (KB, MB, GB, ... and bare K, M, G) powers of 1000, as their names say; a size in
    such a unit is rounded down to whole bytes (``"1.3KiB"`` -> 1331). A count of bytes
    (a number, or a string without a unit or with ``B``) must be whole: ``1.5`` is refused,
    not read as 1 byte. Raises ValueError with one line for anything else, including
    negative sizes and sizes over :data:`MAX_BYTES`.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size in bytes: {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"not a size in bytes: {shown(value)}")
        return _bounded(_whole_bytes(value, value), value)
    text = str(value)
    m = _SIZE.match(text) if len(text) <= _MAX_SIZE_TEXT and text.isascii() else None
    if not m:
        raise ValueError(
            f"not a size in bytes: {shown(value)} (use e.g. 24GiB, 512MiB or 8000000000)"
        )
    number, suffix = m.groups()
    factor = _FACTORS.get((suffix or "").lower())
    if factor is None:
        raise ValueError(
            f"unknown unit in {shown(value)} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
        )
    if factor == 1:
        n = int(number) if "." not in number else _whole_bytes(float(number), value)
    else:
        n = int(float(number) * factor) if float(number) * factor <= MAX_BYTES else MAX_BYTES + 1
    return _bounded(n, value)


def _bounded(n: int, given: object) -> int:
    if n > MAX_BYTES:
        raise ValueError(f"{shown(given)} is over the largest size taken, 1 EiB")
    return n


def _whole_bytes(n: int | float, given: object) -> int:
    """``n`` bytes as an int; a fraction of a byte is refused (one line)."""
    if n != int(n):
        raise ValueError(f"not a whole number of bytes: {shown(given)}")
    return int(n)
