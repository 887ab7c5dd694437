"""On the CPU, what is live before the capture but reachable by no name is one block that
says so, as on CUDA (issue 37, item 8): a tensor kept only in a closure's cell or in a class
attribute of a deleted module, a list reachable only from a reference cycle, and what the
autograd graph of such a tensor saved; nothing of it counted twice against named tensors,
parameters and the memory graphs of named tensors hold.

The test process keeps other tensors alive (fixtures, test modules), so each test measures
against a profile taken just before it made its own: the difference is exact."""

from __future__ import annotations

import gc
import os
import sys
import types

import pandas as pd
import pytest
import torch

import jupyter_memprof
from jupyter_memprof._analysis.categories import UNREACHABLE_REASON
from jupyter_memprof._producers.unnamed import cpu_storage, unnamed_storages

#: The survey counts every tensor of the process: among hundreds of other tests (their
#: fixtures, modules, threads) consecutive captures were seen to differ by megabytes, so
#: these tests run in a fresh process (tests/test_unnamed_fresh_process.py starts it).
FRESH = os.environ.get("MEMPROF_UNNAMED_FRESH_PROCESS") == "1"

pytestmark = [
    pytest.mark.usefixtures("unnamed_survey"),
    pytest.mark.skipif(not FRESH, reason="run in a fresh process by test_unnamed_fresh_process"),
]

_NOTHING = {"nothing": 0}  # a namespace that names nothing (an empty one means the caller's)


def _capture(namespace: dict, body=lambda: torch.ones(3), collect=True) -> jupyter_memprof.Profile:
    if collect:
        gc.collect()
    with jupyter_memprof.profile(namespace=namespace) as prof:
        body()
    return prof


def _unreachable(prof) -> int:
    return int((prof.meta.get("unreachable_bytes") or {}).get("cpu", 0))


def _baseline(prof) -> int:
    return int(prof.meta["baseline_bytes"].get("cpu", 0))


def _rest(prof):
    """The blocks of address 0 on the CPU: what no name reaches."""
    a = prof.allocations
    return a[(a["device"].astype(str) == "cpu") & (a["ptr"] == 0)]


def _closure_over(t: torch.Tensor):
    return lambda: t.sum()


def test_a_tensor_only_a_closure_cell_holds_is_one_block_reachable_by_no_name():
    before = _capture(_NOTHING)
    hooks = [_closure_over(torch.ones(1000))]  # held by a list no variable of ours names
    w = torch.ones(10)
    prof = _capture({"w": w})
    assert _unreachable(prof) - _unreachable(before) == 4000
    assert _baseline(prof) - _baseline(before) == 4000 + 40  # and w, named
    rest = _rest(prof)
    assert len(rest) == 1 and rest["size_bytes"].iloc[0] == _unreachable(prof)
    row = rest.iloc[0]
    assert row["category"] == "unknown" and row["reason"] == UNREACHABLE_REASON
    assert pd.isna(row["alloc_ns"]) and pd.isna(row["free_ns"]) and pd.isna(row["name"])
    # the timeline starts with it, the peak holds it, the summary says it
    t = prof.timeline
    first = t[t["time_ns"] == prof.meta["start_ns"]]
    assert int(first.groupby("category", observed=True)["bytes"].last().sum()) == _baseline(prof)
    assert prof.peak("cpu").attrs["peak_bytes"] >= _baseline(prof)
    assert "reachable from no name" in str(prof) and "reachable from no name" in prof._repr_html_()
    # the dashboard draws it as it draws CUDA's: an `unknown` block and its timeline's band
    from jupyter_memprof._views.dashboard.select import shown

    seen = shown(prof, None, None)
    cols = seen.acols
    at = [i for i, r in enumerate(cols["reason"]) if r == UNREACHABLE_REASON]
    assert len(at) == 1 and cols["category"][at[0]] == "unknown"
    assert cols["size"][at[0]] == _unreachable(prof)
    assert "unknown" in seen.timelines[0].categories
    assert hooks[0]() == 1000


def test_a_class_attribute_of_a_deleted_module_is_reachable_by_no_name():
    before = _capture(_NOTHING)
    mod = types.ModuleType("scratch_cache")
    sys.modules["scratch_cache"] = mod
    exec("import torch\nclass Cache:\n    table = torch.ones(500)\n", mod.__dict__)
    cache = mod.Cache()  # the instance is named; the class's attribute is not reached
    del sys.modules["scratch_cache"], mod
    prof = _capture({"cache": cache})
    assert _unreachable(prof) - _unreachable(before) == 2000
    assert _baseline(prof) - _baseline(before) == 2000


def test_a_list_only_a_reference_cycle_holds_counts_until_the_collector_frees_it():
    before = _capture(_NOTHING)
    gc.disable()  # the cycle must wait for the collection inside the capture
    try:
        cycle: list = [torch.ones(250), torch.ones(2, 50)]  # 1000 + 400 bytes
        cycle.append(cycle)
        del cycle

        def body():
            torch.ones(3)
            gc.collect()  # frees the cycle now: the block of its bytes ends here
            torch.ones(4)

        prof = _capture(_NOTHING, body, collect=False)
    finally:
        gc.enable()
    assert _unreachable(prof) - _unreachable(before) == 1400
    rest = _rest(prof)
    ended = rest[rest["free_ns"].notna()]
    assert sorted(ended["size_bytes"].tolist()) == [400, 1000]
    assert (ended["category"] == "unknown").all()
    # ended when the collector freed them: between the two blocks the body made
    a = prof.allocations
    made = a[a["alloc_ns"].notna()].set_index("size_bytes")["alloc_ns"]
    assert (ended["free_ns"] > made[12]).all() and (ended["free_ns"] < made[16]).all()
    e = prof.events
    gone = e[(e["action"] == "destroy") & (e["alloc_id"].isin(ended["alloc_id"]))]
    assert sorted(gone["size_bytes"].tolist()) == [400, 1000]


def test_what_a_hidden_graph_saved_counts_and_nothing_named_counts_twice():
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 100)
    outs = [model(torch.randn(64, 256)).sum() for _ in range(2)]  # graphs held by names
    before = _capture({"model": model, "outs": outs})
    x, y = torch.randn(32, 256), torch.zeros(32, dtype=torch.long)
    # a loss (4 bytes) only a closure keeps: its graph saved x and y (Python tensors, not
    # named), and cross_entropy's log_softmax result and nll_loss's total weight (4 bytes),
    # made in C++ and never Python objects: found by walking the graph
    f = _closure_over(torch.nn.functional.cross_entropy(model(x), y))
    keep = [f]
    del x, y
    prof = _capture({"model": model, "outs": outs})
    log_softmax = 32 * 100 * 4
    hidden = 32 * 256 * 4 + 32 * 8 + log_softmax + 4 + 4
    assert _unreachable(prof) - _unreachable(before) == hidden
    assert _baseline(prof) - _baseline(before) == hidden
    # the named: parameters, the kept losses and what their graphs saved, each once
    start = prof.names[(prof.names["when"] == "start").to_numpy()]
    named = start.drop_duplicates(["device", "ptr"])
    assert _baseline(prof) == int(named["size_bytes"].sum()) + _unreachable(prof)
    held = start[(start["role"] == "held").to_numpy()]
    assert int(held.drop_duplicates("ptr")["size_bytes"].sum()) == 2 * 64 * 256 * 4
    assert keep[0]() > 0


class _MyTensor(torch.Tensor):
    pass


def test_the_survey_lists_each_unnamed_storage_once_with_its_bytes():
    t = torch.ones(300)
    views = [t[:10], t[100:], t.view(3, 100)]  # one storage
    key = ("cpu", t.untyped_storage().data_ptr())
    found = {(s.device, s.ptr): s.size for s in unnamed_storages(set()).storages}
    assert found[key] == 1200
    assert key not in {(s.device, s.ptr) for s in unnamed_storages({key}).storages}
    mine = [torch.ones(20).as_subclass(_MyTensor)]  # a user's tensor type is a tensor too
    found = {(s.device, s.ptr): s.size for s in unnamed_storages(set()).storages}
    assert found[("cpu", mine[0].untyped_storage().data_ptr())] == 80
    meta = torch.ones(300, device="meta")
    sparse = torch.ones(3).to_sparse()
    assert cpu_storage(meta) is None and cpu_storage(sparse) is None
    assert len(views) == 3


def test_the_block_is_kept_by_save_and_load(tmp_path):
    hooks = [_closure_over(torch.ones(700))]
    prof = _capture(_NOTHING)
    path = tmp_path / "p.memprof"
    prof.save(path)
    back = jupyter_memprof.load(path)
    assert back.meta["unreachable_bytes"] == prof.meta["unreachable_bytes"]
    assert _unreachable(back) >= 2800 and len(_rest(back)) == 1
    assert "reachable from no name" in str(back)
    assert len(hooks) == 1


def test_off_the_survey_adds_nothing(monkeypatch):
    from jupyter_memprof._producers import unnamed

    monkeypatch.setattr(unnamed, "ENABLED", False)
    hooks = [_closure_over(torch.ones(700))]
    prof = _capture(_NOTHING)
    assert _unreachable(prof) == 0 and _rest(prof).empty
    assert len(hooks) == 1
