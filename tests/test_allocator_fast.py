"""replay()'s one-loop replay (allocator_fast.run_fast) against the allocator's rules one
request and one free at a time (DeviceAllocator.malloc/free), on seeded random streams, for
every setting: the same segments, reserved timeline, peaks and out-of-memory."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from jupyter_memprof._analysis.allocator import fast as allocator_fast
from jupyter_memprof._analysis.allocator.config import parse_config
from jupyter_memprof._analysis.allocator.model import (
    DeviceAllocator,
    Replay,
    replay,
    reserved_timeline,
    segments_table,
)
from jupyter_memprof._analysis.schema import Source

KiB = 1024
MiB = 1024 * KiB

SETTINGS = [
    "",
    "expandable_segments:True",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "expandable_segments:True,roundup_power2_divisions:2",
    "max_split_size_mb:40",
    "max_split_size_mb:20,max_non_split_rounding_mb:64,expandable_segments:True",
]


def random_stream(seed: int, events: int, live_max: int) -> tuple[list[int], list[int]]:
    """(keys, sizes): requests of random sizes (under 4 KiB, up to 1 MiB, up to 64 MiB,
    and a few fixed sizes so cached blocks fit exactly), frees of random live blocks, frees
    of blocks never requested and requests for a key still live (its block is never
    freed)."""
    rng = random.Random(seed)
    fixed = [rng.randint(1, 64 * MiB) for _ in range(8)]
    keys: list[int] = []
    sizes: list[int] = []
    live: list[int] = []
    nid = 0
    for _ in range(events):
        pick = rng.random()
        if live and (pick < 0.45 or len(live) > live_max):
            keys.append(live.pop(rng.randrange(len(live))))
            sizes.append(0)
        elif pick < 0.47:
            keys.append(10**9 + rng.randrange(100))  # never requested
            sizes.append(0)
        else:
            if live and pick < 0.48:
                key = rng.choice(live)  # requested again while live
            else:
                nid += 1
                key = nid
                live.append(key)
            top = rng.choice([4096, 1 * MiB, 64 * MiB, 0])
            keys.append(key)
            sizes.append(rng.choice(fixed) if top == 0 else rng.randint(1, top))
    return keys, sizes


def one_by_one(
    keys, sizes, setting, capacity=None, places=None, stream=0
) -> tuple[DeviceAllocator, Replay]:
    """The stream through malloc() and free(), one event at a time, and its Replay;
    ``stream``: the CUDA stream of every event, or a list of each event's."""
    a = DeviceAllocator(parse_config(setting), capacity, None if places is None else iter(places))
    streams = [stream] * len(keys) if isinstance(stream, int) else stream
    where = {}
    for i, (key, size) in enumerate(zip(keys, sizes)):
        if size > 0:
            a.event = i
            where[key] = (a.malloc(size, streams[i]), a.last_list)
        elif key in where:
            a.free(*where.pop(key))
    return a, Replay.of({"cuda:0": a})


def assert_same(fast: Replay, slow: Replay, events: int) -> None:
    """Segments (as prof.segments and as reserved bytes over time), peaks and OOM alike."""
    assert fast.rows == slow.rows
    assert fast.peaks == slow.peaks
    assert fast.oom == slow.oom
    time_ns = np.arange(events, dtype=np.int64) * 1000
    seg_fast = segments_table(fast, time_ns, Source.MODELLED)
    seg_slow = segments_table(slow, time_ns, Source.MODELLED)
    pd.testing.assert_frame_equal(seg_fast, seg_slow)
    pd.testing.assert_frame_equal(reserved_timeline(seg_fast), reserved_timeline(seg_slow))


def live_max(seed: int) -> int:
    """Few live blocks (long reuse of cached ones) or many (long free lists)."""
    return 40 if seed == 1 else 400


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("seed", [1, 2])
def test_the_one_loop_replay_is_the_rules_one_event_at_a_time(setting, seed):
    keys, sizes = random_stream(seed, 6000, live_max=live_max(seed))
    fast = replay(["cuda:0"] * len(keys), keys, sizes, config=parse_config(setting))
    a, slow = one_by_one(keys, sizes, setting)
    assert_same(fast, slow, len(keys))
    assert len(slow.rows) > 10 and slow.peaks["cuda:0"].fragmentation > 0
    assert a.allocated > 0  # blocks still live at the end (and blocks requested again)
    looped = DeviceAllocator(parse_config(setting))  # the loop itself, for every setting
    allocator_fast.run_fast(looped, keys, sizes)
    assert looped.rows == a.rows and looped.free_lists == a.free_lists


@pytest.mark.parametrize("setting", SETTINGS)
def test_at_a_limit_the_one_loop_replay_empties_the_cache_and_runs_out_as_the_rules_do(setting):
    """A limit under the stream's peak: the cache is emptied (segments freed, pages
    unmapped) and retried, and the first request that still does not fit is the same."""
    keys, sizes = random_stream(3, 6000, live_max=60)
    unlimited = replay(["cuda:0"] * len(keys), keys, sizes, config=parse_config(setting))
    reserved = unlimited.peaks["cuda:0"].reserved
    for capacity in (reserved * 3 // 4, reserved // 3):
        fast = replay(
            ["cuda:0"] * len(keys),
            keys,
            sizes,
            config=parse_config(setting),
            capacity={"cuda:0": capacity},
        )
        _, slow = one_by_one(keys, sizes, setting, capacity=capacity)
        assert_same(fast, slow, len(keys))
        given_back = sum(t1 is not None for *_, t1 in slow.rows)
        assert given_back > 0 or "cuda:0" in slow.oom  # the limit was in the way
    if "max_split" not in setting:  # (there, freeing oversize blocks was enough)
        assert "cuda:0" in slow.oom


@pytest.mark.parametrize("setting", ["", "roundup_power2_divisions:4", "expandable_segments:True"])
def test_with_recorded_placement_the_one_loop_replay_puts_segments_where_the_rules_do(setting):
    """Segments at given addresses, out of order: ties go to the lowest address."""
    keys, sizes = random_stream(4, 6000, live_max=200)
    places = [p * 256 * MiB for p in random.Random(4).sample(range(1, 100_000), 5000)]
    fast = replay(
        ["cuda:0"] * len(keys),
        keys,
        sizes,
        config=parse_config(setting),
        placement={"cuda:0": places},
    )
    _, slow = one_by_one(keys, sizes, setting, places=places)
    assert_same(fast, slow, len(keys))


def stream_of_each_event(keys, sizes, seed: int, count: int = 3) -> list[int]:
    """A CUDA stream per event: each request on one of ``count`` streams (at random), each
    free on its block's stream (a free of a block never requested: on stream 0)."""
    rng = random.Random(seed)
    of_key: dict[int, int] = {}
    streams = []
    for key, size in zip(keys, sizes):
        if size > 0:
            of_key[key] = rng.randrange(count)
        streams.append(of_key.get(key, 0))
    return streams


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("seed", [1, 2])
def test_on_several_streams_the_one_loop_replay_is_the_rules_one_event_at_a_time(setting, seed):
    """Each CUDA stream has its own free lists and segments: a block freed on one stream is
    never given to a request on another; the loop replays every event (no repeats skipped)."""
    keys, sizes = random_stream(seed, 6000, live_max=live_max(seed))
    streams = stream_of_each_event(keys, sizes, seed)
    fast = replay(
        ["cuda:0"] * len(keys), keys, sizes, streams=streams, config=parse_config(setting)
    )
    a, slow = one_by_one(keys, sizes, setting, stream=streams)
    assert_same(fast, slow, len(keys))
    assert {s for s, _ in a.free_lists} == {0, 1, 2}
    fast_alloc = DeviceAllocator(parse_config(setting))
    assert allocator_fast.run_fast(fast_alloc, keys, sizes, streams) == len(keys)
    assert fast_alloc.free_lists == a.free_lists and fast_alloc.allocated == a.allocated


@pytest.mark.parametrize("setting", ["", "max_split_size_mb:40", "expandable_segments:True"])
def test_on_several_streams_at_a_limit_the_one_loop_replay_runs_out_as_the_rules_do(setting):
    keys, sizes = random_stream(6, 6000, live_max=60)
    streams = stream_of_each_event(keys, sizes, 6, count=2)
    config = parse_config(setting)
    unlimited = replay(["cuda:0"] * len(keys), keys, sizes, streams=streams, config=config)
    capacity = unlimited.peaks["cuda:0"].reserved // 2
    fast = replay(
        ["cuda:0"] * len(keys),
        keys,
        sizes,
        streams=streams,
        config=config,
        capacity={"cuda:0": capacity},
    )
    _, slow = one_by_one(keys, sizes, setting, capacity=capacity, stream=streams)
    assert_same(fast, slow, len(keys))
    assert "cuda:0" in slow.oom


def test_on_another_stream_the_one_loop_replay_keeps_that_streams_free_lists():
    keys, sizes = random_stream(5, 3000, live_max=100)
    fast = replay(["cuda:0"] * len(keys), keys, sizes, streams=[3] * len(keys))
    a, slow = one_by_one(keys, sizes, "", stream=3)
    assert_same(fast, slow, len(keys))
    assert set(a.free_lists) == {(3, False), (3, True)}


# -- repeated steps ---------------------------------------------------------------------------


def training_like_stream(
    seed: int, steps: int, leak: bool = False
) -> tuple[list[int], list[int], int]:
    """(keys, sizes, events per step): kept blocks, then ``steps`` repeats of one random step
    (requests, each freed later in the step or kept into the next step and freed there,
    frees of blocks never requested; with ``leak``, a key asked for again while live), one
    step in the middle with other sizes, a kept block freed a third of the way, a step
    three quarters of the way that frees a block never requested instead of one of its own;
    then every live block freed and random requests and frees, so that a wrong block
    anywhere would show."""
    rng = random.Random(seed)
    keys: list[int] = []
    sizes: list[int] = []
    kept = [(10**6 + i, rng.randint(1, 8 * MiB)) for i in range(20)]
    for key, size in kept:
        keys.append(key)
        sizes.append(size)
    slots = 30
    step_sizes = [rng.choice([4096, 2 * MiB, 30 * MiB]) for _ in range(slots)]
    step_sizes = [rng.randint(1, top) for top in step_sizes]
    carried = set(rng.sample(range(slots), 5))  # freed in the next step
    ops: list[tuple[str, int]] = [("request", s) for s in rng.sample(range(slots), slots)]
    for s in range(slots):
        if s not in carried:
            after = ops.index(("request", s)) + 1
            ops.insert(rng.randint(after, len(ops)), ("free", s))
        else:
            ops.insert(rng.randint(0, len(ops)), ("carried", s))
    ops.insert(rng.randint(0, len(ops)), ("unknown", 0))
    lost = steps * 3 // 4  # in this step one block is not freed (the free's key is another)
    ops_freed = [s for kind, s in ops if kind == "free"]
    for step in range(steps):
        odd = step == steps // 2
        base = 1000 * (step + 1)
        for kind, s in ops:
            if kind == "request":
                keys.append(base + s)
                sizes.append(step_sizes[s] + (7 * 512 if odd else 0))
                if leak and s == 0:
                    keys.append(base + s)
                    sizes.append(step_sizes[s])
            elif kind == "free" and step == lost and s == ops_freed[0]:
                keys.append(-2)  # this step frees a block never requested instead
                sizes.append(0)
            else:
                keys.append({"free": base + s, "carried": base - 1000 + s, "unknown": -1}[kind])
                sizes.append(0)
        if step == steps // 3:
            keys.append(kept[0][0])
            sizes.append(0)
    live = {k for k, n in zip(keys, sizes) if n > 0} - {k for k, n in zip(keys, sizes) if n <= 0}
    for key in sorted(live):
        keys.append(key)
        sizes.append(0)
    tail_keys, tail_sizes = random_stream(seed, 2000, live_max=50)
    keys += [10**8 + key for key in tail_keys]
    sizes += tail_sizes
    return keys, sizes, len(ops) + (1 if leak else 0)


def replayed_events(keys, sizes, setting) -> int:
    """How many events the one loop replays (the rest are skipped repeats)."""
    return allocator_fast.run_fast(DeviceAllocator(parse_config(setting)), keys, sizes)


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_repeated_steps_are_skipped_and_the_replay_stays_the_rules(setting, seed):
    """A training loop's steps leave the allocator as they found it: after the first few,
    they are not replayed, and the segments, peaks and every block still come out as the
    rules one event at a time give them."""
    keys, sizes, _ = training_like_stream(seed, steps=300)
    fast = replay(["cuda:0"] * len(keys), keys, sizes, config=parse_config(setting))
    _, slow = one_by_one(keys, sizes, setting)
    assert_same(fast, slow, len(keys))
    if "max_split" not in setting:
        assert replayed_events(keys, sizes, setting) < len(keys) * 0.9


@pytest.mark.parametrize("setting", ["", "expandable_segments:True"])
def test_steps_that_leak_are_replayed_whole(setting):
    """A key asked for again while live leaves its block in use for good: no two steps
    start alike, nothing is skipped."""
    keys, sizes, _ = training_like_stream(4, steps=60, leak=True)
    fast = replay(["cuda:0"] * len(keys), keys, sizes, config=parse_config(setting))
    _, slow = one_by_one(keys, sizes, setting)
    assert_same(fast, slow, len(keys))
    assert replayed_events(keys, sizes, setting) == len(keys)


@pytest.mark.parametrize("setting", ["", "expandable_segments:True"])
def test_repeated_steps_at_a_limit_and_with_recorded_placement(setting):
    keys, sizes, _ = training_like_stream(5, steps=150)
    unlimited = replay(["cuda:0"] * len(keys), keys, sizes, config=parse_config(setting))
    capacity = unlimited.peaks["cuda:0"].reserved * 2 // 3
    places = [p * 256 * MiB for p in random.Random(5).sample(range(1, 100_000), 5000)]
    fast = replay(
        ["cuda:0"] * len(keys),
        keys,
        sizes,
        config=parse_config(setting),
        capacity={"cuda:0": capacity},
        placement={"cuda:0": places},
    )
    _, slow = one_by_one(keys, sizes, setting, capacity=capacity, places=places)
    assert_same(fast, slow, len(keys))


@pytest.mark.parametrize(
    "setting",
    [
        "roundup_power2_divisions:4",
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
        "roundup_power2_divisions:[1:16,>:2]",
        "roundup_power2_divisions:1",
    ],
)
@pytest.mark.parametrize("huge", [False, True])
def test_requests_rounded_all_at_once_are_each_rounded_as_the_rules_round_it(setting, huge):
    """The loop rounds a stretch's requests with numpy (roundup_power2_divisions): each as
    round_size gives it, at the edges of every power of two and of the divisions too;
    frees stay as they are; sizes from 2**53 (not exact as floats) go one by one."""
    rng = random.Random(7)
    sizes = [rng.randint(-3, 1 << rng.randint(1, 40)) for _ in range(20_000)]
    sizes += [(1 << k) + e for k in range(53) for e in (-1, 0, 1)]
    sizes += [512 * d + e for d in (1, 2, 4, 8, 16) for e in (-1, 0, 1)]
    if huge:
        sizes.append((1 << 60) + 12345)
    config = parse_config(setting)
    want = [config.round_size(s) if s > 0 else s for s in sizes]
    assert allocator_fast.rounded(config, sizes, 0, len(sizes)) == want
    assert allocator_fast.rounded(config, sizes, 100, 200) == want[100:200]


# -- several devices ------------------------------------------------------------------------


def by_rules_per_device(devices, keys, sizes, setting, capacity) -> Replay:
    """Several devices' events through malloc() and free(), one at a time: one allocator a
    device (made where the device first appears), a free going to its block's allocator."""
    alloc: dict[str, DeviceAllocator] = {}
    where = {}
    for i, (dev, key, size) in enumerate(zip(devices, keys, sizes)):
        a = alloc.get(dev)
        if a is None:
            a = alloc[dev] = DeviceAllocator(parse_config(setting), capacity.get(dev))
        if size > 0:
            a.event = i
            where[key] = (a, a.malloc(size), a.last_list)
        elif key in where:
            block, addr, lst = where.pop(key)
            block.free(addr, lst)
    return Replay.of(alloc)


@pytest.mark.parametrize("setting", ["", "expandable_segments:True", "max_split_size_mb:40"])
def test_several_devices_each_replay_in_one_loop_as_the_rules_do(setting):
    """Each device's events in one loop, positions in the whole stream kept: the same
    segments, peaks and out-of-memory (at a limit on one device) as the rules one event at
    a time; a free labelled with another device frees its block where it was asked for,
    and a device whose only event is such a free still has its (empty) allocator."""
    keys, sizes = random_stream(8, 6000, live_max=200)
    rng = random.Random(8)
    of_key: dict[int, str] = {}
    devices = []
    for key, size in zip(keys, sizes):
        if size > 0:
            of_key[key] = rng.choice(["cuda:0", "cuda:1"])
        dev = of_key.get(key, "cuda:0")
        devices.append("cuda:1" if size <= 0 and rng.random() < 0.05 else dev)
    devices[0], keys[0], sizes[0] = "cuda:2", keys[1], 0  # frees a block not yet asked for
    capacity = {"cuda:1": 2 * 1024 * MiB}
    fast = replay(devices, keys, sizes, config=parse_config(setting), capacity=capacity)
    slow = by_rules_per_device(devices, keys, sizes, setting, capacity)
    assert list(fast.peaks) == list(slow.peaks) == ["cuda:2", "cuda:0", "cuda:1"]
    assert_same(fast, slow, len(keys))
    assert "cuda:1" in slow.oom and slow.peaks["cuda:0"].event > 0
