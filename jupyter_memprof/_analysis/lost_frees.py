"""Frees the profiler missed, found from CUDA's allocator totals.

torch's profiler reports the free of a CUDA block freed outside any op (``del x``, a
tensor's last reference dropped between two statements) only when it records Python
stacks: without them, on a step made to fragment an H100, it reported none of its 312
frees (docs/dev-notes.md). The blocks then look alive to the end; :func:`.blocks.unseen_frees`
ends those whose address is handed out again, at that allocation, and the others stay open:
the memory at the end of the step, its growth and the leaks are wrong.

Every CUDA memory event carries the allocator's ``total_allocated`` after it, so the bytes
freed unseen between two events are known exactly: the total before, plus the event's own
bytes, less the total after (before the first event, what the allocator held when the
capture started, and after the last, what it held when the capture stopped, stand in for
the missing totals). :func:`frees_from_totals` hands each such gap the blocks it freed:

1. a block (made during the capture, or known from before it: a name at the start) is
   freed in a gap after its allocation, at the latest before its address is handed out
   again (a deadline, from ``unseen_frees``);
2. the rest of a gap's bytes is matched by the open blocks made before it, by size: one
   block of exactly that size, the last ones made, two, three, or every such block but one
   to three;
3. among blocks of the same size, the one with the earliest deadline, then the most
   recently made, goes first (temporaries die young);
4. a block the session reaches at the end (a name, a tensor an autograd graph holds) was
   not freed, unless its address was handed out again.

A gap no set of blocks matches keeps its blocks open (the timeline then counts more than
the allocator held: never less), except that bytes freed before the first event that no
known block explains are split off the block of address 0 (what the allocator held that no
block accounts for) and ended there. On the recorded H100 steps of tests/data/h100, with
the frees torch loses without stacks taken out and the names a session gives, every
block's end is found and the live bytes equal the allocator's totals at every event and
at the stop (tests/test_baseline.py).
"""

from __future__ import annotations

import heapq

import numpy as np
import pandas as pd

_NEVER = np.iinfo(np.int64).max
#: three blocks are looked for among this many (the preferred ones): a gap costs at most
#: about its square
_THREES = 16


def frees_from_totals(
    b,
    mem: pd.DataFrame,
    reported: np.ndarray,
    held: tuple[dict, dict],
    names: pd.DataFrame,
) -> dict[str, dict[str, int]]:
    """End the blocks of ``b`` (``blocks._Blocks``) that were freed unseen, device by device,
    where ``mem`` (the allocator events) carries the allocator's totals. ``reported``: the
    blocks whose free the profiler reported; ``held``: device -> the bytes the allocator
    held at the capture's start (``blocks.allocated_at_start``) and at its stop; ``names``:
    what the session reaches at the end is alive (the last block at each of those
    addresses). Updates ``b.has_f`` and ``b.free_ns``. Returns, per device where frees went
    unreported, ``{"blocks": the blocks ended here, "unexplained_bytes": freed bytes no
    block explains}`` (``meta["inferred_frees"]``)."""
    out: dict[str, dict[str, int]] = {}
    if mem.empty or (mem["total_allocated"].to_numpy() < 0).all():
        return out
    end = names[names["when"].astype(object).to_numpy() == "end"]
    alive = set(zip(end["device"].astype(object).tolist(), end["ptr"].tolist()))
    for code, device in enumerate(b.dev_names):
        rows = mem[mem["device"].to_numpy(dtype=object) == device]
        total = rows["total_allocated"].to_numpy(dtype=np.int64)
        if not len(rows) or (total < 0).any():
            continue  # the CPU's reporter keeps no totals
        gaps = _gaps(rows, held[0].get(device), held[1].get(device))
        if not gaps:
            continue
        # blocks made during the capture, and known ones from before it (not the rest of
        # address 0: what the allocator held that no block accounts for)
        cands = np.flatnonzero((b.dev == code) & (b.has_a | (b.ptr != 0)) & ~reported)
        named = [(device, p) in alive for p in b.ptr[cands].tolist()]
        cands = cands[~(np.array(named, dtype=bool) & ~b.has_f[cands])]  # reached at the end
        unmatched, ended = _assign(b, gaps, cands)
        if gaps[0][0] == -_NEVER and unmatched[0] > 0:
            if _split_rest(b, code, unmatched[0], gaps[0][1]):
                unmatched[0] = 0
        out[device] = {"blocks": ended, "unexplained_bytes": int(sum(unmatched))}
    return out


def _gaps(rows: pd.DataFrame, start: int | None, end: int | None) -> list[tuple[int, int, int]]:
    """``(after_ns, before_ns, bytes)`` of each stretch in which the allocator freed bytes
    no event reported: before the first event (from the start, held ``start`` bytes:
    ``after_ns`` -never), between two events, and after the last (to the stop, held ``end``
    bytes: ``before_ns`` never). Where the total grew by more than an event reported (a
    block made where the profiler does not look, as another thread), a later gap of just
    that size is its free, not one of the capture's blocks: no gap."""
    order = np.argsort(rows["time_ns"].to_numpy(), kind="stable")
    t = rows["time_ns"].to_numpy(dtype=np.int64)[order]
    size = rows["size"].to_numpy(dtype=np.int64)[order]
    total = rows["total_allocated"].to_numpy(dtype=np.int64)[order]
    gaps = []
    if start is not None and start + size[0] > total[0]:
        gaps.append((-_NEVER, int(t[0]), int(start + size[0] - total[0])))
    lost = total[:-1] + size[1:] - total[1:]
    unseen: dict[int, int] = {}  # sizes of blocks made unseen (another thread's, say)
    for i in np.flatnonzero(lost).tolist():
        z = int(lost[i])
        if z < 0:
            unseen[-z] = unseen.get(-z, 0) + 1
        elif unseen.get(z):  # the free of such a block: none of ours
            unseen[z] -= 1
        else:
            gaps.append((int(t[i]), int(t[i + 1]), z))
    if end is not None and 0 <= end < total[-1]:
        gaps.append((int(t[-1]), _NEVER, int(total[-1] - end)))
    return gaps


def _split_rest(b, code: int, lost: int, before: int) -> bool:
    """What the allocator held at the start that no block accounts for (the block of address
    0) less ``lost`` bytes freed before the first event (``before``): those become a block of
    their own, ended there."""
    rest = np.flatnonzero((b.dev == code) & (b.ptr == 0) & ~b.has_a & ~b.has_f)
    if not len(rest) or b.size[rest[0]] <= lost:
        return False
    b.size[rest[0]] -= lost
    b.append_preexisting([b.dev_names[code]], np.array([0]), np.array([lost]), None)
    b.has_f[-1], b.free_ns[-1] = True, before - 1
    return True


def _assign(b, gaps: list[tuple[int, int, int]], cands: np.ndarray) -> tuple[list[int], int]:
    """Hand each gap the blocks it freed (see the module's docstring); returns the bytes of
    each gap left unexplained, and how many blocks were ended. The open blocks made so far
    are kept as the gaps go by (by size, and those due by their deadline), so a gap that
    one block explains costs little."""
    deadline = {r: (int(b.free_ns[r]) if b.has_f[r] else _NEVER) for r in cands.tolist()}
    born = {r: (int(b.alloc_ns[r]) if b.has_a[r] else -_NEVER) for r in deadline}
    order = sorted(deadline, key=born.__getitem__)
    pool = _Pool(b.size, lambda r: (deadline[r], -born[r]))
    due: list[tuple[int, int]] = []
    unmatched, k, ended = [], 0, 0
    for after, before, lost in gaps:
        while k < len(order) and born[order[k]] <= after:
            pool.add(order[k])
            if deadline[order[k]] != _NEVER:
                heapq.heappush(due, (deadline[order[k]], order[k]))
            k += 1
        must = []
        while due and due[0][0] <= before:
            r = heapq.heappop(due)[1]
            if r in pool.rows:
                must.append(r)
                pool.drop(r)
        rest = lost - sum(int(b.size[r]) for r in must)
        pick = (pool.matching(rest) if pool.rows else None) if rest > 0 else []
        unmatched.append(rest if rest > 0 and not pick else 0)
        when = after + 1 if before == _NEVER else max(after + 1, before - 1)  # the latest
        for r in (*must, *(pick or ())):
            b.has_f[r], b.free_ns[r] = True, min(when, deadline[r])
            ended += 1
        for r in pick or ():
            pool.drop(r)
    return unmatched, ended


class _Pool:
    """The open blocks a gap may take: in the order they were made, by size, and their bytes;
    ``rank`` orders blocks of one size (the preferred first)."""

    def __init__(self, size: np.ndarray, rank) -> None:
        self.size, self.rank = size, rank
        self.rows: dict[int, None] = {}
        self.by_size: dict[int, list[int]] = {}
        self.bytes = 0

    def add(self, r: int) -> None:
        self.rows[r] = None
        self.by_size.setdefault(int(self.size[r]), []).append(r)
        self.bytes += int(self.size[r])

    def drop(self, r: int) -> None:
        del self.rows[r]
        z = int(self.size[r])
        same = self.by_size[z]
        same.remove(r)
        if not same:
            del self.by_size[z]
        self.bytes -= z

    def best(self, z: int, but=()) -> int | None:
        """The preferred block of ``z`` bytes (not one of ``but``)."""
        same = [r for r in self.by_size.get(z, ()) if r not in but]
        return min(same, key=self.rank) if same else None

    def matching(self, lost: int) -> list[int] | None:
        """Blocks whose sizes add up to ``lost`` exactly (see the module's docstring)."""
        one = self.best(lost)
        if one is not None:
            return [one]
        rows = list(self.rows)
        total = 0
        for k, r in enumerate(reversed(rows)):  # the last ones made
            total += int(self.size[r])
            if total >= lost:
                if total == lost:
                    return rows[len(rows) - k - 1 :]
                break
        found = self._few(lost, rows[::-1])
        if found is not None:
            return found
        spare = self.bytes - lost  # every block but a few (the oldest kept)
        if spare == 0:
            return rows
        kept = self._few(spare, rows) if spare > 0 else None
        if kept is None:
            return None
        keep = set(kept)
        return [r for r in rows if r not in keep]

    def _few(self, want: int, head: list[int]) -> list[int] | None:
        """Two blocks adding up to ``want``, or three with two of them among the first
        :data:`_THREES` of ``head``."""
        by_size = self.by_size
        for z, same in by_size.items():
            w = want - z
            if w in by_size and (w != z or len(same) > 1):
                r = self.best(z)
                return [r, self.best(w, but=(r,))]
        head = head[:_THREES]
        sizes = [int(z) for z in self.size[head]]
        for i, (r, zr) in enumerate(zip(head, sizes)):
            for s, zs in zip(head[i + 1 :], sizes[i + 1 :]):
                if want - zr - zs in by_size:
                    t = self.best(want - zr - zs, but=(r, s))
                    if t is not None:
                        return [r, s, t]
        return None
