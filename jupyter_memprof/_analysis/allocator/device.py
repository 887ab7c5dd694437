"""One device's CUDA caching allocator, request by request.

PyTorch does not hand each tensor to ``cudaMalloc``: its caching allocator
(``c10/cuda/CUDACachingAllocator.cpp``) takes *segments* from CUDA and carves them into
blocks, keeping freed blocks cached for reuse. What runs out on a GPU is the segments (the
*reserved* bytes), so a step whose tensors fit can still fail for fragmentation. This module
replays a stream of allocations and frees through the allocator's rules, as of torch
2.11-2.13 (docs/estimate.md, "Will it fit", lists them with the sequences that test them):

- every request is rounded up to a multiple of 512 bytes (at least 512), or, with
  ``roundup_power2_divisions``, to the next of N equal divisions between powers of two;
- requests of 1 MiB or less come from the *small* pool, whose segments are 2 MiB; larger
  ones from the *large* pool: a new segment is 20 MiB for requests under 10 MiB, else the
  request rounded up to 2 MiB;
- a request takes the smallest cached free block of its pool and stream that fits (ties: the
  lowest address), and splits it when the rest is worth keeping (small pool: 512 bytes or
  more; large pool: more than 1 MiB, and only for requests under ``max_split_size_mb``);
  a freed block merges with free neighbours of its segment;
- with ``max_split_size_mb``, blocks of that size or more are never split, never given to
  smaller requests, and given to larger requests only when less than
  ``max_non_split_rounding_mb`` (20 MiB) too large;
- when a new segment would not fit (a memory limit), the allocator frees cached oversize
  blocks (with ``max_split_size_mb``), then every cached segment with no block in use, and
  tries again: only then is it out of memory;
- with ``expandable_segments:True``, each stream and pool has one segment that grows by
  mapping pages (20 MiB in the large pool, 2 MiB in the small one), splitting on any 512
  bytes left over; freeing only unmaps pages when the cache is emptied (at a limit);
- blocks of one stream are never given to another stream.

:class:`DeviceAllocator` follows these rules one call at a time; the replay loops
(``fast.py``, ``repeat.py``) inline its common paths and call it for the rest.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator
from dataclasses import dataclass

from .config import (
    LARGE_BUFFER,
    MIN_BLOCK,
    MIN_LARGE_ALLOC,
    ROUND_LARGE,
    SMALL_BUFFER,
    AllocatorConfig,
)
from .state import KEY_MASK, KEY_SHIFT, SMALL_SIZE

# -- one device's allocator ---------------------------------------------------------------

_SHIFT, _MASK = KEY_SHIFT, KEY_MASK  # a free-list key: size << _SHIFT | address
_BASE = 1 << 40  # the first segment's address
_EXPANDABLE_SPAN = 1 << 40  # the address space an expandable segment reserves


def _allocation_size(size: int) -> int:
    """The size of a new segment for a (rounded) request of ``size`` bytes."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass
class OutOfMemory:
    """The first request a limited allocator could not serve, even after emptying its
    cache: the state right after the cache was emptied."""

    event: int  # the position of the request in the replayed stream
    size: int  # the rounded request
    allocated: int  # bytes in blocks in use
    reserved: int  # bytes in segments
    segment: int  # the bytes the new segment (or mapping) would have taken


class DeviceAllocator:
    """One device's caching allocator, replayed: :meth:`malloc` and :meth:`free`.

    Blocks are identified by their (model) address; segments lie apart (a gap after each),
    so blocks that touch belong to one segment. ``capacity`` is the memory the reserved
    bytes may not exceed (None: unlimited); the first request that cannot be served even
    after emptying the cache is noted in :attr:`oom`, and the allocator then goes on without
    a limit, so the rest of the stream still replays. :attr:`event` is the position in the
    stream, set by the caller; rows and the peak are noted with it.
    """

    def __init__(
        self,
        config: AllocatorConfig,
        capacity: int | None = None,
        placement: Iterator[int] | None = None,
    ):
        self.config = config
        #: where CUDA put each new plain segment, when known (a recorded trace): ties
        #: between equal free blocks go to the lowest address, and CUDA's addresses follow
        #: no order the model could know
        self.placement = placement
        self.capacity = capacity
        self.expandable = config.expandable_segments
        self.split_limit = config.max_split_size
        self.rounded = any(d > 1 for d in config.roundup_power2_divisions)
        #: neither expandable segments nor max_split_size_mb: the best fit is the first fit
        self.plain = not self.expandable and self.split_limit is None
        self.last_list: list[int] = []
        self.used: dict[int, int] = {}  # block in use -> bytes
        self.free_at: dict[int, int] = {}  # cached free block -> bytes
        self.free_end: dict[int, int] = {}  # where a cached free block ends -> its start
        self.unmapped: dict[int, int] = {}  # an expandable segment's unmapped range -> bytes
        self.unmapped_end: dict[int, int] = {}
        self.free_lists: dict[tuple[int, bool], list[int]] = {}  # (stream, small) -> keys
        self.seg_base: list[int] = []  # by segment
        self.bases: list[int] = []  # the bases of the segments reserved now, ascending
        self.base_seg: list[int] = []  # the segment of each of them
        self.seg_end: list[int] = []
        self.seg_key: list[tuple[int, bool]] = []
        self.seg_row: list[int] = []  # a plain segment's row in :attr:`rows` (-1: expandable)
        self.maps: dict[int, list[list[int]]] = {}  # expandable segment -> [start, end, row]
        #: one row per segment (or mapped range): [small, size, alloc_event, free_event]
        self.rows: list[list] = []
        self.next_address = _BASE if placement is None else 1 << 62
        self.allocated = 0
        self.reserved = 0
        self.peak = 0  # the most reserved bytes, and when
        self.peak_event = -1
        self.peak_allocated = 0  # the most allocated bytes, and the reserved bytes then
        self.reserved_then = 0
        self.event = 0
        self.oom: OutOfMemory | None = None

    # -- requests ---------------------------------------------------------------------------
    def malloc(self, size: int, stream: int = 0) -> int:
        """Serve a request of ``size`` bytes on ``stream``; returns the block's address (its
        size: ``used[address]``; its pool's free list: :attr:`last_list`)."""
        if size < MIN_BLOCK:
            size = MIN_BLOCK
        elif self.rounded:
            size = self.config.round_size(size)
        else:
            size = (size + 511) & ~511
        small = size <= SMALL_SIZE
        lst = self.free_lists.get((stream, small))
        if lst is None:
            lst = self.free_lists[(stream, small)] = []
        self.last_list = lst
        if self.plain:  # the common case of _take_cached, inline
            i = bisect_left(lst, size << _SHIFT)
            found = lst.pop(i) if i < len(lst) else -1
        else:
            found = self._take_cached(lst, size) if lst else -1
        grew = found < 0
        if grew:
            found = self._new_block((stream, small), size)
        addr = found & _MASK
        block = found >> _SHIFT
        free_at = self.free_at
        del free_at[addr], self.free_end[addr + block]
        rest = block - size
        if rest and (
            rest >= MIN_BLOCK
            if small or self.expandable
            else rest > SMALL_SIZE and (self.split_limit is None or size < self.split_limit)
        ):
            r = addr + size
            free_at[r] = rest
            self.free_end[r + rest] = r
            insort(lst, rest << _SHIFT | r)
            block = size
        self.used[addr] = block
        self.allocated += block
        if self.allocated > self.peak_allocated:
            self.peak_allocated, self.reserved_then = self.allocated, self.reserved
        if grew and self.reserved > self.peak:
            self.peak, self.peak_event = self.reserved, self.event
        return addr

    def free(self, addr: int, lst: list[int] | None = None) -> int:
        """Return block ``addr`` to the cache, merged with its free neighbours; returns the
        merged block's address. ``lst``: its pool's free list, when the caller knows it."""
        size = self.used.pop(addr)
        self.allocated -= size
        if lst is None:
            lst = self.free_lists[self.seg_key[self.base_seg[bisect_right(self.bases, addr) - 1]]]
        free_at, free_end = self.free_at, self.free_end
        end = addr + size
        after = free_at.pop(end, 0)
        if after:
            del lst[bisect_left(lst, after << _SHIFT | end)]
            end += after
        before = free_end.pop(addr, -1)
        if before >= 0:
            del lst[bisect_left(lst, free_at.pop(before) << _SHIFT | before)]
            addr = before
        free_at[addr] = end - addr
        free_end[end] = addr
        insort(lst, (end - addr) << _SHIFT | addr)
        return addr

    def _take_cached(self, lst: list[int], size: int) -> int:
        """The free-list key of the best cached block for ``size``, taken off the list, or -1
        (get_free_block)."""
        i = bisect_left(lst, size << _SHIFT)
        if i == len(lst):
            return -1
        if self.expandable and self.maps:
            # an expandable block counts as large as it can grow: prefer blocks that cannot
            while i + 1 < len(lst) and self._growable(lst[i + 1]) < self._growable(lst[i]):
                i += 1
        found = lst[i]
        limit = self.split_limit
        if limit is not None:
            block = found >> _SHIFT
            if size < limit <= block:  # an oversize block for a smaller request
                return -1
            if size >= limit and block >= size + self.config.max_non_split_rounding:
                return -1
        del lst[i]
        return found

    def _growable(self, key: int) -> int:
        """A free block's size plus the unmapped range right after it."""
        end = (key & _MASK) + (key >> _SHIFT)
        return (key >> _SHIFT) + self.unmapped.get(end, 0)

    def _segment_of(self, addr: int) -> int:
        return self.base_seg[bisect_right(self.bases, addr) - 1]

    def _cache(self, addr: int, size: int) -> None:
        """Put a free block on its free list."""
        self.free_at[addr] = size
        self.free_end[addr + size] = addr
        insort(self.free_lists[self.seg_key[self._segment_of(addr)]], size << _SHIFT | addr)

    def _uncache(self, addr: int) -> int:
        """Take cached free block ``addr`` off its free list; returns its size."""
        size = self.free_at.pop(addr)
        del self.free_end[addr + size]
        lst = self.free_lists[self.seg_key[self._segment_of(addr)]]
        del lst[bisect_left(lst, size << _SHIFT | addr)]
        return size

    # -- new memory -------------------------------------------------------------------------
    def _new_block(self, key: tuple[int, bool], size: int) -> int:
        """The free-list key of a block of at least ``size`` bytes from new memory, emptying
        the cache and trying again when a limit is in the way (alloc_block and its
        retries)."""
        found = self._grow(key, size)
        if found < 0 and self._release_oversize(key, size):
            found = self._grow(key, size)
        if found < 0:
            self._release_cached()
            found = self._grow(key, size)
        if found < 0:
            if self.oom is None:
                self.oom = OutOfMemory(
                    self.event, size, self.allocated, self.reserved, self._segment_size(size)
                )
            self.capacity = None
            found = self._grow(key, size)
        return found

    def _segment_size(self, size: int) -> int:
        """The new memory a request of ``size`` bytes needs when no cached block serves it
        (with expandable segments: whole pages)."""
        if not self.expandable:
            return _allocation_size(size)
        page = SMALL_BUFFER if size <= SMALL_SIZE else LARGE_BUFFER
        return -(-size // page) * page

    def _grow(self, key: tuple[int, bool], size: int) -> int:
        if self.expandable:
            return self._grow_expandable(key, size)
        alloc = _allocation_size(size)
        if self.capacity is not None and self.reserved + alloc > self.capacity:
            return -1
        base = self._segment(key, alloc)
        self.seg_row.append(len(self.rows))
        self.rows.append([key[1], alloc, self.event, None])
        self.reserved += alloc
        self.free_at[base] = alloc  # taken at once by the caller
        self.free_end[base + alloc] = base
        return alloc << _SHIFT | base

    def _segment(self, key: tuple[int, bool], span: int) -> int:
        """A new segment of ``span`` address bytes: its address. Segments never touch (a
        gap after each; recorded addresses are doubled), so touching blocks share one."""
        if self.placement is not None and span < _EXPANDABLE_SPAN:
            base = 2 * next(self.placement)
        else:
            base = self.next_address
            self.next_address += -(-span // LARGE_BUFFER) * LARGE_BUFFER + LARGE_BUFFER
        k = bisect_left(self.bases, base)
        self.bases.insert(k, base)
        self.base_seg.insert(k, len(self.seg_base))
        self.seg_base.append(base)
        self.seg_end.append(base + span)
        self.seg_key.append(key)
        return base

    # -- expandable segments ----------------------------------------------------------------
    def _grow_expandable(self, key: tuple[int, bool], size: int) -> int:
        """Map pages of the stream's expandable segment until a free block of ``size`` bytes
        exists there, and take it (try_allocate_expandable_block)."""
        addr = self._expandable_candidate(key, size)
        if addr in self.unmapped:
            addr = self._map(addr, min(self.unmapped[addr], size))
            if addr < 0:
                return -1
        while self.free_at[addr] < size:
            nxt = addr + self.free_at[addr]
            addr = self._map(nxt, min(size - self.free_at[addr], self.unmapped[nxt]))
            if addr < 0:
                return -1
        block = self.free_at[addr]
        lst = self.free_lists[key]
        del lst[bisect_left(lst, block << _SHIFT | addr)]
        return block << _SHIFT | addr

    def _expandable_candidate(self, key: tuple[int, bool], size: int) -> int:
        """The lowest unmapped range (with the free block just before it) that can hold
        ``size`` bytes in a segment of this stream and pool; a new segment when none can."""
        for a in sorted(self.unmapped):
            if self.seg_key[self._segment_of(a)] != key:
                continue
            start = self.free_end.get(a, a)
            room, b = 0, start
            while room < size:
                n = self.free_at.get(b) or self.unmapped.get(b)
                if not n:
                    break
                room, b = room + n, b + n
            if room >= size:
                return start
        # torch reserves address space for more than the device's memory: a block larger
        # than our span gets a segment large enough (whole large pages) rather than none
        span = (
            _EXPANDABLE_SPAN
            if size <= _EXPANDABLE_SPAN
            else -(-size // LARGE_BUFFER) * LARGE_BUFFER
        )
        base = self._segment(key, span)
        self.seg_row.append(-1)
        self.maps[len(self.seg_base) - 1] = []
        self.unmapped[base] = span
        self.unmapped_end[base + span] = base
        return base

    def _map(self, addr: int, size: int) -> int:
        """Map whole pages from the start of unmapped range ``addr`` to cover ``size`` bytes;
        the mapped block joins its free neighbours in the cache. Returns the merged block's
        address, or -1 when a limit is in the way."""
        seg = self._segment_of(addr)
        page = SMALL_BUFFER if self.seg_key[seg][1] else LARGE_BUFFER
        span = self.unmapped[addr]
        mapped = min(-(-size // page) * page, span)
        if self.capacity is not None and self.reserved + mapped > self.capacity:
            return -1
        del self.unmapped[addr], self.unmapped_end[addr + span]
        if mapped < span:
            self.unmapped[addr + mapped] = span - mapped
            self.unmapped_end[addr + span] = addr + mapped
        self.reserved += mapped
        self.maps[seg].append([addr, addr + mapped, len(self.rows)])
        self.rows.append([self.seg_key[seg][1], mapped, self.event, None])
        self.used[addr] = mapped
        self.allocated += mapped
        return self.free(addr)

    def _unmap(self, addr: int) -> None:
        """Unmap the whole pages inside cached free block ``addr`` (emptying the cache)."""
        seg = self._segment_of(addr)
        base = self.seg_base[seg]
        page = SMALL_BUFFER if self.seg_key[seg][1] else LARGE_BUFFER
        size = self.free_at[addr]
        lo = base + -(-(addr - base) // page) * page
        hi = base + (addr + size - base) // page * page
        if hi <= lo:
            return
        self._uncache(addr)
        if lo > addr:
            self._cache(addr, lo - addr)
        if addr + size > hi:
            self._cache(hi, addr + size - hi)
        start, end = lo, hi
        if hi in self.unmapped:
            end = hi + self.unmapped.pop(hi)
            del self.unmapped_end[end]
        if lo in self.unmapped_end:
            start = self.unmapped_end.pop(lo)
            del self.unmapped[start]
        self.unmapped[start] = end - start
        self.unmapped_end[end] = start
        self.reserved -= hi - lo
        self._end_maps(seg, lo, hi)

    def _end_maps(self, seg: int, lo: int, hi: int) -> None:
        """End the rows of the ranges mapped in [lo, hi); what of them lies outside stays
        mapped as new rows."""
        keep = []
        for start, end, row in self.maps[seg]:
            if end <= lo or start >= hi:
                keep.append([start, end, row])
                continue
            self.rows[row][3] = self.event
            small = self.rows[row][0]
            for a, b in ((start, min(end, lo)), (max(start, hi), end)):
                if b > a:
                    keep.append([a, b, len(self.rows)])
                    self.rows.append([small, b - a, self.event, None])
        self.maps[seg] = keep

    # -- emptying the cache -----------------------------------------------------------------
    def _whole(self, addr: int) -> bool:
        """Whether cached block ``addr`` is a whole plain segment."""
        seg = self._segment_of(addr)
        return (
            seg not in self.maps
            and addr == self.seg_base[seg]
            and addr + self.free_at[addr] == self.seg_end[seg]
        )

    def _release_segment(self, addr: int) -> None:
        """Give a cached block that is a whole plain segment back to CUDA."""
        seg = self._segment_of(addr)
        size = self._uncache(addr)
        self.reserved -= size
        self.rows[self.seg_row[seg]][3] = self.event
        k = bisect_left(self.bases, addr)
        del self.bases[k], self.base_seg[k]

    def _release_oversize(self, key: tuple[int, bool], size: int) -> bool:
        """With ``max_split_size_mb``: free cached oversize segments of the stream's pool, one
        large enough or else the largest ones until enough (release_available_cached_blocks)."""
        limit = self.split_limit
        if limit is None:
            return False
        lst = self.free_lists.get(key, [])
        want = max(size, limit)
        i = bisect_left(lst, want << _SHIFT)
        if i < len(lst) and self._whole(lst[i] & _MASK):
            self._release_segment(lst[i] & _MASK)
            return True
        released = 0
        for found in reversed(lst[:i]):
            if released >= want or found >> _SHIFT < limit:
                break
            if self._whole(found & _MASK):
                released += found >> _SHIFT
                self._release_segment(found & _MASK)
        return released >= want

    def _release_cached(self) -> None:
        """Free every cached segment with no block in use, and unmap the free pages of
        expandable segments (release_cached_blocks, as ``torch.cuda.empty_cache()``)."""
        for lst in list(self.free_lists.values()):
            for found in list(lst):
                addr = found & _MASK
                if self._segment_of(addr) in self.maps:
                    self._unmap(addr)
                elif self._whole(addr):
                    self._release_segment(addr)
