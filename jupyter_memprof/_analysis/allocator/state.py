"""One device's allocator state, as the replay loops read it.

What the replay loops (``fast.py``, ``repeat.py``) read and write of
one device's caching allocator: the state of ``device.DeviceAllocator``, named here so
that the loops need not import the model they are called from."""

from __future__ import annotations

from typing import Protocol

SMALL_SIZE = 1024 * 1024  # kSmallSize: the largest request of the small pool
KEY_SHIFT = 64  # a free-list key is size << KEY_SHIFT | address: by size, then address
KEY_MASK = (1 << KEY_SHIFT) - 1


class Rounding(Protocol):
    """What the loops read of the allocator's settings (``AllocatorConfig``): the rounding
    of a request, and how much larger than an oversize request a cached block may be."""

    max_non_split_rounding: int  # max_non_split_rounding_mb, in bytes

    def round_size(self, size: int) -> int: ...


class Moment(Protocol):
    """Something noted at a position of the replayed stream (``OutOfMemory``)."""

    event: int


class AllocatorState(Protocol):
    """One device's allocator, as ``DeviceAllocator`` keeps it."""

    config: Rounding
    expandable: bool  # expandable_segments
    rounded: bool  # roundup_power2_divisions
    split_limit: int | None  # max_split_size_mb, in bytes
    #: (stream, small pool) -> cached free blocks, as KEY_SHIFT keys, ascending
    free_lists: dict[tuple[int, bool], list[int]]
    free_at: dict[int, int]  # cached free block -> bytes
    free_end: dict[int, int]  # where a cached free block ends -> its start
    unmapped: dict[int, int]  # an expandable segment's unmapped range -> bytes
    used: dict[int, int]  # block in use -> bytes
    rows: list[list]  # one per segment (or mapped range)
    allocated: int
    reserved: int
    peak: int
    peak_event: int
    oom: Moment | None  # the first request that could not be served
    peak_allocated: int
    reserved_then: int
    event: int

    def _new_block(self, key: tuple[int, bool], size: int) -> int: ...
