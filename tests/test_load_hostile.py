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


def _zip(path, members: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return os.fspath(path)


def _with_json(saved, path, member: str, change) -> str:
    """The saved zip with ``change(doc)`` applied to one member's JSON (or its return)."""
    members = dict(saved[1])
    doc = json.loads(members[member])
    out = change(doc)
    members[member] = json.dumps(doc if out is None else out).encode()
    return _zip(path, members)


def _refused(path, match: str | None = None) -> str:
    with pytest.raises(ProfileFileError) as info:
        jupyter_memprof.load(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg, msg
    if match:
        assert match in msg, msg
    return msg


def _works(p) -> None:
    """What a loaded profile must do without failing."""
    repr(p), str(p), p.label, p.start_ns, p.end_ns, p.devices, p.summary()
    p.peak()
    p.peak_by("category")


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
    from jupyter_memprof import _storage

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
    _works(jupyter_memprof.load(path))


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


def _check_load(path) -> None:
    try:
        p = jupyter_memprof.load(path)
    except ProfileFileError as exc:
        assert "\n" not in str(exc)
        return
    _works(p)


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
        _check_load(path)


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
        _check_load(path)
