"""Every meta key the package writes is declared once (``_analysis/meta_schema.py``) and
checked on load (issue 37, item 2; issue 41, "meta declared once").

Real profiles of each kind (a plain capture, a long run, an estimate with a limit on CUDA,
``what_if``, ``world_size``) are made, and their meta keys compared with the declared ones; a
crafted value of any key either loads as one ``ProfileFileError`` line or works in
``print(prof)``, ``summary()``, ``leaks()`` and the HTML summary (hypothesis).
"""

from __future__ import annotations

import json
import zipfile

import pytest
import torch
from _loading import refused
from _loading import zip_of as _zip
from _snapshots import record

import jupyter_memprof
from jupyter_memprof import Profile
from jupyter_memprof._analysis import meta_schema as M
from jupyter_memprof._analysis import schema as S
from jupyter_memprof._errors import ProfileFileError
from jupyter_memprof._frontends.snapshot import load_snapshot
from jupyter_memprof._io import json_default
from jupyter_memprof._results.checks import META_FIELDS, check_meta

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


def _step(model, x):
    model(x).sum().backward()


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    """One real profile of each kind the package makes."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    x = torch.randn(4, 16)
    out = {}
    with jupyter_memprof.profile(label="plain") as p:
        _step(model, x)
    out["plain"] = p
    kept = []
    with jupyter_memprof.profile(steps=2, label="long") as p:
        for _ in range(5):
            kept.append(model(x))
            jupyter_memprof.step()
    out["long_run"] = p
    out["estimate"] = jupyter_memprof.estimate(_step, model, x, device="cuda", limit="1MiB")
    out["world_size"] = jupyter_memprof.estimate(_step, model, x, world_size=2)
    cmp = jupyter_memprof.what_if(_step, model, x, autocast=torch.bfloat16)
    out["what_if"] = cmp.b
    with torch.profiler.profile(profile_memory=True, record_shapes=True) as tp:
        _step(model, x)
    trace = tmp_path_factory.mktemp("trace") / "rank3.pt.trace.json"
    tp.export_chrome_trace(str(trace))
    out["trace"] = jupyter_memprof.load_trace(str(trace))
    snap, _ = record(lambda mark: _step(model, x))
    out["snapshot"] = load_snapshot(snap)
    return out


def test_every_key_written_is_declared(profiles):
    for kind, p in profiles.items():
        metas = [p.meta, *(q.meta for q in p.kept.values())]
        for meta in metas:
            undeclared = sorted(set(meta) - set(M.META))
            assert undeclared == [], f"{kind} writes undeclared meta keys {undeclared}"
            saved = json.loads(json.dumps(meta, default=json_default))  # as a file holds it
            assert M.problem(saved) is None, (kind, M.problem(saved))


def test_the_kinds_write_their_keys(profiles):
    """The collection above sees the keys that make each kind what it is."""
    assert "long_run" in profiles["long_run"].meta
    assert "leaks" not in profiles["long_run"].meta  # a table now: read from old files only
    assert {"oom", "limit", "estimate"} <= set(profiles["estimate"].meta)
    assert profiles["world_size"].meta["world_size"] == 2
    assert profiles["what_if"].meta["what_if"] == {"autocast": "torch.bfloat16"}
    assert {"baseline_bytes", "untouched_bytes", "memory_budget"} <= set(profiles["plain"].meta)
    assert {"trace", "tensor_ids"} <= set(profiles["trace"].meta)
    assert any(k.startswith("snapshot_") for k in profiles["snapshot"].meta)


def test_load_checks_are_the_declaration():
    assert set(META_FIELDS) == set(M.META)
    assert all(META_FIELDS[k] is M.META[k].check for k in M.META)


def test_saved_profiles_of_each_kind_load(profiles, tmp_path):
    for kind, p in profiles.items():
        q = jupyter_memprof.load(p.save(tmp_path / f"{kind}.memprof"))
        assert q.meta.keys() == json.loads(json.dumps(p.meta, default=str)).keys()
        str(q), q.summary(), q.leaks()


# -- crafted values -------------------------------------------------------------------------
_CRAFTED = {
    "long_run": [
        {},
        {"steps": 3},
        {"steps_per_window": "2", "windows": 1, "steps": 2},
        {"steps_per_window": 2, "windows": 1, "steps": 2, "tables_steps": [1]},
        {"steps_per_window": 2, "windows": 1, "steps": 2, "kept": {"peak": 3}},
        [1, 2],
    ],
    "leaks": [
        [{}],
        [{"device": "cpu"}],
        [
            {
                "category": "nonsense",
                "device": "cpu",
                "bytes_per_step": 1,
                "steps": 2,
                "total_bytes": 2,
                "alloc_ids": [1],
            }
        ],
        [
            {
                "category": "input",
                "device": "gpu0",
                "bytes_per_step": 1,
                "steps": 2,
                "total_bytes": 2,
                "alloc_ids": [1],
            }
        ],
        {"a": 1},
        [1],
    ],
    "baseline_bytes": [{"cpu": "12"}, {"cpu": -1}, {"nowhere": 1}, [1], {"cpu": 2**70}],
    "untouched_bytes": [{"cpu": "x"}, {"cpu": 1.5}, 3],
    "unreachable_bytes": [{"cpu": None}, {"cuda:0": []}],
    "cuda_start": [{"cuda:0": 5}, {"cuda:0": {"outside_torch_bytes": "x"}}, [1]],
    "cuda_end": [{"cuda:0": {"reserved": -5}}, {"cpu": []}],
    "world_size": [0, -2, "2"],
    "what_if": [[1], {"dtype": {"x": "\ud800"}}],
}


@pytest.mark.parametrize(
    "key,value", [(k, v) for k, vs in _CRAFTED.items() for v in vs], ids=lambda v: repr(v)[:30]
)
def test_crafted_value_is_one_line(profiles, tmp_path, key, value):
    """Before: these loaded, then print(prof), summary() or leaks() raised."""
    path = profiles["long_run"].save(tmp_path / "p.memprof")
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    doc = json.loads(members["meta.json"])
    doc["meta"][key] = value
    members["meta.json"] = json.dumps(doc).encode()
    msg = refused(_zip(tmp_path / "crafted.memprof", members), repr(key))
    assert len(msg) < 300


def _json_values():
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**64), max_value=2**64),
        st.floats(allow_nan=True),
        st.text(max_size=6),
        st.sampled_from(["cpu", "cuda:0", "input", "peak", "first"]),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(
                st.one_of(st.text(max_size=4), st.sampled_from(_FIELD_NAMES)), inner, max_size=4
            ),
        ),
        max_leaves=12,
    )


#: names the composite values use, so that the fuzz reaches past their first check
_FIELD_NAMES = sorted(
    {
        *S.LEAKS,
        "steps_per_window",
        "windows",
        "tables_steps",
        "kept",
        "window_errors",
        "missing_steps",
        "outside_torch_bytes",
        "reserved",
        "cpu",
        "cuda:0",
        "first",
        "last",
        "why",
    }
)


def _mutated(value):
    """A real value with one part replaced by a drawn one."""

    @st.composite
    def draw(draw_):
        v = json.loads(json.dumps(value))
        paths = [()]
        stack = [((), v)]
        while stack:
            where, x = stack.pop()
            items = (
                x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
            )
            for k, y in items:
                paths.append((*where, k))
                stack.append(((*where, k), y))
        path = draw_(st.sampled_from(paths))
        new = draw_(_json_values())
        if not path:
            return new
        parent = v
        for k in path[:-1]:
            parent = parent[k]
        parent[path[-1]] = new
        return v

    return draw()


def _works(p: Profile) -> None:
    str(p), repr(p), p.summary(), p.leaks(), p._repr_html_()


@pytest.mark.parametrize(
    "key",
    [
        "long_run",
        "leaks",
        "baseline_bytes",
        "untouched_bytes",
        "unreachable_bytes",
        "cuda_start",
        "cuda_end",
        "oom",
        "reserved_peak_bytes",
        "inferred_frees",
        "what_if",
    ],
)
def test_fuzzed_meta_loads_or_works(profiles, key):
    base = profiles["estimate"] if key == "oom" else profiles["long_run"]
    real = {
        "cuda_start": {"cuda:0": {"allocated": 1, "reserved": 2, "free": 3, "total": 9}},
        "cuda_end": {"cuda:0": {"outside_torch_bytes": 4}},
        "unreachable_bytes": {"cpu": 1},
        "reserved_peak_bytes": {"cpu": 5},
        "inferred_frees": {"cuda:0": {"blocks": 1, "unexplained_bytes": 2}},
        "what_if": {"dtype": "torch.bfloat16"},
    }.get(key, base.meta.get(key))

    @hypothesis.settings(max_examples=60, deadline=None, database=None)
    @hypothesis.given(st.one_of(_json_values(), _mutated(real)))
    def run(value):
        meta = json.loads(json.dumps(base.meta, default=str))
        meta[key] = value
        try:
            check_meta(meta, "p.memprof")
        except ProfileFileError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 300
            return
        _works(Profile(**base.tables, meta=meta))

    run()
