"""How long the model of CUDA's caching allocator takes to replay a million events.

Three streams of 1,000,000 events (requests and frees) on one device, made here without a GPU:

- training: steps of a 48-layer model, as a training step allocates: each layer's
  activations in forward (sizes from 4 KiB to 24 MiB, fixed per layer, so later steps reuse
  the cached blocks), freed in reverse in backward while gradients and temporaries come and
  go, then the optimizer's temporaries; parameters, gradients and optimizer state stay;
- training, lengths vary: the same steps with every batch of its own length (64 to 512),
  activations scaled with it: nothing repeats, free lists stay as short as training's;
- churn: requests of random sizes (under 4 KiB, up to 1 MiB, up to 64 MiB) and frees of
  random live blocks, up to 2,000 live: long free lists, many splits and merges.

Each is replayed (:func:`jupyter_memprof._analysis.allocator.model.replay`) with the default
settings, ``expandable_segments:True``, ``max_split_size_mb:32`` and
``roundup_power2_divisions:4``, and with the default settings on two CUDA streams (each
block's request and free on one of them, at random). The table gives the median of
``--rounds`` rounds, wall time (min-max in brackets) and the process's CPU time, the CPU
time over the reference loop's, the events replayed one by one (the rest are repeated steps
skipped exactly, ``_analysis/allocator/repeat.py``; on several CUDA streams every event is
replayed) and the reserved peak. The reference loop (10 million dict stores in Python) is
timed before and after each round: on another machine, or on this one less loaded, a
replay takes about the ratio times the reference's time there. The CPU times hold better
than the wall times on a shared machine.

Run: ``.venv/bin/python benchmarks/bench_allocator.py [--events 1000000] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from jupyter_memprof._analysis.allocator.config import parse_config
from jupyter_memprof._analysis.allocator.fast import run_fast
from jupyter_memprof._analysis.allocator.model import DeviceAllocator, replay
from jupyter_memprof._units import format_bytes

KiB, MiB = 1024, 1024 * 1024


def training_stream(
    events: int, layers: int = 48, seed: int = 0, *, lengths_vary: bool = False
) -> tuple[list, list]:
    """(keys, sizes) of training steps until ``events`` events (size 0: a free).
    ``lengths_vary``: every step's activations scaled by a batch length drawn from 64 to
    512 (as with dynamic padding), so no step repeats the one before."""
    rng = random.Random(seed)
    act = [
        rng.choice([4 * KiB, 96 * KiB, 700 * KiB, 3 * MiB, 9 * MiB, 24 * MiB])
        + rng.randrange(0, 4096)
        for _ in range(layers)
    ]
    param = [rng.choice([256 * KiB, 1 * MiB, 4 * MiB]) for _ in range(layers)]
    keys: list[int] = []
    sizes: list[int] = []
    nid = 0

    def alloc(size: int) -> int:
        nonlocal nid
        nid += 1
        keys.append(nid)
        sizes.append(size)
        return nid

    def free(key: int) -> None:
        keys.append(key)
        sizes.append(0)

    for p in param:  # parameters, their gradients and two optimizer states: kept
        for _ in range(4):
            alloc(p)
    while len(keys) < events:
        if lengths_vary:
            length = rng.randint(64, 512)
            step = [max(1, a * length // 512) for a in act]
        else:
            step = act
        saved = [alloc(a) for a in step]  # forward
        for i in reversed(range(layers)):  # backward
            tmp = alloc(step[i] // 2 + 512)
            grad_in = alloc(step[i])
            free(saved[i])
            free(tmp)
            free(grad_in)
        for p in param:  # optimizer
            t = alloc(p)
            free(t)
    return keys[:events], sizes[:events]


def varying_stream(events: int) -> tuple[list, list]:
    """:func:`training_stream` with every batch of its own length."""
    return training_stream(events, lengths_vary=True)


def churn_stream(events: int, seed: int = 0) -> tuple[list, list]:
    """(keys, sizes) of random requests and frees until ``events`` events."""
    rng = random.Random(seed)
    keys: list[int] = []
    sizes: list[int] = []
    live: list[int] = []
    nid = 0
    while len(keys) < events:
        if live and (rng.random() < 0.5 or len(live) > 2000):
            keys.append(live.pop(rng.randrange(len(live))))
            sizes.append(0)
        else:
            nid += 1
            pick = rng.random()
            size = (
                rng.randint(1, 4096)
                if pick < 1 / 3
                else rng.randint(1, MiB)
                if pick < 2 / 3
                else rng.randint(MiB, 64 * MiB)
            )
            keys.append(nid)
            sizes.append(size)
            live.append(nid)
    return keys[:events], sizes[:events]


def two_streams(keys: list, sizes: list, seed: int = 0) -> list[int]:
    """A CUDA stream (0 or 1, at random) per block: its request's and its free's."""
    rng = random.Random(seed)
    of_key: dict[int, int] = {}
    streams = []
    for key, size in zip(keys, sizes):
        if size > 0:
            of_key[key] = rng.randrange(2)
        streams.append(of_key.get(key, 0))
    return streams


def timed(fn) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process, result) of ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def measure(name: str, stream: tuple, setting: str, rounds: int) -> tuple:
    """(wall, CPU) seconds per round, each round between two reference loops, the
    reference loops' (wall, CPU) seconds, the events replayed one by one, the reserved
    peak. ``stream``: keys, sizes and the CUDA stream of each event (None: all on one)."""
    keys, sizes, streams = stream
    devices = ["cuda:0"] * len(keys)
    config = parse_config(setting)
    times, refs = [], [timed(reference_loop)[:2]]
    peak = 0
    for _ in range(rounds):
        wall, cpu, out = timed(lambda: replay(devices, keys, sizes, streams=streams, config=config))
        times.append((wall, cpu))
        refs.append(timed(reference_loop)[:2])
        peak = out.peaks["cuda:0"].reserved
    replayed = run_fast(DeviceAllocator(config), keys, sizes, streams)
    return name, setting or "(default)", len(keys), times, refs, replayed, peak


def reference_loop() -> None:
    """10 million dict stores: how fast Python runs on this machine now."""
    d: dict[int, int] = {}
    for i in range(10_000_000):
        d[i & 1023] = i


def median(pairs: list[tuple[float, float]], which: int) -> float:
    return statistics.median(p[which] for p in pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5, help="rounds per row (median reported)")
    args = ap.parse_args()
    settings = (
        "",
        "expandable_segments:True",
        "max_split_size_mb:32",
        "roundup_power2_divisions:4",
    )
    rows = []
    streams = (
        ("training", training_stream),
        ("training, lengths vary", varying_stream),
        ("churn", churn_stream),
    )
    for name, make in streams:
        keys, sizes = make(args.events)
        rows += [measure(name, (keys, sizes, None), s, args.rounds) for s in settings]
        two = (keys, sizes, two_streams(keys, sizes))
        rows.append(measure(f"{name}, 2 CUDA streams", two, "", args.rounds))
    refs = [r for row in rows for r in row[4]]
    print(
        f"\nMedian of {args.rounds} rounds, wall time (min-max in brackets) and CPU time of "
        f"the process; the reference loop: {median(refs, 0):.2f} s wall "
        f"({min(r[0] for r in refs):.2f}-{max(r[0] for r in refs):.2f}), "
        f"{median(refs, 1):.2f} s CPU (median of {len(refs)}).\n"
    )
    print(
        "| stream | setting | events | replay | CPU | CPU / reference | replayed | reserved peak |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, setting, n, times, ref, replayed, peak in rows:
        wall = [t[0] for t in times]
        spread = f"{median(times, 0):.2f} s ({min(wall):.2f}-{max(wall):.2f})"
        ratio = median(times, 1) / median(ref, 1)
        print(
            f"| {name} | {setting} | {n:,} | {spread} | {median(times, 1):.2f} s | {ratio:.2f} "
            f"| {replayed:,} | {format_bytes(peak)} |"
        )


if __name__ == "__main__":
    main()
