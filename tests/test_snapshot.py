"""A memory snapshot as a Profile: each entry kind, several devices and streams, truncated
histories, old formats, and the views, saving and comparing that work on any profile."""

from __future__ import annotations

import json
import pickle

import pytest

import jupyter_memprof as jm
from jupyter_memprof._errors import ProfileFileError

MiB = 2**20
SITE = "/opt/conda/lib/python3.11/site-packages/torch/"
USER = {"filename": "/home/u/train.py", "line": 40, "name": "main"}


def _frames(*inner) -> list:
    return [{"filename": SITE + f, "line": n, "name": name} for f, n, name in inner] + [USER]


FWD = _frames(
    ("nn/modules/linear.py", 125, "forward"), ("nn/modules/module.py", 1750, "_call_impl")
)
BWD = _frames(("autograd/graph.py", 824, "_engine_run_backward"), ("_tensor.py", 626, "backward"))
OPT = _frames(("optim/adam.py", 400, "_single_tensor_adam"), ("optim/adam.py", 230, "step"))


def _e(action, addr, size, t, frames=(), stream=0, **extra):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t,
            "frames": list(frames), **extra}  # fmt: skip


def _segment(device, address, total, blocks, kind="large", stream=0):
    return {
        "device": device, "address": address, "total_size": total, "stream": stream,
        "allocated_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
        "active_size": 0, "requested_size": 0, "segment_type": kind,
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks,
    }  # fmt: skip


def _block(address, size, state="active_allocated", frames=()):
    return {"address": address, "size": size, "requested_size": size, "state": state,
            "frames": list(frames)}  # fmt: skip


def _two_devices() -> dict:
    """cuda:0 and cuda:1, each a 20 MiB segment; cuda:1 uses two streams."""
    base0, base1 = 1 << 40, 1 << 41
    t0 = [
        _e("segment_alloc", base0, 20 * MiB, 10),
        _e("alloc", base0, 4 * MiB, 10, FWD),
        _e("alloc", base0 + 4 * MiB, 8 * MiB, 11, FWD),
        _e("free_requested", base0, 4 * MiB, 12, BWD),
        _e("free_completed", base0, 4 * MiB, 12, BWD),
        _e("alloc", base0, 2 * MiB, 13, BWD),
    ]
    t1 = [
        _e("segment_alloc", base1, 20 * MiB, 10, stream=7),
        _e("alloc", base1, 6 * MiB, 10, FWD, stream=7),
        _e("free_requested", base1, 6 * MiB, 14, BWD, stream=7),
    ]
    segments = [
        _segment(0, base0, 20 * MiB, [_block(base0, 2 * MiB, frames=BWD),
                                      _block(base0 + 2 * MiB, 2 * MiB, "inactive"),
                                      _block(base0 + 4 * MiB, 8 * MiB, frames=FWD),
                                      _block(base0 + 12 * MiB, 8 * MiB, "inactive")]),
        _segment(1, base1, 20 * MiB, [_block(base1, 6 * MiB, "active_pending_free", FWD),
                                      _block(base1 + 6 * MiB, 14 * MiB, "inactive")], stream=7),
    ]  # fmt: skip
    return {"segments": segments, "device_traces": [t0, t1]}


def test_each_device_is_its_own_and_pending_frees_count_until_completed():
    prof = jm.load_snapshot(_two_devices(), label="two")
    assert prof.devices == ["cuda:0", "cuda:1"]
    assert prof.label == "two"
    a = prof.allocations.set_index(["device", "ptr", "alloc_ns"])
    assert a.loc[("cuda:0", 1 << 40, 10_000), "free_ns"] == 12_000
    # cuda:1's block: its free was requested, never completed: alive at the end
    assert pd_na(a.loc[("cuda:1", 1 << 41, 10_000), "free_ns"])
    assert prof.peak("cuda:0").attrs["peak_bytes"] == 12 * MiB
    assert prof.peak("cuda:1").attrs["peak_bytes"] == 6 * MiB
    assert prof.meta["reserved_peak_bytes"] == {"cuda:0": 20 * MiB, "cuda:1": 20 * MiB}
    assert prof.meta["snapshot_end_allocated"] == {"cuda:0": 10 * MiB, "cuda:1": 6 * MiB}


def pd_na(v) -> bool:
    import pandas as pd

    return v is pd.NA or pd.isna(v)


def test_one_device_only():
    prof = jm.load_snapshot(_two_devices(), device="cuda:1")
    assert prof.devices == ["cuda:1"]
    assert len(prof.allocations) == 1
    assert jm.load_snapshot(_two_devices(), device=0).devices == ["cuda:0"]
    with pytest.raises(ValueError, match="CUDA devices only"):
        jm.load_snapshot(_two_devices(), device="cpu")


def test_categories_and_reasons_from_frames():
    prof = jm.load_snapshot(_two_devices(), device=0)
    got = {
        (int(r.ptr - (1 << 40)) // MiB, r.size_bytes // MiB): (str(r.category), r.reason)
        for r in prof.allocations.itertuples()
    }
    assert got[(0, 4)] == ("activation", "made in forward, freed in backward")
    assert got[(4, 8)] == ("activation", "made in forward")
    assert got[(0, 2)] == ("gradient", "made in backward, kept past it")


def test_what_a_snapshot_cannot_say_is_said():
    prof = jm.load_snapshot(_two_devices())
    assert prof.meta["producer"] == "snapshot"
    assert prof.meta["not_recorded"] == ["tensor_id", "versions", "ops"]
    assert prof.allocations["tensor_id"].isna().all()
    assert prof.versions.empty
    assert "not recorded there: tensor_id, versions, ops" in repr(prof)
    assert "not recorded there" in prof._repr_html_()


def test_a_history_that_starts_late_counts_older_blocks():
    """Blocks from before the history: alive in the final state (with the frames of their
    making) or freed in it; counted from the start, named as such."""
    base = 1 << 40
    trace = [
        _e("free_completed", base + 8 * MiB, 2 * MiB, 5, BWD),
        _e("alloc", base, 2 * MiB, 6, OPT),
    ]
    segments = [_segment(0, base, 20 * MiB, [
        _block(base, 2 * MiB, frames=OPT), _block(base + 2 * MiB, 4 * MiB, frames=FWD),
        _block(base + 6 * MiB, 14 * MiB, "inactive")])]  # fmt: skip
    prof = jm.load_snapshot({"segments": segments, "device_traces": [trace]})
    a = prof.allocations
    older = a[a["alloc_ns"].isna()]
    assert sorted(older["size_bytes"].tolist()) == [2 * MiB, 4 * MiB]
    assert prof.meta["snapshot_older_blocks"] == {"alive": 1, "alive_bytes": 4 * MiB, "freed": 1}
    kept = older[older["free_ns"].isna()].iloc[0]
    assert (str(kept["category"]), kept["reason"]) == ("activation", "made in forward")
    freed = older[older["free_ns"].notna()].iloc[0]
    assert freed["reason"] == "older than the history, freed in backward"
    # 2 freed + 4 alive until the free at 5 µs, then 4 alive + 2 new
    assert prof.peak().attrs["peak_bytes"] == 6 * MiB


def test_old_history_blocks_and_no_times():
    """Snapshots from before ``time_us`` and per-block ``frames``: the entry order is the
    clock, a block's frames are its last ``history`` entry's."""
    base = 1 << 40
    trace = [{"action": "alloc", "addr": base + 2 * MiB, "size": MiB, "stream": 0, "frames": FWD}]
    blocks = [
        {"size": 2 * MiB, "state": "active_allocated", "history": [{"addr": base, "real_size": 2 * MiB, "frames": OPT}]},
        {"size": MiB, "state": "active_allocated", "history": []},
        {"size": 17 * MiB, "state": "inactive"},
    ]  # fmt: skip
    snap = {"segments": [_segment(0, base, 20 * MiB, blocks)], "device_traces": [trace]}
    prof = jm.load_snapshot(snap)
    assert prof.meta["clock"] == "entry order"
    a = prof.allocations.sort_values("ptr")
    assert a["size_bytes"].tolist() == [2 * MiB, MiB]
    assert a["category"].astype(str).tolist() == ["optimizer_state", "activation"]


def test_unknown_keys_and_actions_are_ignored():
    snap = _two_devices()
    snap["device_traces"][0].append(_e("snapshot", 0, 0, 20))
    snap["device_traces"][0].append(_e("annotate", 0, 0, 20, user_metadata="x"))
    snap["something_new"] = {"a": 1}
    prof = jm.load_snapshot(snap)
    assert prof.meta["snapshot_actions"]["annotate"] == 1


def test_annotations_are_ops_and_steps():
    snap = _two_devices()
    snap["external_annotations"] = [
        {"name": "ProfilerStep#0", "stage": "START", "time_us": 9, "device": 0},
        {"name": "ProfilerStep#0", "stage": "END", "time_us": 12, "device": 0},
        {"name": "ProfilerStep#0", "stage": "START", "time_us": 9, "device": 1},  # repeated
        {"name": "ProfilerStep#1", "stage": "START", "time_us": 12, "device": 0},
        {"name": "Optimizer.step#Adam.step", "stage": "START", "time_us": 13, "device": 0},
        {"name": "Optimizer.step#Adam.step", "stage": "END", "time_us": 14, "device": 0},
        {"name": "ProfilerStep#1", "stage": "END", "time_us": 15, "device": 0},
    ]
    prof = jm.load_snapshot(snap, device=0)
    ops = prof.ops.set_index("name")
    assert ops.loc["Optimizer.step#Adam.step", "kind"] == "optimizer"
    assert ops.loc["Optimizer.step#Adam.step", "depth"] == 1
    assert prof.steps["step"].tolist() == [0, 1]


def test_load_tells_formats_apart(tmp_path):
    snap = _two_devices()
    pk = tmp_path / "snap.pickle"
    pk.write_bytes(pickle.dumps(snap))
    js = tmp_path / "snap.json"
    js.write_text(json.dumps(snap))
    a, b = jm.load(pk), jm.load(js)
    assert a.allocations.equals(b.allocations)
    saved = a.save(tmp_path / "p.zip")
    back = jm.load(saved)
    assert back.meta["producer"] == "snapshot"
    assert back.allocations.equals(a.allocations)
    folder = a.save(tmp_path / "p", format="parquet")
    assert jm.load(folder).meta["not_recorded"] == ["tensor_id", "versions", "ops"]
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    with pytest.raises(ProfileFileError):
        jm.load(other)


def test_views_work_on_a_snapshot(tmp_path):
    prof = jm.load_snapshot(_two_devices())
    html = prof.to_html(tmp_path / "d.html")
    assert "jupyter_memprof: snapshot" in open(html).read()
    assert not prof.explain().empty
    assert jm.diff(prof, prof)["delta"].eq(0).all()
    exported = prof.export(tmp_path / "t.trace.json")
    assert exported


def test_a_progress_bar_follows_the_reading_and_the_analysis(tmp_path, monkeypatch):
    from jupyter_memprof._frontends import snapshot

    seen: list = []

    class Bar:
        def __call__(self, stage, done, total):
            seen.append((stage, done, total))

        def close(self):
            seen.append("closed")

    monkeypatch.setattr(snapshot, "_progress", Bar)
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_two_devices()))
    jm.load_snapshot(path)
    assert seen[0] == ("reading the file", 0, 8) and seen[1] == ("reading its records", 1, 8)
    assert seen[-2][1:] == (8, 8) and seen[-1] == "closed"
    done = [s[1] for s in seen[:-1]]
    assert done == sorted(done)


def test_one_snapshot_per_rank_with_load_many(tmp_path):
    for rank in (0, 1):
        snap = _two_devices()
        snap["device_traces"] = [snap["device_traces"][rank]]
        snap["segments"] = [dict(s, device=0) for s in snap["segments"] if s["device"] == rank]
        (tmp_path / f"rank{rank}.pickle").write_bytes(pickle.dumps(snap))
    ranks = jm.load_many(str(tmp_path / "rank*.pickle"), panel=False)
    assert ranks.ranks == [0, 1]
    peaks = ranks.peaks().set_index("rank")["peak_bytes"]
    assert peaks.to_dict() == {0: 12 * MiB, 1: 6 * MiB}


def test_a_big_snapshot_opens_again_from_its_cached_copy(tmp_path, monkeypatch):
    from jupyter_memprof._frontends import snapshot_cache

    monkeypatch.setenv("JUPYTER_MEMPROF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(snapshot_cache, "MIN_BYTES", 0)
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps(_two_devices()))
    first = jm.load_snapshot(path)
    assert "snapshot_cached" not in first.meta
    (copy,) = (tmp_path / "cache").iterdir()
    second = jm.load_snapshot(path, label="again")
    assert second.meta["snapshot_cached"] is True and second.label == "again"
    assert second.allocations.equals(first.allocations)
    assert second.meta["not_recorded"] == first.meta["not_recorded"]
    # another device, or a changed file, is read again
    assert "snapshot_cached" not in jm.load_snapshot(path, device=1).meta
    path.write_bytes(pickle.dumps(_two_devices(), protocol=2))
    assert "snapshot_cached" not in jm.load_snapshot(path).meta
    monkeypatch.setenv("JUPYTER_MEMPROF_CACHE", "off")
    assert snapshot_cache.cache_dir() is None


def test_each_entry_gets_the_innermost_annotation_open_then():
    """The sweep over the points where ops start and end agrees with asking every op."""
    import random

    from jupyter_memprof._producers.snapshot.read import _innermost, _nest

    rng = random.Random(0)
    spans = []
    for _ in range(200):  # nested ranges, as record_function makes them, and gaps
        t0 = rng.randrange(0, 10_000)
        spans.append((t0, t0 + rng.choice([0, 1, 5, 50, 500]), f"op{len(spans)}"))
    ops = _nest(spans)
    times = sorted(rng.randrange(-10, 10_600) for _ in range(3000))
    got = _innermost(ops, times)
    for t, op in zip(times, got):
        open_ = [o for o in ops if o.start_ns <= t <= o.end_ns]
        # the innermost open op: the deepest, the latest started among equals
        want = max(open_, key=lambda o: (o.depth, o.start_ns, o.op_id)).op_id if open_ else -1
        if open_ and op != want:
            # spans that overlap without nesting: any open op containing t is acceptable
            assert any(o.op_id == op for o in open_), (t, op, want)
        else:
            assert op == want, (t, op, want)


def test_the_cached_copy_gives_the_same_tables_and_a_damaged_one_is_read_again(
    tmp_path, monkeypatch
):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jupyter_memprof._frontends import snapshot_cache

    monkeypatch.setenv("JUPYTER_MEMPROF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(snapshot_cache, "MIN_BYTES", 0)
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps(_two_devices()))
    first = jm.load_snapshot(path)
    second = jm.load_snapshot(path)
    assert second.meta["snapshot_cached"] is True
    for name, table in first.tables.items():
        assert second.tables[name].equals(table), name
    for key in ("reserved_peak_bytes", "reserved_peak_ns", "fragmentation_bytes"):
        assert second.meta[key] == first.meta[key]
    # the copy damaged: an event of a cuda:0 block put on cuda:1, which the tables would
    # not say otherwise; refused, and the snapshot is read again
    (copy,) = (tmp_path / "cache").iterdir()
    events = pq.read_table(copy / "events.parquet").to_pandas().copy(deep=True)
    on_0 = (events["device"] == "cuda:0").to_numpy().nonzero()[0][0]
    events.loc[on_0, "device"] = "cuda:1"
    pq.write_table(pa.Table.from_pandas(events, preserve_index=False), copy / "events.parquet")
    with pytest.raises(jm.ProfileFileError, match="puts a block on another device"):
        jm.load(copy)
    third = jm.load_snapshot(path)
    assert "snapshot_cached" not in third.meta
    assert third.allocations.equals(first.allocations)
