"""The model of CUDA's caching allocator on hand-worked sequences: each rule and setting,
with the exact segments and bytes the allocator's source gives."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from jupyter_memprof._analysis.allocator.config import (
    AllocatorConfig,
    config_from_env,
    parse_config,
)
from jupyter_memprof._analysis.allocator.model import DeviceAllocator, replay
from jupyter_memprof._errors import AllocatorConfigError

KiB = 1024
MiB = 1024 * KiB


def segments(a: DeviceAllocator, live_only: bool = True) -> list[tuple[str, int]]:
    """(pool, bytes) of each segment (still reserved, by default), in the order taken."""
    return [
        ("small" if small else "large", size)
        for small, size, _, freed in a.rows
        if not live_only or freed is None
    ]


def fresh(setting: str = "", capacity: int | None = None) -> DeviceAllocator:
    return DeviceAllocator(parse_config(setting), capacity)


# -- sizes and pools ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "block"),
    [(1, 512), (512, 512), (513, 1024), (1000, 1024), (4096, 4096), (1 * MiB, 1 * MiB)],
)
def test_requests_round_up_to_512_bytes(request_, block):
    a = fresh()
    addr = a.malloc(request_)
    assert a.used[addr] == block
    assert segments(a) == [("small", 2 * MiB)]


def test_the_small_pool_packs_requests_of_1_MiB_or_less_into_2_MiB_segments():
    a = fresh()
    for _ in range(4):
        a.malloc(512 * KiB)
    assert segments(a) == [("small", 2 * MiB)] and a.reserved == 2 * MiB
    a.malloc(512 * KiB)  # the fifth does not fit
    assert segments(a) == [("small", 2 * MiB)] * 2
    assert a.allocated == 5 * 512 * KiB


def test_just_over_1_MiB_is_the_large_pool():
    a = fresh()
    a.malloc(1 * MiB + 1)
    assert segments(a) == [("large", 20 * MiB)]
    assert a.used[next(iter(a.used))] == 1 * MiB + 512


def test_requests_under_10_MiB_share_20_MiB_segments():
    a = fresh()
    a.malloc(8 * MiB)
    a.malloc(8 * MiB)  # the 12 MiB rest of the first segment
    assert segments(a) == [("large", 20 * MiB)]
    a.malloc(8 * MiB)  # 4 MiB left: a second segment
    assert segments(a) == [("large", 20 * MiB)] * 2
    assert a.reserved == 40 * MiB and a.allocated == 24 * MiB


@pytest.mark.parametrize(
    ("request_", "segment", "block"),
    [
        (10 * MiB, 10 * MiB, 10 * MiB),  # from 10 MiB: its own segment
        (11 * MiB + 1, 12 * MiB, 12 * MiB),  # rounded to 2 MiB; 1 MiB - 512 left: kept
        (19 * MiB, 20 * MiB, 20 * MiB),  # 1 MiB left is not more than 1 MiB: not split
        (19 * MiB - 512, 20 * MiB, 19 * MiB - 512),  # 1 MiB + 512 left: split off
        (100 * MiB + 3, 102 * MiB, 100 * MiB + 512),
    ],
)
def test_large_requests_get_their_own_segment_rounded_to_2_MiB(request_, segment, block):
    a = fresh()
    addr = a.malloc(request_)
    assert segments(a) == [("large", segment)]
    assert a.used[addr] == block and a.allocated == block


def test_a_small_pool_rest_of_512_bytes_is_split_off():
    a = fresh()
    addr = a.malloc(2 * MiB - 512 - 1 * MiB)  # 1 MiB - 512
    assert a.used[addr] == 1 * MiB - 512
    b = a.malloc(1 * MiB)
    c = a.malloc(512)  # exactly the 512 bytes left
    assert a.used[b] == 1 * MiB and a.used[c] == 512 and segments(a) == [("small", 2 * MiB)]


# -- reuse -----------------------------------------------------------------------------------


def test_best_fit_takes_the_smallest_cached_block_that_fits():
    a = fresh()
    big = a.malloc(12 * MiB)  # its own 12 MiB segment
    a.malloc(4 * MiB)  # a 20 MiB segment: a 16 MiB rest stays free
    a.free(big)
    got = a.malloc(11 * MiB)  # 12 MiB and 16 MiB free: the 12 MiB one
    assert got == big and a.used[got] == 12 * MiB  # 1 MiB left: not split
    assert a.reserved == 32 * MiB
    assert a.malloc(16 * MiB) != big and a.reserved == 32 * MiB  # the rest, exactly


def test_equal_blocks_go_lowest_address_first():
    a = fresh()
    first = a.malloc(12 * MiB)
    second = a.malloc(12 * MiB)
    a.free(second)
    a.free(first)
    assert a.malloc(12 * MiB) == min(first, second)


def test_freed_neighbours_merge_and_serve_a_larger_request():
    a = fresh()
    x = a.malloc(4 * MiB)
    y = a.malloc(4 * MiB)
    z = a.malloc(4 * MiB)
    a.malloc(4 * MiB)
    a.free(x)
    a.free(z)
    a.free(y)  # x, y and z are one 12 MiB block now
    assert a.malloc(12 * MiB) == x
    assert segments(a) == [("large", 20 * MiB)]


def test_a_cached_block_is_reused_without_a_new_segment():
    a = fresh()
    x = a.malloc(30 * MiB)
    a.free(x)
    assert a.reserved == 30 * MiB and a.allocated == 0
    assert a.malloc(29 * MiB) == x and len(a.rows) == 1


def test_a_stream_never_gets_another_streams_blocks():
    a = fresh()
    x = a.malloc(8 * MiB, stream=0)
    a.free(x)
    y = a.malloc(8 * MiB, stream=1)
    assert y != x and segments(a) == [("large", 20 * MiB)] * 2
    assert a.malloc(8 * MiB, stream=0) == x


# -- settings --------------------------------------------------------------------------------


def test_max_split_size_oversize_blocks_are_not_split_nor_given_to_smaller_requests():
    a = fresh("max_split_size_mb:40")
    x = a.malloc(50 * MiB)
    a.free(x)
    y = a.malloc(12 * MiB)  # under the limit: not the 50 MiB block
    assert y != x and segments(a) == [("large", 50 * MiB), ("large", 12 * MiB)]
    z = a.malloc(45 * MiB)  # over the limit and less than 20 MiB smaller: the whole block
    assert z == x and a.used[z] == 50 * MiB


def test_max_split_size_large_requests_take_oversize_blocks_only_within_20_MiB():
    a = fresh("max_split_size_mb:20")
    x = a.malloc(50 * MiB)
    a.free(x)
    y = a.malloc(25 * MiB)  # 50 >= 25 + 20: refused
    assert y != x and a.used[y] == 26 * MiB
    assert a.malloc(32 * MiB) == x  # 50 < 32 + 20: taken whole
    assert a.used[x] == 50 * MiB


def test_max_non_split_rounding_widens_that_slack():
    a = fresh("max_split_size_mb:20,max_non_split_rounding_mb:40")
    x = a.malloc(50 * MiB)
    a.free(x)
    assert a.malloc(25 * MiB) == x and a.used[x] == 50 * MiB


def test_without_max_split_size_a_large_block_is_split_for_a_small_request():
    a = fresh()
    x = a.malloc(50 * MiB)
    a.free(x)
    assert a.malloc(12 * MiB) == x and a.used[x] == 12 * MiB
    assert segments(a) == [("large", 50 * MiB)]


@pytest.mark.parametrize(
    ("setting", "request_", "block"),
    [
        ("roundup_power2_divisions:4", 1200 * MiB + 1, 1280 * MiB),  # 1024, 1280, ...
        ("roundup_power2_divisions:4", 1024 * MiB + 1, 1280 * MiB),
        ("roundup_power2_divisions:4", 1024 * MiB, 1024 * MiB),  # a power of two stays
        ("roundup_power2_divisions:4", 1200, 1536),  # not over 512 x 4: 512 rounding
        ("roundup_power2_divisions:4", 3000, 3072),  # 2048, 2560, 3072, 3584
        ("roundup_power2_divisions:8", 5 * MiB + 1, 5 * MiB + 512 * KiB),
        # by size: below 512 MiB 1 division (512 rounding), below 1 GiB 2, then 4
        ("roundup_power2_divisions:[256:1,512:2,>:4]", 200 * MiB + 1, 200 * MiB + 512),
        ("roundup_power2_divisions:[256:1,512:2,>:4]", 300 * MiB + 1, 300 * MiB + 512),
        ("roundup_power2_divisions:[256:1,512:2,>:4]", 600 * MiB, 768 * MiB),
        ("roundup_power2_divisions:[256:1,512:2,>:4]", 5000 * MiB, 5120 * MiB),
    ],
)
def test_roundup_power2_divisions(setting, request_, block):
    a = fresh(setting)
    addr = a.malloc(request_)
    assert a.used[addr] == block


def test_expandable_segments_grow_one_segment_by_20_MiB_pages():
    a = fresh("expandable_segments:True")
    x = a.malloc(5 * MiB)
    assert a.reserved == 20 * MiB
    y = a.malloc(30 * MiB)  # the free 15 MiB plus one more page... 20 MiB
    assert y == x + 5 * MiB and a.reserved == 40 * MiB
    assert segments(a) == [("large", 20 * MiB), ("large", 20 * MiB)]  # one row per mapping
    a.malloc(4 * MiB + 1)  # 5 MiB were left: the rest of 512 bytes or more is split
    assert a.reserved == 40 * MiB and a.allocated == 39 * MiB + 512


def test_expandable_segments_small_pool_pages_are_2_MiB():
    a = fresh("expandable_segments:True")
    for _ in range(5):
        a.malloc(1 * MiB)
    assert a.reserved == 6 * MiB and segments(a) == [("small", 2 * MiB)] * 3


def test_expandable_segments_prefer_a_block_that_cannot_grow():
    a = fresh("expandable_segments:True")
    x = a.malloc(5 * MiB)
    a.malloc(10 * MiB)
    a.free(x)  # 5 MiB free at the start, 5 MiB free before the unmapped rest
    assert a.malloc(3 * MiB) == x


def test_expandable_large_requests_split_too():
    plain, grown = fresh(), fresh("expandable_segments:True")
    for a in (plain, grown):
        for _ in range(3):
            a.malloc(15 * MiB)
    assert plain.reserved == 48 * MiB  # three 16 MiB segments
    assert grown.reserved == 60 * MiB and grown.allocated == 45 * MiB  # one, of 3 pages


# -- a memory limit ---------------------------------------------------------------------------


def test_at_a_limit_cached_segments_are_freed_and_the_request_retried():
    a = fresh(capacity=40 * MiB)
    x = a.malloc(12 * MiB)
    a.free(x)
    a.malloc(30 * MiB)  # 12 + 30 > 40: the cached 12 MiB segment goes back first
    assert a.oom is None and a.reserved == 30 * MiB
    assert segments(a, live_only=False) == [("large", 12 * MiB), ("large", 30 * MiB)]
    assert a.rows[0][3] == a.rows[1][2]  # given back when the second was taken


def test_a_segment_with_a_block_in_use_is_not_freed_and_the_limit_is_hit():
    a = fresh(capacity=40 * MiB)
    x = a.malloc(4 * MiB)  # a 20 MiB segment
    a.malloc(4 * MiB)
    a.free(x)
    a.event = 7
    a.malloc(24 * MiB)  # 20 + 24 > 40; the 20 MiB segment holds a block in use
    assert a.oom is not None
    assert (a.oom.event, a.oom.size, a.oom.allocated, a.oom.reserved) == (
        7,
        24 * MiB,
        4 * MiB,
        20 * MiB,
    )
    assert a.reserved == 44 * MiB  # after the note, the replay goes on without a limit


def test_at_a_limit_max_split_size_frees_oversize_blocks_first():
    a = fresh("max_split_size_mb:20", capacity=100 * MiB)
    x = a.malloc(30 * MiB)
    y = a.malloc(40 * MiB)
    a.malloc(4 * MiB)  # a 20 MiB segment in use
    a.free(x)
    a.free(y)
    a.malloc(50 * MiB)  # 90 + 50 > 100; no cached block of 50 MiB or more, so the
    # largest oversize ones go back until 50 MiB are freed: 40, then 30
    assert a.oom is None and a.reserved == 70 * MiB
    assert segments(a) == [("large", 20 * MiB), ("large", 50 * MiB)]


def test_expandable_segments_at_a_limit_unmap_free_pages():
    a = fresh("expandable_segments:True", capacity=60 * MiB)
    x = a.malloc(30 * MiB)  # pages [0, 40)
    a.malloc(5 * MiB)  # [30, 35)
    a.free(x)  # free: [0, 30) and [35, 40)
    a.malloc(45 * MiB)  # needs 40 more MiB: 80 > 60, so the free page [0, 20) is unmapped
    assert a.oom is None and a.reserved == 60 * MiB and a.allocated == 50 * MiB


# -- the stream -------------------------------------------------------------------------------


def test_replay_keeps_devices_apart_and_ignores_frees_of_unknown_blocks():
    out = replay(
        ["cuda:0", "cuda:1", "cuda:0", "cuda:0", "cuda:1"],
        [1, 2, 1, 99, 3],
        [8 * MiB, 100, 0, 0, 12 * MiB],
    )
    assert sorted((d, s, size) for d, s, size, _, _ in out.rows) == [
        ("cuda:0", False, 20 * MiB),
        ("cuda:1", False, 12 * MiB),
        ("cuda:1", True, 2 * MiB),
    ]
    assert out.peaks["cuda:0"].reserved == 20 * MiB and out.peaks["cuda:0"].event == 0
    assert out.peaks["cuda:1"].reserved == 14 * MiB
    assert out.peaks["cuda:1"].fragmentation == 2 * MiB - 512


# -- the setting's text ------------------------------------------------------------------------


def test_settings_parse_as_torch_reads_them():
    c = parse_config(
        "expandable_segments:True, max_split_size_mb:128,roundup_power2_divisions:[>:2],"
        "garbage_collection_threshold:0.6,backend:native"
    )
    assert c.expandable_segments and c.max_split_size == 128 * MiB
    # '>' fills the sizes after the last one named (none: from 2 MiB), as torch does
    assert c.roundup_power2_divisions == (0,) + (2,) * 15
    assert parse_config(None) == parse_config("") == AllocatorConfig()
    assert parse_config("expandable_segments:False").expandable_segments is False
    assert config_from_env({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}).setting == (
        "expandable_segments:True"
    )
    assert config_from_env({}) == AllocatorConfig()


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("max_split_size_mb:10", "max_split_size_mb must be at least 20 (MB), not 10"),
        ("max_split_size_mb:lots", "max_split_size_mb takes a whole number, not 'lots'"),
        ("expandable_segments:yes", "expandable_segments takes True or False, not 'yes'"),
        ("roundup_power2_divisions:3", "roundup_power2_divisions: 3 is not a power of 2"),
        ("roundup_power2_divisions:[100:2]", "roundup_power2_divisions: 100 is not a power of 2"),
        ("roundup_power2_divisions:[256:2", "expected ']' at the end"),
        ("expandable_segment:True", "unknown setting 'expandable_segment'"),
        ("max_split_size_mb", "expected ':' at the end"),
        ("max_split_size_mb=128", "unknown setting 'max_split_size_mb=128'"),
        ("garbage_collection_threshold:1.5", "between 0 and 1"),
        ("backend:cudaMallocAsync", "CUDA's own allocator, which is not modelled"),
        ("expandable_segments:True,expandable_segments:False", "given twice"),
    ],
)
def test_a_bad_setting_is_one_clear_line(setting, says):
    with pytest.raises(AllocatorConfigError) as err:
        parse_config(setting)
    text = str(err.value)
    assert says in text and "\n" not in text and text.startswith(f"allocator setting {setting!r}")


def test_a_bad_setting_in_the_environment_names_the_variable():
    with pytest.raises(AllocatorConfigError, match=r"^PYTORCH_CUDA_ALLOC_CONF: allocator"):
        config_from_env({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:1"})


# -- real GPU data ----------------------------------------------------------------------------
# The caching allocator's own history (torch.cuda.memory._record_memory_history) of every
# bench_cuda scenario and of a step made to fragment, from an empty allocator, on an H100
# with torch 2.11.0+cu130 (benchmarks/record_cuda.py; tests/data/allocator/README.md).

DATA = Path(__file__).parent / "data" / "allocator"
TRACES = sorted(DATA.glob("*.json.gz"))


def load_trace(path: Path) -> dict:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def trace_stream(d: dict) -> dict:
    """The requests and completed frees of a recorded trace, and its segments."""
    code = {a: i for i, a in enumerate(d["actions"])}
    out = {"keys": [], "sizes": [], "streams": [], "places": [], "segments": [], "peak": 0}
    reserved = 0
    for act, addr, size, stream in d["trace"]:
        if act in (code["alloc"], code["free_completed"]):
            out["keys"].append(addr)
            out["sizes"].append(size if act == code["alloc"] else 0)
            out["streams"].append(stream)
        elif act in (code["segment_alloc"], code["segment_map"]):
            out["segments"].append(size)
            out["places"] += [addr] if act == code["segment_alloc"] else []
            reserved += size
            out["peak"] = max(out["peak"], reserved)
        elif act in (code["segment_free"], code["segment_unmap"]):
            reserved -= size
    return out


def test_the_recorded_traces_are_all_here():
    names = {p.name.split("__")[0] for p in TRACES}
    assert len(names) == 10 and "fragment" in names  # nine scenarios and the fragmenter
    assert {p.name.split("__")[1] for p in TRACES} == {
        "default.json.gz",
        "expandable.json.gz",
        "max_split_20.json.gz",
        "roundup_4.json.gz",
    }


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_the_model_replays_real_h100_traces_to_torchs_reserved_peak(path):
    """Replayed from the empty allocator, the model takes the segments CUDA's allocator
    took, of the same sizes in the same order, and reaches torch.cuda.max_memory_reserved
    exactly, once it is told where CUDA put each segment (ties between equal free blocks go
    to the lowest address); without the addresses, within 1%."""
    d = load_trace(path)
    s = trace_stream(d)
    assert s["peak"] == d["max_memory_reserved"]  # the trace holds every segment
    config = parse_config(d["alloc_conf"])
    devices = ["cuda:0"] * len(s["keys"])
    placed = replay(
        devices, s["keys"], s["sizes"], s["streams"], config, placement={"cuda:0": s["places"]}
    )
    assert [size for _, _, size, _, _ in placed.rows] == s["segments"]
    assert placed.peaks["cuda:0"].reserved == d["max_memory_reserved"]
    modelled = replay(devices, s["keys"], s["sizes"], s["streams"], config)
    error = modelled.peaks["cuda:0"].reserved / d["max_memory_reserved"] - 1
    assert abs(error) < 0.01
    if d["setting"] != "roundup_4":  # ties there went to another segment
        assert modelled.peaks["cuda:0"].reserved == d["max_memory_reserved"]


# -- profiles ---------------------------------------------------------------------------------


def _blocks_step():
    """Blocks of known sizes on the step's device: 3 MiB, 8 MiB (freed), 12 MiB, 100 KiB."""
    a = torch.empty(3 * MiB // 4)
    b = torch.empty(8 * MiB // 4)
    del b
    c = torch.empty(12 * MiB // 4)
    d = torch.empty(100 * KiB // 4)
    return a, c, d


@pytest.fixture(scope="module")
def blocks_estimate():
    from jupyter_memprof import estimate

    w = torch.empty(2 * MiB // 4)  # a block from before the step: placed first
    return estimate(lambda w: (w, _blocks_step()), w, device="cuda:0")


def test_an_estimate_for_cuda_has_its_segments_and_reserved_peak(blocks_estimate):
    """w (2 MiB) and a (3 MiB) share a 20 MiB segment, b (8 MiB) takes 8 of its last 15
    MiB and gives them back, c (12 MiB) takes 12 of those 15 (a cached block serves a large
    request too), d (100 KiB) gets a small-pool segment."""
    prof = blocks_estimate
    seg = prof.segments
    assert list(seg.columns) == [
        "segment_id",
        "device",
        "pool",
        "size_bytes",
        "alloc_ns",
        "free_ns",
        "source",
    ]
    assert seg[["pool", "size_bytes"]].astype(object).values.tolist() == [
        ["large", 20 * MiB],
        ["small", 2 * MiB],
    ]
    assert set(seg["source"]) == {"modelled"} and seg["free_ns"].isna().all()
    assert seg["alloc_ns"].iloc[0] == prof.start_ns  # w was there at the start
    assert prof.meta["reserved_peak_bytes"] == {"cuda:0": 22 * MiB}
    assert prof.meta["reserved_peak_ns"] == {"cuda:0": int(seg["alloc_ns"].iloc[1])}
    live = 2 * MiB + 3 * MiB + 12 * MiB + 100 * KiB
    assert prof.peak("cuda:0").attrs["peak_bytes"] == live
    assert prof.meta["fragmentation_bytes"] == {"cuda:0": 22 * MiB - live}


def test_segments_survive_save_and_load_in_both_formats(blocks_estimate, tmp_path):
    import jupyter_memprof

    for fmt in ("zip", "parquet"):
        path = tmp_path / f"p.{fmt}"
        blocks_estimate.save(path, **({"format": "parquet"} if fmt == "parquet" else {}))
        back = jupyter_memprof.load(path)
        pd.testing.assert_frame_equal(back.segments, blocks_estimate.segments)
        assert back.meta["reserved_peak_bytes"] == {"cuda:0": 22 * MiB}


def test_a_file_saved_before_segments_loads_with_none(blocks_estimate, tmp_path):
    import shutil
    import zipfile

    import jupyter_memprof

    path = blocks_estimate.save(tmp_path / "p.memprof")
    old = tmp_path / "old.memprof"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(old, "w") as dst:
        for info in src.infolist():
            if info.filename != "segments.json":
                dst.writestr(info, src.read(info))
    assert jupyter_memprof.load(old).segments.empty
    folder = blocks_estimate.save(tmp_path / "p.parquet", format="parquet")
    (Path(folder) / "segments.parquet").unlink()
    assert jupyter_memprof.load(folder).segments.empty
    shutil.rmtree(folder)


def test_a_cpu_capture_has_no_segments_and_takes_the_setting():
    import jupyter_memprof

    with jupyter_memprof.profile(namespace={}, allocator="expandable_segments:True") as prof:
        torch.ones(1000) * 2
    assert prof.segments.empty and prof.meta["allocator"] == "expandable_segments:True"
    assert "reserved_peak_bytes" not in prof.meta


def test_a_bad_setting_stops_a_capture_before_it_starts(monkeypatch):
    import jupyter_memprof
    from jupyter_memprof._errors import CaptureError

    with pytest.raises(CaptureError, match=r"^allocator setting 'max_split_size_mb:5': "):
        jupyter_memprof.profile(namespace={}, allocator="max_split_size_mb:5")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:perhaps")
    with pytest.raises(CaptureError, match=r"^PYTORCH_CUDA_ALLOC_CONF: allocator setting"):
        jupyter_memprof.profile(namespace={})


def test_recorded_reserved_totals_are_kept_and_the_model_checked_against_them(blocks_estimate):
    """Where the events table holds the reserved totals torch's profiler recorded
    (``reserved_bytes``), the recorded peak is the profile's, and the model's error on it
    is in meta."""
    from jupyter_memprof._analysis.allocator.model import model_profile

    events = blocks_estimate.events.copy()
    recorded = [pd.NA] * len(events)
    recorded[-1] = 24 * MiB  # the allocator also held a block the step never saw
    events["reserved_bytes"] = pd.array(recorded, dtype="Int64")
    tables = {"events": events, "allocations": blocks_estimate.allocations}
    segments, meta = model_profile(tables)
    assert meta["reserved_peak_bytes"] == {"cuda:0": 24 * MiB}
    assert meta["reserved_model_error"] == {"cuda:0": (22 - 24) / 24}
    pd.testing.assert_frame_equal(segments, blocks_estimate.segments)
    _, without = model_profile({**tables, "events": blocks_estimate.events})
    assert without["reserved_peak_bytes"] == {"cuda:0": 22 * MiB}
    assert "reserved_model_error" not in without


def test_the_inline_replay_of_the_default_settings_is_malloc_and_free_step_for_step():
    """replay() runs the default settings in one loop (allocator_fast.run_fast): the same
    segments, peaks and fragmentation as malloc() and free() called one by one, on a
    stream of random requests (under 4 KiB, up to 1 MiB, up to 64 MiB) and frees."""
    import random

    rng = random.Random(1)
    keys, sizes, live, nid = [], [], [], 0
    for _ in range(20_000):
        if live and (rng.random() < 0.5 or len(live) > 300):
            keys.append(live.pop(rng.randrange(len(live))))
            sizes.append(0)
        else:
            nid += 1
            top = rng.choice([4096, 1 * MiB, 64 * MiB])
            keys.append(nid)
            sizes.append(rng.randint(1, top))
            live.append(nid)
    keys.append(12345678)  # a free of a block never requested
    sizes.append(0)
    fast = replay(["cuda:0"] * len(keys), keys, sizes)
    a = DeviceAllocator(AllocatorConfig())
    where = {}
    for i, (key, size) in enumerate(zip(keys, sizes)):
        a.event = i
        if size:
            where[key] = a.malloc(size)
        elif key in where:
            a.free(where.pop(key))
    assert [(s, n, t0, t1) for _, s, n, t0, t1 in fast.rows] == [tuple(r) for r in a.rows]
    peak = fast.peaks["cuda:0"]
    assert (peak.reserved, peak.event, peak.allocated, peak.reserved_then) == (
        a.peak,
        a.peak_event,
        a.peak_allocated,
        a.reserved_then,
    )
    assert len(a.rows) > 10 and peak.fragmentation > 0
