"""The checks a saved profile's tables pass on load, on both ways of finding blocks by id.

The analysis numbers blocks 0, 1, 2, ...: the load checks then find a block's row by its id
(no sort); any other numbering is searched. Each contradiction is refused on both, with
the same line, and a profile whose ids are only renumbered loads the same.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import jupyter_memprof
from jupyter_memprof import ProfileFileError


@pytest.fixture(scope="module")
def prof():
    """One small real capture (a linear layer's forward and backward)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    x = torch.randn(4, 8)
    with jupyter_memprof.profile(namespace={"model": model, "x": x}, label="tiny") as p:
        model(x).sum().backward()
    return p


def _rewrite(folder, name: str, change) -> None:
    """Replace the table ``name`` of the Parquet profile ``folder`` by ``change(df)``."""
    file = f"{folder}/{name}.parquet"
    df = change(pq.read_table(file).to_pandas().copy(deep=True))
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), file)


def _spread(df, column: str):
    """The block ids of ``column`` as 10, 13, 16, ...: not 0, 1, 2, ..."""
    df[column] = df[column] * 3 + 10
    return df


@pytest.fixture(params=["numbered", "spread"])
def folder(request, prof, tmp_path):
    """The profile saved as a Parquet folder, its block ids as saved or spread out."""
    path = prof.save(tmp_path / "p", format="parquet")
    if request.param == "spread":
        _rewrite(path, "allocations", lambda df: _spread(df, "alloc_id"))
        _rewrite(path, "events", lambda df: _spread(df, "alloc_id"))
        for name in ("versions", "uses", "names"):
            _rewrite(path, name, lambda df: _spread(df, "alloc_id"))
    return path


def _refused(path, text: str) -> None:
    with pytest.raises(ProfileFileError, match=text) as err:
        jupyter_memprof.load(path)
    assert "\n" not in str(err.value)


def test_renumbered_blocks_load_the_same(prof, folder):
    got = jupyter_memprof.load(folder)
    assert len(got.allocations) == len(prof.allocations) > 0
    assert got.allocations["size_bytes"].tolist() == prof.allocations["size_bytes"].tolist()
    assert got.peak_by("category").to_dict() == prof.peak_by("category").to_dict()


def test_a_block_twice(folder):
    def change(df):
        df.loc[1, "alloc_id"] = df.loc[0, "alloc_id"]
        return df

    _rewrite(folder, "allocations", change)
    _refused(folder, "names a block twice")


def test_an_event_of_an_unknown_block(folder):
    def change(df):
        df.loc[len(df) - 1, "alloc_id"] = 10**6
        return df

    _rewrite(folder, "events", change)
    _refused(folder, "column 'alloc_id' names a block that is not in 'allocations'")


def test_a_negative_block_id(folder):
    def change(df):
        df.loc[0, "alloc_id"] = -5
        return df

    _rewrite(folder, "events", change)
    _refused(folder, "names a block that is not in 'allocations'")


def test_a_block_without_events(folder):
    def change(df):
        first = df["alloc_id"].iloc[0]
        return df[df["alloc_id"] != first].reset_index(drop=True)

    _rewrite(folder, "events", change)
    _refused(folder, "holds a block without events")


def test_an_event_on_another_device_than_its_block(folder):
    def change(df):
        df["device"] = df["device"].cat.add_categories(["cuda:0"])
        df.loc[len(df) - 1, "device"] = "cuda:0"
        return df

    _rewrite(folder, "events", change)
    _refused(folder, "puts a block on another device than 'allocations' does")


def test_a_timeline_device_without_events(folder):
    def change(df):
        df["device"] = df["device"].cat.add_categories(["cuda:3"])
        df.loc[0, "device"] = "cuda:3"
        return df

    _rewrite(folder, "timeline", change)
    _refused(folder, "'timeline' names a device that has no events")


def test_a_timeline_device_listed_but_unused_loads(folder):
    def change(df):
        df["device"] = df["device"].cat.add_categories(["cuda:3"])
        return df

    _rewrite(folder, "timeline", change)
    assert len(jupyter_memprof.load(folder).timeline) > 0


def test_a_category_outside_the_vocabulary(folder):
    # a Parquet dictionary may list a value no row uses: only a used one is refused
    def unused(df):
        df["category"] = df["category"].cat.add_categories(["bogus"])
        return df

    def used(df):
        df.loc[0, "category"] = "bogus"
        return df

    _rewrite(folder, "allocations", unused)
    assert "bogus" not in set(jupyter_memprof.load(folder).allocations["category"].cat.categories)
    _rewrite(folder, "allocations", used)
    _refused(folder, "column 'category' holds 'bogus', not one of")


def test_every_column_of_a_loaded_profile_can_be_written(prof, tmp_path):
    # the columns are read without a copy of the whole table: each must still be the
    # table's own writable array (pyarrow hands over read-only views)
    got = jupyter_memprof.load(prof.save(tmp_path / "p", format="parquet"))
    for df in got.tables.values():
        if df.empty:
            continue
        for col in df.columns:
            value = df[col].iloc[-1]
            if isinstance(value, list):  # ops.input_shapes: a list is not one value to .loc
                continue
            df.loc[0, col] = value
            assert df[col].iloc[0] is value or df[col].iloc[0] == value or value != value
        assert df.equals(df.copy())
