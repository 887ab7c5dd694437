"""Standard exports: torch's memory-timeline files, Chrome trace events, the dashboard.

The torch formats are compared with what torch itself writes for the same trace: one step
is recorded once, and both our analysis and torch's ``MemoryProfileTimeline`` read that one
raw result.
"""

from __future__ import annotations

import gc
import gzip
import json
import os

import numpy as np
import pytest
import torch

import jupyter_memprof
from jupyter_memprof._analysis.timeline import build_events, build_timeline
from jupyter_memprof._frontends.capture import build_tables
from jupyter_memprof._io import WriteRefused
from jupyter_memprof._producers.recorder import Recorder
from jupyter_memprof._results.profile import Profile
from jupyter_memprof._views.exports import ExportError, coalesce, export_format


@pytest.fixture(scope="module")
def recorded():
    """One Adam step of a small MLP recorded once: our profile, the same profile without the
    frees only our weak references saw (torch does not report frees of blocks from before
    the capture it has no size for: the gradients zero_grad frees, mostly), and torch's
    memory timeline of that same raw result."""
    from torch.profiler._memory_profiler import MemoryProfile, MemoryProfileTimeline

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32), torch.randn(16, 8)
    ns = {"model": model, "opt": opt, "x": x, "y": y}

    def step():
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    step()
    gc.collect()
    recorder = Recorder(["cpu"], with_stack=True, namespace=lambda: ns)
    recorder.start()
    step()
    recorder.stop()
    torch_tl = MemoryProfileTimeline(MemoryProfile(recorder.kineto_results))
    tables, meta = build_tables(recorder)
    prof = Profile(**tables, meta={**meta, "devices": ["cpu"], "label": "step"})
    recorder.watched_frees = []
    tables, meta = build_tables(recorder)
    recorder.release()
    as_torch = Profile(
        **_as_torch_sees(tables, meta), meta={**meta, "devices": ["cpu"], "label": "step"}
    )
    return prof, as_torch, torch_tl


def _as_torch_sees(tables: dict, meta: dict) -> dict:
    """The tables without the blocks only the session knows (the baseline: named at the
    start, never seen in torch's trace), with events and timeline rebuilt."""
    a = tables["allocations"]
    torch_knows = a["tensor_id"].notna() | a["alloc_ns"].notna() | a["free_op_id"].notna()
    a = a[torch_knows].reset_index(drop=True)
    v = tables["versions"]
    v = v[v["alloc_id"].isin(a["alloc_id"])].reset_index(drop=True)
    events = build_events(a, v, tables["ops"], meta["start_ns"])
    return {
        **tables,
        "allocations": a,
        "versions": v,
        "events": events,
        "timeline": build_timeline(events, v),
    }


@pytest.fixture(scope="module")
def same_trace(recorded):
    """Our profile of the step as far as torch's profiler sees it, and torch's timeline."""
    _, as_torch, torch_tl = recorded
    return as_torch, torch_tl


def test_frees_torch_does_not_report_are_ours_alone(recorded):
    """The gradients of the warm-up step, freed by zero_grad: torch reports such a free only
    when its allocator remembers a size for the address; our weak references see each one."""
    prof, as_torch, _ = recorded
    a = prof.allocations
    freed_pre = a[a["alloc_ns"].isna() & a["free_ns"].notna()]
    grads = {"model.0.weight.grad": 8192, "model.0.bias.grad": 256, "model.2.weight.grad": 2048}
    grads["model.2.bias.grad"] = 32
    assert dict(zip(freed_pre["name"], freed_pre["size_bytes"])) == grads
    start, first_op = prof.meta["start_ns"], int(prof.ops["start_ns"].min())
    assert (freed_pre["free_ns"] >= start).all()
    zero_grad = prof.ops[prof.ops["name"].astype(str).str.contains("zero_grad")].iloc[0]
    assert (freed_pre["free_ns"] <= int(zero_grad["end_ns"])).all() and first_op >= start


def _load(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def test_export_format_by_suffix():
    assert export_format("a.raw.json.gz") == "raw"
    assert export_format("a.trace.json") == "trace"
    assert export_format("a.trace.json.gz") == "trace"
    assert export_format("a.json") == "timeline"
    assert export_format("a.json.gz") == "timeline"
    assert export_format("A.HTML") == "html"
    assert export_format("a.raw.json") == "timeline"  # torch's raw layout needs .raw.json.gz
    for bad in ("a.txt", "a.gz", "json", ".json", "a.parquet", "a.memprof"):
        with pytest.raises(ExportError, match="must end in one of"):
            export_format(bad)


def test_raw_matches_torch_layout(same_trace, tmp_path):
    prof, torch_tl = same_trace
    ours = _load(prof.export(tmp_path / "ours.raw.json.gz"))
    torch_tl.export_memory_timeline_raw(str(tmp_path / "torch.json"), "cpu")
    theirs = _load(tmp_path / "torch.json")

    for rows in (ours, theirs):
        assert rows and all(len(r) == 4 and all(type(v) is int for v in r) for r in rows)
        assert rows == sorted(rows, key=lambda r: (r[0], r[1]))
        assert {r[1] for r in rows} <= {1, 2, 3, 4}
        assert {r[3] for r in rows} <= set(range(8))
        for t, action, size, _ in rows:
            assert (t == -1) == (action == 1)  # preexisting blocks, and only they, have no time
            assert (size < 0) == (action == 4) or action == 3
    # the same actions happen at the same times with the same bytes; categories may differ
    assert {r[1] for r in ours} == {r[1] for r in theirs}
    creates = lambda rows: sorted((r[0], r[2]) for r in rows if r[1] == 2)  # noqa: E731
    destroys = lambda rows: sorted((r[0], r[2]) for r in rows if r[1] == 4)  # noqa: E731
    assert creates(ours) == creates(theirs)
    # Frees of blocks from before the capture (gradients freed by zero_grad) happen at the
    # same times. torch reports them only when its allocator remembers a size for that
    # address, which can be a stale size from an earlier block there (docs/tables.md); ours
    # are the sizes of the named blocks.
    a = prof.allocations
    pre = a[a["alloc_ns"].isna() & a["free_ns"].notna()]
    pre_times = set(pre["free_ns"].tolist())
    assert sorted(t for t, _ in destroys(ours) if t in pre_times) == sorted(
        t for t, _ in destroys(theirs) if t in pre_times
    )
    assert sorted(-b for t, b in destroys(ours) if t in pre_times) == sorted(
        pre["size_bytes"].tolist()
    )
    grads = {"model.0.weight.grad": 8192, "model.0.bias.grad": 256, "model.2.weight.grad": 2048}
    grads["model.2.bias.grad"] = 32
    assert dict(zip(pre["name"], pre["size_bytes"])).items() <= grads.items()
    rest = lambda rows: [r for r in destroys(rows) if r[0] not in pre_times]  # noqa: E731
    assert rest(ours) == rest(theirs)
    # in-place writes come as (-bytes old category, +bytes new category) pairs
    bumps = [r for r in ours if r[1] == 3]
    assert bumps and len(bumps) % 2 == 0
    for minus, plus in zip(bumps[::2], bumps[1::2]):
        assert minus[0] == plus[0] and minus[2] == -plus[2] < 0
    # the codes are torch's: parameters (0) are preexisting and still alive at the end
    cat_of = {c: i for i, c in enumerate(jupyter_memprof._vocab.Category.values())}
    live = prof.allocations[prof.allocations["free_ns"].isna()]
    param_bytes = int(live.loc[live["category"] == "parameter", "size_bytes"].sum())
    assert sum(r[2] for r in ours if r[3] == cat_of["parameter"]) == param_bytes
    assert param_bytes == sum(p.numel() * 4 for p in torch.nn.Linear(32, 64).parameters()) + sum(
        p.numel() * 4 for p in torch.nn.Linear(64, 8).parameters()
    )


def test_raw_sums_to_the_live_bytes_of_the_timeline(same_trace, tmp_path):
    prof, _ = same_trace
    rows = _load(prof.export(tmp_path / "s.raw.json.gz"))
    last = prof.timeline.groupby(["device", "category"], observed=True)["bytes"].last()
    per_cat = {}
    for _, _, size, cat in rows:
        per_cat[cat] = per_cat.get(cat, 0) + size
    names = jupyter_memprof._vocab.Category.values()
    assert {names[c]: v for c, v in per_cat.items() if v} == {
        c: int(v) for (_, c), v in last.items() if v
    }


def test_plain_timeline_matches_torch_layout(same_trace, tmp_path):
    prof, torch_tl = same_trace
    times, sizes = _load(prof.export(tmp_path / "ours.json"))
    torch_tl.export_memory_timeline(str(tmp_path / "torch.json"), "cpu")
    t_times, t_sizes = _load(tmp_path / "torch.json")
    assert len(times) == len(sizes) and len(t_times) == len(t_sizes)
    assert all(len(row) == 9 and row[0] == 0 for row in sizes)
    assert all(len(row) == 9 for row in t_sizes)
    assert times == sorted(times) and all(type(t) is int and t > 0 for t in times)
    # torch's microsecond clock and preexisting handling: the same first time; the same
    # last total (every block is counted by both, only their categories differ)
    assert times[0] == t_times[0]
    assert sum(sizes[-1]) == sum(t_sizes[-1])
    assert max(map(sum, sizes)) == max(map(sum, t_sizes))
    # and it is exactly torch's coalescing applied to our raw rows
    raw = _load(prof.export(tmp_path / "ours.raw.json.gz"))
    assert [times, sizes] == list(coalesce(raw))
    gz_times, gz_sizes = _load(prof.export(tmp_path / "ours.json.gz"))
    assert (gz_times, gz_sizes) == (times, sizes)


def test_coalesce_is_torchs(same_trace, tmp_path):
    """Our coalescing of raw rows equals torch's own, row for row, on torch's own rows."""
    _, torch_tl = same_trace
    torch_tl.export_memory_timeline_raw(str(tmp_path / "raw.json"), "cpu")
    times, sizes = torch_tl._coalesce_timeline("cpu")
    assert list(coalesce(_load(tmp_path / "raw.json"))) == [times, sizes]


def test_trace_structure(same_trace, tmp_path):
    prof, _ = same_trace
    path = prof.export(tmp_path / "step.trace.json.gz")
    doc = _load(path)
    assert json.loads(json.dumps(doc)) == doc
    events = doc["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == len(prof.ops)
    for e in slices:
        assert e["dur"] >= 0 and isinstance(e["tid"], int) and e["name"]
        assert {"op_id", "kind", "phase"} <= set(e["args"])
    # real threads (the main thread, perhaps autograd's), each named once
    threads = {e["tid"] for e in slices}
    assert threads == set(prof.ops["thread"]) and len(threads) <= 3
    names = [e for e in events if e["name"] == "thread_name"]
    assert sorted(e["tid"] for e in names) == sorted(threads)
    # properly nested per thread: a slice that starts inside another ends inside it
    by_tid: dict = {}
    for e in sorted(slices, key=lambda e: (e["tid"], e["ts"], -e["dur"])):
        stack = by_tid.setdefault(e["tid"], [])
        while stack and stack[-1] <= e["ts"]:
            stack.pop()
        end = e["ts"] + e["dur"]
        assert not stack or end <= stack[-1] + 1e-3
        stack.append(end)
    with_module = [e for e in slices if "module" in e["args"]]
    assert with_module and any("callsite" in e["args"] for e in slices)
    assert {e["args"]["phase"] for e in slices} >= {"forward", "backward", "optimizer"}

    counters = [e for e in events if e["ph"] == "C"]
    assert counters and {e["name"] for e in counters} == {"live bytes cpu"}
    assert all(v >= 0 for e in counters for v in e["args"].values())
    ts = [e["ts"] for e in counters]
    assert ts == sorted(ts)
    final = prof.timeline.groupby(["device", "category"], observed=True)["bytes"].last()
    assert {k: v for k, v in counters[-1]["args"].items() if v} == {
        c: int(v) for (_, c), v in final.items() if v
    }

    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == len(finishes) == len(prof.flows) > 0
    by_op = {e["args"]["op_id"]: e for e in slices}
    for (_, row), i in zip(prof.flows.iterrows(), sorted(starts)):
        s, f = starts[i], finishes[i]
        fwd, bwd = by_op[row["forward_op_id"]], by_op[row["backward_op_id"]]
        assert s["ts"] == fwd["ts"] and s["tid"] == fwd["tid"]
        assert f["ts"] == bwd["ts"] and f["tid"] == bwd["tid"] and f["bp"] == "e"
        assert fwd["args"]["phase"] == "forward" and bwd["args"]["phase"] == "backward"
        assert s["ts"] < f["ts"]
    meta = [e for e in events if e["ph"] == "M"]
    assert {e["name"] for e in meta} == {"process_name", "thread_name"}


def test_html_export_is_the_dashboard(same_trace, tmp_path):
    prof, _ = same_trace
    path = prof.export(tmp_path / "step.html")
    text = open(path, encoding="utf-8").read()
    assert 'id="memprof-status"' in text and "jupyter_memprof: step" in text


def test_devices_and_rank_in_the_path(same_trace, tmp_path):
    prof, _ = same_trace
    ranked = Profile(**prof.tables, meta={**prof.meta, "rank": 3, "devices": ["cpu"]})
    written = ranked.export(tmp_path / "r{rank}-{device}.raw.json.gz")
    assert written == str(tmp_path / "r3-cpu.raw.json.gz")
    assert ranked.export(tmp_path / "x.json", device="cpu") == str(tmp_path / "x.json")
    with pytest.raises(ExportError, match="no device 'cuda:0'"):
        prof.export(tmp_path / "y.json", device="cuda:0")
    with pytest.raises(ExportError, match="torch memory-timeline formats only"):
        prof.export(tmp_path / "y.trace.json", device="cpu")
    assert not os.path.exists(tmp_path / "y.json")
    # two devices: one file per device, named by the device
    two = Profile(**prof.tables, meta={**prof.meta, "devices": ["cpu", "cuda:0"]})
    paths = two.export(tmp_path / "two.raw.json.gz")
    assert paths == [str(tmp_path / "two.cpu.raw.json.gz"), str(tmp_path / "two.cuda0.raw.json.gz")]
    assert _load(paths[1]) == []


def test_bad_paths_write_nothing(same_trace, tmp_path):
    prof, _ = same_trace
    with pytest.raises(ExportError, match="must end in one of"):
        prof.export(tmp_path / "step.txt")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prof.export(tmp_path / "missing" / "step.json")
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(IsADirectoryError):
        prof.export(tmp_path / "folder.json")
    # somebody else's JSON is not replaced without overwrite=True
    config = tmp_path / "config.json"
    config.write_text('{"keep": true}')
    with pytest.raises(WriteRefused, match="overwrite=True"):
        prof.export(config)
    assert config.read_text() == '{"keep": true}'
    notes = tmp_path / "notes.html"
    notes.write_text("<p>mine</p>")
    with pytest.raises(WriteRefused):
        prof.export(notes)
    assert notes.read_text() == "<p>mine</p>"
    assert sorted(os.listdir(tmp_path)) == ["config.json", "folder.json", "notes.html"]
    # our own exports are replaced; overwrite=True replaces anything
    prof.export(tmp_path / "again.json")
    prof.export(tmp_path / "again.json")
    prof.export(config, overwrite=True)
    assert isinstance(_load(config), list)


def test_empty_profile_exports(tmp_path):
    empty = Profile.empty(devices=["cpu"])
    assert _load(empty.export(tmp_path / "e.raw.json.gz")) == []
    assert _load(empty.export(tmp_path / "e.json")) == [[], []]
    doc = _load(empty.export(tmp_path / "e.trace.json"))
    assert [e["ph"] for e in doc["traceEvents"]] == ["M"]


def test_events_in_torch_units(same_trace, tmp_path):
    """Raw times are the profiler's own nanoseconds, as torch writes them; one row per event,
    two per in-place write."""
    prof, _ = same_trace
    rows = np.array(_load(prof.export(tmp_path / "u.raw.json.gz")))
    ev = prof.events
    timed = rows[rows[:, 0] >= 0, 0]
    assert timed.min() == ev.loc[ev["action"] != "preexisting", "time_ns"].min()
    assert timed.max() == ev["time_ns"].max()
    assert len(rows) == len(ev) + int((ev["action"] == "increment_version").sum())
