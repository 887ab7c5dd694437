"""A synthetic profile of any number of memory events, for the dashboard's size tests and
benchmark (benchmarks/bench_dashboard.py): a long training job's shape, built straight into
the tables of :mod:`jupyter_memprof._analysis.schema` (no torch run could make 10M events on
this machine in a test's time).

Shape: parameters allocated before the capture, then steps. Each step allocates ``per_step``
activation blocks one after the other, then frees them last-first (a sawtooth whose tooth is
the step's peak), with one short-lived temporary block (a spike: allocated and freed by the
next event) at a position that moves from step to step. Sizes are random (seeded): every
step's peak and every spike differ, so the local peaks a chart must keep are known exactly
from the tables (:func:`local_peaks`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from jupyter_memprof._analysis import schema as S
from jupyter_memprof._results.profile import Profile

#: nanoseconds between two events
TICK = 1000


def synthetic_profile(events: int, *, per_step: int = 1000, seed: int = 0) -> Profile:
    """A profile of about ``events`` memory events on ``cuda:0`` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    per_event = 2 * per_step + 2  # each step: its blocks' allocs and frees, one spike pair
    steps = max(1, events // per_event)
    # event k of a step: 0..per_step-1 allocate blocks 0..per_step-1 (with the spike pair
    # inserted at `at`), then blocks per_step-1..0 are freed
    at = rng.integers(1, per_step, size=steps)  # the spike's place among the allocations
    n_blocks = steps * (per_step + 1) + 1  # + the parameters
    size = np.empty(n_blocks, dtype=np.int64)
    size[0] = 64 << 20
    body = rng.lognormal(11.0, 1.2, size=(steps, per_step)).astype(np.int64) // 512 * 512 + 512
    spike = rng.integers(8 << 20, 96 << 20, size=steps) // 512 * 512
    size[1:] = np.concatenate([body, spike[:, None]], axis=1).reshape(-1)
    # event order within a step, as (block column, is_free): the allocations with the spike
    # pair after allocation `at`, then the frees
    col = np.empty((steps, per_event), dtype=np.int64)
    free = np.zeros((steps, per_event), dtype=bool)
    j = np.arange(per_event)[None, :]
    a = at[:, None]
    col[:] = np.where(j <= a, j, j - 2)  # allocations before and after the spike pair
    col[:, :] = np.where((j == a + 1) | (j == a + 2), per_step, col)  # the spike's two events
    free[:, :] = j == a + 2
    tail = j >= per_step + 2  # the frees, last block first
    col[:, :] = np.where(tail, 2 * per_step + 1 - j, col)
    free |= tail
    block = (1 + np.arange(steps)[:, None] * (per_step + 1) + col).reshape(-1)
    free = free.reshape(-1)
    n_ev = len(block) + 1
    time = np.arange(n_ev, dtype=np.int64) * TICK + TICK
    time[0] = 0
    block = np.concatenate([[0], block])
    free = np.concatenate([[False], free])
    cat_of = np.full(n_blocks, S.Category.ACTIVATION.value, dtype=object)
    cat_of[0] = S.Category.PARAMETER.value
    cat_of[1 + per_step :: per_step + 1] = S.Category.TEMPORARY.value
    category = pd.Categorical.from_codes(
        pd.Categorical(cat_of, dtype=S.CATEGORY_DTYPE).codes[block], dtype=S.CATEGORY_DTYPE
    )
    delta = np.where(free, -size[block], size[block])
    action = np.where(free, "destroy", "create").astype(object)
    action[0] = "preexisting"
    op_id = np.arange(n_ev, dtype=np.int64) // 8  # eight events per op
    n_ops = int(op_id[-1]) + 1
    events_t = pd.DataFrame(
        {
            "time_ns": time,
            "action": pd.Categorical(action, dtype=S.ACTION_DTYPE),
            "alloc_id": block,
            "tensor_id": pd.array(block, dtype="Int64"),
            "version": pd.array(np.zeros(n_ev, dtype=np.int64), dtype="Int64"),
            "device": pd.Categorical.from_codes(np.zeros(n_ev, dtype=np.int8), ["cuda:0"]),
            "size_bytes": size[block],
            "category": category,
            "op_id": pd.array(np.where(block == 0, -1, op_id), dtype="Int64"),
            "reserved_bytes": pd.array(np.full(n_ev, pd.NA), dtype="Int64"),
        }
    )
    events_t.loc[0, "op_id"] = pd.NA
    # the timeline: live bytes of the event's category after it
    codes = category.codes.astype(np.int64)
    live = np.zeros(n_ev, dtype=np.int64)
    for c in np.unique(codes):
        mine = codes == c
        live[mine] = np.cumsum(delta[mine])
    timeline_t = pd.DataFrame(
        {
            "time_ns": time,
            "device": events_t["device"],
            "category": category,
            "bytes": live,
        }
    )
    first = np.full(n_blocks, -1, dtype=np.int64)
    last = np.full(n_blocks, -1, dtype=np.int64)
    first[block[~free]] = np.flatnonzero(~free)
    last[block[free]] = np.flatnonzero(free)
    alloc_ns = pd.array(np.where(first > 0, time[first.clip(0)], pd.NA), dtype="Int64")
    free_ns = pd.array(np.where(last > 0, time[last.clip(0)], pd.NA), dtype="Int64")
    alloc_op = pd.array(np.where(first > 0, op_id[first.clip(0)], pd.NA), dtype="Int64")
    free_op = pd.array(np.where(last > 0, op_id[last.clip(0)], pd.NA), dtype="Int64")
    allocations = pd.DataFrame(
        {
            "alloc_id": np.arange(n_blocks, dtype=np.int64),
            "tensor_id": pd.array(np.arange(n_blocks), dtype="Int64"),
            "device": pd.Categorical.from_codes(np.zeros(n_blocks, dtype=np.int8), ["cuda:0"]),
            "ptr": np.arange(n_blocks, dtype=np.int64) * 4096,
            "size_bytes": size,
            "alloc_ns": alloc_ns,
            "free_ns": free_ns,
            "alloc_op_id": alloc_op,
            "free_op_id": free_op,
            "category": pd.Categorical(cat_of, dtype=S.CATEGORY_DTYPE),
            "reason": pd.array([None] * n_blocks, dtype=S.STRING),
            "name": pd.array([None] * n_blocks, dtype=S.STRING),
            "module": pd.array([None] * n_blocks, dtype=S.STRING),
            "module_reason": pd.array([None] * n_blocks, dtype=S.STRING),
            "callsite": pd.array([None] * n_blocks, dtype=S.STRING),
        }
    )
    names = np.array(["aten::empty", "aten::mm", "aten::add", "aten::relu"])
    op_start = np.arange(n_ops, dtype=np.int64) * 8 * TICK + TICK // 2
    ops = pd.DataFrame(
        {
            "op_id": np.arange(n_ops, dtype=np.int64),
            "parent_id": pd.array([pd.NA] * n_ops, dtype="Int64"),
            "depth": np.zeros(n_ops, dtype=np.int64),
            "name": pd.Categorical.from_codes(np.arange(n_ops) % 4, names),
            "kind": pd.Categorical(["op"] * n_ops, dtype=S.KIND_DTYPE),
            "start_ns": op_start,
            "end_ns": op_start + 8 * TICK - 100,
            "thread": np.ones(n_ops, dtype=np.int64),
            "seq_nr": pd.array([pd.NA] * n_ops, dtype="Int64"),
            "phase": pd.Categorical(["forward"] * n_ops, dtype=S.PHASE_DTYPE),
            "module": pd.array([None] * n_ops, dtype=S.STRING),
            "callsite": pd.array([None] * n_ops, dtype=S.STRING),
            "input_shapes": np.full(n_ops, None, dtype=object),
            "self_alloc_bytes": np.zeros(n_ops, dtype=np.int64),
            "total_alloc_bytes": np.zeros(n_ops, dtype=np.int64),
            "flops": pd.array([pd.NA] * n_ops, dtype="Int64"),
            "node_id": pd.array([pd.NA] * n_ops, dtype="Int64"),
        }
    )
    tables = {name: S.empty(schema) for name, schema in S.TABLES.items()}
    tables.update(
        ops=S.conform(ops, S.OPS, name="ops"),
        allocations=S.conform(allocations, S.ALLOCATIONS, name="allocations"),
        events=S.conform(events_t, S.EVENTS, name="events"),
        timeline=S.conform(timeline_t, S.TIMELINE, name="timeline"),
    )
    meta = {
        "label": f"synthetic job, {n_ev:,} memory events",
        "start_ns": 0,
        "end_ns": int(time[-1]) + TICK,
        "event_count": n_ev,
    }
    return Profile(**tables, meta=meta)


def total_bytes(prof: Profile) -> tuple[np.ndarray, np.ndarray]:
    """The event times and the total live bytes after each (one device: the only one)."""
    ev = prof.events
    delta = np.where(ev["action"].astype(str) == "destroy", -1, 1) * ev["size_bytes"].to_numpy()
    return ev["time_ns"].to_numpy(), np.cumsum(delta)


def local_peaks(prof: Profile, lo_ns: int, hi_ns: int, columns: int) -> np.ndarray:
    """The highest total in each of ``columns`` equal slices of [lo_ns, hi_ns) (NaN where a
    slice holds no event), from the tables: what a chart of that range must show."""
    t, total = total_bytes(prof)
    inside = (t >= lo_ns) & (t < hi_ns)
    col = ((t[inside] - lo_ns) * columns // (hi_ns - lo_ns)).astype(np.int64)
    out = np.full(columns, -np.inf)
    np.maximum.at(out, col, total[inside].astype(np.float64))
    out[np.isinf(out)] = np.nan
    return out
