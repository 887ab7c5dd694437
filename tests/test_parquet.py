"""Profiles saved as a folder of Parquet files: lossless, typed, readable by other tools."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

import jupyter_memprof
from jupyter_memprof._analysis import schema as S
from jupyter_memprof._io import WriteRefused
from jupyter_memprof._results.profile import Profile


def _assert_same(a: Profile, b: Profile) -> None:
    for name in S.TABLES:
        pd.testing.assert_frame_equal(a.tables[name], b.tables[name], check_exact=True)
    assert json.loads(json.dumps(a.meta, default=str)) == b.meta


def test_round_trip_is_lossless(mlp_adam_profile, tmp_path):
    prof, _ = mlp_adam_profile
    path = prof.save(tmp_path / "step", format="parquet")
    assert path == str(tmp_path / "step")
    assert sorted(os.listdir(path)) == sorted([*(f"{t}.parquet" for t in S.TABLES), "meta.json"])
    back = jupyter_memprof.load(path)
    _assert_same(prof, back)
    # the declared dtypes, vocabularies included (every value, in order)
    assert back.allocations["category"].dtype == S.CATEGORY_DTYPE
    assert back.ops["parent_id"].dtype == "Int64" and back.ops["module"].dtype == "string"
    assert back.ops["input_shapes"].tolist() == prof.ops["input_shapes"].tolist()
    assert back.peak_by("category").equals(prof.peak_by("category"))
    # the zip and the folder hold the same profile
    _assert_same(jupyter_memprof.load(prof.save(tmp_path / "step.memprof")), back)


def test_columns_are_typed_for_other_tools(mlp_adam_profile, tmp_path):
    import pyarrow.parquet as pq

    prof, _ = mlp_adam_profile
    path = prof.save(tmp_path / "p", format="parquet")
    schema = pq.read_schema(os.path.join(path, "allocations.parquet"))
    assert str(schema.field("size_bytes").type) == "int64"
    assert str(schema.field("alloc_ns").type) == "int64"  # nullable, not float
    assert str(schema.field("category").type).startswith("dictionary<values=string")
    assert schema.field("category").type.ordered
    assert str(schema.field("reason").type) in ("string", "large_string")
    ops = pq.read_table(os.path.join(path, "ops.parquet"))
    assert json.loads(ops.column("input_shapes")[0].as_py()) == prof.ops["input_shapes"][0]


def test_empty_profile_round_trip(tmp_path):
    empty = Profile.empty(label="nothing")
    back = jupyter_memprof.load(empty.save(tmp_path / "e", format="parquet"))
    _assert_same(empty, back)


def test_a_text_column_with_no_text_at_all_round_trips(mlp_adam_profile, tmp_path):
    """A table whose text column is missing in every row (an estimate of one op outside any
    module has no ``module``) is a dictionary column with an empty dictionary."""
    prof, _ = mlp_adam_profile
    ops = prof.ops.copy()
    ops["module"] = pd.array([None] * len(ops), dtype=S.STRING)
    one = Profile(**{**prof.tables, "ops": ops}, meta=prof.meta)
    back = jupyter_memprof.load(one.save(tmp_path / "one", format="parquet"))
    _assert_same(one, back)


def test_rank_in_the_path(mlp_adam_profile, tmp_path):
    prof, _ = mlp_adam_profile
    ranked = Profile(**prof.tables, meta={**prof.meta, "rank": 1, "world_size": 2})
    assert ranked.save(tmp_path / "rank{rank}", format="parquet") == str(tmp_path / "rank1")
    assert jupyter_memprof.load(tmp_path / "rank1").meta["rank"] == 1
    assert prof.save(tmp_path / "r{rank}.memprof").endswith("r0.memprof")


def test_replacing_and_refusing(mlp_adam_profile, tmp_path):
    prof, _ = mlp_adam_profile
    target = tmp_path / "run"
    prof.save(target, format="parquet")
    prof.save(target, format="parquet")  # our own folder: replaced
    other = tmp_path / "data"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(WriteRefused, match="overwrite=True"):
        prof.save(other, format="parquet")
    assert os.listdir(other) == ["keep.txt"]
    with pytest.raises(ValueError, match="unknown format 'csv'"):
        prof.save(tmp_path / "x", format="csv")
    with pytest.raises(FileNotFoundError):
        prof.save(tmp_path / "missing" / "x", format="parquet")
    assert sorted(os.listdir(tmp_path)) == ["data", "run"]


def test_damaged_folders_give_one_clear_error(mlp_adam_profile, tmp_path):
    prof, _ = mlp_adam_profile
    with pytest.raises(jupyter_memprof.ProfileFileError, match="without meta.json"):
        jupyter_memprof.load(tmp_path)
    path = prof.save(tmp_path / "p", format="parquet")
    os.remove(os.path.join(path, "flows.parquet"))
    with pytest.raises(jupyter_memprof.ProfileFileError, match="lacks the table flows"):
        jupyter_memprof.load(path)
    with open(os.path.join(path, "flows.parquet"), "wb") as fh:
        fh.write(b"not parquet")
    with pytest.raises(jupyter_memprof.ProfileFileError, match="not a readable table"):
        jupyter_memprof.load(path)
    with open(os.path.join(path, "meta.json"), "w") as fh:
        json.dump({"format": "jupyter_memprof.parquet", "format_version": 99}, fh)
    with pytest.raises(jupyter_memprof.ProfileFileError, match="newer jupyter_memprof"):
        jupyter_memprof.load(path)
