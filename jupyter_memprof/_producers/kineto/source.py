"""A trace file read safely: gzip or plain, capped, type-checked.

A Chrome/Kineto trace: plain or gzip JSON, sizes capped, every field
the reader uses checked for its type and range.

A hostile file (deep nesting, numbers too large for their field, wrong types, a gzip bomb, not
JSON at all) raises :class:`~jupyter_memprof.ProfileFileError` with one line naming the file
and what is wrong; nothing else escapes for a file's content (a missing path is
FileNotFoundError).

The events are kept as small tuples (:class:`Span`, :class:`Mem`), the decoded document
dropped as soon as they are taken out of it.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import stat
import zlib
from typing import NamedTuple

from ..._errors import ProfileFileError
from .frames import kept

__all__ = ["MAX_JSON_BYTES", "Mem", "Span", "TraceFile", "looks_like_trace", "read_file"]

#: The largest decompressed JSON read (a gzip bomb stops here, with one line).
MAX_JSON_BYTES = 8 << 30
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 24
_HEAD = 1 << 16
#: ts and dur in microseconds: beyond this (about 30 years after 1970) a time is not one
_MAX_US = 1e15
_U64 = 1 << 64
_TID_MIN = -(1 << 63)
_NUMBER = (int, float)
_NO_SHAPES: list = []
_SEQ_MAX = 1 << 63
_I62 = 1 << 62
_I31 = 1 << 31
#: device names by CUDA index, made once
_CUDA: dict[int, str] = {}
#: the categories of complete events read as spans
SPAN_CATS = frozenset({"cpu_op", "user_annotation", "python_function"})
MEMORY = "[memory]"
OOM = "[OutOfMemory]"


class Span(NamedTuple):
    """A complete event (``ph: X``) of a CPU thread: an op, an annotation or a Python call."""

    cat: str
    name: str
    tid: int
    start_ns: int
    end_ns: int
    seq_nr: int  # autograd's "Sequence number", -1 when none
    shapes: list


class Mem(NamedTuple):
    """A ``[memory]`` or ``[OutOfMemory]`` instant event."""

    oom: bool
    tid: int
    time_ns: int
    device: str | None  # None: a device type this reader does not keep
    addr: int
    size: int
    total_allocated: int
    total_reserved: int


class TraceFile(NamedTuple):
    spans: list[Span]
    mems: list[Mem]
    rank: int | None
    world_size: int | None
    skipped_devices: int  # memory events on devices other than the CPU and CUDA
    event_count: int
    info: dict  # the trace's own top-level fields of plain values (schemaVersion, ...)


def _shown(path: str) -> str:
    return path if path.isprintable() else ascii(path)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def looks_like_trace(path: str) -> bool:
    """Whether ``path`` is a file that starts as a Chrome trace does (a JSON object or list,
    plain or gzip): read by content, not by name. Reads at most :data:`_HEAD` bytes (a
    trace of many GPUs lists their properties before its events)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEAD)
            if head[:2] == _GZIP_MAGIC:
                fh.seek(0)
                with gzip.GzipFile(fileobj=fh) as gz:
                    head = gz.read(_HEAD)
    except (OSError, EOFError, zlib.error):
        return False
    text = head.lstrip()
    keys = (b'"traceEvents"', b'"ph"', b'"schemaVersion"', b'"deviceProperties"')
    return text[:1] in (b"{", b"[") and any(k in text for k in keys)


def _read_bytes(path: str, where: str) -> bytes:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise ProfileFileError(f"{where} cannot be read ({_one_line(exc)})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise ProfileFileError(f"{where} is {kind}, not a trace")
    try:
        with open(path, "rb") as fh:
            if fh.read(2) != _GZIP_MAGIC:
                if st.st_size > MAX_JSON_BYTES:
                    raise ProfileFileError(f"{where} is over {MAX_JSON_BYTES} bytes of JSON")
                fh.seek(0)
                return fh.read()
            fh.seek(0)
            parts, total = [], 0
            with gzip.GzipFile(fileobj=fh) as gz:
                while chunk := gz.read(_CHUNK):
                    total += len(chunk)
                    if total > MAX_JSON_BYTES:
                        raise ProfileFileError(
                            f"{where} decompresses to over {MAX_JSON_BYTES} bytes: not read"
                        )
                    parts.append(chunk)
            return b"".join(parts)
    except ProfileFileError:
        raise
    except (OSError, EOFError, zlib.error) as exc:
        raise ProfileFileError(f"{where} is not a readable trace ({_one_line(exc)})") from None


def _decode(raw: bytes, where: str):
    """The JSON document in ``raw`` (the standard library's reader: orjson parses a trace
    about 1.6x faster but holds 1.4x the memory while it does, measured in docs/traces.md)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ProfileFileError(f"{where} is nested too deeply to be a trace") from None
    except (ValueError, UnicodeDecodeError) as exc:  # bad JSON, an int of too many digits
        raise ProfileFileError(f"{where} is not JSON ({_one_line(exc)})") from None


class _Bad(Exception):
    """A field of one event is wrong (turned into a ProfileFileError naming the event)."""


def _int(v, what: str, lo: int, hi: int) -> int:
    if type(v) is float and v.is_integer():
        v = int(v)
    if type(v) is not int or not lo <= v < hi:
        raise _Bad(f"{what} is {_brief(v)}, not an integer in range")
    return v


def _brief(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _us(v, what: str) -> float:
    if type(v) not in (int, float) or not math.isfinite(v) or abs(v) > _MAX_US:
        raise _Bad(f"{what} is {_brief(v)}, not a time in microseconds")
    return float(v)


def _ns(ts_us: float, base_ns: int) -> int:
    return base_ns + round(ts_us * 1000.0)


def _span(e: dict, cat: str, base_ns: int) -> Span:
    name = e.get("name")
    if type(name) is not str:
        raise _Bad(f"name is {_brief(name)}, not text")
    tid = _int(e.get("tid"), "tid", -(1 << 63), _U64)
    start = _us(e.get("ts"), "ts")
    dur = _us(e.get("dur", 0), "dur")
    args = e.get("args") or {}
    if type(args) is not dict:
        raise _Bad("args is not an object")
    seq = args.get("Sequence number", -1)
    seq = _int(seq, "Sequence number", -1, 1 << 63) if seq is not None else -1
    shapes = _shapes(args.get("Input Dims"))
    s_ns = _ns(start, base_ns)
    return Span(cat, name, tid, s_ns, max(s_ns, _ns(start + max(dur, 0.0), base_ns)), seq, shapes)


def _shapes(dims) -> list:
    """``Input Dims`` as the ops table keeps input shapes: a list of shapes (lists of
    ints), a tensor list as a list of shapes; anything else is left out (an empty list)."""
    if type(dims) is not list or len(dims) > 4096:
        return []
    out = []
    for d in dims:
        if type(d) is list and all(_dim(x) for x in d):
            out.append(d)
        elif type(d) is list and all(type(x) is list and all(_dim(y) for y in x) for x in d):
            out.append(d)
        else:
            out.append([])
    return out


def _dim(x) -> bool:
    return type(x) is int and 0 <= x < 1 << 62


def _mem(e: dict, base_ns: int, oom: bool) -> Mem:
    args = e.get("args")
    if type(args) is not dict:
        raise _Bad("args is not an object")
    tid = _int(e.get("tid", 0), "tid", -(1 << 63), _U64)
    t = _ns(_us(e.get("ts"), "ts"), base_ns)
    dev_type = _int(args.get("Device Type", 0), "Device Type", -(1 << 31), 1 << 31)
    dev_id = _int(args.get("Device Id", -1), "Device Id", -(1 << 31), 1 << 31)
    size = _int(args.get("Bytes", 0), "Bytes", -(1 << 62), 1 << 62)
    addr = 0 if oom else _int(args.get("Addr"), "Addr", 0, _U64)
    total_a = _int(args.get("Total Allocated", -1), "Total Allocated", -1, 1 << 62)
    total_r = _int(args.get("Total Reserved", -1), "Total Reserved", -1, 1 << 62)
    device = "cpu" if dev_type == 0 else f"cuda:{max(dev_id, 0)}" if dev_type == 1 else None
    return Mem(oom, tid, t, device, addr, size, total_a, total_r)


def _mem_fast(e: dict, base_ns: int) -> Mem | None:
    """A usual ``[memory]`` event of the CPU or CUDA read with its checks inline; None for
    anything else (then :func:`_mem` reads it, and says what is wrong)."""
    args = e.get("args")
    if type(args) is not dict or e.get("name") != MEMORY:
        return None
    tid, ts = e.get("tid", 0), e.get("ts")
    dev_type, dev_id = args.get("Device Type", 0), args.get("Device Id", -1)
    size, addr = args.get("Bytes", 0), args.get("Addr")
    total_a = args.get("Total Allocated", -1)
    total_r = args.get("Total Reserved", -1)
    if not (
        type(tid) is int
        and type(ts) in _NUMBER
        and type(size) is int
        and type(addr) is int
        and type(total_a) is int
        and type(total_r) is int
        and type(dev_id) is int
        and _TID_MIN <= tid < _U64
        and -_MAX_US <= ts <= _MAX_US
        and -_I62 <= size < _I62
        and 0 <= addr < _U64
        and -1 <= total_a < _I62
        and -1 <= total_r < _I62
        and -1 <= dev_id < _I31
    ):
        return None
    if dev_type == 0 and type(dev_type) is int:
        device = "cpu"
    elif dev_type == 1 and type(dev_type) is int:
        device = _CUDA.get(dev_id) or _CUDA.setdefault(dev_id, f"cuda:{max(dev_id, 0)}")
    else:
        return None
    return Mem(False, tid, base_ns + round(ts * 1000.0), device, addr, size, total_a, total_r)


def _events(doc, where: str) -> tuple[list, dict]:
    if isinstance(doc, list):
        return doc, {}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ProfileFileError(f"{where} is JSON but not a trace (no traceEvents list)")
    return doc["traceEvents"], doc


def _rank(doc: dict) -> tuple[int | None, int | None]:
    info = doc.get("distributedInfo")
    if not isinstance(info, dict):
        return None, None
    rank, world = info.get("rank"), info.get("world_size")
    ok = [v if type(v) is int and 0 <= v < 1 << 31 else None for v in (rank, world)]
    return ok[0], ok[1]


def _read_events(events: list, base: int, where: str) -> tuple[list[Span], list[Mem], int]:
    """The spans and memory events among ``events`` (times from ``base``), and how many
    memory events name no device (skipped); a malformed event raises ProfileFileError."""
    spans: list[Span] = []
    mems: list[Mem] = []
    skipped = 0
    add = spans.append
    kept_names: dict[str, bool] = {}
    for i, e in enumerate(events):
        if type(e) is not dict:
            raise ProfileFileError(f"{where}: event {i} is {type(e).__name__}, not an object")
        try:
            ph = e.get("ph")
            if ph == "X":
                cat, name = e.get("cat"), e.get("name")
                if cat == "python_function":
                    # most are library frames, dropped here (by name, decided once)
                    if type(name) is str:
                        keep = kept_names.get(name)
                        if keep is None:
                            keep = kept_names[name] = kept(name)
                        if not keep:
                            continue
                elif cat not in SPAN_CATS:
                    continue
                # the common case checked inline (a third of the reading time); anything
                # unusual goes the slow way, which says what is wrong
                tid, ts, dur = e.get("tid"), e.get("ts"), e.get("dur", 0)
                if (
                    type(name) is str
                    and type(tid) is int
                    and type(ts) in _NUMBER
                    and type(dur) in _NUMBER
                    and -_MAX_US <= ts <= _MAX_US
                    and 0 <= dur <= _MAX_US
                    and _TID_MIN <= tid < _U64
                ):
                    seq = -1
                    if cat != "python_function":
                        args = e.get("args")
                        if type(args) is not dict or "Input Dims" in args:
                            add(_span(e, cat, base))
                            continue
                        seq = args.get("Sequence number", -1)
                        if type(seq) is not int or not -1 <= seq < _SEQ_MAX:
                            add(_span(e, cat, base))
                            continue
                    t0 = base + round(ts * 1000.0)
                    t1 = base + round((ts + dur) * 1000.0)
                    add(Span(cat, name, tid, t0, t1 if t1 > t0 else t0, seq, _NO_SHAPES))
                else:
                    add(_span(e, cat, base))
            elif ph == "i" and e.get("name") in (MEMORY, OOM):
                m = _mem_fast(e, base) or _mem(e, base, e["name"] == OOM)
                if m.device is None:
                    skipped += 1
                else:
                    mems.append(m)
        except _Bad as exc:
            raise ProfileFileError(f"{where}: event {i} ({_brief(e.get('name'))}): {exc}") from None
    return spans, mems, skipped


def read_file(path: str) -> TraceFile:
    """The spans and memory events of the trace at ``path`` (see the module docstring)."""
    where = _shown(path)
    doc = _decode(_read_bytes(path, where), where)
    events, top = _events(doc, where)
    base = top.get("baseTimeNanoseconds", 0)
    if type(base) is not int or not 0 <= base < 1 << 62:
        raise ProfileFileError(f"{where}: baseTimeNanoseconds is {_brief(base)}, not a time")
    spans, mems, skipped = _read_events(events, base, where)
    other = top.get("otherData")
    if not mems and isinstance(other, dict) and other.get("generator") == "jupyter_memprof":
        raise ProfileFileError(
            f"{where} is a Chrome trace jupyter_memprof exported (for Perfetto), with no "
            "memory events to read back: load the profile saved with prof.save() instead"
        )
    if not mems:
        raise ProfileFileError(
            f"{where} has no memory events: torch's profiler writes them with profile_memory=True"
        )
    rank, world = _rank(top)
    info = {
        k: v
        for k, v in top.items()
        if k in ("schemaVersion", "trace_id", "host_name", "with_stack", "record_shapes")
        and type(v) in (int, str, bool)
        and len(str(v)) <= 200
    }
    return TraceFile(spans, mems, rank, world, skipped, len(events), info)
