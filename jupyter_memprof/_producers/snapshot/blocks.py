"""The size of each block a snapshot's trace allocates.

A trace entry holds the *requested* bytes; ``torch.cuda.memory_allocated`` counts the
*block*: the request rounded (to 512 bytes, or as ``roundup_power2_divisions`` says), or a
whole cached block when the rest would not be split off. Blocks are found from the layout
the trace itself records: segments (``segment_alloc``, mapped ranges, the final state) and
the blocks in use, at their real addresses. A free block is the gap from an address to the
next block in use (the allocator merges free neighbours), so a request served at ``addr``
took ``gap`` bytes when the rest (``gap - rounded``) was too small to split: in the large
pool 1 MiB or less, or a request over ``max_split_size``; the small pool and expandable
segments split every rest of 512 bytes or more.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["Layout", "Rules"]

_MIN_BLOCK = 512
_SMALL_SIZE = 1 << 20  # the largest request of the small pool


def default_rounding(size: int) -> int:
    return _MIN_BLOCK if size < _MIN_BLOCK else -(-size // _MIN_BLOCK) * _MIN_BLOCK


class Rules(NamedTuple):
    """The allocator settings the sizes follow (the snapshot's, parsed by the caller)."""

    rounding: Callable[[int], int] = default_rounding
    max_split_size: int | None = None
    expandable: bool = False


class Layout:
    """Segments and blocks in use, per device, at their addresses."""

    def __init__(self, rules: Rules, *, every_block: bool = False) -> None:
        """``every_block``: place every block (the largest free block is asked for, at an
        ``oom``); else only those a later request's size can depend on: blocks of the large
        pool in plain segments (small blocks live in segments of their own)."""
        self.rules = rules
        self.every_block = every_block
        self.bases: dict[int, list[int]] = {}  # device -> segment starts, ascending
        self.ends: dict[tuple[int, int], int] = {}  # (device, start) -> end
        self.used: dict[int, list[int]] = {}  # device -> starts of blocks in use, ascending
        self.size: dict[tuple[int, int], int] = {}  # (device, start) -> bytes of a block in use
        self.allocated: dict[int, int] = {}  # device -> bytes of the blocks in use

    def add_segment(self, dev: int, addr: int, size: int) -> None:
        if (dev, addr) not in self.ends:
            insort(self.bases.setdefault(dev, []), addr)
        self.ends[(dev, addr)] = max(self.ends.get((dev, addr), 0), addr + size)

    def drop_segment(self, dev: int, addr: int, size: int) -> None:
        bases = self.bases.get(dev, [])
        for base in [b for b in bases if addr <= b < addr + size]:
            bases.remove(base)
            self.ends.pop((dev, base), None)

    def occupy(self, dev: int, addr: int, size: int) -> None:
        insort(self.used.setdefault(dev, []), addr)
        self.size[(dev, addr)] = size
        self.allocated[dev] = self.allocated.get(dev, 0) + size

    def release(self, dev: int, addr: int) -> None:
        used = self.used.get(dev, [])
        i = bisect_right(used, addr) - 1
        if i >= 0 and used[i] == addr:
            del used[i]
            self.allocated[dev] -= self.size.pop((dev, addr), 0)

    def largest_free(self, dev: int) -> int:
        """The largest free block on ``dev`` now: the largest gap between blocks in use
        inside a segment (free neighbours are merged)."""
        used = self.used.get(dev, [])
        best = 0
        for base in self.bases.get(dev, []):
            end = self.ends[(dev, base)]
            at = base
            j = bisect_right(used, base - 1)
            while j < len(used) and used[j] < end:
                best = max(best, used[j] - at)
                at = max(at, used[j] + self.size.get((dev, used[j]), 0))
                j += 1
            best = max(best, end - at)
        return best

    def place(self, dev: int, addr: int, request: int) -> int:
        """The block a request of ``request`` bytes served at ``addr`` took, now in use."""
        size = self.rules.rounding(request)
        if size > _SMALL_SIZE and not self.rules.expandable:
            size = self.block_size(dev, addr, request)
        elif not self.every_block:
            return size
        self.occupy(dev, addr, size)
        return size

    def remove(self, dev: int, addr: int) -> None:
        """Block ``addr`` is free again (nothing when it was not placed)."""
        if (dev, addr) in self.size:
            self.release(dev, addr)

    def block_size(self, dev: int, addr: int, request: int) -> int:
        """The block a request of ``request`` bytes served at ``addr`` took."""
        size = self.rules.rounding(request)
        small = size <= _SMALL_SIZE
        if small or self.rules.expandable:
            return size
        bases = self.bases.get(dev, [])
        i = bisect_right(bases, addr) - 1
        if i < 0 or self.ends[(dev, bases[i])] <= addr:
            return size  # a segment the record does not know
        end = self.ends[(dev, bases[i])]
        used = self.used.get(dev, [])
        j = bisect_right(used, addr)
        gap = min(end, used[j]) - addr if j < len(used) else end - addr
        rest = gap - size
        limit = self.rules.max_split_size
        if rest > 0 and (rest <= _SMALL_SIZE or (limit is not None and size >= limit)):
            return gap
        return size
