"""The `jupyter-memprof` command in subprocesses: exit codes, --json against its schema,
one-line errors, estimates of a function by import path, and its documentation."""

from __future__ import annotations

import argparse
import json
import re
import zipfile

import jsonschema
import pytest
from _cli_support import PARAMETER_BYTES, ROOT, run_cli, run_many, save_profiles, write_steps

import jupyter_memprof
from jupyter_memprof._cli.main import build_parser
from jupyter_memprof._cli.schema import NAME, SCHEMA, VERSION
from jupyter_memprof._results.profile import Profile

VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    profiles = save_profiles(folder)
    write_steps(folder)
    return folder, profiles


def _doc(result: dict) -> dict:
    doc = json.loads(result["stdout"])
    VALIDATOR.validate(doc)
    assert doc["schema"] == NAME and doc["schema_version"] == VERSION
    return doc


def _one_line(result: dict) -> str:
    err = result["stderr"].strip()
    assert err and "\n" not in err, result
    return err


def test_schema_is_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_summary_of_a_saved_file_in_a_fresh_process_without_torch(files):
    folder, profiles = files
    code, out, err = run_cli(
        "summary", "clean.zip", "--json", cwd=folder, python=("-X", "importtime")
    )
    assert code == 0, err
    imported = {line.rsplit("|", 1)[-1].strip() for line in err.splitlines() if "|" in line}
    assert "pandas" in imported and "torch" not in imported and "bokeh" not in imported
    doc = json.loads(out)
    VALIDATOR.validate(doc)
    want = profiles["clean"].summary()["peaks"]["cpu"]
    (peak,) = doc["peaks"]
    assert peak["device"] == "cpu" and peak["bytes"] == want["bytes"]
    assert peak["categories"] == {k: int(v) for k, v in want["top_categories"].items()}
    assert peak["categories"]["parameter"] == (64 * 256 + 256 + 256 * 8 + 8) * 4
    assert doc["limit"] is None and doc["leaks"] == [] and doc["ok"] is True
    assert sum(g["bytes"] for g in doc["explain"]["groups"]) == want["bytes"]


def test_saved_files_exit_codes_and_json(files):
    folder, profiles = files
    snapshot = hasattr(Profile, "to_snapshot")
    argvs = [
        ["summary", "clean.zip", "--limit", "1KiB"],
        ["summary", "clean.zip", "--limit", "1GiB", "--json"],
        ["leaks", "leak.zip"],
        ["leaks", "leak.zip", "--json"],
        ["leaks", "clean.parquet"],
        ["explain", "clean.parquet", "--rows", "2", "--json"],  # 5
        ["diff", "clean.zip", "leak.zip", "--json"],
        ["html", "clean.zip", "-o", "clean.html"],
        ["convert", "clean.zip", "-o", "again.parquet", "--json"],
        ["convert", "again.parquet", "-o", "again.zip"],
        ["convert", "clean.zip", "-o", "clean.pickle"],  # 10
        ["explain", "clean.zip"],
        ["summary", "clean.zip", "--limit", "1KiB", "--json"],
        ["--help"],
        ["schema"],
        ["--version"],
    ]
    r = run_many(argvs, cwd=folder)
    assert r[0]["code"] == 1 and re.search(r"^OVER 1\.0 KiB on cpu: needs", r[0]["stdout"], re.M)
    assert "memory profile" in r[0]["stdout"]
    doc = _doc(r[1])
    assert r[1]["code"] == 0 and doc["limit"]["fits"] and doc["limit"]["bytes"] == 2**30
    assert r[2]["code"] == 1 and "held by kept" in r[2]["stdout"]
    doc = _doc(r[3])
    assert r[3]["code"] == 1 and doc["ok"] is False
    (leak,) = doc["leaks"]
    assert leak["holder"] == "kept" and leak["bytes_per_step"] == 128 * 128 * 4
    assert leak["category"] and leak["steps"] >= 3
    assert r[4]["code"] == 0 and "no memory grows" in r[4]["stdout"]
    doc = _doc(r[5])
    groups = doc["explain"]["groups"]
    assert len(groups) == 3 and groups[-1]["group"] == "everything else"
    assert (
        sum(g["bytes"] for g in groups) == doc["explain"]["peak_bytes"] == doc["peaks"][0]["bytes"]
    )
    assert groups[0]["bytes"] >= groups[1]["bytes"]
    doc = _doc(r[6])
    rows = {row["key"]: row for row in doc["rows"]}
    assert rows["parameter"]["delta"] == 0
    assert doc["peak_b"] - doc["peak_a"] == sum(row["delta"] for row in doc["rows"])
    assert r[7]["code"] == 0 and "<html" in (folder / "clean.html").read_text()[:2000].lower()
    doc = _doc(r[8])
    assert doc["format"] == "parquet" and (folder / "again.parquet" / "meta.json").exists()
    assert r[9]["code"] == 0
    again = jupyter_memprof.load(folder / "again.zip")
    assert again.allocations.equals(profiles["clean"].allocations)
    if snapshot:
        assert r[10]["code"] == 0
    else:
        assert r[10]["code"] == 2 and "not available" in _one_line(r[10])
    assert r[11]["code"] == 0 and "peak" in r[11]["stdout"] and "for:" in r[11]["stdout"]
    doc = _doc(r[12])
    over = doc["limit"]["first_over"]
    assert r[12]["code"] == 1 and over["device"] == "cpu" and over["bytes"] > 1024
    assert r[13]["code"] == 0 and all(c in r[13]["stdout"] for c in ("summary", "estimate", "mcp"))
    assert r[14]["code"] == 0 and json.loads(r[14]["stdout"]) == SCHEMA
    assert r[15]["stdout"].strip() == f"jupyter-memprof {jupyter_memprof.__version__}"


def test_bad_arguments_and_files_are_one_line_and_exit_2(files):
    folder, _ = files
    with zipfile.ZipFile(folder / "bogus.zip", "w") as z:
        z.writestr("hello.txt", "not a profile")
    (folder / "notes.html").write_text("my own notes")
    argvs = [
        ["summary"],
        ["summary", "missing.zip"],
        ["summary", "bogus.zip"],
        ["summary", "clean.zip", "--limit", "lots"],
        ["frobnicate"],  # 4
        ["html", "clean.zip", "-o", "notes.html"],
        ["convert", "clean.zip", "-o", "clean.txt"],
        ["explain", "clean.zip", "--device", "cuda:7"],
        ["estimate", "no_such_module:step"],
        ["estimate", "cli_steps:NOT_A_FUNCTION"],  # 9
        ["estimate", "cli_steps:needs_arguments"],
        ["estimate", "cli_steps:reads_values", "--device", "cpu"],
        ["estimate", "cli_steps"],
        ["fit", "cli_steps:step"],
        ["summary", "missing.zip", "--json"],  # 14
        ["estimate", "cli_steps:reads_values", "--batch", "4"],
        ["estimate", "cli_steps:step", "--device", "tpu"],
        ["estimate", "cli_steps:step", "--world-size", "0"],
    ]
    r = run_many(argvs, cwd=folder)
    for result in r:
        assert result["code"] == 2, result
        _one_line(result)
    assert _one_line(r[0]).startswith("jupyter-memprof summary: error: the following arguments")
    assert "missing.zip" in _one_line(r[1])
    assert "bogus.zip" in _one_line(r[2])
    assert "lots" in _one_line(r[3])
    assert "frobnicate" in _one_line(r[4])
    assert "notes.html" in _one_line(r[5]) and (folder / "notes.html").read_text() == "my own notes"
    assert "--to" in _one_line(r[6])
    assert "no module named 'no_such_module'" in _one_line(r[8])
    assert "not a function" in _one_line(r[9])
    assert "needs arguments" in _one_line(r[10])
    assert "item" in _one_line(r[11])
    assert "MODULE:FUNCTION" in _one_line(r[12])
    assert "--limit" in _one_line(r[13])
    doc = _doc(r[14])
    assert doc["ok"] is False and "missing.zip" in doc["error"] and doc["command"] == "summary"
    assert "takes no batch size" in _one_line(r[15])
    assert "tpu" in _one_line(r[16])
    assert "world_size" in _one_line(r[17])


def test_estimate_and_fit_by_import_path(files):
    folder, _ = files
    argvs = [
        ["estimate", "cli_steps:step", "--batch", "64", "--json"],
        ["estimate", "cli_steps:step", "--limit", "800MiB", "--json"],
        ["estimate", "cli_steps:step", "--limit", "4GiB", "--gpu", "A100", "--progress"],
        ["estimate", str(folder / "cli_steps.py") + ":step", "--device", "cpu", "--batch", "4"],
        ["fit", "cli_steps:step", "--limit", "2GiB", "--high", "100000", "--json"],
        ["fit", "cli_steps:step", "--limit", "100MiB"],  # 5
        ["fit", "cli_steps:step", "--limit", "2GiB", "--high", "100000", "--context", "0",
         "--gpu", "A100", "--json"],
    ]  # fmt: skip
    r = run_many(argvs, cwd=folder)
    doc = _doc(r[0])
    assert r[0]["code"] == 0 and doc["estimate"] is True and doc["devices"] == ["cuda:0"]
    (peak,) = doc["peaks"]
    assert peak["categories"]["parameter"] == PARAMETER_BYTES
    assert peak["categories"]["optimizer_state"] >= 2 * PARAMETER_BYTES
    assert peak["reserved_bytes"] >= peak["bytes"]
    doc = _doc(r[1])
    assert r[1]["code"] == 1 and doc["limit"]["fits"] is False
    assert doc["limit"]["first_over"]["cause"] in ("tensors", "cache", "context")
    assert r[2]["code"] == 0 and "fits 4.0 GiB on cuda:0" in r[2]["stdout"]
    assert "estimating cli_steps:step on cuda:0" in r[2]["stderr"]
    assert r[3]["code"] == 0 and "on cpu" in r[3]["stdout"]
    doc = _doc(r[4])
    assert r[4]["code"] == 0 and doc["ok"] and doc["batch"] > 64
    fits = {t["batch"]: t["fits"] for t in doc["tried"]}
    assert fits[doc["batch"]] and not any(ok for b, ok in fits.items() if b > doc["batch"])
    assert doc["report"]["limit"]["fits"] is True
    assert r[5]["code"] == 1 and "no batch fits" in r[5]["stdout"]
    # estimate()'s options in fit: without the CUDA context more of the limit is the batch's
    bare = _doc(r[6])
    assert r[6]["code"] == 0 and bare["batch"] > doc["batch"]


# -- the console script and its documentation --------------------------------------------
def test_console_script_and_plugin_are_declared():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["jupyter-memprof"] == "jupyter_memprof._cli.main:run"
    assert project["entry-points"]["pytest11"]["jupyter_memprof"] == "jupyter_memprof.pytest_plugin"
    assert any(d.startswith("mcp") for d in project["optional-dependencies"]["mcp"])


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_command_and_option_is_documented():
    doc = (ROOT / "docs" / "cli.md").read_text()
    for name, sub in _subparsers(build_parser()).items():
        assert f"jupyter-memprof {name}" in doc, name
        for action in sub._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    assert flag in doc, f"{name} {flag}"


def test_docs_repeat_the_schema():
    text = (ROOT / "docs" / "cli.md").read_text()
    block = re.search(r"<!-- schema -->\n```json\n(.*?)\n```", text, re.S)
    assert block, "docs/cli.md: the schema block after <!-- schema -->"
    assert json.loads(block.group(1)) == SCHEMA, "run: python -m jupyter_memprof schema"
