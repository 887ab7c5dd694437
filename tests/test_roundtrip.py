"""Saved profiles round-trip, and every file ``load`` accepts works (issue 25, items 1 and 5).

A property test over real captures (with and without Python stacks, with and without
``nn.Module``, real CPU captures and estimates for a CUDA device) saves each profile in both
formats and loads it back: every table equal, dtypes and categories included. A fuzz test
mutates a saved profile's tables (a deterministic corpus) and runs every public method on
each mutated file ``load`` accepts: each works, or ``load`` refused the file with one
``ProfileFileError`` line.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import zipfile

import pandas as pd
import pytest
import torch

import jupyter_memprof
from jupyter_memprof import ProfileFileError

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

_CAPTURES: dict[tuple, object] = {}


class _Functional(torch.nn.Module):
    """A layer, for the captures with a module."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.fc(x))


def _step(model, w, x):
    """One training step: with a module (``model``) or on plain tensors (``w``)."""
    out = model(x) if model is not None else torch.relu(x @ w)
    out.sum().backward()


def _capture(stack: bool, module: bool, kind: str, width: int):
    """A real capture (kind ``cpu``) or an estimate for ``cuda:0`` (kind ``estimate``), made
    once per combination."""
    key = (stack, module, kind, width)
    if key not in _CAPTURES:
        torch.manual_seed(0)
        model = _Functional(width) if module else None
        w = torch.randn(width, width, requires_grad=True)
        x = torch.randn(4, width)
        if kind == "estimate":
            p = jupyter_memprof.estimate(_step, model, w, x, device="cuda:0")
        else:
            with jupyter_memprof.profile(
                with_stack=stack, namespace={"model": model, "w": w, "x": x}, label="rt"
            ) as p:
                _step(model, w, x)
        _CAPTURES[key] = p
    return _CAPTURES[key]


def _assert_same(a, b) -> None:
    for name in a.tables:
        pd.testing.assert_frame_equal(a.tables[name], b.tables[name], obj=name)
        assert a.tables[name].dtypes.to_dict() == b.tables[name].dtypes.to_dict(), name
    assert json.loads(json.dumps(a.meta, default=str)) == b.meta


@hypothesis.settings(max_examples=12, deadline=None, derandomize=True)
@hypothesis.given(
    stack=st.booleans(),
    module=st.booleans(),
    kind=st.sampled_from(["cpu", "estimate"]),
    width=st.sampled_from([8, 24]),
)
def test_every_table_round_trips_through_both_formats(stack, module, kind, width):
    # before: a Parquet save of a capture without stacks (no callsite in any row) or without
    # a module could not be loaded ("index 0 is out of bounds for axis 0 with size 0")
    p = _capture(stack, module, kind, width)
    if not stack and kind == "cpu":
        assert p.ops["callsite"].isna().all()
    if not module:
        assert p.ops["module"].isna().all()
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in ("zip", "parquet"):
            path = p.save(os.path.join(tmp, f"p.{fmt}"), format=fmt)
            _assert_same(p, jupyter_memprof.load(path))


# -- fuzz: every public method on every file load accepts -------------------------------------
def _exercise(p, tmp: str) -> None:
    """Every public method of a loaded profile (each must work)."""
    repr(p), p._repr_html_(), p.summary(), p.label, p.start_ns, p.end_ns
    devices = p.devices
    for device in [None, *devices]:
        p.peak(device)
        for by in ("category", "module", "op", "name"):
            p.peak_by(by, device)
    ids = p.allocations["alloc_id"].tolist()
    for alloc_id in ids[:2] + ids[-2:]:
        p.lineage(alloc_id)
        p.lineage_text(alloc_id)
    p.show()
    p.to_html(os.path.join(tmp, "p.html"), overwrite=True)
    if devices or p.meta.get("devices"):
        p.export(os.path.join(tmp, "p.raw.json.gz"), overwrite=True)
        p.export(os.path.join(tmp, "p.json"), overwrite=True)
    p.export(os.path.join(tmp, "p.trace.json"), overwrite=True)
    jupyter_memprof.diff(p, p)
    jupyter_memprof.compare(p, p).build()
    for fmt in ("zip", "parquet"):
        again = jupyter_memprof.load(p.save(os.path.join(tmp, f"again.{fmt}"), fmt, overwrite=True))
        _assert_same(p, again)


def _mutate(rng: random.Random, members: dict[str, bytes]) -> dict[str, bytes]:
    """One to three changes to the tables' rows: a value copied from another row or set to
    another value, a row dropped or repeated."""
    members = dict(members)
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(sorted(n for n in members if n != "meta.json"))
        doc = json.loads(members[name])
        data = doc["data"]
        rows = doc["rows"]
        if not rows:
            continue
        col = rng.choice(sorted(data))
        i, j = rng.randrange(rows), rng.randrange(rows)
        how = rng.choice(["copy", "value", "value", "drop", "repeat"])
        if how == "copy":
            data[col][i] = data[col][j]
        elif how == "value":
            data[col][i] = rng.choice([None, 0, 1, -1, 2**40, "cpu", "cuda:0", "activation", ""])
        else:
            for values in data.values():
                if how == "drop":
                    del values[i]
                else:
                    values.insert(i, values[i])
            doc["rows"] = len(next(iter(data.values())))
        members[name] = json.dumps(doc).encode()
    return members


# MEMPROF_FUZZ_FILES=500 MEMPROF_FUZZ_SEED=1 runs a longer search from another corpus
FUZZ_FILES = int(os.environ.get("MEMPROF_FUZZ_FILES", "80"))
FUZZ_SEED = int(os.environ.get("MEMPROF_FUZZ_SEED", "25"))


def test_every_public_method_works_on_every_file_load_accepts(tmp_path):
    # before: files that loaded and then broke: a device with blocks but no events (repr
    # raised), a block id twice (lineage_text), events of unknown blocks (export: KeyError,
    # compare: IndexError)
    base = _capture(True, True, "cpu", 8)
    path = base.save(tmp_path / "base.memprof")
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    rng = random.Random(FUZZ_SEED)
    loaded = 0
    for k in range(FUZZ_FILES):
        mutated = tmp_path / f"m{k}.memprof"
        with zipfile.ZipFile(mutated, "w", zipfile.ZIP_DEFLATED) as z:
            for n, data in _mutate(rng, members).items():
                z.writestr(n, data)
        try:
            p = jupyter_memprof.load(mutated)
        except ProfileFileError as exc:
            assert "\n" not in str(exc)
            continue
        loaded += 1
        work = tmp_path / f"w{k}"
        work.mkdir()
        try:
            _exercise(p, str(work))
        except Exception as exc:
            raise AssertionError(f"file {k} loads, then {type(exc).__name__}: {exc}") from exc
    assert loaded >= FUZZ_FILES // 4, loaded  # the corpus keeps testing loaded profiles
