"""What a step reserves on a GPU: the caching allocator replayed.

PyTorch does not hand each tensor to ``cudaMalloc``: its caching allocator takes
*segments* from CUDA and carves them into blocks, keeping freed blocks cached for reuse.
What runs out on a GPU is the segments (the *reserved* bytes), so a step whose tensors fit
can still fail for fragmentation. :mod:`.device` states the rules, as of torch 2.11-2.13
(docs/estimate.md, "Will it fit", lists them with the sequences that test them).

:mod:`.config` reads the settings; :class:`DeviceAllocator` (:mod:`.device`) is one device's
allocator; :func:`replay` drives them over a stream of events (in one loop,
``fast.py``, skipping exact repeats of a step, ``repeat.py``);
:func:`model_profile` replays a profile's tables into ``prof.segments``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .. import schema as S
from ..arrays import cuda_rows
from ..schema import Pool, Source
from . import fast as allocator_fast
from .config import AllocatorConfig
from .device import DeviceAllocator, OutOfMemory

# -- replaying a stream -----------------------------------------------------------------------


@dataclass
class Peak:
    """A device's peaks: the most reserved bytes and the event that reached them, and the
    most allocated bytes (whole blocks, as ``torch.cuda.memory_allocated`` counts them)
    with the reserved bytes at that moment."""

    reserved: int
    event: int
    allocated: int
    reserved_then: int

    @property
    def fragmentation(self) -> int:
        """At the allocated peak: reserved bytes no block in use holds (cached free blocks,
        the split-off rests of segments)."""
        return self.reserved_then - self.allocated


@dataclass
class Replay:
    """What :func:`replay` found, per device (keys: the devices' names)."""

    #: rows of ``prof.segments`` (without segment ids): device, small, size, alloc, free
    #: (alloc and free are positions in the stream; free None: still reserved at the end)
    rows: list[tuple[str, bool, int, int, int | None]] = field(default_factory=list)
    peaks: dict[str, Peak] = field(default_factory=dict)
    oom: dict[str, OutOfMemory] = field(default_factory=dict)

    @classmethod
    def of(cls, alloc: Mapping[str, DeviceAllocator]) -> Replay:
        """What each device's allocator (device -> allocator) holds after a replay."""
        out = cls()
        for dev, a in alloc.items():
            out.rows.extend((dev, small, size, t0, t1) for small, size, t0, t1 in a.rows)
            out.peaks[dev] = Peak(a.peak, a.peak_event, a.peak_allocated, a.reserved_then)
            if a.oom is not None:
                out.oom[dev] = a.oom
        return out


def replay(
    devices: Sequence[str],
    keys: Sequence[int],
    sizes: Sequence[int],
    streams: Sequence[int] | None = None,
    config: AllocatorConfig | None = None,
    capacity: Mapping[str, int] | None = None,
    placement: Mapping[str, Sequence[int]] | None = None,
) -> Replay:
    """Replay a stream of requests and frees through one :class:`DeviceAllocator` per
    device: event i is a request of ``sizes[i]`` bytes (> 0) for block ``keys[i]``, or its
    free (``sizes[i] <= 0``); ``streams`` (default all 0) are CUDA stream ids. A free of a
    block never requested is ignored (the block is not the allocator's). ``capacity``:
    device -> the bytes it may reserve; ``placement``: device -> the addresses CUDA gave its
    new segments, in order (from a recorded trace)."""
    config = config or AllocatorConfig()
    capacity, placement = capacity or {}, placement or {}
    alloc: dict[str, DeviceAllocator] = {}
    for dev in dict.fromkeys(devices):  # in the order they first appear
        places = placement.get(dev)
        alloc[dev] = DeviceAllocator(
            config, capacity.get(dev), None if places is None else iter(places)
        )
    if len(alloc) == 1:  # one device: the whole stream in one loop
        allocator_fast.run_fast(next(iter(alloc.values())), keys, sizes, streams)
    else:  # each device's events in one loop (a free goes to its block's device)
        for dev, events in allocator_fast.by_device(devices, keys, sizes).items():
            allocator_fast.run_part(alloc[dev], events, keys, sizes, streams)
    return Replay.of(alloc)


# -- a profile's allocator ----------------------------------------------------------------------


def is_cuda(device: str) -> bool:
    return str(device).startswith("cuda")


@dataclass
class Stream:
    """A profile's CUDA allocations and frees, in the order the allocator saw them: blocks
    live at the capture's start first (by address), then the events."""

    event: np.ndarray  # the row of ``events`` (-1: a block from before the capture)
    time_ns: np.ndarray
    device: list[str]
    key: list[int]
    size: list[int]  # > 0: a request, 0: a free


def profile_stream(tables: Mapping[str, pd.DataFrame]) -> Stream:
    """The CUDA allocations and frees of a profile's ``events`` table."""
    ev = tables["events"]
    act = ev["action"].astype(object).to_numpy()
    dev, cuda = ev["device"].astype(object).to_numpy(), cuda_rows(ev["device"])
    pre = cuda & (act == "preexisting")
    live = cuda & ((act == "create") | (act == "destroy"))
    pre_rows = np.flatnonzero(pre)
    if len(pre_rows):  # the allocator's oldest blocks, placed first, lowest address first
        alloc = tables["allocations"]
        ptr = pd.Series(alloc["ptr"].to_numpy(), index=alloc["alloc_id"].to_numpy())
        ptrs = ptr.reindex(ev["alloc_id"].to_numpy()[pre_rows]).to_numpy()
        pre_rows = pre_rows[np.argsort(ptrs, kind="stable")]
    rows = np.concatenate([pre_rows, np.flatnonzero(live)])
    size = ev["size_bytes"].to_numpy()[rows]
    size = np.where(act[rows] == "destroy", 0, size)
    return Stream(
        event=rows,
        time_ns=ev["time_ns"].to_numpy()[rows],
        device=[str(d) for d in dev[rows].tolist()],
        key=ev["alloc_id"].to_numpy()[rows].tolist(),
        size=size.tolist(),
    )


def segments_table(result: Replay, time_ns: np.ndarray, source: Source) -> pd.DataFrame:
    """``prof.segments`` from a replay's rows, stream positions turned into times."""
    if not result.rows:
        return S.empty(S.SEGMENTS)
    dev, small, size, t0, t1 = zip(*result.rows)
    t1 = np.array([-1 if t is None else t for t in t1], dtype=np.int64)
    return S.conform(
        pd.DataFrame(
            {
                "segment_id": np.arange(len(dev), dtype=np.int64),
                "device": pd.Categorical(dev),
                "pool": pd.Categorical(
                    [Pool.SMALL.value if s else Pool.LARGE.value for s in small],
                    dtype=S.POOL_DTYPE,
                ),
                "size_bytes": np.array(size, dtype=np.int64),
                "alloc_ns": time_ns[np.array(t0, dtype=np.int64)],
                "free_ns": S.integers(time_ns[np.maximum(t1, 0)], t1 < 0),
                "source": pd.Categorical([source.value] * len(dev), dtype=S.SOURCE_DTYPE),
            }
        ),
        S.SEGMENTS,
        name="segments",
    )


def reserved_timeline(segments: pd.DataFrame, device: str | None = None) -> pd.DataFrame:
    """Reserved bytes over time from ``prof.segments``: ``time_ns, device, reserved_bytes``,
    one row per segment change (a segment given back at the time another is taken counts
    as given back first)."""
    seg = segments if device is None else segments[segments["device"] == device]
    out = []
    for dev, g in seg.groupby("device", observed=True):
        freed = g["free_ns"].notna().to_numpy()
        t = np.concatenate(
            [g["alloc_ns"].to_numpy(), g["free_ns"].to_numpy(dtype=np.int64, na_value=0)[freed]]
        )
        d = np.concatenate([g["size_bytes"].to_numpy(), -g["size_bytes"].to_numpy()[freed]])
        order = np.lexsort((d, t))
        out.append(
            pd.DataFrame(
                {"time_ns": t[order], "device": str(dev), "reserved_bytes": np.cumsum(d[order])}
            )
        )
    if not out:
        return pd.DataFrame(
            {
                "time_ns": pd.Series([], dtype="int64"),
                "device": pd.Series([], dtype=object),
                "reserved_bytes": pd.Series([], dtype="int64"),
            }
        )
    return pd.concat(out, ignore_index=True)


def model_profile(
    tables: Mapping[str, pd.DataFrame], config: AllocatorConfig | None = None
) -> tuple[pd.DataFrame, dict]:
    """Replay a profile's CUDA blocks through the allocator model.

    Returns ``prof.segments`` (modelled) and meta: ``reserved_peak_bytes`` (device ->
    bytes), ``reserved_peak_ns`` (when it was first reached), ``fragmentation_bytes``
    (at the peak of allocated bytes: reserved minus allocated) and ``allocator`` (the setting
    replayed). Where the
    ``events`` table holds the reserved totals torch's profiler recorded
    (``reserved_bytes``), the recorded peak is kept as ``reserved_peak_bytes`` and the
    model's relative error on it is ``reserved_model_error``.
    """
    config = config or AllocatorConfig()
    stream = profile_stream(tables)
    meta: dict = {"allocator": config.setting}
    if not stream.key:
        return S.empty(S.SEGMENTS), meta
    result = replay(stream.device, stream.key, stream.size, config=config)
    segments = segments_table(result, stream.time_ns, Source.MODELLED)
    peaks = {d: p.reserved for d, p in result.peaks.items()}
    when = {d: int(stream.time_ns[p.event]) for d, p in result.peaks.items() if p.event >= 0}
    frag = {d: p.fragmentation for d, p in result.peaks.items()}
    meta.update(reserved_peak_bytes=peaks, reserved_peak_ns=when, fragmentation_bytes=frag)
    recorded = recorded_peaks(tables["events"])
    if recorded:
        meta["reserved_model_error"] = {
            d: (peaks[d] - r) / r for d, r in recorded.items() if d in peaks and r > 0
        }
        meta["reserved_peak_bytes"] = {**peaks, **recorded}
    return segments, meta


def recorded_peaks(events: pd.DataFrame) -> dict[str, int]:
    """Device -> the largest reserved total torch's profiler recorded (the events table's
    ``reserved_bytes`` column, when it has one)."""
    if "reserved_bytes" not in events.columns:
        return {}
    r = events[["device", "reserved_bytes"]].dropna()
    r = r[cuda_rows(r["device"])]
    if r.empty:
        return {}
    return {
        str(d): int(v)
        for d, v in r.groupby("device", observed=True)["reserved_bytes"].max().items()
    }
