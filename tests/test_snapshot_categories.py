"""Categories of snapshots made from real CPU training runs (tests/_snapshots.py), checked
against the truth read from the Python objects at each phase boundary."""

from __future__ import annotations

import pytest
import torch
from _snapshots import block, record, scores
from torch.profiler import record_function

import jupyter_memprof as jm


def _train(mark, steps: int = 3, set_to_none: bool = True):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for i in range(steps):
        with record_function(f"ProfilerStep#{i}"):
            x = torch.randn(64, 256)
            y = torch.randint(0, 10, (64,))
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out, y)
            mark(f"forward{i}", _truth(model, opt, x, y, out=out))
            loss.backward()
            mark(f"backward{i}", _truth(model, opt, x, y))
            opt.step()
            mark(f"step{i}", _truth(model, opt, x, y))
            opt.zero_grad(set_to_none=set_to_none)
    return model, opt


def _truth(model, opt, x, y, out=None) -> dict:
    truth = {p: "parameter" for p in model.parameters()}
    truth.update({p.grad: "gradient" for p in model.parameters() if p.grad is not None})
    for state in opt.state.values():
        truth.update({t: "optimizer_state" for t in state.values() if torch.is_tensor(t)})
    truth.update({x: "input", y: "input"})
    if out is not None:
        truth[out] = "activation"
    return truth


@pytest.fixture(scope="module")
def run():
    snap, marks = record(_train)
    return jm.load_snapshot(snap, label="mlp"), marks, snap


def test_categories_match_the_objects_at_every_phase_boundary(run):
    prof, marks, _ = run
    got = scores(prof, marks, default={f"forward{i}": "activation" for i in range(3)})
    assert min(got.values()) >= 0.95, got


def test_the_peak_is_exact_and_hardly_unknown(run):
    prof, _, snap = run
    # the peak replayed from the trace entries alone, each request rounded as CUDA's
    # allocator rounds it (these blocks come from no segment the record knows)
    live = best = 0
    for e in snap["device_traces"][0]:
        size = block(e["size"])
        live += size if e["action"] == "alloc" else 0
        live -= size if e["action"] == "free_completed" else 0
        best = max(best, live)
    peak = prof.peak()
    assert peak.attrs["peak_bytes"] == best
    unknown = peak.loc[peak["category"] == "unknown", "size_bytes"].sum()
    assert unknown <= 0.02 * best


def test_steps_come_from_the_annotations(run):
    prof, _, _ = run
    # the model's making before the first ProfilerStep is a step of its own
    assert prof.steps["step"].tolist() == [0, 1, 2, 3]
    assert set(prof.ops["name"]) >= {"ProfilerStep#0", "Optimizer.step#Adam.step"}


def test_parameters_gradients_and_state_by_their_reasons(run):
    prof, _, _ = run
    a = prof.allocations
    reasons = a.groupby("reason", observed=True)["category"].first().astype(str).to_dict()
    assert reasons["made in a module's __init__"] == "parameter"
    assert reasons["made in backward, kept past it"] == "gradient"
    assert reasons["made in optimizer.step(), kept past it"] == "optimizer_state"
    assert reasons["made in forward, freed in backward"] == "activation"
    # the first Linear's weight: 512 x 256 floats, made in __init__, alive to the end
    w = a[(a["size_bytes"] == 512 * 256 * 4) & a["free_ns"].isna()]
    assert "parameter" in set(w["category"].astype(str))


def test_a_wrapped_ring_buffer_counts_older_blocks(run):
    """The first 40% of the entries lost: the model's and optimizer's blocks from before
    come from the final segments, with their frames; frees of lost allocations are blocks
    older than the history; the live bytes at the end are the same."""
    _, _, snap = run
    n = len(snap["device_traces"][0])
    wrapped = dict(snap, device_traces=[snap["device_traces"][0][int(n * 0.4) :]])
    prof = jm.load_snapshot(wrapped)
    full = jm.load_snapshot(snap)
    older = prof.meta["snapshot_older_blocks"]
    assert older["alive"] > 0 and older["freed"] > 0
    alive_end = prof.allocations[prof.allocations["free_ns"].isna()]
    alive_full = full.allocations[full.allocations["free_ns"].isna()]
    assert alive_end["size_bytes"].sum() == alive_full["size_bytes"].sum()
    assert sorted(alive_end["category"].astype(str)) == sorted(alive_full["category"].astype(str))
    assert (prof.allocations["alloc_ns"].isna()).sum() == older["alive"] + older["freed"]


def _train_cnn(mark, steps: int = 3):
    """A CNN with BatchNorm (buffers), SGD with momentum, gradients zeroed in place, and
    batches from a DataLoader."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(16 * 16 * 16, 10),
    )  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.utils.data.TensorDataset(torch.randn(64, 3, 16, 16), torch.randint(0, 10, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    for i, (x, y) in zip(range(steps), loader):
        with record_function(f"ProfilerStep#{i}"):
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out, y)
            truth = _truth(model, opt, x, y, out=out)
            truth.update({b: "parameter" for b in model.buffers()})
            truth.update({t: "input" for t in data.tensors})  # the dataset: data too
            mark(f"forward{i}", truth)
            loss.backward()
            mark(f"backward{i}", {**truth, **_truth(model, opt, x, y)})
            opt.step()
            mark(f"step{i}", {**truth, **_truth(model, opt, x, y)})
            opt.zero_grad(set_to_none=False)
    return model, opt, data


def test_categories_of_a_cnn_with_buffers_momentum_and_a_data_loader():
    snap, marks = record(_train_cnn)
    prof = jm.load_snapshot(snap, label="cnn")
    got = scores(prof, marks, default={f"forward{i}": "activation" for i in range(3)})
    assert min(got.values()) >= 0.95, got
    reasons = set(prof.allocations["reason"].dropna())
    assert "made by data loading" in reasons
    peak = prof.peak()
    unknown = peak.loc[peak["category"] == "unknown", "size_bytes"].sum()
    assert unknown <= 0.02 * peak.attrs["peak_bytes"]


def _leaky(mark, steps: int = 4):
    """A loop that keeps every step's output (a list of forward results): it grows."""
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 1024)
    opt = torch.optim.Adam(model.parameters())
    kept = []
    for _ in range(steps):
        out = model(torch.randn(64, 256))
        out.sum().backward()
        opt.step()
        opt.zero_grad()
        kept.append(out.detach())
    return model, opt, kept


def test_steps_from_optimizer_frames_and_the_leak_they_show():
    snap, _ = record(_leaky)
    snap["external_annotations"] = []  # recorded without record_function marks
    prof = jm.load_snapshot(snap)
    steps = prof.ops[prof.ops["kind"] == "optimizer"]
    assert len(steps) == 4 and set(steps["name"]) == {"Optimizer.step#(from its frames)"}
    assert len(prof.steps) >= 4
    leaks = prof.leaks()
    assert not leaks.empty
    top = leaks.iloc[0]
    assert top["bytes_per_step"] == 64 * 1024 * 4
    assert str(top["category"]) == "activation"
    # the leaking function, from the recorded stacks (a snapshot has no op for it; frames
    # made from a CPU run name the function's first line, as torch's Python tracer does)
    line = _leaky.__code__.co_firstlineno
    assert top["callsite"].endswith(f"test_snapshot_categories.py:{line} in _leaky")
    block = int(top["alloc_ids"][0])
    assert prof.allocations.loc[block, "callsite"] == top["callsite"]
    made = prof.lineage(block).query("relation == 'allocated'")
    assert made["callsite"].tolist() == [top["callsite"]]


def _frameless_backward(snap: dict) -> dict:
    """The snapshot as a GPU records it: the autograd engine's device threads record no
    Python frames, so only the first entry of each backward (``_make_grads`` on the main
    thread) keeps its stack."""
    trace, out, inside = snap["device_traces"][0], [], False
    for e in trace:
        backward = any(f["name"] == "_engine_run_backward" for f in e["frames"])
        out.append(dict(e, frames=[]) if backward and inside else e)
        inside = backward
    return dict(snap, device_traces=[out])


def test_backward_without_frames_is_read_from_the_time_order(run):
    _, marks, snap = run
    prof = jm.load_snapshot(_frameless_backward(snap))
    got = scores(prof, marks, default={f"forward{i}": "activation" for i in range(3)})
    assert min(got.values()) >= 0.95, got
    reasons = set(prof.allocations["reason"].dropna())
    assert "made in backward, kept past it (no frames: by time)" in reasons
    peak = prof.peak()
    unknown = peak.loc[peak["category"] == "unknown", "size_bytes"].sum()
    assert unknown <= 0.02 * peak.attrs["peak_bytes"]
