"""The model's replay loop: one device's stream in one function.

A whole stream of one device is replayed in one function,
its steps inline.

:class:`~jupyter_memprof._analysis.allocator.device.DeviceAllocator` states the allocator's
rules one request (``malloc``) and one free (``free``) at a time. Replaying a million events
through those methods spends most of its time on calls and attribute look-ups, so
:func:`run_fast` runs the same rules over a whole stream with the state in local names:

- a request is rounded (512 bytes; ``roundup_power2_divisions``: a stretch's requests all
  at once, :func:`rounded`), takes the first block of its stream's and pool's free list at
  or above its size (sorted by size, then address: the best fit, lowest address first),
  and splits off the rest when it is worth keeping (small pool and expandable segments: any 512 bytes;
  large pool: more than 1 MiB, and with ``max_split_size_mb`` only for requests under it);
- with expandable segments, a block that could still grow (it ends where unmapped pages
  begin) is passed over for the next one when that one is smaller than what the first
  could grow to, as ``get_free_block`` does;
- with ``max_split_size_mb``, the block found is refused (a new block is taken instead)
  when it is oversize for a smaller request, or too much larger than an oversize one;
- a free merges the block with its free neighbours (found by where they start and end) and
  returns it to the free list it came from (kept with the live block);
- whatever needs new memory (a new segment, mapping pages, emptying the cache at a limit,
  an out-of-memory) goes through the allocator's own methods, with the counters handed
  over first and read back after.

Tests compare the loop with the methods on seeded random streams for every setting, one
CUDA stream and several, segment for segment.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from itertools import islice

import numpy as np

from . import repeat as allocator_repeat
from .config import MIN_BLOCK
from .state import KEY_MASK, KEY_SHIFT, SMALL_SIZE, AllocatorState, Rounding

_EXACT = 1 << 53  # sizes below this are exact as floats (their bit length: frexp)

#: a live block of the loop: (address, bytes, the free list it returns to)
Block = tuple[int, int, list[int]]


def run_fast(
    alloc: AllocatorState,
    keys: Sequence[int],
    sizes: Sequence[int],
    streams: Sequence[int] | None = None,
) -> int:
    """Replay requests and frees on ``alloc`` as ``malloc``/``free`` one by one would: event
    i is a request of ``sizes[i]`` bytes (> 0) for block ``keys[i]`` on CUDA stream
    ``streams[i]`` (default 0), or its free (a free of a block not requested is ignored).
    Leaves ``alloc``'s rows, counters and peaks as the methods would (``used``: the blocks
    whose keys are still live). On one CUDA stream, repeats of a step that leave the
    allocator as they found it are not replayed again (:mod:`.repeat`): returns
    how many events were replayed."""
    where: dict[int, Block] = {}
    replayed = 0
    streams = [] if streams is None else list(streams)
    if streams and streams.count(streams[0]) != len(streams):
        _run(alloc, keys, sizes, 0, len(sizes), where, streams)  # several streams: all
        replayed = len(sizes)
    else:
        stream = streams[0] if streams else 0
        for lo, hi in allocator_repeat.windows(alloc, keys, sizes, where):
            _run(alloc, keys, sizes, lo, hi, where, stream)
            replayed += hi - lo
    alloc.used = {addr: size for addr, size, _ in where.values()}
    return replayed


def by_device(
    devices: Sequence[str], keys: Sequence[int], sizes: Sequence[int]
) -> dict[str, list[int]]:
    """Device -> the positions of its events in a stream of several devices' events: its
    requests, and the frees of the blocks it was last asked for (a free of a block never
    requested: where it says)."""
    of_key: dict[int, str] = {}
    parts: dict[str, list[int]] = {}
    for i, (dev, key, size) in enumerate(zip(devices, keys, sizes)):
        if size > 0:
            of_key[key] = dev
        else:
            dev = of_key.get(key, dev)
        part = parts.get(dev)
        if part is None:
            part = parts[dev] = []
        part.append(i)
    return parts


def run_part(
    alloc: AllocatorState,
    events: list[int],
    keys: Sequence[int],
    sizes: Sequence[int],
    streams: Sequence[int] | None = None,
) -> int:
    """:func:`run_fast` on the events at ``events`` (ascending positions) of a stream:
    ``alloc``'s rows, peak and out-of-memory then give positions in the whole stream."""
    replayed = run_fast(
        alloc,
        [keys[i] for i in events],
        [sizes[i] for i in events],
        None if streams is None else [streams[i] for i in events],
    )
    for row in alloc.rows:
        row[2] = events[row[2]]
        if row[3] is not None:
            row[3] = events[row[3]]
    if alloc.peak_event >= 0:
        alloc.peak_event = events[alloc.peak_event]
    if alloc.oom is not None:
        alloc.oom.event = events[alloc.oom.event]
    return replayed


def _lists(alloc: AllocatorState, stream: int) -> tuple[list[int], list[int]]:
    """The free lists of a CUDA stream: (small pool, large pool)."""
    lists = alloc.free_lists
    return lists.setdefault((stream, True), []), lists.setdefault((stream, False), [])


def _run(
    a: AllocatorState,
    keys: Sequence[int],
    sizes: Sequence[int],
    lo: int,
    hi: int,
    where: dict[int, Block],
    streams: int | Sequence[int],
) -> None:
    """Events ``lo`` to ``hi`` (excluded), with ``where`` the live blocks (key -> block),
    kept up to date; ``streams``: the CUDA stream of every event, or of each."""
    multi = not isinstance(streams, int)
    stream = streams[lo] if multi else streams
    small_l, large_l = _lists(a, stream)
    free_at, free_end, unmapped, w_pop = a.free_at, a.free_end, a.unmapped, where.pop
    expandable, limited = a.expandable, a.split_limit is not None  # max_split_size_mb
    window = rounded(a.config, sizes, lo, hi) if a.rounded else islice(sizes, lo, hi)
    split_large = 0 if expandable else SMALL_SIZE  # the rest a large block keeps
    limit, every = a.split_limit or 0, limited and expandable  # (every request checked)
    allocated, reserved = a.allocated, a.reserved
    top, reserved_then = a.peak_allocated, a.reserved_then
    S, M, SMALL, bisect, ins = KEY_SHIFT, KEY_MASK, SMALL_SIZE, bisect_left, insort
    for i, size in enumerate(window, lo):
        if size > 0:  # a request
            if multi and streams[i] != stream:
                stream = streams[i]
                small_l, large_l = _lists(a, stream)
            size = (size + 511) & ~511
            if size <= SMALL:
                lst, keep = small_l, 0
            else:
                lst, keep = large_l, split_large
            j = bisect(lst, size << S)
            if limited and (every or size >= limit or (j < len(lst) and lst[j] >> S >= limit)):
                j, keep = _limit(a, lst, j, size, keep)
            try:
                found = lst.pop(j)
            except IndexError:  # nothing cached fits: new memory
                found = _new_memory(a, i, allocated, (stream, lst is small_l), size)
                allocated, reserved, j = a.allocated, a.reserved, -1
            addr, block = found & M, found >> S
            end = addr + block
            if expandable and j >= 0 and end in unmapped and not limited:  # it can grow
                ins(lst, found)
                found = lst.pop(_least_growable(lst, j, unmapped))
                addr, block = found & M, found >> S
                end = addr + block
            del free_at[addr]
            rest = block - size
            if rest > keep:  # split: the rest stays cached
                r = addr + size
                free_at[r] = rest
                free_end[end] = r
                ins(lst, rest << S | r)
                block = size
            else:
                del free_end[end]
            allocated += block
            if allocated > top:
                top, reserved_then = allocated, reserved
            where[keys[i]] = (addr, block, lst)
            continue
        found = w_pop(keys[i], None)  # a free
        if found is None:
            continue
        addr, block, lst = found
        allocated -= block
        end = addr + block
        if end in free_at:  # merge with the free block after
            after = free_at.pop(end)
            del lst[bisect(lst, after << S | end)]
            end += after
        if addr in free_end:  # and with the one before
            before = free_end.pop(addr)
            del lst[bisect(lst, free_at[before] << S | before)]
            addr = before
        free_at[addr] = block = end - addr
        free_end[end] = addr
        ins(lst, block << S | addr)
    a.allocated, a.peak_allocated, a.reserved_then = allocated, top, reserved_then


def _new_memory(a: AllocatorState, event: int, allocated: int, key: tuple, size: int) -> int:
    """The free-list key of a block from new memory for a request no cached block serves
    (the model's own rules: a new segment, or the cache emptied at a limit); the peak of
    reserved bytes noted. ``allocated``: the loop's count, handed to the model."""
    a.event, a.allocated = event, allocated
    found = a._new_block(key, size)
    if a.reserved > a.peak:
        a.peak, a.peak_event = a.reserved, event
    return found


def _limit(
    alloc: AllocatorState, lst: list[int], j: int, size: int, keep: int
) -> tuple[int, int | float]:
    """With ``max_split_size_mb``: the position of the cached block a request of ``size``
    bytes takes (``len(lst)``: none, new memory; with expandable segments the least
    growable one, as ``get_free_block`` picks), and the rest its block keeps unsplit."""
    limit = alloc.split_limit
    if j < len(lst):
        if alloc.expandable:
            j = _least_growable(lst, j, alloc.unmapped)
        block = lst[j] >> KEY_SHIFT
        if size < limit <= block or (
            size >= limit and block >= size + alloc.config.max_non_split_rounding
        ):
            j = len(lst)  # an oversize block for a smaller request, or one far too large
    if size >= limit and keep and not alloc.expandable:
        keep = float("inf")  # an oversize request's large block is never split
    return j, keep


def _least_growable(lst: list[int], j: int, unmapped: dict[int, int]) -> int:
    """From ``lst[j]`` on, the position of the block the allocator takes with expandable
    segments: while the next block (larger or equal) could grow to less than this one can
    (its size plus the unmapped pages right after it), the next one."""

    def growable(key: int) -> int:
        return (key >> KEY_SHIFT) + unmapped.get((key & KEY_MASK) + (key >> KEY_SHIFT), 0)

    while j + 1 < len(lst) and growable(lst[j + 1]) < growable(lst[j]):
        j += 1
    return j


def rounded(config: Rounding, sizes: Sequence[int], lo: int, hi: int) -> list[int]:
    """Events ``lo`` to ``hi``'s sizes with every request rounded as ``config.round_size``
    rounds it, with ``roundup_power2_divisions`` (frees as they are): all at once."""
    try:
        s = np.fromiter(islice(sizes, lo, hi), dtype=np.int64, count=hi - lo)
    except (OverflowError, TypeError, ValueError):
        s = None
    if s is None or (s >= _EXACT).any():  # sizes numpy cannot take: one by one
        return [config.round_size(x) if x > 0 else x for x in islice(sizes, lo, hi)]
    request = s > 0
    out = np.where(request, np.maximum(-(-s // MIN_BLOCK) * MIN_BLOCK, MIN_BLOCK), s)
    bits = np.frexp(np.maximum(s, 1).astype(np.float64))[1].astype(np.int64)  # bit length
    table = np.array(config.roundup_power2_divisions, dtype=np.int64)
    divisions = table[np.clip(bits - 21, 0, len(table) - 1)]
    fine = request & (divisions > 1) & (s > MIN_BLOCK * divisions) & (s & (s - 1) != 0)
    s, bits, divisions = s[fine], bits[fine], divisions[fine]
    floor = np.left_shift(1, bits - 1)
    step = floor >> (np.frexp(divisions.astype(np.float64))[1] - 1)  # floor / divisions
    down = s & ~(np.maximum(step, 1) - 1)
    out[fine] = np.where(step == 0, floor << 1, np.where(down == s, s, down + step))
    return out.tolist()
