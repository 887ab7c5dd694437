"""Estimate mode: fake runs of real programs against real captures of the same step."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from _lineage_page import decode_lineage
from torch import nn

import jupyter_memprof
from jupyter_memprof import EstimateError, estimate
from jupyter_memprof._producers.fake.recorder import CUDNN_HINT, cuda_rounded


def classification_step(model, opt, x, y):
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def _mlp(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    return model, opt, x, y


def _snapshot(model, opt):
    return (
        {k: v.detach().clone() for k, v in model.state_dict().items()},
        {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()},
        {
            i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
            for i, s in enumerate(opt.state.values())
        },
    )


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, z) for x, z in zip(a, b))
    if torch.is_tensor(a):
        return torch.is_tensor(b) and torch.equal(a, b)
    return a == b


@pytest.fixture(scope="module")
def warm_mlp():
    model, opt, x, y = _mlp()
    classification_step(model, opt, x, y)
    return model, opt, x, y


@pytest.fixture(scope="module")
def mlp_estimate(warm_mlp):
    model, opt, x, y = warm_mlp
    return estimate(classification_step, model, opt, x, y)


@pytest.fixture(scope="module")
def mlp_real(warm_mlp):
    model, opt, x, y = warm_mlp
    state = _snapshot(model, opt)
    gc.collect()
    with jupyter_memprof.profile(namespace={"model": model, "opt": opt, "x": x, "y": y}) as prof:
        classification_step(model, opt, x, y)
    # put the step back so that other tests see the warmed-up state they expect
    model.load_state_dict(state[0])
    return prof


def _bytes_by_role(prof, role: str) -> int:
    n = prof.names
    rows = n[(n["role"] == role) & (n["when"] == "end")]
    return int(rows["size_bytes"].sum())


def test_mlp_adam_exact_state_bytes(mlp_estimate, warm_mlp):
    model = warm_mlp[0]
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    prof = mlp_estimate
    assert prof.meta["estimate"] is True
    assert _bytes_by_role(prof, "parameter") == params
    assert _bytes_by_role(prof, "gradient") == params
    # exp_avg + exp_avg_sq per parameter, plus one float32 step counter per parameter
    steps = 4 * len(list(model.parameters()))
    assert _bytes_by_role(prof, "optimizer_state") == 2 * params + steps
    by = prof.peak_by("category")
    assert by["parameter"] == params
    assert by["optimizer_state"] == 2 * params + steps


def test_mlp_adam_peak_matches_real_capture(mlp_estimate, mlp_real):
    est, real = mlp_estimate.peak().attrs["peak_bytes"], mlp_real.peak().attrs["peak_bytes"]
    assert abs(est - real) / real < 0.02, (est, real)
    e, r = mlp_estimate.peak_by("category"), mlp_real.peak_by("category")
    for cat in ("parameter", "optimizer_state", "gradient"):
        assert e[cat] == r[cat], cat


def test_estimate_is_a_profile_with_the_usual_tables(mlp_estimate):
    prof = mlp_estimate
    assert set(prof.tables) == set(jupyter_memprof.Profile.empty().tables)
    ops = prof.ops
    assert {"module", "op", "backward", "optimizer"} <= set(ops["kind"].astype(str))
    assert {"forward", "backward", "optimizer"} <= set(ops["phase"].astype(str))
    # forward -> backward links, e.g. addmm -> AddmmBackward0
    flows = prof.flows.merge(ops[["op_id", "name"]], left_on="backward_op_id", right_on="op_id")
    assert flows["name"].astype(str).str.contains("AddmmBackward0").any()
    # the clock counts positions in the run: monotonic, starting near 0
    assert prof.events["time_ns"].is_monotonic_increasing
    assert prof.meta["clock"] == "op sequence"
    assert "test_estimate.py" in str(ops["callsite"].dropna().iloc[0])
    # lineage of the largest activation works like on a real capture
    acts = prof.allocations[prof.allocations["category"] == "activation"]
    story = prof.lineage(int(acts.sort_values("size_bytes").iloc[-1]["alloc_id"]))
    assert {"allocated", "freed"} <= set(story["relation"].astype(str))


def test_real_objects_are_untouched():
    model, opt, x, y = _mlp(1)
    classification_step(model, opt, x, y)
    before = _snapshot(model, opt)
    x_before = x.clone()
    estimate(classification_step, model, opt, x, y, device="cuda:0")
    after = _snapshot(model, opt)
    assert _same(before, after)
    assert torch.equal(x, x_before)
    assert all(type(p) is nn.Parameter for p in model.parameters())
    assert opt.state[next(model.parameters())]["step"].item() == 1.0


# -- CUDA on a machine without it ----------------------------------------------------------
def test_cuda_estimate_without_cuda_rounds_to_512(warm_mlp):
    model, opt, x, y = warm_mlp
    prof = estimate(classification_step, model, opt, x, y, device="cuda:0")
    assert prof.meta["device"] == "cuda:0"
    assert prof.meta["simulated_cuda"] is (not torch.cuda.is_available())
    a = prof.allocations
    on_cuda = a["device"].astype(str) == "cuda:0"
    assert (a.loc[on_cuda, "size_bytes"] % 512 == 0).all()
    params = sum(cuda_rounded(p.numel() * p.element_size()) for p in model.parameters())
    assert _bytes_by_role(prof, "parameter") == params
    assert _bytes_by_role(prof, "gradient") == params
    # float32 step counters stay on the CPU, 4 bytes each, as torch keeps them for
    # parameters on CUDA (on a GPU, foreach Adam adds CPU scalars of its own)
    n = len(list(model.parameters()))
    cpu = a[~on_cuda]
    steps = cpu[cpu["category"].astype(str) == "optimizer_state"]
    assert set(cpu["device"].astype(str)) == {"cpu"} and list(steps["size_bytes"]) == [4] * n
    if prof.meta["simulated_cuda"]:
        assert len(cpu) == n
    assert _bytes_by_role(prof, "optimizer_state") == 2 * params + 4 * n
    assert prof.peak().attrs["device"] == "cuda:0"
    assert "estimate" in repr(prof)


def test_one_block_size_rule_for_both_producers():
    """CUDA's caching allocator holds multiples of 512 bytes (what torch.cuda.memory_allocated
    counts, measured on an H100); the CPU holds what was asked; nothing for 0 bytes."""
    from jupyter_memprof._devices import block_bytes

    assert [block_bytes("cuda:0", n) for n in (0, 1, 40, 512, 513, 2048)] == [
        0,
        512,
        512,
        512,
        1024,
        2048,
    ]
    assert [block_bytes("cpu", n) for n in (0, 1, 40, 513)] == [0, 1, 40, 513]
    assert cuda_rounded(40) == 512


def test_cuda_factories_and_moves_inside_the_step():
    def step(n):
        w = torch.randn(n, n, device="cuda", requires_grad=True)
        x = torch.ones(8, n).cuda()
        y = x.to("cuda:0") @ w
        y.sum().backward()
        return w.grad

    prof = estimate(step, 64, device="cuda")
    a = prof.allocations
    assert set(a["device"].astype(str)) == {"cuda:0"}
    # w (16 KiB), w.grad (16 KiB) and the 8x64 activations (2 KiB) were all seen
    assert (a["size_bytes"] == 64 * 64 * 4).sum() >= 2


# -- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"device": "tpu"}, "unknown device 'tpu'"),
        ({"device": "mps"}, "not supported"),
        ({"device": 3}, "device must be a string"),
        ({"limit": "lots"}, "limit: not a size in bytes"),
        ({"limit": 0}, "more than 0 bytes"),
        # before: read as 1 byte
        ({"limit": 1.5}, r"^limit: not a whole number of bytes: 1\.5$"),
        ({"limit": "1.5"}, r"^limit: not a whole number of bytes: '1\.5'$"),
    ],
)
def test_bad_device_or_limit_fails_before_running(kwargs, message):
    ran = []
    with pytest.raises(EstimateError, match=message):
        estimate(lambda: ran.append(1), **kwargs)
    assert ran == []


def test_data_dependent_ops_name_the_op_and_the_line(warm_mlp):
    model = warm_mlp[0]

    def uses_item(model, x):
        loss = model(x).sum()
        if loss.item() > 0:  # the line the error names
            loss.backward()

    def uses_nonzero(x):
        return x.nonzero()

    x = torch.randn(4, 256)
    with pytest.raises(EstimateError) as err:
        estimate(uses_item, model, x)
    text = str(err.value)
    assert "aten::_local_scalar_dense" in text and "in uses_item" in text
    assert "\n" not in text
    with pytest.raises(EstimateError, match=r"aten::nonzero .* in uses_nonzero"):
        estimate(uses_nonzero, x)
    assert model[0].weight.grad is not None  # untouched: still the warm-up gradient


def test_numpy_in_an_estimate_is_one_line_naming_the_line():
    """Before: RuntimeError ".numpy() is not supported for tensor subclasses"."""
    import numpy as np

    def step(x):
        y = x * 2
        return y.numpy().sum()

    def step_array(x):
        return np.asarray(x * 2)

    with pytest.raises(EstimateError) as err:
        estimate(step, torch.ones(3))
    line = step.__code__.co_firstlineno + 2
    assert str(err.value) == (
        f"Tensor.numpy() needs tensor values, which a fake run does not have at "
        f"test_estimate.py:{line} in step: estimate code that does not read values "
        "(`.item()`, `.numpy()`, `nonzero`, `if tensor:`, boolean masks)"
    )
    with pytest.raises(EstimateError, match=r"^numpy's array\(\) needs tensor values"):
        estimate(step_array, torch.ones(3))


def test_a_real_tensor_the_step_reads_is_named():
    w = torch.randn(4, 4)

    def step(x):
        return x @ w  # `w` was not passed to estimate()

    with pytest.raises(EstimateError, match=r"aten::mm got a real tensor \(shape \[4, 4\]\)"):
        estimate(step, torch.randn(2, 4))


# -- limit, summary and views ----------------------------------------------------------------
@pytest.fixture(scope="module")
def oom_estimate():
    model, opt, x, y = _mlp(2)  # a fresh Adam: its state is created inside the step
    return estimate(classification_step, model, opt, x, y, device="cuda:0", limit="8MiB", context=0)


def test_limit_names_where_the_step_runs_out_of_memory(oom_estimate):
    """On a GPU what runs out is the caching allocator's segments: this step's tensors
    peak at 7.7 MiB, under the 8 MiB limit, but its segments need 10 MiB: the allocator's
    cache pushes it over, in the optimizer; expandable segments would fit it in 8 MiB."""
    prof = oom_estimate
    oom = prof.meta["oom"]
    assert oom["device"] == "cuda:0" and oom["limit"] == 8 * 2**20
    assert prof.peak("cuda:0").attrs["peak_bytes"] <= oom["limit"]
    assert prof.meta["reserved_peak_bytes"] == {"cuda:0": 10 * 2**20}
    assert oom["bytes"] == 10 * 2**20 > oom["limit"] and oom["cause"] == "cache"
    assert oom["tensors_bytes"] <= oom["limit"] and oom["context_bytes"] == 0
    assert oom["bytes"] == oom["tensors_bytes"] + oom["cache_bytes"] + oom["context_bytes"]
    assert oom["expandable_segments"] == {"fits": True, "reserved_peak_bytes": 8 * 2**20}
    assert oom["phase"] == "optimizer" and oom["op_name"].startswith("aten::")
    assert "in classification_step" in oom["callsite"]
    assert sum(oom["live_by_category"].values()) <= oom["tensors_bytes"]
    lines = repr(prof).splitlines()
    # never "estimate estimate of"; the label names the inputs, and nothing "ran"
    assert lines[0] == "memory estimate of classification_step(Sequential, Adam, 64x256, 64)"
    assert any("estimated in " in line for line in lines) and "ran " not in repr(prof)
    assert lines[1].startswith("  OUT OF MEMORY: cuda:0 would need 10.0 MiB (tensors ")
    assert "during optimizer; pushed over by the allocator's cache (fragmentation)" in lines[1]
    assert "with expandable_segments:True it would fit (reserved peak 8.0 MiB)" in lines[1]
    reserved = "  reserved peak 10.0 MiB on cuda:0 (caching allocator, modelled); fragmentation"
    assert any(line.startswith(reserved) for line in lines)
    assert "computed on the CPU path" in lines[-1] or torch.cuda.is_available()
    html = prof._repr_html_()
    assert "memprof-summary-oom" in html and "memory estimate" in html
    assert "memprof-summary-reserved" in html


def test_the_limit_counts_the_cuda_context_and_the_allocator_setting(warm_mlp):
    """The default CUDA context (751 MiB, measured on an H100) counts against the limit; the
    allocator= setting changes the segments: with expandable segments the same step fits in
    8 MiB."""
    from jupyter_memprof._analysis.limit import CUDA_CONTEXT_BYTES

    prof = estimate(classification_step, *warm_mlp, device="cuda:0", limit="700MiB")
    oom = prof.meta["oom"]
    assert oom["cause"] == "context" and oom["context_bytes"] == CUDA_CONTEXT_BYTES
    fits = estimate(classification_step, *warm_mlp, device="cuda:0", limit="760MiB")
    assert fits.meta["oom"] is None
    grown = estimate(
        classification_step,
        *_mlp(2),  # as oom_estimate's step, which needs 10 MiB of default segments
        device="cuda:0",
        limit="8MiB",
        context="0B",
        allocator="expandable_segments:True",
    )
    assert grown.meta["oom"] is None and grown.meta["allocator"] == "expandable_segments:True"
    assert grown.meta["reserved_peak_bytes"] == {"cuda:0": 8 * 2**20}
    assert set(grown.segments["size_bytes"]) == {2 * 2**20}  # small-pool pages only


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"allocator": "expandable_segments:maybe"}, "expandable_segments takes True or False"),
        ({"allocator": 3}, "allocator setting must be text"),
        ({"context": "lots"}, "context: not a size in bytes"),
    ],
)
def test_bad_allocator_or_context_fails_before_running(kwargs, message):
    ran = []
    with pytest.raises(EstimateError, match=message) as err:
        estimate(lambda: ran.append(1), device="cuda:0", **kwargs)
    assert "\n" not in str(err.value) and not ran


def test_a_step_that_fits_says_so(warm_mlp):
    prof = estimate(classification_step, *warm_mlp, limit=10**9)
    assert prof.meta["oom"] is None
    line = repr(prof).splitlines()[1]
    assert line.startswith("  fits in the limit of 953.7 MiB on cpu: needs ")
    assert line.endswith(" MiB") and "headroom" in line


def test_dashboard_marks_the_limit_and_the_oom_moment(oom_estimate):
    from bokeh.models import Axis, Span

    from jupyter_memprof._views.dashboard.page import build

    layout = build(oom_estimate).layout
    limit = list(layout.select({"name": "memprof-limit-cuda:0", "type": Span}))
    oom = list(layout.select({"name": "memprof-oom-cuda:0", "type": Span}))
    assert limit[0].location == 8 * 2**20 and limit[0].dimension == "width"
    # the OOM line sits at the crossing's position on the fake clock (1 "ms" per record)
    assert oom[0].location == oom_estimate.meta["oom"]["time_ns"] / 1e6
    labels = {a.axis_label for a in layout.select({"type": Axis})}
    assert "position in the run (op sequence): an estimate" in labels


def test_tiny_devices_are_folded_into_the_title_not_charted(warm_mlp):
    from bokeh.models import Div, Span

    from jupyter_memprof._units import format_bytes
    from jupyter_memprof._views.dashboard.page import build

    prof = estimate(classification_step, *warm_mlp, device="cuda:0", limit="4MiB")
    # Adam's step counters stay on the CPU (as torch keeps them): a few bytes next to cuda:0
    cpu = prof.peak("cpu").attrs["peak_bytes"]
    assert prof.devices == ["cpu", "cuda:0"] and 0 < cpu < 1024
    layout = build(prof).layout
    names = {m.name for m in layout.references() if m.name}
    assert "memprof-timeline-cuda:0" in names and "memprof-timeline-cpu" not in names
    # no limit line on a chart of another device
    spans = {s.name for s in layout.select({"type": Span}) if s.name}
    assert "memprof-limit-cpu" not in spans and "memprof-limit-cuda:0" in spans
    texts = " ".join(d.text for d in layout.select({"type": Div}))
    assert f"too small to chart: cpu (peak {format_bytes(cpu)})" in texts


def test_save_and_load_keep_the_estimate(oom_estimate, tmp_path):
    loaded = jupyter_memprof.load(oom_estimate.save(tmp_path / "est.memprof"))
    assert loaded.meta["estimate"] is True
    assert loaded.meta["oom"] == oom_estimate.meta["oom"]
    assert loaded.peak().attrs["peak_bytes"] == oom_estimate.peak().attrs["peak_bytes"]


@pytest.mark.browser
def test_estimate_dashboard_renders_and_says_estimate(oom_estimate, tmp_path):
    from _browser import chromium_page
    from test_dashboard_browser import DEEP_TEXT

    path = oom_estimate.to_html(tmp_path / "estimate.html")
    with chromium_page(viewport=(1400, 1800)) as page:
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"file://{path}")
        page.wait_for_function(
            "window.memprofReady !== undefined || window.memprofError !== undefined",
            timeout=30_000,
        )
        assert page.evaluate("window.memprofError") is None
        head = page.locator(".memprof-summary").first.evaluate(DEEP_TEXT)
        assert "memory estimate" in head and "OUT OF MEMORY" in head
        labels = page.evaluate(
            """() => { const out = [];
                 for (const m of Bokeh.documents[0].all_models) if (m.type === "Label") out.push(m.text);
                 return out; }"""
        )
        assert "limit 8.0 MiB" in labels
        assert any(t.startswith("out of memory at #") for t in labels), labels
        assert page.locator(".memprof-timeline canvas").count() >= 1
        assert errors == []


# -- %%memprofile --estimate -----------------------------------------------------------------


def _fake_in(ns: dict) -> list[str]:
    from torch._subclasses.fake_tensor import FakeTensor

    from jupyter_memprof._producers.fake.copy import walk_values

    out = []
    for k, v in ns.items():
        for x in (v, *walk_values(v)):
            if isinstance(x, FakeTensor) or (
                isinstance(x, nn.Module) and any(isinstance(p, FakeTensor) for p in x.parameters())
            ):
                out.append(k)
    return out


def test_magic_estimate_binds_fakes_and_restores_the_namespace(shell, run):
    model, opt, x, y = _mlp(3)
    classification_step(model, opt, x, y)
    ns = shell.user_ns
    ns.update(est_model=model, est_opt=opt, est_x=x, est_y=y, est_kept="real", est_n=1)
    ns["est_step"] = None
    run(
        "def est_step():\n"
        "    est_opt.zero_grad()\n"
        "    F.cross_entropy(est_model(est_x), est_y).backward()\n"
        "    est_opt.step()\n"
    )
    before = _snapshot(model, opt)
    result, out = run(
        "%%memprofile --estimate --device cuda:0 --limit 24GiB --allocator "
        "expandable_segments:True --context 600MiB --gpu A100 -o est_prof --no-display\n"
        "est_step()\n"
        "est_new = est_model(est_x)\n"
        "est_n = 2\n"
        "est_kept = est_x\n"
    )
    assert result.error_in_exec is None, out
    prof = ns["est_prof"]
    assert prof.meta["estimate"] is True and prof.meta["device"] == "cuda:0"
    assert prof.meta["oom"] is None and prof.meta["limit"] == 24 * 2**30
    assert prof.meta["allocator"] == "expandable_segments:True"
    assert prof.meta["gpu"] == "A100 (sm80)"
    assert prof.label.endswith("(estimate)")
    # the notebook function saw the fakes too: the step's gradients are named
    names = set(prof.names["name"].dropna())
    assert "est_model.0.weight.grad" in names or "0.weight.grad" in names, names
    # every name is bound as before the cell; nothing fake is left; nothing real changed
    assert "est_new" not in ns
    assert ns["est_n"] == 1 and ns["est_kept"] == "real" and ns["est_model"] is model
    assert _fake_in(ns) == []
    assert _same(before, _snapshot(model, opt))


def test_magic_estimate_bad_input_is_one_line(shell, run):
    ns = shell.user_ns
    ns["est_t"] = torch.randn(4, 4)
    for cell, message in [
        ("%%memprofile --estimate --device tpu\nest_bad = 1", "unknown device 'tpu'"),
        ("%%memprofile --estimate --limit lots\nest_bad = 1", "limit: not a size in bytes"),
        ("%%memprofile --limit 1GiB\nest_bad = 1", "--limit needs --estimate"),
        ("%%memprofile --context 1GiB\nest_bad = 1", "--context needs --estimate"),
        (
            "%%memprofile --estimate --allocator max_split_size_mb:1\nest_bad = 1",
            "max_split_size_mb must be at least 20 (MB), not 1",
        ),
        ("%%memprofile --allocator foo:1\nest_bad = 1", "UsageError: allocator setting 'foo:1'"),
        ("%%memprofile --estimate --context lots\nest_bad = 1", "context: not a size in bytes"),
        ("%%memprofile --estimate --gpu Z80\nest_bad = 1", "unknown gpu 'Z80'"),
        ("%%memprofile --gpu A100\nest_bad = 1", "--gpu needs --estimate"),
        (
            "%%memprofile --estimate --device cpu,cuda\nest_bad = 1",
            "--estimate takes one --device",
        ),
        (
            "%%memprofile --estimate --no-display\nest_bad = est_t.nonzero()",
            "aten::nonzero on [4, 4] needs tensor values",
        ),
    ]:
        result, out = run(cell)
        lines = out.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("UsageError: "), out
        assert message in lines[0], out
        assert "est_bad" not in ns
    assert "In[" in lines[0]  # the data-dependent op names the cell's line
    assert _fake_in(ns) == []


# -- the programs estimate mode must handle, each against a real capture ---------------------
class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(1000, 64)
        self.out = nn.Linear(64, 1000, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, t):
        return self.out(self.emb(t))


class _Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(128, 128), nn.ReLU()) for _ in range(4))
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        for b in self.blocks:
            x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False)
        return self.head(x)


class _Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(128, 256), nn.Linear(256, 10)

    def forward(self, x):
        return self.b(_Square.apply(self.a(x)))


def _small(frozen: bool = False):
    m = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
    if frozen:
        m[0].requires_grad_(False)
    return m


def _accumulate_and_clip(m, o, x, y):
    o.zero_grad(set_to_none=False)
    for xb, yb in zip(x.chunk(2), y.chunk(2)):
        F.cross_entropy(m(xb), yb).backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    o.step()


def _autocast(m, o, x, y):
    o.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(m(x), y)
    loss.backward()
    o.step()


def _lm(m, o, t):
    o.zero_grad()
    F.cross_entropy(m(t).flatten(0, 1), t.flatten()).backward()
    o.step()


def _build_copy_and_step(x):
    """nn.TransformerEncoder deep-copies its layer; an EMA copy deep-copies the model."""
    import copy

    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 2)
    ema = copy.deepcopy(enc)
    opt = torch.optim.AdamW(enc.parameters())
    enc(x).sum().backward()
    opt.step()
    with torch.no_grad():
        for pe, p in zip(ema.parameters(), enc.parameters()):
            pe.mul_(0.9).add_(p, alpha=0.1)


def _case(name):
    torch.manual_seed(0)
    x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
    if name == "frozen":
        m = _small(frozen=True)
        o = torch.optim.Adam([p for p in m.parameters() if p.requires_grad])
        return classification_step, (m, o, x, y)
    if name == "tied":
        m = _Tied()
        return _lm, (m, torch.optim.AdamW(m.parameters()), torch.randint(0, 1000, (8, 16)))
    if name == "checkpointing":
        m = _Checkpointed()
        o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        return classification_step, (m, o, torch.randn(64, 128), y.repeat(2))
    if name == "custom_function":
        m = _Custom()
        return classification_step, (m, torch.optim.Adam(m.parameters()), x, y)
    if name == "accumulation_and_clipping":
        m = _small()
        return _accumulate_and_clip, (m, torch.optim.Adam(m.parameters()), x, y)
    if name == "autocast":
        m = _small()
        return _autocast, (m, torch.optim.Adam(m.parameters()), x, y)
    if name == "deepcopy":
        return _build_copy_and_step, (torch.randn(4, 16, 64),)
    raise KeyError(name)


@pytest.mark.parametrize(
    "name",
    [
        "frozen",
        "tied",
        "checkpointing",
        "custom_function",
        "accumulation_and_clipping",
        "autocast",
        "deepcopy",
    ],
)
def test_estimate_matches_the_real_step(name):
    fn, args = _case(name)
    fn(*args)  # warm up: optimizer state and gradients exist
    models = [a for a in args if isinstance(a, nn.Module)]
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in models]
    est = estimate(fn, *args)
    assert all(_same(b, {k: v for k, v in m.state_dict().items()}) for b, m in zip(before, models))
    gc.collect()
    with jupyter_memprof.profile(namespace={"args": list(args)}) as real:
        fn(*args)
    pe, pr = est.peak().attrs["peak_bytes"], real.peak().attrs["peak_bytes"]
    assert abs(pe - pr) / pr < 0.02, (pe, pr)
    if models:  # parameters, gradients and optimizer state: exact
        names = est.names
        for role in ("parameter", "gradient", "optimizer_state"):
            e = names[(names["role"] == role) & (names["when"] == "end")]["size_bytes"].sum()
            r = real.names[(real.names["role"] == role) & (real.names["when"] == "end")]
            assert e == r["size_bytes"].sum(), role


def test_containers_and_kwargs_are_copied_and_user_errors_propagate():
    from torch._subclasses.fake_tensor import FakeTensor

    seen = {}

    def step(batch, *, cfg):
        seen["types"] = (type(batch["x"]), type(batch["pair"][1]), type(cfg[0]))
        return batch["x"].sum() + batch["pair"][1].sum() + cfg[0].sum()

    batch = {"x": torch.ones(16, 16), "pair": (1, torch.ones(8))}
    prof = estimate(step, batch, cfg=[torch.ones(4)])
    assert seen["types"] == (FakeTensor, FakeTensor, FakeTensor)
    assert type(batch["x"]) is torch.Tensor and batch["x"].sum().item() == 256
    pre = prof.allocations[prof.allocations["alloc_ns"].isna()]
    assert sorted(pre["size_bytes"]) == [16, 32, 1024]  # the three tensors passed in

    def broken(x):
        raise KeyError("user bug")

    with pytest.raises(KeyError, match="user bug"):
        estimate(broken, torch.ones(2))
    # nothing of the fake run is left active
    t = torch.ones(2) * 2
    assert type(t) is torch.Tensor and t.sum().item() == 4.0


# -- an estimate's clock counts records: positions, never milliseconds -------------------------
_TIME_UNIT = __import__("re").compile(r"\d\s*(ms|µs|s)\b")


def test_an_estimates_dashboard_and_lineage_show_positions_not_ms(mlp_estimate, mlp_real):
    from bokeh.models import CustomJS

    from jupyter_memprof._views.dashboard.page import build
    from jupyter_memprof._views.text import lineage_text

    def texts(prof, built):
        o, a = built.ops.data, built.allocs.data
        out = {"start": list(o["start_txt"]), "dur": list(o["dur_txt"])}
        out["lifetime"] = [t for t, s in zip(a["lifetime"], a["summary"]) if not s]
        lin = []
        for s, e in zip(a["lin0"], a["lin1"]):
            if e > s:
                lin += decode_lineage(
                    built.lineage_all.data,
                    built.lineage_pool,
                    int(s),
                    int(e),
                    records=bool(prof.meta.get("estimate")),
                )["t_txt"]
        out["lineage"] = lin
        biggest = int(prof.allocations.nlargest(1, "size_bytes")["alloc_id"].iloc[0])
        out["text"] = lineage_text(
            prof.tables, biggest, prof.start_ns, records=bool(prof.meta.get("estimate"))
        ).splitlines()[1:]
        return out

    est = texts(mlp_estimate, build(mlp_estimate))
    for what, values in est.items():
        assert values, what
        assert not [v for v in values if _TIME_UNIT.search(v)], (what, values[:5])
    assert all(v.startswith("record #") for v in est["start"])
    assert all(v.endswith(("record", "records")) for v in est["dur"])
    assert all(v.startswith("record #") or v == "before capture" for v in est["lineage"])
    assert any("records" in v for v in est["lifetime"])
    assert all("record #" in line or "before capture" in line for line in est["text"])
    # a real capture keeps its milliseconds
    real = texts(mlp_real, build(mlp_real))
    assert all(_TIME_UNIT.search(v) for v in real["start"] + real["dur"])
    assert all(" ms " in line or "before capture" in line for line in real["text"])
    # the time filter's text is told which clock it shows (range_selected.js)
    for prof, want in ((mlp_estimate, True), (mlp_real, False)):
        cbs = [
            m
            for m in build(prof).layout.references()
            if isinstance(m, CustomJS) and "Time filter" in m.code
        ]
        assert [m.args["estimate"] for m in cbs] == [want]


@pytest.mark.skipif(__import__("shutil").which("node") is None, reason="node is not installed")
def test_the_time_filter_of_an_estimate_says_records_not_ms():
    import json
    import subprocess

    from jupyter_memprof._views.dashboard import js as dashboard_js

    body = dashboard_js.range_selected()
    out = {}
    for estimate_ in (True, False):
        script = (
            "const allocs = {data: {x0: [0, 5], x1: [3, 9], summary: [0, 0]}};\n"
            "const ops = {data: {left: [0, 4], right: [2, 8]}};\n"
            "const alloc_filter = {}, op_filter = {}, filter_info = {};\n"
            "const cb_obj = {geometry: {type: 'rect', x0: 2.4, x1: 6.6}};\n"
            f"const estimate = {json.dumps(estimate_)};\n"
            f"(function () {{\n{body}\n}})();\n"
            "console.log(filter_info.text);\n"
        )
        done = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        out[estimate_] = done.stdout
    assert "records #2 &ndash; #7 of the run" in out[True] and " ms" not in out[True]
    assert "2.400 &ndash; 6.600 ms" in out[False]


# -- size rules: memory oneDNN's LSTM kernels allocate that a fake run cannot see ---------------
class _LSTMTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(32, 96, 2, batch_first=True)
        self.head = nn.Linear(96, 5)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


def _lstm_step(m, o, x, y):
    o.zero_grad()
    F.cross_entropy(m(x).flatten(0, 1), y).backward()
    o.step()


@pytest.fixture(scope="module")
def lstm_pair():
    torch.manual_seed(0)
    m = _LSTMTagger()
    o = torch.optim.Adam(m.parameters(), lr=1e-3)
    x, y = torch.randn(6, 24, 32), torch.randint(0, 5, (6 * 24,))
    _lstm_step(m, o, x, y)
    est = estimate(_lstm_step, m, o, x, y)
    gc.collect()
    with jupyter_memprof.profile(namespace={"m": m, "o": o, "x": x, "y": y}) as real:
        _lstm_step(m, o, x, y)
    return m, o, x, y, est, real


def test_lstm_estimate_matches_the_real_peak_with_size_rules(lstm_pair):
    m, o, x, y, est, real = lstm_pair
    pe, pr = est.peak().attrs["peak_bytes"], real.peak().attrs["peak_bytes"]
    # measured: +1.76% (the rules' blocks are exact; an activation lives longer in the
    # estimate at its peak); the bench's larger LSTM: +0.04%
    assert 0 <= (pe - pr) / pr < 0.02, (pe, pr)
    for role in ("parameter", "gradient", "optimizer_state"):
        assert _bytes_by_role(est, role) == _bytes_by_role(real, role), role
    # the workspace each layer's forward hands to its backward: saved, freed by the backward
    ops = est.ops.set_index("op_id")["name"]
    a = est.allocations
    fwd = a[a["alloc_op_id"].map(ops) == "aten::mkldnn_rnn_layer"]
    assert (fwd["category"] == "activation").any()
    held = fwd[fwd["free_op_id"].map(ops).str.contains("MkldnnRnnLayerBackward0", na=False)]
    assert held["size_bytes"].max() > 100_000
    # kernel temporaries: allocated and freed by the op itself
    inside = a[
        (a["alloc_op_id"] == a["free_op_id"])
        & a["alloc_op_id"].map(ops).str.startswith("aten::mkldnn_rnn_layer")
    ]
    assert len(inside) == 2 * 4 + 2 * 4  # 4 per call (ld(96) == 96: no backward reorders)
    assert set(inside["category"]) == {"temporary"}


def test_lstm_without_size_rules_misses_most_of_the_peak(lstm_pair):
    from jupyter_memprof._producers.fake import sizes

    m, o, x, y, _, real = lstm_pair
    sizes.SIZE_RULES = False
    try:
        before = estimate(_lstm_step, m, o, x, y).peak().attrs["peak_bytes"]
    finally:
        sizes.SIZE_RULES = True
    assert before < 0.6 * real.peak().attrs["peak_bytes"]


def test_lstm_size_rules_fit_the_real_kernel_sizes():
    """The rules' byte counts against a real capture of one layer, at shapes where oneDNN pads
    leading dimensions (H 100, C 300 > H, batch first, bidirectional)."""
    from jupyter_memprof._producers.cpu_kernels import CPU_SIZE_RULES

    fwd_rule = CPU_SIZE_RULES[torch.ops.aten.mkldnn_rnn_layer.default]
    bwd_rule = CPU_SIZE_RULES[torch.ops.aten.mkldnn_rnn_layer_backward.default]
    lstm = nn.LSTM(300, 100, 1, batch_first=True, bidirectional=True)
    x = torch.randn(5, 9, 300)
    with jupyter_memprof.profile() as real:
        lstm(x)[0].sum().backward()
    ops = real.ops.set_index("op_id")
    a = real.allocations
    for name, rule in (
        ("aten::mkldnn_rnn_layer", fwd_rule),
        ("aten::mkldnn_rnn_layer_backward", bwd_rule),
    ):
        calls = ops.index[ops["name"] == name]
        assert len(calls) == 2
        for op in calls:
            args = {
                "input": torch.empty(5, 9, 300),
                "mode": 2,
                "train": True,
                "batch_first": True,
                "hidden_size": 100,
            }
            outs, temps = rule(args)
            kids = set(ops.index[ops["parent_id"] == op])
            direct = sorted(int(s) for s in a[a["alloc_op_id"] == op]["size_bytes"])
            # the summed bias: an aten::add inside the forward, direct in the backward
            bias = [4 * 100 * 4] if outs else []
            assert sorted(temps) == sorted([*direct, *bias])
            if outs:  # the workspace: an aten::empty inside the forward
                sizes = set(int(s) for s in a[a["alloc_op_id"].isin(kids)]["size_bytes"])
                assert outs[3] in sizes


def test_custom_op_without_a_fake_kernel_is_one_line():
    lib = torch.library.Library("memprof_test", "DEF")
    lib.define("opaque(Tensor x) -> Tensor")
    lib.impl("opaque", lambda x: x * 2, "CPU")
    model, opt, x, y = _mlp(5)
    classification_step(model, opt, x, y)
    before = _snapshot(model, opt)
    ns = {"model": model, "opt": opt, "x": x}

    def step(model, opt, x):
        h = torch.ops.memprof_test.opaque(model(x))  # the line the error names
        h.sum().backward()
        opt.step()

    with pytest.raises(EstimateError) as err:
        estimate(step, model, opt, x)
    text = str(err.value)
    assert "\n" not in text
    assert "memprof_test::opaque" in text and "fake" in text and "in step" in text, text
    assert _fake_in(ns) == []
    assert _same(_snapshot(model, opt), before)
    t = torch.ones(2) * 2  # nothing of the fake run is left active
    assert type(t) is torch.Tensor
    del lib


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA here: no simulated CUDA path")
def test_lstm_size_rules_stay_on_the_cpu(lstm_pair):
    """The rules are measured on the CPU kernels: an estimate for CUDA with cuDNN off
    (PyTorch's own kernels, computed on the CPU path here) records neither their workspace
    sizes nor their temporaries (with cuDNN on it runs cuDNN's: test_cuda_rules.py)."""
    m, o, x, y, cpu_est, _ = lstm_pair
    with torch.backends.cudnn.flags(enabled=False):
        cuda_est = estimate(_lstm_step, m, o, x, y, device="cuda:0")

    def rnn_blocks(prof):
        ops = prof.ops.set_index("op_id")["name"]
        a = prof.allocations
        return a[a["alloc_op_id"].map(ops).str.startswith("aten::mkldnn_rnn_layer", na=False)]

    cpu, cuda = rnn_blocks(cpu_est), rnn_blocks(cuda_est)
    assert (cpu["alloc_op_id"] == cpu["free_op_id"]).sum() == 16  # the CPU's temporaries
    assert (cuda["alloc_op_id"] == cuda["free_op_id"]).sum() == 0
    assert set(cuda["device"]) == {"cuda:0"}
    assert cuda["size_bytes"].max() < cpu["size_bytes"].max()  # no oneDNN workspace


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cudnn_lstm_on_a_gpu_is_one_clear_error_and_works_with_cudnn_off(lstm_pair):
    """On a GPU, cuDNN's RNN backward has no meta kernel and fails on fake tensors: one
    EstimateError line with the way out, which works."""
    m, o, x, y, _, _ = lstm_pair
    with pytest.raises(EstimateError) as err:
        estimate(_lstm_step, m, o, x, y, device="cuda:0")
    text = str(err.value)
    assert "\n" not in text and "cuDNN" in text
    assert text.endswith(CUDNN_HINT)
    with torch.backends.cudnn.flags(enabled=False):
        prof = estimate(_lstm_step, m, o, x, y, device="cuda:0")
    assert prof.meta["simulated_cuda"] is False
    params = sum(cuda_rounded(p.numel() * p.element_size()) for p in m.parameters())
    assert _bytes_by_role(prof, "parameter") == params


def test_an_estimate_sees_only_its_own_thread():
    """Another thread calls a real model and steps a real optimizer over and over while the
    estimate runs. The module and optimizer hooks are global: before, that thread's calls
    were recorded as the estimate's own (515 ops instead of 43 here)."""
    import threading

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(8, 16)

    def step(model, x):
        model(x).sum().backward()

    alone = estimate(step, model, x)
    other = nn.Linear(4, 4)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    stop, running = threading.Event(), threading.Event()

    def loop():
        y = torch.ones(2, 4)
        while not stop.is_set():
            other(y).sum().backward()
            other_opt.step()
            running.set()

    t = threading.Thread(target=loop, name="training elsewhere")
    t.start()
    try:
        assert running.wait(60)
        beside = estimate(step, model, x)
    finally:
        stop.set()
        t.join(60)
    assert len(alone.ops) == 43
    columns = ["name", "kind", "parent_id", "module", "phase"]  # seq_nr: autograd's counter
    assert beside.ops[columns].astype(str).equals(alone.ops[columns].astype(str))
    modules = set(beside.ops.loc[beside.ops["kind"] == "module", "module"].astype(str))
    assert modules == {"model", "model.0", "model.1", "model.2"}
    assert beside.allocations["size_bytes"].tolist() == alone.allocations["size_bytes"].tolist()


def test_magic_estimate_fakes_the_notebooks_scheduler(shell, run):
    """The magic binds a scheduler in the notebook (an object reaching the optimizer) to a
    fake copy too: the real learning rate and the scheduler's counters stay as they were."""
    model, opt, x, y = _mlp(4)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    classification_step(model, opt, x, y)
    ns = shell.user_ns
    ns.update(sch_model=model, sch_opt=opt, sch_sched=sched, sch_x=x, sch_y=y)
    lr, epoch = opt.param_groups[0]["lr"], sched.last_epoch
    result, out = run(
        "%%memprofile --estimate --no-display\n"
        "F.cross_entropy(sch_model(sch_x), sch_y).backward()\n"
        "sch_opt.step()\n"
        "sch_sched.step()\n"
    )
    assert result.error_in_exec is None, out
    assert opt.param_groups[0]["lr"] == lr and sched.last_epoch == epoch
    assert ns["sch_sched"] is sched and sched.optimizer is opt
    assert _fake_in(ns) == []
