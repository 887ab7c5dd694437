"""The whole footprint: every byte live when a capture starts is in the profile, named where
the session can name it, whether or not the captured code touches it."""

from __future__ import annotations

import collections
import gc
import time
import types

import numpy as np
import pytest
import scenarios
import torch
from torch import nn

import jupyter_memprof


def _storage_key(t: torch.Tensor):
    return (str(t.device), t.untyped_storage().data_ptr())


def _block_bytes(t: torch.Tensor) -> int:
    n = t.untyped_storage().nbytes()
    return -(-n // 512) * 512 if t.device.type == "cuda" else n


def _reachable_storages(namespace: dict) -> dict:
    """(device, address) -> bytes of every tensor storage Python reaches from the values of
    ``namespace``, by the garbage collector's referents (an independent walk: it does not
    enter modules, classes or module globals), plus every reached leaf's ``.grad``."""
    found: dict = {}
    seen: set[int] = set()
    todo = collections.deque(v for k, v in namespace.items() if not k.startswith("_"))
    module_dicts = {id(vars(m)) for m in list(__import__("sys").modules.values()) if m}
    while todo:
        obj = todo.popleft()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType)):
            continue
        seen.add(id(obj))
        if id(obj) in module_dicts:
            continue
        if isinstance(obj, torch.Tensor):
            if obj.device.type != "meta":
                found[_storage_key(obj)] = _block_bytes(obj)
            if obj.grad is not None:
                found[_storage_key(obj.grad)] = _block_bytes(obj.grad)
        if isinstance(obj, types.FunctionType):
            todo.extend(c.cell_contents for c in obj.__closure__ or ())
            continue
        todo.extend(gc.get_referents(obj))
    return found


def _live_at_start(prof, device: str = "cpu") -> int:
    t = prof.timeline
    t = t[(t["device"].astype(str) == device) & (t["time_ns"] == prof.meta["start_ns"])]
    return int(t.groupby("category", observed=True)["bytes"].last().sum())


def _trained_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)
    nn.functional.cross_entropy(model(x), torch.randint(0, 10, (32,))).backward()
    opt.step()  # gradients and Adam's state stay alive
    return model, opt, x


def test_an_evaluation_after_a_training_step_holds_the_gradients_and_adam_state():
    model, opt, x = _trained_mlp()
    ns = {"model": model, "opt": opt, "x": x}
    gc.collect()
    with jupyter_memprof.profile(namespace=ns) as prof:
        with torch.no_grad():
            out = model(x)
    a = prof.allocations
    params = sum(p.numel() * 4 for p in model.parameters())
    assert params == 9610 * 4
    by_cat = a[a["alloc_ns"].isna()].groupby("category", observed=True)["size_bytes"].sum()
    assert by_cat["parameter"] == params
    assert by_cat["gradient"] == params
    # exp_avg and exp_avg_sq per parameter, and a 4-byte step counter each
    assert by_cat["optimizer_state"] == 2 * params + 4 * 4
    grads = a[a["category"] == "gradient"]
    assert set(grads["name"]) == {f"model.{n}.grad" for n, _ in model.named_parameters()}
    assert set(grads["reason"]) == {".grad of a parameter; existed before the capture, untouched"}
    w = a[a["name"] == "model.0.weight.grad"].iloc[0]
    assert w["ptr"] == model[0].weight.grad.untyped_storage().data_ptr()
    state = a[a["name"] == "opt.state[model.0.weight].exp_avg_sq"].iloc[0]
    assert state["category"] == "optimizer_state" and state["size_bytes"] == 128 * 64 * 4
    # the peak is the process's: everything above plus the batch and the forward's blocks
    start = _live_at_start(prof)
    assert start == 4 * params + 16 + 32 * 64 * 4
    assert prof.peak().attrs["peak_bytes"] >= start + out.numel() * 4
    assert prof.meta["baseline_bytes"]["cpu"] == start
    assert prof.meta["untouched_bytes"]["cpu"] == 3 * params + 16  # params and x are read
    # the summary (text, and the HTML above the dashboard) says it
    line = "live before the capture on cpu: 158.2 KiB, of which untouched 112.6 KiB"
    assert line in str(prof) and line in prof._repr_html_()


class _Holder:
    def __init__(self) -> None:
        self.buf = torch.zeros(250)


class _WithCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.cache = [torch.ones(30)]

    def forward(self, x):
        return self.fc(x)


def _closure():
    hidden = torch.zeros(100)
    return lambda: hidden.sum()


def test_tensors_held_by_containers_attributes_closures_and_hooks_are_named():
    kept: list = []
    model = _WithCache()
    model.fc.register_forward_hook(lambda m, i, o: kept.append(o.detach()))
    model(torch.ones(2, 4))  # the hook keeps one output
    ns = {
        "cache": [torch.ones(1000), (torch.ones(10),)],
        "batches": {"train": torch.ones(500)},
        "holder": _Holder(),
        "f": _closure(),
        "model": model,
        "Out": {3: torch.ones(7)},
        "_private": torch.ones(12345),  # not the user's
    }
    gc.collect()
    with jupyter_memprof.profile(namespace=ns) as prof:
        torch.ones(3)
    a = prof.allocations
    pre = a[a["alloc_ns"].isna()].set_index("name")
    expected = {
        "cache[0]": 4000,
        "cache[1][0]": 40,
        "batches['train']": 2000,
        "holder.buf": 1000,
        "f.<closure>.hidden": 400,
        "model.cache[0]": 120,
        "Out[3]": 28,
    }
    for name, size in expected.items():
        row = pre.loc[name]
        assert row["size_bytes"] == size, name
        assert row["category"] == "input", name
        assert row["reason"] == "existed before the capture, untouched", name
    hooked = [n for n in pre.index.dropna() if "forward_hooks" in n]
    assert len(hooked) == 1 and hooked[0].endswith(".<closure>.kept[0]"), hooked
    assert pre.loc[hooked[0], "size_bytes"] == 2 * 4 * 4
    assert pre.loc["model.fc.weight", "category"] == "parameter"
    assert (a["size_bytes"] != 12345 * 4).all()


def test_a_bare_leaf_that_receives_grad_is_a_parameter():
    torch.manual_seed(0)
    w = torch.randn(64, 32, requires_grad=True)  # no nn.Parameter, no module
    x = torch.randn(16, 64)
    gc.collect()
    with jupyter_memprof.profile(namespace={"w": w, "x": x}) as prof:
        (x @ w).square().mean().backward()
    a = prof.allocations
    w_row = a[a["name"] == "w"].iloc[0]
    assert w_row["category"] == "parameter" and w_row["size_bytes"] == 64 * 32 * 4
    g = a[a["name"] == "w.grad"].iloc[0]
    assert g["category"] == "gradient" and g["size_bytes"] == 64 * 32 * 4
    assert pd_isna(g["free_ns"]) and not pd_isna(g["alloc_ns"])
    # x needs no gradient: plain data
    assert a[a["name"] == "x"].iloc[0]["category"] == "input"


def pd_isna(v) -> bool:
    import pandas as pd

    return bool(pd.isna(v))


def test_a_block_from_before_the_capture_freed_during_it_ends_when_it_is_freed():
    """torch reports no free of a CPU block allocated before the profiler started; a weak
    reference on the storage sees it."""
    ns = {"big": torch.ones(4096), "kept": torch.ones(16)}
    gc.collect()
    with jupyter_memprof.profile(namespace=ns) as prof:
        before = time.time_ns()
        del ns["big"]
        after = time.time_ns()
        torch.ones(8)
    a = prof.allocations
    big = a[a["name"] == "big"].iloc[0]
    assert big["size_bytes"] == 4096 * 4 and pd_isna(big["alloc_ns"])
    assert before <= big["free_ns"] <= after
    kept = a[a["name"] == "kept"].iloc[0]
    assert pd_isna(kept["free_ns"])
    # the timeline drops the freed bytes at that moment
    t = prof.timeline[prof.timeline["category"] == "input"]
    at_start = t.loc[t["time_ns"] == prof.meta["start_ns"], "bytes"].iloc[-1]
    assert at_start == 4096 * 4 + 64 and t["bytes"].iloc[-1] == 64
    assert t.loc[t["time_ns"] == big["free_ns"], "bytes"].iloc[-1] == 64


@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
def test_the_timeline_starts_at_the_live_bytes_python_reaches(name):
    ns, step = scenarios.SCENARIOS[name]()
    step()
    gc.collect()
    truth = _reachable_storages(ns)
    with jupyter_memprof.profile(namespace=ns) as prof:
        step()
    assert _live_at_start(prof) == sum(truth.values()), name
    a = prof.allocations
    pre = a[a["alloc_ns"].isna() & (a["device"].astype(str) == "cpu") & (a["size_bytes"] > 0)]
    assert set(zip(pre["device"].astype(str), pre["ptr"])) == {k for k, v in truth.items() if v}


def test_an_empty_namespace_has_no_baseline():
    gc.collect()
    with jupyter_memprof.profile(namespace={}) as prof:
        pass
    assert prof.allocations.empty
    assert prof.meta["baseline_bytes"] == {}


def test_the_walk_stops_and_says_so():
    from jupyter_memprof._producers.reach import reach

    deep: list = [torch.ones(1)]
    for _ in range(20):
        deep = [deep]
    found = reach({"deep": deep, "flat": list(range(1000)), "t": torch.ones(2)})
    assert [p for p, _ in found.tensors] == ["t"]  # 21 levels down is past the depth limit
    assert not found.truncated
    many = reach({"xs": [object() for _ in range(50)]}, max_objects=10)
    assert many.truncated


def test_attributes_are_read_without_running_user_code():
    from jupyter_memprof._producers.reach import reach

    class Trap:
        __slots__ = ("t",)

        def __init__(self):
            self.t = torch.ones(3)

        def __getattribute__(self, name):
            raise RuntimeError("user code ran")

    class Lazy:
        def __init__(self):
            self.real = torch.ones(2)

        @property
        def computed(self):
            raise RuntimeError("user code ran")

        def __getattr__(self, name):
            raise RuntimeError("user code ran")

    found = reach({"trap": Trap(), "lazy": Lazy()})
    assert sorted(p for p, _ in found.tensors) == ["lazy.real", "trap.t"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_cuda_the_peak_is_max_memory_allocated_and_reserved_is_recorded():
    device = torch.device("cuda:0")
    torch.manual_seed(0)
    with device:
        model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10))
        opt = torch.optim.Adam(model.parameters())
        x = torch.randn(256, 512)
        hidden = [torch.ones(3, 1000)]
    step = lambda: (opt.zero_grad(), model(x).square().mean().backward(), opt.step())  # noqa: E731
    step()
    torch.cuda.synchronize()
    gc.collect()
    ns = {"model": model, "opt": opt, "x": x, "hidden": hidden}
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    with jupyter_memprof.profile(namespace=ns) as prof:
        step()
        torch.cuda.synchronize()
    torch_peak = torch.cuda.max_memory_allocated(device)
    torch_reserved_peak = torch.cuda.max_memory_reserved(device)
    assert _live_at_start(prof, "cuda:0") == start
    assert prof.meta["baseline_bytes"]["cuda:0"] == start
    assert prof.peak("cuda:0").attrs["peak_bytes"] == torch_peak
    assert prof.meta["reserved_peak_bytes"]["cuda:0"] == torch_reserved_peak
    ev = prof.events[prof.events["device"].astype(str) == "cuda:0"]
    assert ev["reserved_bytes"].notna().all()
    cuda = prof.meta["cuda_start"]["cuda:0"]
    assert cuda["allocated"] == start and cuda["total"] > cuda["free"] > 0
    a = prof.allocations
    rest = a[(a["device"].astype(str) == "cuda:0") & (a["ptr"] == 0)]
    assert len(rest) <= 1
    assert (rest["category"] == "unknown").all()
    h = a[a["name"] == "hidden[0]"].iloc[0]
    assert h["size_bytes"] == 12288 and h["reason"] == "existed before the capture, untouched"


# -- real H100 streams (tests/data/h100, recorded by benchmarks/record_cuda.py) -----------------
def _h100_capture(path, *, with_stack: bool = True):
    """A Capture of a recorded H100 step's allocator events as torch's profiler reported
    them (address, block size, the allocator's totals after each), with the counters read
    at the step's start and end; blocks paired by address in order. Without ``with_stack``,
    the frees torch's profiler reports only with Python stacks (of blocks freed outside any
    op) are left out, as torch leaves them out (docs/dev-notes.md)."""
    import json

    from jupyter_memprof._records import NO_ID, Capture, DeviceTotals, MemoryRecord, Trace

    data = json.loads(path.read_text())
    t0 = 1_000_000_000
    open_at: dict[int, int] = {}
    memory, next_id = [], 0
    for t, ptr, size, allocated, reserved, op in data["profiler"]:
        if size < 0 and op == -1 and not with_stack:
            continue
        if size > 0:
            open_at[ptr] = aid = next_id
            next_id += 1
        else:
            aid = open_at.pop(ptr, None)
            if aid is None:
                aid, next_id = next_id, next_id + 1
        memory.append(
            MemoryRecord(t0 + t, ptr, size, NO_ID, aid, "cuda:0", NO_ID, allocated, reserved)
        )

    def totals(when: str) -> DeviceTotals:
        counters = data["totals"][f"step_{when}"]
        free, total = data["totals"][f"mem_get_info_{when}"]
        return DeviceTotals(
            counters["allocated_bytes.all.current"],
            counters["reserved_bytes.all.current"],
            free,
            total,
        )

    trace = Trace([], [], memory, [], len(memory))
    capture = Capture(
        trace,
        [],
        [],
        [],
        ["cuda:0"],
        t0,
        {"cuda:0": totals("start")},
        {"cuda:0": totals("end")},
        [],
    )
    return capture, data


H100 = sorted((__import__("pathlib").Path(__file__).parent / "data" / "h100").glob("*.json"))


@pytest.mark.parametrize("path", H100, ids=[p.stem for p in H100])
def test_recorded_h100_steps_start_peak_and_reserved_match_the_allocator(path):
    from jupyter_memprof._analysis.pipeline import analyse

    capture, data = _h100_capture(path)
    tables, meta = analyse(capture)
    totals = data["totals"]
    start = totals["step_start"]["allocated_bytes.all.current"]
    assert meta["baseline_bytes"]["cuda:0"] == start
    t = tables["timeline"]
    first = t[t["time_ns"] == meta["start_ns"]].groupby("category", observed=True)["bytes"].last()
    assert int(first.sum()) == start
    live = tables["events"]
    sign = live["action"].map({"destroy": -1, "increment_version": 0}).fillna(1).astype(int)
    peak = int((sign * live["size_bytes"]).cumsum().max())
    assert peak == totals["step_max_memory_allocated"]
    assert meta["reserved_peak_bytes"]["cuda:0"] == totals["step_max_memory_reserved"]
    rest = tables["allocations"]
    rest = rest[rest["ptr"] == 0]
    assert len(rest) == 1 and rest["category"].astype(str).tolist() == ["unknown"]


def _live_at_events(allocations, memory) -> list[int]:
    """The live bytes the allocations table gives right after each recorded event."""
    a = allocations["alloc_ns"].to_numpy(dtype=float, na_value=-np.inf)
    f = allocations["free_ns"].to_numpy(dtype=float, na_value=np.inf)
    size = allocations["size_bytes"].to_numpy()
    return [int(size[(a <= m.time_ns) & (f > m.time_ns)].sum()) for m in memory]


def _session_names(allocations):
    """The names a session gives the blocks of a recorded step: every block alive at its
    end (``kept``, the model's state), and every block from before it (at its start)."""
    from jupyter_memprof._records import NameRow
    from jupyter_memprof._vocab import Role

    a = allocations
    end = a[a["alloc_ns"].notna() & a["free_ns"].isna()]
    start = a[a["alloc_ns"].isna() & (a["ptr"] != 0)]
    return [
        NameRow(f"{when}[{i}]", Role.VARIABLE, "cuda:0", int(p), int(z), when)
        for when, rows in (("end", end), ("start", start))
        for i, (p, z) in enumerate(zip(rows["ptr"], rows["size_bytes"]))
    ]


@pytest.mark.parametrize("path", H100, ids=[p.stem for p in H100])
def test_frees_lost_without_python_stacks_are_found_from_the_allocators_totals(path):
    """Without Python stacks torch's profiler drops the frees of blocks freed outside any op
    (17 to 312 per recorded step). Before, those blocks stayed open to the end (the fragment
    step ended with 1.28 GB live against the allocator's 199 MB). Now the allocator's totals
    after each event say how much was freed unseen, and the blocks are ended there: with
    the names a session gives (what it reaches at the end, what it named at the start), the
    live bytes equal the allocator's at every recorded event and at the end, and the same
    blocks are left open as with stacks."""
    from jupyter_memprof._analysis.pipeline import analyse

    full, data = _h100_capture(path)
    truth, truth_meta = analyse(full)
    capture, _ = _h100_capture(path, with_stack=False)
    assert len(capture.trace.memory) < len(full.trace.memory)  # frees were lost
    names = _session_names(truth["allocations"])
    tables, meta = analyse(capture._replace(names=names))
    a = tables["allocations"]
    totals = [m.total_allocated for m in capture.trace.memory]
    assert _live_at_events(a, capture.trace.memory) == totals
    end = data["totals"]["step_end"]["allocated_bytes.all.current"]
    assert int(a.loc[a["free_ns"].isna(), "size_bytes"].sum()) == end
    made_open = a[a["alloc_ns"].notna() & a["free_ns"].isna()]
    t = truth["allocations"]
    same = t[t["alloc_ns"].notna() & t["free_ns"].isna()]
    assert sorted(made_open["ptr"]) == sorted(same["ptr"])
    assert (
        meta["baseline_bytes"]["cuda:0"]
        == data["totals"]["step_start"]["allocated_bytes.all.current"]
    )
    found = meta["inferred_frees"]["cuda:0"]
    assert found["blocks"] > 0 and found["unexplained_bytes"] == 0
    assert "inferred_frees" not in truth_meta  # with stacks: nothing to find
    # without any name, the same at every event; at the end, a gap no set of blocks explains
    # keeps its blocks open (the fragment step's 272 frees after its last event, among the
    # 18 blocks it keeps): never less than the allocator held
    bare, bare_meta = analyse(capture)
    bare = bare["allocations"]
    assert _live_at_events(bare, capture.trace.memory) == totals
    left = int(bare.loc[bare["free_ns"].isna(), "size_bytes"].sum())
    assert left >= end and (left == end) == (path.stem != "fragment__default")
    assert bare_meta["inferred_frees"]["cuda:0"]["unexplained_bytes"] == left - end
