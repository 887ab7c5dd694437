"""Loading damaged or crafted files (issue 13, item 2) and saving safely (item 4, `save`).

Every damaged or hostile file or folder given to ``jupyter_memprof.load`` raises one
``ProfileFileError`` line naming the file; a profile that loads works (repr, peak, peak_by);
sizes are checked before anything is decompressed; ``save`` is atomic and refuses to replace
a file that is not a saved profile.
"""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import tempfile
import threading
import time
import zipfile

import pytest
import torch
from _loading import check_load, works
from _loading import refused as _refused
from _loading import zip_of as _zip

import jupyter_memprof
from jupyter_memprof import ProfileFileError
from jupyter_memprof._io import WriteRefused

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


@pytest.fixture(scope="module")
def prof():
    """One small real capture (a linear layer's forward and backward)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    x = torch.randn(4, 8)
    with jupyter_memprof.profile(namespace={"model": model, "x": x}, label="tiny") as p:
        model(x).sum().backward()
    return p


@pytest.fixture(scope="module")
def saved(prof, tmp_path_factory):
    """The profile saved once as a zip: its bytes and its members."""
    path = prof.save(tmp_path_factory.mktemp("zip") / "p.memprof")
    with open(path, "rb") as fh:
        data = fh.read()
    with zipfile.ZipFile(path) as z:
        members = {name: z.read(name) for name in z.namelist()}
    return data, members


@pytest.fixture(scope="module")
def folder(prof, tmp_path_factory):
    return prof.save(tmp_path_factory.mktemp("pq") / "p", format="parquet")


def _with_json(saved, path, member: str, change) -> str:
    """The saved zip with ``change(doc)`` applied to one member's JSON (or its return)."""
    members = dict(saved[1])
    doc = json.loads(members[member])
    out = change(doc)
    members[member] = json.dumps(doc if out is None else out).encode()
    return _zip(path, members)


# -- the zip: one test per kind of damage ----------------------------------------------------
def test_meta_document_not_an_object(saved, tmp_path):
    # before: AttributeError ('list' object has no attribute 'get')
    members = {**saved[1], "meta.json": b"[1, 2]"}
    _refused(_zip(tmp_path / "p.memprof", members), "not a saved jupyter_memprof profile")


def test_inner_meta_not_an_object(saved, tmp_path):
    # before: loaded, then repr(prof) raised AttributeError
    path = _with_json(saved, tmp_path / "p.memprof", "meta.json", lambda d: d.update(meta=[1]))
    _refused(path, "metadata is not a JSON object")


@pytest.mark.parametrize(
    "field,value",
    [
        ("start_ns", "soon"),
        ("end_ns", 1.5),
        ("devices", "cpu"),
        ("oom", {"device": 1}),
        ("analysis_interrupted", "yes"),  # read by the summary and the magic
        ("stop_error", ["x"]),
        ("inferred_frees", {"cuda:0": {"blocks": -1}}),  # read by the summary
        ("inferred_frees", {"gpu": {"blocks": 1}}),
    ],
)
def test_meta_field_of_the_wrong_type(saved, tmp_path, field, value):
    # before: loaded, then prof.start_ns / repr(prof) / the summary raised
    path = _with_json(
        saved, tmp_path / "p.memprof", "meta.json", lambda d: d["meta"].update({field: value})
    )
    _refused(path, f"metadata field {field!r}")


def test_a_device_that_is_no_device_name(saved, tmp_path):
    # before: "cpu" flipped to "bpu" loaded, then prof.peak() raised ValueError
    def change(d):
        d["data"]["device"] = ["bpu" if v == "cpu" else v for v in d["data"]["device"]]

    path = _with_json(saved, tmp_path / "p.memprof", "allocations.json", change)
    _refused(path, "device 'bpu'")


def test_a_path_the_system_refuses_is_one_error(tmp_path):
    # before: ValueError from os.stat (embedded null byte), outside the promised errors
    with pytest.raises(ProfileFileError, match="cannot be read"):
        jupyter_memprof.load(str(tmp_path / "p\0.memprof"))


def test_format_version_not_a_number(saved, tmp_path):
    # before: TypeError ('>' not supported between str and int)
    path = _with_json(
        saved, tmp_path / "p.memprof", "meta.json", lambda d: d.update(format_version="1")
    )
    _refused(path, "format_version")


def test_table_that_is_a_list(saved, tmp_path):
    # before: TypeError (list indices must be integers)
    path = _with_json(saved, tmp_path / "p.memprof", "ops.json", lambda d: [d])
    _refused(path, "table 'ops' is not a table")


def test_text_in_an_integer_column(saved, tmp_path):
    # before: ValueError (invalid literal for int())
    def change(d):
        d["data"]["size_bytes"][0] = "lots"

    _refused(_with_json(saved, tmp_path / "p.memprof", "events.json", change), "not integers")


def test_huge_integer(saved, tmp_path):
    # before: OverflowError (Python int too large to convert to C long)
    def change(d):
        d["data"]["size_bytes"][0] = 10**30

    _refused(_with_json(saved, tmp_path / "p.memprof", "events.json", change), "64-bit range")


def test_columns_of_different_lengths(saved, tmp_path):
    # before: ValueError (All arrays must be of the same length)
    def change(d):
        d["data"]["size_bytes"].append(1)

    _refused(_with_json(saved, tmp_path / "p.memprof", "events.json", change), "rows")


def test_deep_nesting(saved, tmp_path):
    # before: RecursionError
    members = dict(saved[1])
    text = members["ops.json"].decode()
    deep = "[" * 100_000 + "]" * 100_000
    members["ops.json"] = text.replace(
        '"input_shapes": [', f'"input_shapes": [{deep}, ', 1
    ).encode()
    _refused(_zip(tmp_path / "p.memprof", members), "nests too deeply")


def test_moderate_nesting_in_input_shapes(saved, tmp_path):
    # before: loaded (900 levels), then anything walking the shapes could hit the recursion limit
    def change(d):
        d["data"]["input_shapes"][0] = json.loads("[" * 900 + "]" * 900)

    _refused(_with_json(saved, tmp_path / "p.memprof", "ops.json", change), "nested at most")


def test_invalid_utf8(saved, tmp_path):
    # before: UnicodeDecodeError
    members = {**saved[1], "names.json": b'{"data": {"name": ["\xff\xfe"]}}'}
    _refused(_zip(tmp_path / "p.memprof", members), "not UTF-8")


def test_lone_surrogate_in_a_label(saved, tmp_path):
    # before: loaded; printing the profile raised UnicodeEncodeError
    members = dict(saved[1])
    members["meta.json"] = members["meta.json"].replace(b'"tiny"', b'"\\ud800"')
    _refused(_zip(tmp_path / "p.memprof", members), "metadata field 'label'")


def test_op_reference_out_of_range(saved, tmp_path):
    # before: loaded, then prof.peak() raised IndexError
    def change(d):
        d["data"]["alloc_op_id"] = [10**9 if v is not None else v for v in d["data"]["alloc_op_id"]]

    path = _with_json(saved, tmp_path / "p.memprof", "allocations.json", change)
    _refused(path, "names an op that is not in 'ops'")


def test_device_that_is_not_a_device(saved, tmp_path):
    # before: loaded, then repr(prof) raised ValueError (int('²') in the device order)
    def change(d):
        d["data"]["device"] = ["cuda:²" for _ in d["data"]["device"]]

    path = _with_json(saved, tmp_path / "p.memprof", "events.json", change)
    _refused(path, "not a device")


def test_corrupt_deflate_data(saved, tmp_path):
    # before: zlib.error (not a BadZipFile)
    data = bytearray(saved[0])
    with zipfile.ZipFile(io.BytesIO(saved[0])) as z:
        info = z.getinfo("ops.json")
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start : start + 8] = b"\xff" * 8  # block type 3: invalid
    path = tmp_path / "p.memprof"
    path.write_bytes(bytes(data))
    _refused(path)


def test_fifo_as_the_path(tmp_path):
    # before: open() blocked forever
    path = tmp_path / "p.memprof"
    os.mkfifo(path)
    result = []

    def run():
        try:
            jupyter_memprof.load(path)
        except Exception as exc:
            result.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    assert result and isinstance(result[0], ProfileFileError), result
    assert "not a regular file" in str(result[0])


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        jupyter_memprof.load(tmp_path / "nothing.memprof")


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_decompression_bomb(saved, tmp_path):
    # before: loaded the 300 MB member (about 600 MB of memory) before failing on it
    path = tmp_path / "bomb.memprof"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in saved[1].items():
            if name != "ops.json":
                z.writestr(name, data)
        chunk = b" " * 2**20
        with z.open("ops.json", "w") as f:
            for _ in range(300):
                f.write(chunk)
    assert os.path.getsize(path) < 2**20
    before = _max_rss_mb()
    t0 = time.perf_counter()
    _refused(path, "refusing to decompress")
    assert time.perf_counter() - t0 < 2
    assert _max_rss_mb() - before < 30


def test_header_that_lies_about_its_size(saved, tmp_path):
    # (held before too: zipfile stops at the declared size.) The data inflates to 50 MB, its
    # headers say 1000 bytes: the read stops there and the CRC refuses it.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in saved[1].items():
            z.writestr(name, b" " * 50 * 2**20 if name == "flows.json" else data)
    data = bytearray(buf.getvalue())
    size = (50 * 2**20).to_bytes(4, "little")
    assert data.count(size) >= 2  # the local header and the central directory
    data = data.replace(size, (1000).to_bytes(4, "little"))
    path = tmp_path / "liar.memprof"
    path.write_bytes(bytes(data))
    before = _max_rss_mb()
    _refused(path)
    assert _max_rss_mb() - before < 30


# -- the Parquet folder ------------------------------------------------------------------------
def _copy(folder, tmp_path) -> str:
    return shutil.copytree(folder, tmp_path / "copy")


def _rewrite(path: str, table: str, change) -> None:
    import pyarrow.parquet as pq

    file = os.path.join(path, f"{table}.parquet")
    t = change(pq.read_table(file))
    pq.write_table(t, file)


def test_parquet_deep_nested_input_shapes(folder, tmp_path):
    # before: RecursionError from the JSON decoder
    import pyarrow as pa

    path = _copy(folder, tmp_path)
    deep = "[" * 100_000 + "]" * 100_000

    def change(t):
        col = t.column("input_shapes").to_pylist()
        col[0] = deep
        i = t.schema.get_field_index("input_shapes")
        return t.set_column(i, "input_shapes", pa.array(col, pa.string()))

    _rewrite(path, "ops", change)
    _refused(path, "nests too deeply")


def test_parquet_integer_out_of_range(folder, tmp_path):
    # before: loaded 2**64 - 1 as -1 (a silent wrap) or raised OverflowError
    import pyarrow as pa

    path = _copy(folder, tmp_path)

    def change(t):
        n = len(t)
        i = t.schema.get_field_index("size_bytes")
        return t.set_column(i, "size_bytes", pa.array([2**64 - 1] * n, pa.uint64()))

    _rewrite(path, "events", change)
    _refused(path, "64-bit range")


def test_parquet_meta_field_of_the_wrong_type(folder, tmp_path):
    # before: loaded, then prof.start_ns raised ValueError
    path = _copy(folder, tmp_path)
    meta = os.path.join(path, "meta.json")
    with open(meta) as fh:
        doc = json.load(fh)
    doc["meta"]["start_ns"] = "soon"
    with open(meta, "w") as fh:
        json.dump(doc, fh)
    _refused(path, "metadata field 'start_ns'")


def test_parquet_folder_where_a_table_file_should_be(folder, tmp_path):
    # before: pyarrow read the folder as a dataset of every file in it
    path = _copy(folder, tmp_path)
    os.remove(os.path.join(path, "ops.parquet"))
    shutil.copytree(folder, os.path.join(path, "ops.parquet"))
    os.rename(
        os.path.join(path, "ops.parquet", "ops.parquet"), os.path.join(path, "ops.parquet", "x")
    )
    _refused(path, "is a folder")


def test_parquet_size_bomb(folder, tmp_path):
    # before: read 10 million rows (240 MB) declared by a file of a few kB
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = _copy(folder, tmp_path)
    batch = pa.table(
        {
            c: pa.array(np.zeros(1_000_000, dtype=np.int64))
            for c in ("seq_nr", "forward_op_id", "backward_op_id")
        }
    )
    with pq.ParquetWriter(
        os.path.join(path, "flows.parquet"), batch.schema, compression="zstd"
    ) as w:
        for _ in range(10):
            w.write_table(batch)
    del batch
    assert os.path.getsize(os.path.join(path, "flows.parquet")) < 2**20
    before = _max_rss_mb()
    t0 = time.perf_counter()
    _refused(path, "refusing to decompress")
    assert time.perf_counter() - t0 < 2
    assert _max_rss_mb() - before < 30


# -- saving --------------------------------------------------------------------------------
def test_failed_save_leaves_the_previous_file(prof, tmp_path, monkeypatch):
    from jupyter_memprof._results import storage as _storage

    path = prof.save(tmp_path / "p.memprof")
    before = open(path, "rb").read()
    calls = []
    real = _storage._table_to_json

    def fail_third(df):
        calls.append(1)
        if len(calls) == 3:
            raise TypeError("cannot serialise this table")
        return real(df)

    monkeypatch.setattr(_storage, "_table_to_json", fail_third)
    with pytest.raises(TypeError, match="cannot serialise"):
        prof.save(path)
    assert open(path, "rb").read() == before  # before: emptied, then half written
    assert os.listdir(tmp_path) == ["p.memprof"]  # no temporary file left
    monkeypatch.undo()
    works(jupyter_memprof.load(path))


def test_save_refuses_to_replace_other_files(prof, tmp_path):
    notes = tmp_path / "notes.ipynb"
    notes.write_text('{"cells": []}')
    with pytest.raises(WriteRefused, match="overwrite=True"):  # before: replaced silently
        prof.save(notes)
    assert notes.read_text() == '{"cells": []}'
    path = prof.save(tmp_path / "p.memprof")
    assert prof.save(path) == path  # a saved profile is replaced
    assert prof.save(notes, overwrite=True) == str(notes)
    assert jupyter_memprof.load(notes).label == "tiny"


# -- property-based: mutated valid files load or raise ProfileFileError ---------------------
_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(["cpu", "cuda:0", "cuda:²", "activation", "alloc", "", "\ud800"]),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=6,
)


def _mutate_json(data, doc):
    """Replace, delete or add one value somewhere in ``doc`` (drawn by hypothesis)."""
    root = [doc]
    parent, key = root, 0
    node = doc
    while isinstance(node, (dict, list)) and node and data.draw(st.integers(0, 3)) > 0:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        parent, key = node, data.draw(st.sampled_from(keys))
        node = node[key]
    how = data.draw(st.sampled_from(["replace", "delete", "append"]))
    if how == "delete" and parent is not root:
        del parent[key]
    elif how == "append" and isinstance(node, list):
        node.append(data.draw(_json_values))
    else:
        parent[key] = data.draw(_json_values)
    return root[0]


def _bytes_mutation(data, raw: bytes) -> bytes:
    how = data.draw(st.sampled_from(["flip", "truncate", "zero"]))
    at = data.draw(st.integers(0, max(len(raw) - 1, 0)))
    if how == "truncate":
        return raw[:at]
    b = bytearray(raw)
    if how == "flip":
        b[at] ^= data.draw(st.integers(1, 255))
    else:
        b[at : at + data.draw(st.integers(1, 64))] = b"\0" * 64
    return bytes(b)


# MEMPROF_HYPOTHESIS_EXAMPLES=2000 runs a longer, randomised search
_EXAMPLES = int(os.environ.get("MEMPROF_HYPOTHESIS_EXAMPLES", "0"))
_SETTINGS = hypothesis.settings(
    max_examples=_EXAMPLES or 120,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow, hypothesis.HealthCheck.data_too_large],
    derandomize=not _EXAMPLES,
)


@_SETTINGS
@hypothesis.given(data=st.data())
def test_mutated_zip_loads_or_raises_profile_file_error(saved, data):
    raw, members = saved
    kind = data.draw(st.sampled_from(["bytes", "member", "json", "json", "json"]))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.memprof")
        if kind == "bytes":
            with open(path, "wb") as fh:
                fh.write(_bytes_mutation(data, raw))
        elif kind == "member":
            name = data.draw(st.sampled_from(sorted(members)))
            other = data.draw(st.sampled_from(sorted(members)) | st.just(None))
            new = dict(members)
            if other is None:
                del new[name]
            else:
                new[name] = members[other]
            _zip(path, new)
        else:
            name = data.draw(st.sampled_from(sorted(members)))
            doc = _mutate_json(data, json.loads(members[name]))
            _zip(path, {**members, name: json.dumps(doc).encode("utf-8", "surrogatepass")})
        check_load(path)


@_SETTINGS
@hypothesis.given(data=st.data())
def test_mutated_parquet_folder_loads_or_raises_profile_file_error(folder, data):
    names = sorted(os.listdir(folder))
    with tempfile.TemporaryDirectory() as tmp:
        path = shutil.copytree(folder, os.path.join(tmp, "p"))
        name = data.draw(st.sampled_from(names))
        file = os.path.join(path, name)
        with open(file, "rb") as fh:
            raw = fh.read()
        if name == "meta.json" and data.draw(st.booleans()):
            doc = _mutate_json(data, json.loads(raw))
            raw = json.dumps(doc).encode("utf-8", "surrogatepass")
        else:
            raw = _bytes_mutation(data, raw)
        with open(file, "wb") as fh:
            fh.write(raw)
        check_load(path)


# -- issue 25: memory bounded before anything is built ---------------------------------------
def _peak_mb(fn) -> float:
    """The peak of memory traced (Python objects, numpy and pandas buffers) while ``fn``
    runs, in MiB."""
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak / 2**20


@pytest.mark.parametrize("rows", [10**8, 10**9])
def test_declared_rows_are_checked_before_missing_columns_are_filled(saved, tmp_path, rows):
    # before: [None] * rows for the column the file lacks: 3.2 GB and 6 s at 1e8 rows,
    # MemoryError at 1e9
    def change(d):
        del d["data"]["module"]  # a column added after format 1: filled with NA on load
        d["rows"] = rows

    path = _with_json(saved, tmp_path / "p.memprof", "allocations.json", change)
    assert os.path.getsize(path) < 20_000
    assert _peak_mb(lambda: _refused(path, f"not {rows}")) < 5


def test_many_json_values_are_refused_before_parsing(saved, tmp_path):
    # before: 31 MiB of "[]," (45 kB zipped) parsed into 10 million lists: 1.6 GB
    members = dict(saved[1])
    text = members["ops.json"].decode()
    lists = "[" + "[]," * (10 * 2**20 + 1) + "[]]"
    members["ops.json"] = text.replace('"input_shapes": [', f'"input_shapes": [{lists}, ', 1)
    path = _zip(tmp_path / "p.memprof", {n: (d.encode() if isinstance(d, str) else d)
                                         for n, d in members.items()})  # fmt: skip
    assert os.path.getsize(path) < 100_000
    msg = []
    # the member (31 MiB, within the declared sizes) is counted as it is read, never held
    assert _peak_mb(lambda: msg.append(_refused(path, "refusing to parse"))) < 10
    assert msg[0] == (
        f"{path}: ops.json brings the values in the file over 1,048,576 (at most 8 per byte "
        "of the file, or 1,048,576); refusing to parse it"
    )


def _one_long_text(path: str, fmt: str, length: int) -> None:
    """Set ``ops.name`` of the first op of the profile at ``path`` to ``length`` letters."""
    if fmt == "zip":
        with zipfile.ZipFile(path) as z:
            members = {n: z.read(n) for n in z.namelist()}
        doc = json.loads(members["ops.json"])
        doc["data"]["name"][0] = "a" * length
        members["ops.json"] = json.dumps(doc).encode()
        _zip(path + ".tmp", members)
        os.replace(path + ".tmp", path)
        return
    import pyarrow as pa

    def change(t):
        names = t.column("name").to_pylist()
        names[0] = "a" * length
        i = t.schema.get_field_index("name")
        return t.set_column(i, "name", pa.array(names).dictionary_encode())

    _rewrite(path, "ops", change)


@pytest.mark.parametrize("fmt", ["zip", "parquet"])
def test_an_over_long_text_value_is_refused(prof, tmp_path, fmt):
    # before: a 55 kB Parquet folder whose ops.name dictionary held one 8 MiB string loaded,
    # then to_html allocated 8.3 GiB (views lay text out at its longest value per row)
    path = prof.save(tmp_path / f"p.{fmt}", format=fmt)
    _one_long_text(path, fmt, 8 * 2**20)
    size = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file())
    assert size < 2**20  # a small file (snappy, as pyarrow writes by default)
    msg = []
    assert _peak_mb(lambda: msg.append(_refused(path, "over the 65,536"))) < 60
    assert "8,388,608 characters" in msg[0] and "'name'" in msg[0]


def test_rows_times_the_longest_text_is_bounded(saved, tmp_path):
    # a value under the per-value cap in a table of many rows: views would lay out
    # rows x 64 Ki characters, over what the file's size allows
    def change(d):
        data = d["data"]
        n = d["rows"]
        for col, values in data.items():
            data[col] = (values * (1 + 1000 // n))[:1000]
        data["op_id"] = list(range(1000))
        data["callsite"][0] = "c" * 60_000
        d["rows"] = 1000

    path = _with_json(saved, tmp_path / "p.memprof", "ops.json", change)
    assert _peak_mb(lambda: _refused(path, "spells out more text")) < 40


# -- issue 25: crafted files that loaded, then broke ----------------------------------------
def test_a_device_with_blocks_but_no_events(saved, tmp_path):
    # before: loaded, then repr(prof) raised
    def change(d):
        data = d["data"]
        for values in data.values():
            values.append(values[0])
        data["alloc_id"][-1] = max(data["alloc_id"]) + 1
        data["device"][-1] = "cuda:0"
        d["rows"] += 1

    path = _with_json(saved, tmp_path / "p.memprof", "allocations.json", change)
    _refused(path, "a block without events")


def test_a_block_id_twice(saved, tmp_path):
    # before: loaded, then lineage_text raised
    def change(d):
        d["data"]["alloc_id"][1] = d["data"]["alloc_id"][0]

    path = _with_json(saved, tmp_path / "p.memprof", "allocations.json", change)
    _refused(path, "names a block twice")


def test_events_of_unknown_blocks(saved, tmp_path):
    # before: loaded, then export raised KeyError and compare IndexError
    def change(d):
        d["data"]["alloc_id"][-1] = 10**6

    path = _with_json(saved, tmp_path / "p.memprof", "events.json", change)
    _refused(path, "names a block that is not in 'allocations'")


def test_an_event_without_an_action(saved, tmp_path):
    # before: loaded, then export raised KeyError: nan (found by the fuzz test)
    def change(d):
        d["data"]["action"][0] = None

    path = _with_json(saved, tmp_path / "p.memprof", "events.json", change)
    _refused(path, "column 'action' has missing values")


# -- issue 25: odd arguments --------------------------------------------------------------------
def test_a_bytes_path_loads(prof, tmp_path):
    # before: AttributeError ('bytes' object has no attribute 'isprintable')
    for fmt in ("zip", "parquet"):
        path = prof.save(os.fsencode(tmp_path / f"p.{fmt}"), format=fmt)
        assert jupyter_memprof.load(os.fsencode(path)).label == "tiny"


def test_a_parquet_folder_whose_name_is_not_utf8(prof, tmp_path):
    # before: UnicodeEncodeError from pyarrow
    path = os.path.join(tmp_path, os.fsdecode(b"run-\xff\xfe"))
    prof.save(path, format="parquet")
    assert jupyter_memprof.load(path).label == "tiny"


def test_lineage_of_a_block_that_is_not_there(prof):
    # before: lineage_text raised a bare KeyError: 1000000000
    for call in (prof.lineage, prof.lineage_text):
        with pytest.raises(
            KeyError, match=r"no block with alloc_id=1000000000 \(valid: 0\.\.\d+\)"
        ):
            call(10**9)
    with pytest.raises(KeyError, match="no block with alloc_id=10000"):
        prof.lineage_text(10**40)


# -- issue 25: what saving creates, and targets it must not open ------------------------------
def _mode(path) -> int:
    return os.stat(path).st_mode & 0o777


def _every_writer(prof, folder) -> dict[str, str]:
    """Each kind of file the package writes, written once into ``folder``."""
    return {
        "zip": prof.save(os.path.join(folder, "p.memprof")),
        "parquet": prof.save(os.path.join(folder, "p"), format="parquet"),
        "html": prof.to_html(os.path.join(folder, "p.html")),
        "raw": prof.export(os.path.join(folder, "p.raw.json.gz")),
        "timeline": prof.export(os.path.join(folder, "p.json")),
        "trace": prof.export(os.path.join(folder, "p.trace.json")),
        "compare": jupyter_memprof.compare(prof, prof).to_html(os.path.join(folder, "c.html")),
    }


@pytest.fixture
def umask():
    """Set the process umask for one test (restored after)."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o002], ids=["022", "002"])
def test_files_are_created_with_the_users_umask(prof, tmp_path, umask, mask):
    # before: every file 0600 and Parquet folders 0700, whatever the umask
    umask(mask)
    written = _every_writer(prof, tmp_path)
    for what, path in written.items():
        want = 0o777 & ~mask if what == "parquet" else 0o666 & ~mask
        assert _mode(path) == want, (what, oct(_mode(path)))
    for name in os.listdir(written["parquet"]):
        assert _mode(os.path.join(written["parquet"], name)) == 0o666 & ~mask, name


def test_saving_over_a_file_keeps_its_mode(prof, tmp_path, umask):
    # before: re-saving over a 0644 file made it 0600
    written = _every_writer(prof, tmp_path)
    umask(0o077)
    written = _every_writer(prof, tmp_path)  # replaces every file written above
    for what, path in written.items():
        assert _mode(path) == (0o755 if what == "parquet" else 0o644), what
    os.chmod(written["zip"], 0o640)
    prof.save(written["zip"])
    assert _mode(written["zip"]) == 0o640
    os.chmod(written["parquet"], 0o555)  # read-only: its mode is set once it is written
    prof.save(written["parquet"], format="parquet")
    assert _mode(written["parquet"]) == 0o555
    assert jupyter_memprof.load(written["parquet"]).label == "tiny"


def _in_time(fn, seconds: float = 10):
    """``fn()``'s exception (or result), failing the test if it has not ended in time."""
    out = []

    def run():
        try:
            out.append(fn())
        except Exception as exc:
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert out, "blocked"
    return out[0]


@pytest.mark.parametrize(
    "name,write",
    [
        ("p.memprof", lambda p, path: p.save(path)),
        ("p.memprof", lambda p, path: p.save(path, overwrite=True)),
        ("p", lambda p, path: p.save(path, format="parquet")),
        ("p.html", lambda p, path: p.to_html(path)),
        ("p.html", lambda p, path: p.export(path, overwrite=True)),
        ("p.raw.json.gz", lambda p, path: p.export(path)),
        ("p.trace.json", lambda p, path: p.export(path)),
    ],
)
def test_writing_onto_a_fifo_is_refused_without_blocking(prof, tmp_path, name, write):
    # before: blocked forever (the check whether the file is ours opened it for reading)
    path = tmp_path / name
    os.mkfifo(path)
    exc = _in_time(lambda: write(prof, str(path)))
    assert isinstance(exc, WriteRefused), exc
    assert str(exc) == f"refusing to write {path}: it is a FIFO, not a regular file"
    assert os.listdir(tmp_path) == [name]


def test_html_option_onto_a_fifo_is_refused_before_the_cell_runs(tmp_path):
    # before: %%memprofile --html onto a FIFO blocked (or, with --force, was said to help)
    from IPython.core.error import UsageError

    from jupyter_memprof._frontends.magic_options import check_html_target

    path = tmp_path / "report.html"
    os.mkfifo(path)
    exc = _in_time(lambda: check_html_target(str(path)))
    assert isinstance(exc, UsageError)
    assert str(exc) == f"--html: refusing to write {path}: it is a FIFO, not a regular file"


def _as_another_user(fn) -> str:
    """``fn()``'s exception as text, ``fn`` run in a child process as the user ``nobody``
    (root only)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns to pytest
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                fn()
                text = "no error"
            except Exception as exc:
                text = f"{type(exc).__name__}: {exc}"
            os.write(write, text.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        text = fh.read().decode()
    os.waitpid(pid, 0)
    return text


def test_a_file_the_user_cannot_read_is_refused_as_such(prof, tmp_path):
    # before: "not a saved jupyter_memprof profile; pass overwrite=True", for a saved profile
    # of another user
    if os.getuid() != 0:
        path = prof.save(tmp_path / "mine.memprof")
        os.chmod(path, 0)
        with pytest.raises(PermissionError, match="you may not read it$"):
            prof.save(path)
        return
    shared = tempfile.mkdtemp(dir="/tmp")  # a folder every user may reach
    try:
        os.chmod(shared, 0o1777)
        path = prof.save(os.path.join(shared, "theirs.memprof"))
        os.chmod(path, 0o600)
        text = _as_another_user(lambda: prof.save(path))
        assert text == (
            f"PermissionError: cannot replace {path}: you may not read it (it belongs to "
            "another user)"
        )
        folder = prof.save(os.path.join(shared, "theirs"), format="parquet")
        os.chmod(folder, 0o700)
        assert _as_another_user(lambda: prof.save(folder, format="parquet")) == (
            f"PermissionError: cannot replace {folder}: you may not read it (it belongs to "
            "another user)"
        )
        assert sorted(os.listdir(shared)) == ["theirs", "theirs.memprof"]
        hidden = os.path.join(tmp_path, "p.memprof")  # under a folder only root may enter
        assert _as_another_user(lambda: prof.save(hidden)).startswith(
            f"PermissionError: cannot write {hidden}: you may not enter"
        )
    finally:
        shutil.rmtree(shared)


def test_a_name_of_250_bytes_can_be_written(prof, tmp_path):
    # before: OSError (File name too long) from the temporary name, longer than the name
    stem = "é" * 119  # 238 bytes in UTF-8
    for suffix, write in [
        (".memprof", lambda path: prof.save(path)),
        (".parquet", lambda path: prof.save(path, format="parquet")),
        (".html", lambda path: prof.to_html(path)),
        (".trace.json", lambda path: prof.export(path)),
    ]:
        name = stem + "x" * (250 - len(stem.encode()) - len(suffix)) + suffix
        assert len(name.encode()) == 250
        path = write(str(tmp_path / name))
        assert os.path.basename(path) == name
    assert len(os.listdir(tmp_path)) == 4


def test_a_file_of_no_known_kind_is_one_line_naming_what_load_opens(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("garbage, not a profile\n")
    with pytest.raises(jupyter_memprof.ProfileFileError) as info:
        jupyter_memprof.load(path)
    message = str(info.value)
    assert "\n" not in message
    assert "a saved profile" in message and "memory snapshot" in message
    assert "trace" in message
