"""The caching allocator model's replay loop: a whole stream of one device and one CUDA
stream in one function, its steps inline.

:class:`~jupyter_memprof._analysis.allocator.DeviceAllocator` states the allocator's rules
one request (``malloc``) and one free (``free``) at a time. Replaying a million events
through those methods spends most of its time on calls and attribute look-ups, so
:func:`run_fast` runs the same rules over a whole stream with the state in local names:

- a request is rounded (512 bytes, or ``roundup_power2_divisions`` through a table of the
  sizes seen), takes the first block of its pool's free list at or above its size (sorted
  by size, then address: the best fit, lowest address first), and splits off the rest when
  it is worth keeping (small pool and expandable segments: any 512 bytes; large pool: more
  than 1 MiB);
- with expandable segments, a block that could still grow (it ends where unmapped pages
  begin) is passed over for the next one when that one is smaller than what the first
  could grow to, as ``get_free_block`` does;
- a free merges the block with its free neighbours (found by where they start and end);
- whatever needs new memory (a new segment, mapping pages, emptying the cache at a limit,
  an out-of-memory) goes through the allocator's own methods, with the counters handed
  over first and read back after.

What it does not cover (``max_split_size_mb``, which changes which cached blocks may be
taken and split; several CUDA streams in one stream of events) is replayed through the
methods (:func:`applies`). Tests compare the two on seeded random streams for every
setting, segment for segment.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from itertools import islice

from . import allocator_repeat
from .allocator_state import KEY_MASK, KEY_SHIFT, SMALL_SIZE, AllocatorState


def applies(alloc: AllocatorState, streams: Sequence[int] | None) -> bool:
    """Whether :func:`run_fast` can replay a stream on ``alloc``: no ``max_split_size_mb``
    and one CUDA stream (``streams`` None or all equal)."""
    if alloc.split_limit is not None:
        return False
    return streams is None or len(streams) == 0 or min(streams) == max(streams)


def run_fast(
    alloc: AllocatorState, keys: Sequence[int], sizes: Sequence[int], stream: int = 0
) -> int:
    """Replay requests and frees on ``alloc`` as ``malloc``/``free`` one by one would: event
    i is a request of ``sizes[i]`` bytes (> 0) for block ``keys[i]``, or its free (a free of
    a block not requested is ignored); every event is on CUDA stream ``stream``. Leaves
    ``alloc``'s rows, counters and peaks as the methods would (``used``: the blocks whose
    keys are still live). Repeats of a step that leave the allocator as they found it are
    not replayed again (:mod:`.allocator_repeat`): returns how many events were replayed."""
    where: dict[int, tuple[int, int]] = {}  # a live block's key -> (address, bytes)
    replayed = 0
    for lo, hi in allocator_repeat.windows(alloc, keys, sizes, where):
        _run(alloc, keys, sizes, lo, hi, stream, where)
        replayed += hi - lo
    alloc.used = dict(where.values())
    return replayed


def _run(
    alloc: AllocatorState,
    keys: Sequence[int],
    sizes: Sequence[int],
    lo: int,
    hi: int,
    stream: int,
    where: dict[int, tuple[int, int]],
) -> None:
    """Events ``lo`` to ``hi`` (excluded), with ``where`` the live blocks (key -> (address,
    bytes)), kept up to date."""
    a = alloc
    large_l = a.free_lists.setdefault((stream, False), [])
    small_l = a.free_lists.setdefault((stream, True), [])
    free_at, free_end, unmapped = a.free_at, a.free_end, a.unmapped
    expandable = a.expandable
    rounded = a.rounded
    round_size, sizes_seen = a.config.round_size, {}
    split_large = 0 if expandable else SMALL_SIZE  # the rest a large block keeps
    allocated, top, reserved_then = a.allocated, a.peak_allocated, a.reserved_then
    reserved, peak, peak_event = a.reserved, a.peak, a.peak_event
    S, M, bisect, ins, w_pop = KEY_SHIFT, KEY_MASK, bisect_left, insort, where.pop
    for i, size in enumerate(islice(sizes, lo, hi), lo):
        if size > 0:  # a request
            if rounded:
                size = sizes_seen.get(size) or sizes_seen.setdefault(size, round_size(size))
            elif size & 511:
                size = (size | 511) + 1
            if size <= SMALL_SIZE:
                lst, keep = small_l, 0
            else:
                lst, keep = large_l, split_large
            j = bisect(lst, size << S)
            try:
                found = lst.pop(j)
            except IndexError:  # nothing cached fits: new memory
                a.event, a.allocated = i, allocated
                found = a._new_block((stream, lst is small_l), size)
                allocated, reserved = a.allocated, a.reserved
                if reserved > peak:
                    peak, peak_event = reserved, i
                j = -1
            addr = found & M
            block = found >> S
            end = addr + block
            if expandable and j >= 0 and end in unmapped:  # a cached block that can grow
                ins(lst, found)
                found = lst.pop(_least_growable(lst, j, unmapped))
                addr = found & M
                block = found >> S
                end = addr + block
            del free_at[addr], free_end[end]
            rest = block - size
            if rest > keep:  # split: the rest stays cached
                r = addr + size
                free_at[r] = rest
                free_end[end] = r
                ins(lst, rest << S | r)
                block = size
            allocated += block
            if allocated > top:
                top, reserved_then = allocated, reserved
            where[keys[i]] = (addr, block)
            continue
        found = w_pop(keys[i], None)  # a free
        if found is None:
            continue
        addr, block = found
        lst = small_l if block <= SMALL_SIZE else large_l  # small-pool blocks: <= 1 MiB
        allocated -= block
        end = addr + block
        if end in free_at:  # merge with the free block after
            after = free_at.pop(end)
            del lst[bisect(lst, after << S | end)]
            end += after
        if addr in free_end:  # and with the one before
            before = free_end.pop(addr)
            del lst[bisect(lst, free_at.pop(before) << S | before)]
            addr = before
        block = end - addr
        free_at[addr] = block
        free_end[end] = addr
        ins(lst, block << S | addr)
    a.allocated, a.peak_allocated, a.reserved_then = allocated, top, reserved_then
    a.peak, a.peak_event = peak, peak_event


def _least_growable(lst: list[int], j: int, unmapped: dict[int, int]) -> int:
    """From ``lst[j]`` on, the position of the block the allocator takes with expandable
    segments: while the next block (larger or equal) could grow to less than this one can
    (its size plus the unmapped pages right after it), the next one."""

    def growable(key: int) -> int:
        return (key >> KEY_SHIFT) + unmapped.get((key & KEY_MASK) + (key >> KEY_SHIFT), 0)

    while j + 1 < len(lst) and growable(lst[j + 1]) < growable(lst[j]):
        j += 1
    return j
