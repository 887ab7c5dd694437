"""Repeated steps found in an allocator stream, not replayed.

A training loop asks the caching allocator for the same sizes in the same order every step,
and frees them in the same order. Once the allocator's state at the start of a step is the
state it had at the start of the step before (the same free blocks, the same blocks in use,
the same segments), each further step that repeats the one before event for event leaves
it in that state again, giving every request the block it gave the step before: replaying
it changes nothing but which keys hold which blocks. :func:`windows` finds such repeats and
skips them; everything else is replayed.

Exact, not a guess. With the period ``p`` of the request sizes found (numpy, once), the
state is compared at every ``p`` events (``t``). A stretch ``[t, T)`` of whole periods is
skipped only when the state at ``t`` equals the state at ``t - p`` and every event ``i`` of
the stretch repeats event ``i - p``: the same size, and a free frees the block of the
request ``p`` events before the one that ``i - p`` freed (or both free nothing). By
induction each request then gets the block request ``i - p`` got, the allocated bytes go up
and down as they did (no new peak), no segment is taken, and the state at ``T`` is the state
at ``t``. For a free of a block requested before ``t`` the blocks are compared directly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from .state import AllocatorState

#: the live blocks of a replay: key -> (address, bytes, the free list the block returns to)
Live = dict[int, tuple[int, int, list[int]]]
MIN_EVENTS = 4096  # shorter streams are replayed whole
MIN_PERIOD = 8  # shorter periods: the state is compared too often to pay off
WARM_UP = 1024  # the events replayed before the period is looked for (at least)
PROBE = 64  # the request sizes compared first when looking for the period
CANDIDATES = 256  # periods tried
HISTORY = 32  # a step may be up to this many periods of the sizes
GIVE_UP = 64  # states in a row unlike those before them, and no more are compared


@dataclass
class _Plan:
    """A stream's period and what repeats in it."""

    start: int  # where the period was found: the states are compared from here on
    period: int
    sizes: np.ndarray
    match: np.ndarray  # per event: the request a free frees (-1: none; requests: -2)
    before: np.ndarray  # per event: the key's event before it (-1: none)
    after: np.ndarray  # per event: the key's event after it (the stream's length: none)
    _bad: dict[int, np.ndarray] = field(default_factory=dict)

    def bad(self, step: int) -> np.ndarray:
        """The events (from ``step`` on) that do not repeat the one ``step`` events before:
        another size, or a free of another request (or of one where that freed none)."""
        if step not in self._bad:
            s, m = self.sizes, self.match
            same = s[step:] == s[:-step]
            frees = (m[step:] - step == m[:-step]) | ((m[step:] == -1) & (m[:-step] == -1))
            self._bad[step] = np.flatnonzero(~(same & ((s[step:] > 0) | frees))) + step
        return self._bad[step]


def windows(
    alloc: AllocatorState,
    keys: Sequence[int],
    sizes: Sequence[int],
    where: Live,
) -> Iterator[tuple[int, int]]:
    """The ranges ``(lo, hi)`` of events to replay, in order, covering the stream but for
    the repeats skipped between them. The caller replays each range on ``alloc`` before
    asking for the next; ``where`` (key -> block, the live blocks) is brought to the end of
    each skipped stretch."""
    n = len(sizes)
    plan = _plan(keys, sizes)
    if plan is None:
        yield 0, n
        return
    p, t = plan.period, plan.start
    yield 0, t
    history: deque[tuple[tuple, Live]] = deque(maxlen=HISTORY)
    misses = 0
    while t + p <= n and misses < GIVE_UP:
        state = _state(alloc, where)
        end, misses = t, misses + 1
        for j, (before, where_before) in enumerate(reversed(history), 1):
            if before == state:  # as j periods ago: a step of j periods may repeat
                end, misses = _skip(plan, j * p, keys, sizes, where, t, where_before), 0
                break
        if end > t:
            t = end
            history.clear()
        history.append((state, dict(where)))
        if t + p > n:
            break
        yield t, t + p
        t += p
    yield t, n


def _plan(keys: Sequence[int], sizes: Sequence[int]) -> _Plan | None:
    """The period of the request sizes and the events that repeat it, or None (too short,
    no period, keys that are not integers)."""
    n = len(sizes)
    if n < MIN_EVENTS:
        return None
    seq = sizes if isinstance(sizes, list) else list(sizes)
    for base in (min(n // 16, WARM_UP), n // 16):  # past a warm-up, early or later
        start = next((i for i in range(base, n) if seq[i] > 0), n)
        period = _period(seq, start)
        if period is not None:
            break
    else:
        return None
    try:
        s = np.fromiter(seq, np.int64, n)
        k = np.fromiter(keys, np.int64, n)
    except (TypeError, ValueError, OverflowError):  # keys that are not 64-bit integers
        return None
    match, before, after = _links(k, s)
    return _Plan(start, period, s, match, before, after)


def _period(s: list[int], start: int) -> int | None:
    """The smallest ``p`` (at least MIN_PERIOD) with the sizes from ``start`` repeating
    after ``p`` events for ``p`` events, or None."""
    top = min((len(s) - start) // 2, len(s) // 4)
    probe = s[start : start + PROBE]
    at = start + MIN_PERIOD
    for _ in range(CANDIDATES):
        try:
            at = s.index(s[start], at, start + top + 1)
        except (ValueError, IndexError):
            return None
        p = at - start
        if s[at : at + len(probe)] == probe and s[at : at + p] == s[start:at]:
            return p
        at += 1
    return None


def _links(k: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per event: the request whose block a free frees (the key's event just before it,
    when that is a request; -1: the free frees nothing; -2: a request), and the key's
    events before and after it."""
    n = len(k)
    order = np.argsort(k, kind="stable")
    same = k[order[1:]] == k[order[:-1]]
    first, second = order[:-1][same], order[1:][same]
    before = np.full(n, -1, dtype=np.int64)
    before[second] = first
    after = np.full(n, n, dtype=np.int64)
    after[first] = second
    match = np.where(s > 0, -2, -1)
    frees = second[(s[second] <= 0) & (s[first] > 0)]
    match[frees] = before[frees]
    return match, before, after


def _state(alloc: AllocatorState, where: Live) -> tuple:
    """What the allocator's next steps depend on: the segments (how many were taken, the
    bytes reserved), the cached free blocks, the blocks in use (by block, not key)."""
    return (
        len(alloc.rows),
        alloc.reserved,
        alloc.allocated,
        tuple(tuple(lst) for lst in alloc.free_lists.values()),
        sorted(where.values()),
    )


def _skip(
    plan: _Plan,
    step: int,
    keys: Sequence[int],
    sizes: Sequence[int],
    where: Live,
    t: int,
    where_before: Live,
) -> int:
    """Skip the whole steps of ``step`` events from ``t`` that repeat the step before
    (the state at ``t`` being the state at ``t - step``, when ``where_before`` was
    ``where``): ``where`` brought to their end. Returns where replaying goes on (``t``:
    nothing skipped)."""
    match, bad = plan.match, plan.bad(step)
    k = int(np.searchsorted(bad, t))
    end = t + ((int(bad[k]) if k < len(bad) else len(sizes)) - t) // step * step
    m = match[t:end]
    for i in (np.flatnonzero((m >= 0) & (m < t)) + t).tolist():  # blocks from before t
        now = where.get(keys[match[i]])
        if now is None or now != where_before.get(keys[match[i] - step]):
            end = t + (i - t) // step * step
            break
    if end == t:
        return t
    blocks = _period_blocks(keys, sizes, where, t - step, t)
    span = np.arange(t, end)
    # the keys live at t that the skipped steps free or ask for again, then the blocks live
    # at the end (each the block of its request's place in the step before t)
    gone = span[(plan.before[t:end] >= 0) & (plan.before[t:end] < t)].tolist()
    kept = span[(match[t:end] == -2) & (plan.after[t:end] >= end)].tolist()
    new = [(keys[e], blocks[(e - t) % step]) for e in kept]
    if any(block is None for _, block in new):  # a block not known: replay instead
        return t
    for e in gone:
        where.pop(keys[e], None)
    where.update(new)
    return end


def _period_blocks(
    keys: Sequence[int], sizes: Sequence[int], where: Live, lo: int, hi: int
) -> list[tuple[int, int, list[int]] | None]:
    """Per event of ``[lo, hi)``: the block a request got, when it is its key's last
    request there and still live at ``hi`` (``where``); else None."""
    last = {keys[i]: i for i in range(lo, hi) if sizes[i] > 0}
    return [
        where.get(keys[i]) if sizes[i] > 0 and last[keys[i]] == i else None for i in range(lo, hi)
    ]
