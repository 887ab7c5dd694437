"""A long run's kept windows (``prof.kept``) are saved with the profile and load back.

Each distinct window is stored once under ``kept/<i>/`` (zip members or Parquet
subfolders); the window whose tables are the profile's own stores only its ``steps`` and
``leaks`` and shares the profile's other tables on load. A long run saved before ``leaks``
was a table (its rows in ``meta["leaks"]``) loads with the same leaks. A damaged or crafted ``kept_windows`` entry, or a
window's member missing or wrong, is one ``ProfileFileError`` line, as for the rest of a file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile

import pytest
import torch
from _loading import check_load, works
from _loading import refused as _refused
from _loading import zip_of as _zip

import jupyter_memprof
from jupyter_memprof import Profile
from jupyter_memprof._analysis import schema as S
from jupyter_memprof._results import checks, kept

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


@pytest.fixture(scope="module")
def run():
    """A long run of 5 Adam steps of a linear layer in windows of 2: kept first (steps
    0-1), peak and last."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(8, 16)
    cache = []
    ns = {"model": model, "opt": opt, "x": x, "cache": cache}
    with jupyter_memprof.profile(namespace=ns, steps=2, label="run") as prof:
        for _ in range(5):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            cache.append(torch.ones(256))
    return prof


@pytest.fixture(scope="module")
def saved(run, tmp_path_factory):
    """The run saved as a zip: its members."""
    path = run.save(tmp_path_factory.mktemp("kept") / "run.memprof")
    with zipfile.ZipFile(path) as z:
        return {name: z.read(name) for name in z.namelist()}


def _same(a: Profile, b: Profile) -> None:
    for name in S.TABLES:
        assert b.tables[name].equals(a.tables[name]), name
        assert list(b.tables[name].dtypes) == list(a.tables[name].dtypes), name
    assert b.meta == a.meta


# -- the round trip ----------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["zip", "parquet"])
def test_kept_windows_are_saved_and_load_back(run, tmp_path, fmt):
    assert list(run.kept) == ["first", "peak", "last"]
    first, peak, last = run.kept["first"], run.kept["peak"], run.kept["last"]
    assert first.steps["step"].tolist() == [0, 1]
    assert last.steps["step"].max() == run.steps["step"].max() > 1
    back = jupyter_memprof.load(run.save(tmp_path / f"run.{fmt}", format=fmt))
    assert list(back.kept) == list(run.kept)
    for what, p in run.kept.items():
        _same(p, back.kept[what])
    # the peak's window is the profile's own tables: stored once, shared again on load
    assert peak.ops is run.ops
    assert back.kept["peak"].ops is back.ops and back.kept["peak"].events is back.events
    assert back.kept["peak"].steps["step"].tolist() == peak.steps["step"].tolist()
    assert back.steps.equals(run.steps)  # the run's, not the window's
    assert len(back.steps) > len(back.kept["peak"].steps)
    assert back.kept["peak"].label == peak.label and "steps" in back.kept["peak"].label
    # windows shared by several kept steps stay one profile
    assert len({id(p) for p in back.kept.values()}) == len({id(p) for p in run.kept.values()})
    works(back)
    back.kept["first"].leaks()


def test_the_zip_stores_each_window_once_and_the_shared_one_as_its_steps(run, saved):
    doc = json.loads(saved["meta.json"])
    windows = doc["kept_windows"]
    # the cache grows every step: the highest peak is in the last window
    assert run.kept["peak"] is run.kept["last"] is not run.kept["first"]
    assert [w["keep"] for w in windows] == [["first"], ["peak", "last"]]
    for i, w in enumerate(windows):
        own = sorted(n for n in saved if n.startswith(f"kept/{i}/"))
        if w["shares_tables"]:
            assert own == [f"kept/{i}/leaks.json", f"kept/{i}/meta.json", f"kept/{i}/steps.json"]
        else:
            assert len(own) == len(S.TABLES) + 1
    assert sum(w["shares_tables"] for w in windows) == 1


def _as_saved_before_the_leaks_table(run, path: str, fmt: str) -> None:
    """Make the saved ``path`` as files were before ``leaks`` was a table: no ``leaks``
    member anywhere, the run's rows in ``meta["leaks"]`` (as plain JSON values)."""
    rows = json.loads(run.leaks().to_json(orient="records"))
    if fmt == "parquet":
        for folder, _, files in os.walk(path):
            if "leaks.parquet" in files:
                os.remove(os.path.join(folder, "leaks.parquet"))
        with open(os.path.join(path, "meta.json"), encoding="utf-8") as fh:
            doc = json.load(fh)
        doc["meta"]["leaks"] = rows
        with open(os.path.join(path, "meta.json"), "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        return
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist() if not n.endswith("leaks.json")}
    doc = json.loads(members["meta.json"])
    doc["meta"]["leaks"] = rows
    members["meta.json"] = json.dumps(doc).encode()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


@pytest.mark.parametrize("fmt", ["zip", "parquet"])
def test_a_long_run_saved_with_its_leaks_in_meta_loads_with_the_same_leaks(run, tmp_path, fmt):
    assert run.leaks()["holder"].tolist() == ["cache"] and "leaks" not in run.meta
    path = run.save(tmp_path / f"old.{fmt}", format=fmt)
    _as_saved_before_the_leaks_table(run, path, fmt)
    back = jupyter_memprof.load(path)
    assert back.leaks().equals(run.leaks())
    assert list(back.leaks().dtypes) == list(run.leaks().dtypes)
    assert "leaks" not in back.meta  # moved into the table: saved again, saved as one
    for what, p in run.kept.items():  # each window finds its own again from its tables
        assert back.kept[what].leaks().equals(p.leaks()), what
    again = jupyter_memprof.load(back.save(tmp_path / f"again.{fmt}", format=fmt))
    assert again.leaks().equals(run.leaks())


def test_a_profile_without_kept_windows_saves_as_before(tmp_path):
    with jupyter_memprof.profile(label="plain") as prof:
        torch.ones(100)
    path = prof.save(tmp_path / "plain.memprof")
    with zipfile.ZipFile(path) as z:
        assert not [n for n in z.namelist() if n.startswith("kept/")]
        assert "kept_windows" not in json.loads(z.read("meta.json"))
    assert jupyter_memprof.load(path).kept == {}
    folder = prof.save(tmp_path / "plain", format="parquet")
    assert "kept" not in os.listdir(folder) and jupyter_memprof.load(folder).kept == {}


def test_too_many_kept_windows_is_one_error_and_writes_nothing(tmp_path):
    prof = Profile.empty(label="many")
    prof.kept = {i: Profile.empty() for i in range(kept.MAX_WINDOWS + 1)}
    with pytest.raises(ValueError, match=f"at most {kept.MAX_WINDOWS} kept windows"):
        prof.save(tmp_path / "many.memprof")
    assert os.listdir(tmp_path) == []


def test_the_member_limit_holds_the_most_kept_windows():
    assert (kept.MAX_WINDOWS + 1) * (len(S.TABLES) + 1) <= checks.MAX_MEMBERS


# -- damaged or crafted files ------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, match",
    [
        ({"a": 1}, "lists its kept windows as"),
        ([[1]], "kept window 0 is"),
        ([{"keep": "first", "shares_tables": False}], "kept window 0 names its steps"),
        ([{"keep": ["middle"], "shares_tables": False}], "kept window 0 names its steps"),
        ([{"keep": [-1], "shares_tables": False}], "kept window 0 names its steps"),
        ([{"keep": [], "shares_tables": False}], "kept window 0 names its steps"),
        ([{"keep": ["first"], "shares_tables": 1}], "shares_tables is"),
        ([{"keep": ["first"], "shares_tables": True}] * 2, "names a step another window"),
        ([{"keep": [i], "shares_tables": True} for i in range(65)], "over 64"),
    ],
)
def test_a_bad_kept_windows_entry_is_one_line(saved, tmp_path, value, match):
    doc = json.loads(saved["meta.json"])
    doc["kept_windows"] = value
    path = _zip(tmp_path / "bad.memprof", {**saved, "meta.json": json.dumps(doc).encode()})
    _refused(path, match)


def test_a_kept_window_lacking_a_table_is_one_line(saved, tmp_path):
    members = {n: b for n, b in saved.items() if n != "kept/0/ops.json"}
    _refused(_zip(tmp_path / "lacks.memprof", members), "lacks the table kept/0/ops.json")
    members = {n: b for n, b in saved.items() if n != "kept/0/meta.json"}
    _refused(_zip(tmp_path / "lacks-meta.memprof", members), "lacks kept/0/meta.json")


def test_a_kept_windows_tables_are_checked_as_the_profiles_are(saved, tmp_path):
    ops = json.loads(saved["kept/0/ops.json"])
    ops["data"]["op_id"] = [i + 1 for i in ops["data"]["op_id"]]
    members = {**saved, "kept/0/ops.json": json.dumps(ops).encode()}
    _refused(_zip(tmp_path / "ops.memprof", members), "kept window 0: table 'ops' does not number")
    meta = json.loads(saved["kept/0/meta.json"])
    meta["meta"]["start_ns"] = "soon"
    members = {**saved, "kept/0/meta.json": json.dumps(meta).encode()}
    _refused(_zip(tmp_path / "meta.memprof", members), "metadata field 'start_ns'")
    meta["format"] = "other"
    members = {**saved, "kept/0/meta.json": json.dumps(meta).encode()}
    _refused(_zip(tmp_path / "format.memprof", members), "is not a saved jupyter_memprof profile")


def test_a_parquet_folder_lacking_a_kept_window_is_one_line(run, tmp_path):
    folder = run.save(tmp_path / "run", format="parquet")
    shutil.rmtree(os.path.join(folder, "kept", "1"))
    _refused(folder, "lacks kept/1/, a kept window it lists")
    os.remove(os.path.join(folder, "kept", "0", "ops.parquet"))
    _refused(folder, "lacks the table ops.parquet")


@hypothesis.settings(
    max_examples=int(os.environ.get("MEMPROF_HYPOTHESIS_EXAMPLES", "0")) or 40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
@hypothesis.given(data=st.data())
def test_a_mutated_long_run_loads_or_is_one_line(saved, data):
    name = data.draw(st.sampled_from(sorted(n for n in saved if n.endswith("meta.json"))))
    doc = json.loads(saved[name])
    windows = doc.get("kept_windows") or [{}]
    entry = windows[data.draw(st.integers(0, len(windows) - 1))]
    key = data.draw(st.sampled_from(["keep", "shares_tables", "meta", "format"]))
    value = data.draw(
        st.none()
        | st.booleans()
        | st.integers(-2, 70)
        | st.text(max_size=6)
        | st.lists(st.integers(-1, 9) | st.sampled_from(["first", "peak", "last", "x"]), max_size=3)
    )
    (doc if key in ("meta", "format") else entry)[key] = value
    with tempfile.TemporaryDirectory() as tmp:
        check_load(_zip(os.path.join(tmp, "m.memprof"), {**saved, name: json.dumps(doc).encode()}))
