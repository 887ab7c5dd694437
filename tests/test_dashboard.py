"""The dashboard's data and models, from real captures of a training step (no browser here;
tests/test_dashboard_browser.py drives the page itself)."""

from __future__ import annotations

import base64
import gzip
import html
import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
from _lineage_page import decode_lineage
from torch.profiler import record_function

import jupyter_memprof
from jupyter_memprof._results.profile import Profile
from jupyter_memprof._views.dashboard import data as dd
from jupyter_memprof._views.dashboard.html import write_html
from jupyter_memprof._views.dashboard.page import build

LABEL = "<b>x</b>"


def training_step_profile(blocks: int = 3, width: int = 32, batch: int = 64) -> Profile:
    """One Adam step of an MLP of Linear+LayerNorm+ReLU blocks, the forward pass inside a
    ``record_function`` whose label is HTML (it must always be shown as text)."""
    torch.manual_seed(0)
    layers = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width)

    def step():
        with record_function(LABEL):
            loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    step()  # optimizer state exists before the capture, as in a training loop
    ns = {"model": model, "opt": opt, "x": x}
    with jupyter_memprof.profile(namespace=ns, label="<i>mlp</i> step") as prof:
        step()
    return prof


@pytest.fixture(scope="module")
def prof():
    return training_step_profile()


def _state_at(prof: Profile, device: str, t_ns: int) -> dict[str, int]:
    """Live bytes per category at ``t_ns`` straight from the allocations table."""
    a = prof.allocations[prof.allocations["device"].astype(object) == device]
    # in int64: absolute ns do not fit a float64 exactly (steps of 256 ns)
    big = np.iinfo(np.int64)
    alloc = a["alloc_ns"].to_numpy(dtype=np.int64, na_value=big.min)
    free = a["free_ns"].to_numpy(dtype=np.int64, na_value=big.max)
    live = a[(alloc <= t_ns) & (free > t_ns)]
    return live.groupby(live["category"].astype(object))["size_bytes"].sum().to_dict()


# --- level of detail ------------------------------------------------------------------------
def test_m4_keeps_extremes_and_respects_the_budget():
    rng = np.random.default_rng(1)
    total = np.cumsum(rng.normal(size=100_000))
    total[73_210] = total.max() + 50  # a lone spike
    total[12_345] = total.min() - 50  # a lone dip
    keep = dd.m4_indices(total, 4000)
    assert len(keep) <= 4000 + 1
    assert 73_210 in keep and 12_345 in keep
    assert keep[0] == 0 and keep[-1] == len(total) - 1
    assert np.all(np.diff(keep) > 0)
    # every bucket's own max and min survive
    edges = np.linspace(0, len(total), 1000 + 1).astype(int)
    for s, e in zip(edges[:-1], edges[1:], strict=True):
        assert s + int(np.argmax(total[s:e])) in keep
        assert s + int(np.argmin(total[s:e])) in keep
    assert np.array_equal(dd.m4_indices(total[:50], 4000), np.arange(50))


def test_timeline_points_are_exact_states_and_keep_the_peak(prof):
    device = "cpu"
    full = dd.timeline(prof, device, dd.window(prof))
    thin = dd.timeline(prof, device, dd.window(prof), budget=40)
    assert full.points_in == thin.points_in > 40
    assert len(thin.columns["t"]) <= 40 + 3  # + the capture's start and end
    # the peak is kept exactly, and is the analysis' peak
    pk = prof.peak(device)
    assert thin.peak_bytes == pk.attrs["peak_bytes"] == int(np.max(thin.columns["total"]))
    assert int(np.max(full.columns["total"])) == pk.attrs["peak_bytes"]
    # every drawn point is the true state of the tables at that time
    start = dd.window(prof).start_ns
    for k in range(1, len(thin.columns["t"]) - 1):
        t_ns = start + round(thin.columns["t"][k] * 1e6)
        # times went through ms floats: find the exact event time nearest to it
        times = prof.timeline["time_ns"].to_numpy()
        t_ns = int(times[np.argmin(np.abs(times - t_ns))])
        truth = _state_at(prof, device, t_ns)
        for c in thin.categories:
            assert thin.columns[f"b_{c}"][k] == truth.get(c, 0), (k, c)


def test_allocations_budget_summarises_the_small_blocks(prof):
    a = prof.allocations
    sel = dd.select_allocations(prof, budget=10)
    assert sel.total == len(a)
    # the 10 largest, largest first (plus blocks live at the peak, at most budget // 4)
    assert 10 <= len(sel.table) <= 12
    sizes = sel.table["size_bytes"].to_numpy()
    assert list(sizes[:10]) == sorted(a["size_bytes"], reverse=True)[:10]
    # nothing is lost: listed + summarised == everything, per (device, category)
    assert sel.summarised["count"].sum() + len(sel.table) == len(a)
    assert sel.summarised["size_bytes"].sum() + sizes.sum() == a["size_bytes"].sum()
    ops = dd.select_ops(prof, dd.window(prof), set())
    cols = dd.allocation_columns(prof, sel, ops, dd.window(prof))
    n = len(sel.table)
    assert cols["summary"][n:] == [True] * len(sel.summarised)
    assert all("smaller blocks, summarised" in s for s in cols["name"][n:])


def test_ops_budget_keeps_a_tree_and_counts_what_was_left_out(prof):
    win = dd.window(prof)
    must = {int(prof.allocations["alloc_op_id"].dropna().iloc[-1])}
    ops = dd.select_ops(prof, win, must, budget=60)
    shown = set(ops.columns["op_id"].tolist())
    assert ops.total == len(prof.ops)
    assert ops.left_out == len(prof.ops) - len(shown) > 0
    assert must <= shown
    parent = prof.ops.set_index("op_id")["parent_id"]
    for op_id in shown:  # every shown op's parent is shown: still a tree
        p = parent[op_id]
        assert pd.isna(p) or int(p) in shown
    longest = prof.ops.assign(d=prof.ops["end_ns"] - prof.ops["start_ns"]).nlargest(5, "d")
    assert set(longest["op_id"]) <= shown


# --- the built views ---------------------------------------------------------------------------
def test_sources_follow_the_tables(prof):
    built = build(prof)
    a = built.allocs.data
    listed = [i for i, s in zip(a["alloc_id"], a["summary"], strict=True) if not s]
    by_size = prof.allocations.sort_values(["size_bytes", "alloc_id"], ascending=[False, True])
    assert listed == by_size["alloc_id"].tolist()  # small capture: every block, largest first
    # lineage embedded per block is exactly prof.lineage(alloc_id)
    for row in (0, len(listed) // 2, len(listed) - 1):
        aid = int(a["alloc_id"][row])
        want = prof.lineage(aid)
        s, e = int(a["lin0"][row]), int(a["lin1"][row])
        assert e - s == len(want)
        got = decode_lineage(built.lineage_all.data, built.lineage_pool, s, e)
        assert got["op_name"] == ["" if pd.isna(v) else v for v in want["op_name"].astype(object)]
        assert got["relation"] == want["relation"].astype(str).tolist()
        assert got["module"] == ["" if pd.isna(v) else v for v in want["module"].astype(object)]
    # flows link shown forward ops to their backward ops
    f = built.layout.select_one({"name": "memprof-flows"}).data
    o = built.ops.data
    assert len(f["fi"]) == len(prof.flows) > 0
    for fi, bi in zip(f["fi"], f["bi"], strict=True):
        assert o["phase"][bi] == "backward"
        assert o["phase"][fi] != "backward"
    # times are ms since the capture start
    start = prof.meta["start_ns"]
    first = prof.ops.sort_values("start_ns").iloc[0]
    assert o["left"][0] == pytest.approx((first["start_ns"] - start) / 1e6)


def test_views_carry_their_css_classes(prof):
    layout = build(prof).layout
    classes = {c for m in layout.references() for c in getattr(m, "css_classes", []) or []}
    assert {
        "memprof-timeline",
        "memprof-optree",
        "memprof-allocations",
        "memprof-lineage",
    } <= classes
    from bokeh.models import DataTable

    allocs = next(
        m
        for m in layout.references()
        if "memprof-allocations" in (getattr(m, "css_classes", None) or [])
    )
    assert any(isinstance(m, DataTable) for m in allocs.references())
    assert layout.select_one({"name": "memprof-header"}) is not None
    assert build(prof, header=False).layout.select_one({"name": "memprof-header"}) is None


def test_device_and_category_filters(prof):
    built = build(prof, device="cpu", categories=["parameter", "gradient"])
    cats = set(built.allocs.data["category"])
    assert cats <= {"parameter", "gradient"} and "parameter" in cats
    n_param = int((prof.allocations["category"].astype(object) == "parameter").sum())
    assert list(built.allocs.data["category"]).count("parameter") == n_param


def test_one_timeline_per_device(prof):
    # a second device: the same capture's blocks again under "cuda:0" (this machine has no
    # GPU; the views only care about the device column)
    def twice(df):
        other = df.assign(device=df["device"].astype(object).replace({"cpu": "cuda:0"}))
        both = pd.concat([df.assign(device=df["device"].astype(object)), other])
        return both.astype({"device": "category"}).reset_index(drop=True)

    allocs = twice(prof.allocations)
    allocs["alloc_id"] = np.arange(len(allocs))
    two = Profile(
        **{**prof.tables, "allocations": allocs, "timeline": twice(prof.timeline)},
        meta=prof.meta,
    )
    assert two.devices == ["cpu", "cuda:0"]
    layout = build(two).layout
    names = {m.name for m in layout.references() if m.name}
    assert {"memprof-timeline-cpu", "memprof-timeline-cuda:0"} <= names
    cpu = build(two, device="cuda:0")
    assert set(cpu.allocs.data["device"]) == {"cuda:0"}
    assert "memprof-timeline-cpu" not in {m.name for m in cpu.layout.references() if m.name}


def test_write_html_is_standalone_and_small(prof, tmp_path):
    path = write_html(prof, tmp_path / "dash.html")
    text = open(path, encoding="utf-8").read()
    assert len(text.encode()) < 2_000_000
    # no network: no external scripts or stylesheets, BokehJS inlined (compressed)
    assert not re.search(r"<script[^>]+src=", text)
    assert not re.search(r"<link[^>]+href=", text)
    assert "cdn.bokeh.org" not in text
    blob = re.search(r'id="memprof-bokehjs">([^<]+)<', text).group(1)
    js = gzip.decompress(base64.b64decode(blob)).decode()
    import bokeh

    assert f'"{bokeh.__version__}"' in js or bokeh.__version__ in js
    doc = gzip.decompress(base64.b64decode(re.search(r'id="memprof-doc">([^<]+)<', text).group(1)))
    docs = json.loads(doc)
    assert docs and "memprof-timeline" in doc.decode()
    assert text.count("<title>") == 1
    assert "<title>jupyter_memprof: &lt;i&gt;mlp&lt;/i&gt; step</title>" in text


# --- every label is text, never markup ----------------------------------------------------------
EVIL_TITLE = "<img src=x id=memprof-evil-title>"
EVIL_MODULE = "<img src=x id=memprof-evil-module>"
EVIL_FILE = "<img src=x id=memprof-evil-callsite>"  # a code object's file name
EVIL_LABELS = (LABEL, EVIL_TITLE, EVIL_MODULE, EVIL_FILE)

# One training step whose every kind of label is HTML: the profile label, a module path (a
# submodule registered under an HTML name), the callsite (code compiled under an HTML file
# name) and a record_function label.
_EVIL_STEP = f"""
def step():
    with torch.profiler.record_function({LABEL!r}):
        loss = model(x).square().mean()
    loss.backward()
    opt.step()
"""


def evil_labels_profile() -> Profile:
    """A real step whose op names, module paths, callsites and profile label are HTML."""
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module(EVIL_MODULE, torch.nn.Linear(16, 16))
    model.add_module("act", torch.nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    code_ns = {"torch": torch, "model": model, "opt": opt, "x": x}
    exec(compile(_EVIL_STEP, EVIL_FILE, "exec"), code_ns)
    code_ns["step"]()
    with jupyter_memprof.profile(namespace={"model": model, "x": x}, label=EVIL_TITLE) as prof:
        code_ns["step"]()
    return prof


@pytest.fixture(scope="module")
def evil():
    return evil_labels_profile()


def _strings(node, owner=(None, None), attr=None):
    """(model type, model name, attribute, string) for every string in a serialized Bokeh
    document, with the innermost model holding it and the attribute it is under."""
    if isinstance(node, dict):
        if node.get("type") == "object":
            attrs = node.get("attributes", {})
            for key, value in attrs.items():
                yield from _strings(value, (node.get("name"), attrs.get("name")), key)
            return
        for value in node.values():
            yield from _strings(value, owner, attr)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value, owner, attr)
    elif isinstance(node, str):
        yield (*owner, attr, node)


def test_every_label_kind_is_data_never_markup(evil, tmp_path):
    ops = evil.ops
    assert (ops["name"] == LABEL).sum() == 1
    assert (ops["module"] == f"model.{EVIL_MODULE}").sum() > 3
    assert ops["callsite"].str.startswith(f"{EVIL_FILE}:").sum() > 3
    text = open(write_html(evil, tmp_path / "evil.html"), encoding="utf-8").read()
    # the page itself: the profile label only escaped, in the title
    head = text[: text.index("</head>")]
    assert f"<title>jupyter_memprof: {html.escape(EVIL_TITLE)}</title>" in head
    blob = re.search(r'id="memprof-doc">([^<]+)<', text).group(1)
    outside_blob = text.replace(blob, "")
    for label in EVIL_LABELS:
        assert label not in outside_blob, label
    # the document, decoded: each label is in the data the views draw as text (table cells,
    # tooltips, the strings the click handlers escape), never in a model that renders HTML
    doc = json.loads(gzip.decompress(base64.b64decode(blob)))
    strings = list(_strings(doc))
    found = {label: set() for label in EVIL_LABELS}
    for kind, name, path, value in strings:
        for label in EVIL_LABELS:
            if label in value:
                found[label].add((kind, name, path))
    as_data = {("ColumnDataSource", "memprof-ops", "data"), ("CustomJS", None, "args")}
    assert found[LABEL] >= {("ColumnDataSource", "memprof-ops", "data")}
    assert found[EVIL_MODULE] >= {
        ("ColumnDataSource", "memprof-ops", "data"),
        ("ColumnDataSource", "memprof-allocations", "data"),
    }
    assert found[EVIL_FILE] >= as_data
    assert found[EVIL_TITLE] == set()  # the title appears only escaped
    for label, where in found.items():
        assert {kind for kind, _, _ in where} <= {"ColumnDataSource", "CustomJS"}, (label, where)
        assert {p for _, _, p in where} <= {"data", "args"}, (label, where)
    # the header (HTML) names the profile, escaped
    header = [v for _, n, a, v in strings if n == "memprof-header" and a == "text"]
    assert len(header) == 1 and html.escape(EVIL_TITLE) in header[0]
    # tooltips show fields as text: no {safe} formatter anywhere
    assert not any("{safe}" in v for _, _, _, v in strings)


def test_empty_profile_still_builds(tmp_path):
    empty = Profile.empty(label="nothing")
    built = build(empty)
    assert built.allocs.data["alloc_id"] == []
    path = write_html(empty, tmp_path / "empty.html")
    assert path == str(tmp_path / "empty.html")
    text = open(path, encoding="utf-8").read()
    assert "<title>jupyter_memprof: nothing</title>" in text
    blob = re.search(r'id="memprof-doc">([^<]+)<', text).group(1)
    divs = [
        v
        for kind, _, attr, v in _strings(json.loads(gzip.decompress(base64.b64decode(blob))))
        if kind == "Div" and attr == "text"
    ]
    assert "<i>No memory events were recorded.</i>" in divs


def test_widget_controls_and_lineage_to_variable(prof, ipython_shell):
    import ipywidgets

    shell = ipython_shell
    w = prof.show()
    assert isinstance(w, ipywidgets.Widget)
    assert w.selected_alloc_id is None
    assert w.lineage_to_variable("blk") is None  # nothing clicked yet: says so
    assert "Click one block" in w._status.value
    # what a click in the browser syncs back: one selected row of the allocations source
    row = 3
    w._built.allocs.selected.indices = [row]
    aid = int(w._built.allocs.data["alloc_id"][row])
    assert w.selected_alloc_id == aid
    df = w.lineage_to_variable("blk")
    pd.testing.assert_frame_equal(shell.user_ns["blk"], prof.lineage(aid))
    pd.testing.assert_frame_equal(df, prof.lineage(aid))
    assert w.lineage_to_variable("not a name") is None
    # device and category controls rebuild the views
    w._categories.value = ("parameter",)
    assert set(w._built.allocs.data["category"]) == {"parameter"}
    w._device.value = "cpu"
    assert set(w._built.allocs.data["device"]) == {"cpu"}


def test_the_reused_selection_follows_the_tables_and_dies_with_the_profile():
    import gc

    from jupyter_memprof._views.dashboard import page as D

    p = training_step_profile(blocks=1)
    first = D._shown(p, None, None)
    assert D._shown(p, None, None) is first  # show() then to_html(): chosen once
    p.allocations = p.allocations.copy()  # a table replaced: chosen again
    second = D._shown(p, None, None)
    assert second is not first and D._shown(p, None, None) is second
    p.meta["estimate"] = True  # what the times mean changed: chosen again
    assert D._shown(p, None, None) is not second
    jupyter_memprof.release(p)  # released: nothing derived from it stays
    assert D.last_shown == []
    D._shown(p, None, None)
    assert D.last_shown
    del p
    gc.collect()
    assert D.last_shown == []  # the profile died: so did its selection


# --- the page BokehJS receives ------------------------------------------------------------------
def _canonical(doc: dict) -> str:
    """A document's JSON with every model id replaced by the order it first appears in."""
    ids: dict[str, int] = {}
    text = json.dumps(doc)
    return re.sub(r'"id": "([^"]+)"', lambda m: f'"id": {ids.setdefault(m[1], len(ids))}', text)


def _bokeh_json(layout) -> dict:
    from bokeh.document import Document

    doc = Document()
    doc.add_root(layout)
    return doc.to_json(deferred=False)


def test_a_template_filled_in_is_the_document_bokeh_serializes(prof):
    from jupyter_memprof._views.dashboard import page as D

    D._templates.clear()
    D.page(prof)  # the template of this shape, made from this capture's values
    other = training_step_profile()  # another capture of the same step: other times, data
    shape, values = D._spec(other, D._shown(other, None, None), header=True)
    template, _ = D._template(shape, values)
    assert len(D._templates) == 1  # the same shape: the same template
    assert shape == D._spec(prof, D._shown(prof, None, None), header=False)[0]
    want = _bokeh_json(D._layout(shape, values, header=True).layout)
    got = template.render(values)
    assert _canonical(got) == _canonical(want)  # so none of the first capture's values is left
    text = json.dumps(got)
    assert values["uid"] in text and values["chart_title0"] in text
    assert json.dumps(values["ops_title"])[1:-1] in text
    assert "memprof-slot" not in text


def test_where_the_peak_falls_is_a_value_of_the_template_not_its_shape():
    """Where the peak falls was part of the template's shape (which side of its mark the
    label went), so two captures of one step whose peaks fell either side of 60% of the run
    got two shapes (a flaky template test). Here two estimates (their clock counts records:
    no timing) of one program, the big temporary early or late: one shape."""
    from jupyter_memprof import estimate
    from jupyter_memprof._views.dashboard import page as D

    def early(x):
        big = torch.ones(1000, 1000)
        del big
        for _ in range(20):
            x = x + 1

    def late(x):
        for _ in range(20):
            x = x + 1
        big = torch.ones(1000, 1000)
        del big

    specs = {}
    for fn in (early, late):
        est = estimate(fn, torch.ones(8))
        specs[fn.__name__] = D._spec(est, D._shown(est, None, None), header=True)
    (shape, first), (other, last) = specs["early"], specs["late"]
    assert shape == other
    # the peak is said under the chart's title, wherever the mark is
    assert first["peak_text0"].startswith("\u25bc peak 3.8 MiB at #")
    assert last["peak_text0"].startswith("\u25bc peak 3.8 MiB at #")
    assert first["peak_x0"] < last["peak_x0"]
    template, _ = D._template(shape, first)
    for values in (first, last):
        want = _bokeh_json(D._layout(shape, values, header=True).layout)
        assert _canonical(template.render(values)) == _canonical(want)


def test_an_estimate_page_is_the_document_bokeh_serializes():
    from jupyter_memprof import estimate
    from jupyter_memprof._views.dashboard import page as D

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.Adam(model.parameters())

    def step(model, opt, x):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    est = estimate(step, model, opt, torch.randn(32, 64), device="cuda:0", limit="256KiB")
    assert est.meta["oom"] is not None
    shape, values = D._spec(est, D._shown(est, None, None), header=True)
    assert shape.estimate and shape.charts[0].limit and shape.charts[0].oom
    template, _ = D._template(shape, values)
    want = _bokeh_json(D._layout(shape, values, header=True).layout)
    assert _canonical(template.render(values)) == _canonical(want)
    assert values["limit_text"] == "limit 256.0 KiB"


def test_page_without_header_and_its_live_sources(prof):
    from jupyter_memprof._views.dashboard import page as D

    shown = D.page(prof, header=False, live=True)
    root = shown.doc["roots"][0]
    assert root["id"] == shown.root.id and root["attributes"]["name"] == "memprof-dashboard"
    text = json.dumps(shown.doc)
    assert "memprof-header" not in text
    assert "memprof-header" in json.dumps(D.page(prof).doc)
    # the sources the widget reads carry the document's ids, and hold what the page shows
    built = shown.built
    reps = {m["id"]: m for m in _models(shown.doc)}
    for source in (built.ops, built.allocs, built.lineage, built.lineage_all):
        rep = reps[source.id]
        assert rep["name"] == "ColumnDataSource"
        assert rep["attributes"]["name"] == source.name
        assert rep["attributes"]["selected"]["id"] == source.selected.id
    assert list(built.allocs.data["alloc_id"]) == list(D._shown(prof, None, None).acols["alloc_id"])
    assert set(built.lineage.data) == set(D.LINEAGE_VIEW_COLUMNS)


def test_the_widget_takes_the_browsers_selection_and_ignores_the_rest(prof):
    w = prof.show(header=False)
    try:
        view, allocs = w._view, w._built.allocs
        row = 2
        clicked = {"kind": "ModelChanged", "model": {"id": allocs.selected.id},
                   "attr": "indices", "new": [row]}  # fmt: skip
        view._sync_model(view, {"event": "jsevent", **clicked}, [])
        assert w.selected_alloc_id == int(allocs.data["alloc_id"][row])
        # a change to a model the kernel does not hold (the op details, a range): ignored
        div = next(m for m in _models(view.render_bundle["docs_json"]) if m.get("name") == "Div")
        other = {"kind": "ModelChanged", "model": {"id": div["id"]}, "attr": "text", "new": "x"}
        view._sync_model(view, {"event": "jsevent", **other}, [])
        assert w.selected_alloc_id == int(allocs.data["alloc_id"][row])
    finally:
        w.close()


def _models(node):
    """Every model representation in a serialized document."""
    if isinstance(node, dict):
        if node.get("type") == "object" and "id" in node:
            yield node
        for value in node.values():
            yield from _models(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from _models(value)


def test_lineage_and_peak_numbers_are_the_tables(prof):
    from jupyter_memprof._analysis.peak import peak_point

    a = prof.allocations.set_index("alloc_id")
    lin = jupyter_memprof._analysis.lineage.all_lineages(prof.tables)
    made = lin[lin["relation"] == "allocated"]
    # times stay exact int64 nanoseconds (no float rounding on the way)
    want = a.loc[made["alloc_id"], "alloc_ns"].to_numpy(dtype=np.int64)
    assert (made["time_ns"].to_numpy(dtype=np.int64) == want).all()
    freed = lin[lin["relation"] == "freed"]
    want = a.loc[freed["alloc_id"], "free_ns"].to_numpy(dtype=np.int64)
    assert (freed["time_ns"].to_numpy(dtype=np.int64) == want).all()
    pk, point = prof.peak("cpu"), peak_point(prof.tables, "cpu")
    assert point.peak_bytes == pk.attrs["peak_bytes"] == int(pk["size_bytes"].sum())
    assert point.peak_ns == pk.attrs["peak_ns"]
    assert sorted(point.alloc_ids.tolist()) == sorted(pk["alloc_id"].tolist())


def test_op_times_read_as_format_time_writes_them():
    from jupyter_memprof._units import format_ms, format_time

    rng = np.random.default_rng(7)
    edges = [0.0, -0.0, 0.0004, 0.0005, 0.00125, 0.9999, 0.99995, 0.99996, 1.0, 12.3456789]
    edges += [999.9994, 999.9996, 1000.0, 1234.5678, 86_400_000.0, -0.25, -3.5, -999.9996]
    ms = np.concatenate(
        [
            edges,
            [float("nan"), float("inf")],
            rng.exponential(1.0, 3000),
            rng.exponential(1000.0, 3000),
            np.round(rng.uniform(-2000, 2000, 3000), 4) + 0.0005,  # ties of the rounding
        ]
    )
    got = dd._time_texts(ms, records=False)
    assert got.tolist() == [format_ms(v) for v in ms.tolist()]
    assert got[:3].tolist() == ["0.0 µs", "0.0 µs", "0.4 µs"]
    assert got[len(edges)].tolist() == ""  # NaN
    spans = dd._time_texts(np.array([1.0, 2.0, 1234.5]), records=True, span=True)
    assert spans.tolist() == [format_time(v, records=True, span=True) for v in (1.0, 2.0, 1234.5)]
    assert spans.tolist() == ["1 record", "2 records", "1,235 records"]


def test_the_page_carries_the_bokehjs_bokeh_bundles(prof, tmp_path):
    from bokeh.embed.bundle import bundle_for_objs_and_resources
    from bokeh.resources import INLINE

    from jupyter_memprof._views.dashboard import page as D
    from jupyter_memprof._views.dashboard.html import bokehjs

    def bundled(layout) -> str:
        return ";\n".join(bundle_for_objs_and_resources([layout], INLINE).js_raw)

    plain = D.page(prof)
    assert not plain.tex
    assert bokehjs(mathjax=False) == bundled(build(prof).layout)
    # a label holding TeX: Bokeh adds MathJax for the header that shows it, and so do we
    tex = Profile(**prof.tables, meta={**prof.meta, "label": "step $$x^2$$"})
    assert D.page(tex).tex
    assert bokehjs(mathjax=True) == bundled(build(tex).layout) != bokehjs(mathjax=False)
    write_html(tex, tmp_path / "tex.html")
    blob = re.search(r'id="memprof-bokehjs">([^<]+)<', (tmp_path / "tex.html").read_text())
    assert gzip.decompress(base64.b64decode(blob.group(1))).decode() == bokehjs(mathjax=True)


def test_the_layout_reflows_to_a_narrow_panel(prof, monkeypatch):
    from bokeh.models import DataTable, Div, Plot, Step

    from jupyter_memprof._views.dashboard import page as D

    layout = build(prof).layout
    # the allocations and the lineage one above the other, full width; columns keep widths
    panels = [c.css_classes[0] for c in layout.children if c.css_classes]
    assert panels[-2:] == ["memprof-allocations", "memprof-lineage"]
    tables = list(layout.select({"type": DataTable}))
    assert tables and {t.autosize_mode for t in tables} == {"none"}
    # plot titles are one short line; what they said in more words is in HTML that wraps
    titles = [p.title.text for p in layout.select({"type": Plot})]
    assert max(map(len, titles)) <= 40, titles
    keys = {d.name: d.text for d in layout.select({"type": Div}) if d.name}
    for phase in dd.PHASE_COLORS:  # the Ops chart's colours
        assert (
            f"{dd.PHASE_COLORS[phase]};margin-right:4px'></span>{phase}<"
            in keys["memprof-phase-key"]
        )
    present = set(prof.allocations["category"].astype(str))
    for cat, color in dd.CATEGORY_COLORS.items():  # the lifetimes chart's colours
        assert (f"{color};margin-right:4px'></span>{cat}<" in keys["memprof-category-key"]) == (
            cat in present
        )
    # the total's outline is left out over thousands of steps (a black band otherwise)
    steps = len(list(layout.select({"type": Step})))  # the chart's total, the overview's
    D.forget()
    monkeypatch.setattr(D, "OUTLINE_POINTS", 10)
    dense = build(prof).layout
    assert 0 < len(list(dense.select({"type": Step}))) < steps  # the overview keeps its own


def test_category_checkboxes_choose_what_is_drawn(prof):
    w = prof.show()
    try:
        choice = w._categories
        boxes = {b.description: b for b in choice._boxes}
        assert all(b.value for b in boxes.values()) and set(choice.value) == set(boxes)
        boxes["parameter"].value = False  # unticked in the browser
        assert "parameter" not in choice.value
        assert "parameter" not in set(w._built.allocs.data["category"])
        choice.value = ("gradient",)
        assert [n for n, b in boxes.items() if b.value] == ["gradient"]
        assert set(w._built.allocs.data["category"]) == {"gradient"}
    finally:
        w.close()
