"""One profile per rank: a real two-process DDP step on the CPU, saved, loaded, compared."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from _spawn import HERE, spawn_ranks

import jupyter_memprof
from jupyter_memprof._analysis import schema as S
from jupyter_memprof._results.profile import Profile
from jupyter_memprof._results.profile_set import ProfileSet

WORLD = 2
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """Spawn two gloo ranks that each profile one DDP step and save ``rank{rank}``."""
    out = tmp_path_factory.mktemp("ddp")
    spawn_ranks("_ddp_worker.py", WORLD, str(out), TIMEOUT_S)
    return out


def test_each_rank_records_its_rank(ddp_run):
    for r in range(WORLD):
        meta = jupyter_memprof.load(ddp_run / f"rank{r}").meta
        assert (meta["rank"], meta["world_size"]) == (r, WORLD)


def test_load_many_concatenates_by_rank(ddp_run):
    ps = jupyter_memprof.load_many(str(ddp_run / "rank*"))
    assert isinstance(ps, ProfileSet) and ps.ranks == [0, 1] and len(ps) == 2
    for name, schema in S.TABLES.items():
        table = getattr(ps, name)
        assert list(table.columns) == ["rank", *schema]
        assert table["rank"].dtype == "int64"
        parts = [ps[r].tables[name] for r in ps.ranks]
        assert len(table) == sum(map(len, parts))
        for col, dtype in schema.items():
            if not (isinstance(dtype, str) and dtype in ("category", "object")):
                assert str(table[col].dtype) == str(parts[0][col].dtype), (name, col)
    a = ps.allocations
    back = a[a["rank"] == 1].drop(columns="rank").reset_index(drop=True)
    back["device"] = back["device"].cat.remove_unused_categories()
    pd.testing.assert_frame_equal(back, ps[1].allocations, check_categorical=False)
    # "{rank}" reads as a glob, a list of paths works, and the order comes from meta
    same = jupyter_memprof.load_many(str(ddp_run / "rank{rank}"))
    assert same.ranks == [0, 1]
    rev = jupyter_memprof.load_many([ddp_run / "rank1", ddp_run / "rank0"])
    assert rev.ranks == [0, 1] and rev[1].meta["rank"] == 1


def test_ranks_agree_on_parameters_and_buckets_hold_gradients(ddp_run):
    ps = jupyter_memprof.load_many(str(ddp_run / "rank*"))
    by_cat = ps.peak_by("category")
    assert list(by_cat.index) == [0, 1] and by_cat.index.name == "rank"
    params = 64 * 256 + 256 + 256 * 32 + 32
    assert (by_cat["parameter"] == params * 4).all()
    peaks = ps.peaks()
    for r in ps.ranks:
        prof = ps[r]
        unknown = by_cat.loc[r].get("unknown", 0)
        assert unknown <= 0.01 * peaks.loc[peaks["rank"] == r, "peak_bytes"].item()
        a = prof.allocations
        # DDP's gradient bucket (one: these parameters fit DDP's first bucket): the reducer
        # writes every gradient into it during backward, all-reduces it and copies it back
        # into .grad; it is a gradient
        buckets = a[a["reason"] == "gradient bucket, reduced across ranks in backward"]
        assert len(buckets) == 1, a[["size_bytes", "category", "reason", "name"]]
        assert (buckets["category"] == "gradient").all()
        assert int(buckets["size_bytes"].sum()) == params * 4
        grads = a[(a["reason"] == ".grad of a parameter") & a["free_ns"].isna()]
        assert int(grads["size_bytes"].sum()) == params * 4


def test_duckdb_over_the_parquet_folders(ddp_run):
    """The query in docs/guide/files.md: bytes at each rank's peak, by category, from the files."""
    duckdb = pytest.importorskip("duckdb")
    query = open(os.path.join(HERE, "..", "docs", "guide", "files.md"), encoding="utf-8").read()
    sql = query.split("```sql\n", 1)[1].split("```", 1)[0]
    run = str(ddp_run)
    con = duckdb.connect()
    got = con.execute(sql.replace("run/", run + "/")).df()
    ps = jupyter_memprof.load_many(f"{run}/rank*")
    expected = ps.peak_by("category")
    assert sorted(got["rank"].unique().tolist()) == [0, 1]
    for row in got.itertuples():
        assert expected.loc[row.rank, row.category] == row.bytes


def test_profile_set_without_ranks_uses_file_order(mlp_adam_profile, tmp_path):
    prof, _ = mlp_adam_profile
    a = prof.save(tmp_path / "a.memprof")
    b = Profile(**prof.tables, meta=dict(prof.meta)).save(tmp_path / "b", format="parquet")
    ps = jupyter_memprof.load_many([a, b])
    assert ps.ranks == [0, 1]
    wide = ps.peak_by("category")
    assert (wide.loc[0] == wide.loc[1]).all()
    assert wide.loc[0].to_dict() == {k: int(v) for k, v in prof.peak_by("category").items()}
    with pytest.raises(FileNotFoundError, match="no saved profiles match"):
        jupyter_memprof.load_many(str(tmp_path / "nothing*"))
    with pytest.raises(KeyError, match="no profile of rank 5"):
        ps[5]
    with pytest.raises(ValueError, match="ranks must be distinct"):
        ProfileSet([prof, prof], [0, 0])


def test_load_many_lists_every_rank_in_the_panel(ddp_run):
    """The panel lists the profiles of this kernel's session: each rank loaded is one entry,
    labelled with its rank, ready to compare with another; release() takes them out."""
    from jupyter_memprof._frontends import comm, session

    before = {sid for sid, _ in session.items()}
    ps = jupyter_memprof.load_many(str(ddp_run / "rank*"))
    added = {sid: p for sid, p in session.items() if sid not in before}
    assert sorted(p.meta["rank"] for p in added.values()) == [0, 1]
    labels = sorted(comm._info(sid, p)["label"] for sid, p in added.items())
    assert labels == ["rank 0", "rank 1"]  # as the ranks saved them: named once
    unnamed = jupyter_memprof.load(ddp_run / "rank1")
    unnamed.meta["label"] = "step"
    (ddp_run / "relabelled").mkdir(exist_ok=True)
    unnamed.save(ddp_run / "relabelled" / "rank1", format="parquet")
    one = jupyter_memprof.load_many([ddp_run / "relabelled" / "rank1"])
    assert one[1].label == "step (rank 1)" and one[1].session_id is not None
    jupyter_memprof.release(one[1])
    quiet = jupyter_memprof.load_many(str(ddp_run / "rank*"), panel=False)
    assert all(p.session_id is None for p in quiet.profiles)
    for p in ps.profiles:
        jupyter_memprof.release(p)
    assert not any(sid in added for sid, _ in session.items())
