"""`jupyter-memprof mcp` through the official SDK's own stdio client: the tools, each called
on real files, answering the command line's JSON, and paths outside the folders refused."""

from __future__ import annotations

import asyncio
import os
import sys

import jsonschema
import pytest
from _cli_support import PARAMETER_BYTES, env, save_profiles, write_steps

from jupyter_memprof._cli import commands
from jupyter_memprof._cli.schema import SCHEMA

mcp = pytest.importorskip("mcp")
from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402

VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
TOOLS = {"list_profiles", "summary", "explain", "leaks", "diff", "estimate", "fit"}

#: A module outside the allowed folders, on the server's import path: importing it would
#: leave a file behind.
EVIL = """
import pathlib
pathlib.Path(__file__).with_name("imported").write_text("yes")


def step():
    pass
"""


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mcp_root")
    save_profiles(root)
    write_steps(root)
    outside = tmp_path_factory.mktemp("mcp_outside")
    (outside / "evil.py").write_text(EVIL)
    (outside / "secret.zip").write_bytes((root / "clean.zip").read_bytes())
    os.symlink(outside, root / "link_out")
    return root, outside


async def _session(root, outside, calls):
    """Start the server, list its tools, make each call; the answers."""
    server_env = env()
    server_env["PYTHONPATH"] += os.pathsep + str(outside)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "jupyter_memprof", "mcp", "--root", str(root)],
        env=server_env,
        cwd=str(outside),
    )
    async with Client(params, read_timeout_seconds=300) as client:
        tools = (await client.list_tools()).tools
        answers = [await client.call_tool(name, args) for name, args in calls]
    return tools, answers


@pytest.fixture(scope="module")
def session(folders):
    root, outside = folders
    calls = [
        ("list_profiles", {}),
        ("summary", {"file": "clean.zip"}),
        ("explain", {"file": "clean.parquet", "rows": 2}),
        ("leaks", {"file": str(root / "leak.zip")}),
        ("diff", {"a": "clean.zip", "b": "leak.zip"}),
        ("estimate", {"target": "cli_steps:step", "batch": 64, "limit": "800MiB"}),  # 5
        ("fit", {"target": "cli_steps.py:step", "limit": "2GiB", "high": 4096}),
        ("summary", {"file": str(outside / "secret.zip")}),
        ("summary", {"file": "../" + outside.name + "/secret.zip"}),
        ("summary", {"file": "link_out/secret.zip"}),
        ("estimate", {"target": "evil:step"}),  # 10
        ("estimate", {"target": str(outside / "evil.py") + ":step"}),
        ("estimate", {"target": "json:dumps"}),
        ("summary", {"file": "missing.zip"}),
    ]
    return asyncio.run(_session(root, outside, calls))


def _doc(answer) -> dict:
    assert not answer.is_error, answer.content
    doc = answer.structured_content
    VALIDATOR.validate(doc)
    return doc


def _error(answer) -> str:
    assert answer.is_error
    return answer.content[0].text


def test_tools_are_listed_with_their_arguments(session):
    tools, _ = session
    by_name = {t.name: t for t in tools}
    assert set(by_name) == TOOLS
    shared = {"target", "device", "limit", "gpu", "world_size", "allocator", "context"}
    assert shared | {"batch"} <= set(by_name["estimate"].input_schema["properties"])
    assert shared | {"low", "high"} <= set(by_name["fit"].input_schema["properties"])
    assert by_name["diff"].input_schema["required"] == ["a", "b"]
    assert all(t.description for t in tools)


def test_each_tool_answers_the_command_lines_json(folders, session):
    root, _ = folders
    _, answers = session
    listed = answers[0].structured_content
    assert {"clean.zip", "leak.zip", "clean.parquet"} <= set(listed["files"])
    assert "link_out/secret.zip" not in listed["files"]
    real = os.path.realpath(root / "clean.zip")
    assert _doc(answers[1]) == commands.summary(real).document
    doc = _doc(answers[2])
    assert len(doc["explain"]["groups"]) == 3 and doc["command"] == "explain"
    doc = _doc(answers[3])
    assert doc["ok"] is False and doc["leaks"][0]["holder"] == "kept"
    doc = _doc(answers[4])
    assert doc["command"] == "diff" and doc["rows"]
    doc = _doc(answers[5])
    assert doc["peaks"][0]["device"] == "cuda:0"
    assert doc["peaks"][0]["categories"]["parameter"] == PARAMETER_BYTES
    assert doc["limit"]["fits"] is False and doc["ok"] is False
    doc = _doc(answers[6])
    assert doc["command"] == "fit" and doc["ok"] and 64 < doc["batch"] <= 4096


def test_paths_outside_the_folders_are_refused(folders, session):
    _, outside = folders
    _, answers = session
    for answer in answers[7:10]:
        assert "outside the allowed folders" in _error(answer)
    assert "not a file inside the allowed folders" in _error(answers[10])
    assert not (outside / "imported").exists()
    assert "outside the allowed folders" in _error(answers[11])
    assert "not a file inside the allowed folders" in _error(answers[12])
    assert "no such file or folder" in _error(answers[13])
