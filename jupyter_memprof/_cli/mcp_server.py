"""An MCP server on stdio: ``jupyter-memprof mcp --root DIR``.

It is built on the
official ``mcp`` SDK (the optional extra ``jupyter_memprof[mcp]``).

Its tools are the command line's read-only subcommands and return the same JSON documents
(:mod:`.schema`): ``list_profiles``, ``summary``, ``explain``, ``leaks``, ``diff``,
``estimate`` and ``fit``. Every path is confined to the folders the server was started
with (:func:`confine`: links followed, ``..`` resolved): a path outside them is refused
before anything is opened. ``estimate`` and ``fit`` import their function only from a
module or script file inside those folders. A failing tool answers with an error: the
command line's one line.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from . import commands as C
from .target import within

#: What ``list_profiles`` lists: the files ``jupyter_memprof.load`` may open, by suffix.
PROFILE_SUFFIXES = (".zip", ".parquet", ".pickle", ".pkl", ".json", ".json.gz")
#: At most this many entries are listed.
MAX_LISTED = 500

INSTRUCTIONS = """\
jupyter_memprof answers "where did my PyTorch memory go?". Saved profiles (and files
jupyter_memprof.load opens) live in the allowed folders: list_profiles finds them; summary
gives each device's peak by category and any limit verdict; explain says what filled the
peak and which what_if changes could cut it; leaks lists memory that grows every step; diff
subtracts two peaks. estimate and fit run a function given as MODULE:FUNCTION (a module or
script in the allowed folders) that builds its own model and batch, on fake tensors: no GPU
is needed and nothing is allocated. Every tool returns the JSON of `jupyter-memprof ... --json`
(schema jupyter-memprof-cli, version 1)."""


class OutsideRoots(ValueError):
    """A path outside the server's folders."""


def confine(path: str, roots: Sequence[str]) -> str:
    """``path`` (relative ones against the first root) as an absolute path inside
    ``roots``; :class:`OutsideRoots` otherwise. Nothing is opened."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise OutsideRoots("a path is needed")
    full = path if os.path.isabs(path) else os.path.join(roots[0], path)
    if not within(full, roots):
        raise OutsideRoots(f"{path} is outside the allowed folders")
    return os.path.realpath(full)


def _listed(roots: Sequence[str]) -> list[str]:
    found: list[str] = []
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files) + [d for d in dirs if d.endswith(".parquet")]:
                if name.endswith(PROFILE_SUFFIXES) and within(os.path.join(folder, name), roots):
                    found.append(os.path.relpath(os.path.join(folder, name), roots[0]))
                    if len(found) >= MAX_LISTED:
                        return found
    return found


def build(roots: Sequence[str]):
    """The server (an ``mcp`` ``MCPServer``) for these folders."""
    try:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError as err:
        raise C.CommandError(
            "the MCP server needs the mcp package: pip install 'jupyter_memprof[mcp]'"
        ) from err
    from .. import __version__

    roots = [os.path.realpath(r) for r in roots]
    for r in roots:
        if not os.path.isdir(r):
            raise C.CommandError(f"--root {r} is not a folder")

    def answer(work) -> dict[str, Any]:
        """The tool's document, or its error as the command line's one line."""
        try:
            return work()
        except Exception as err:
            raise ToolError(C.one_line(err)) from None

    server = MCPServer("jupyter-memprof", instructions=INSTRUCTIONS, version=__version__)
    _file_tools(server, roots, answer)
    _run_tools(server, roots, answer)
    return server


def _file_tools(server, roots: list[str], answer) -> None:
    """The tools on files: list_profiles, summary, explain, leaks, diff."""

    def path(p: str) -> str:
        return confine(p, roots)

    @server.tool()
    def list_profiles() -> dict[str, Any]:
        """The files in the allowed folders that look like saved profiles, snapshots or
        traces (relative to the first folder), and the folders themselves."""
        return answer(lambda: {"roots": roots, "files": _listed(roots)})

    @server.tool()
    def summary(file: str, limit: str | None = None, device: str | None = None) -> dict[str, Any]:
        """Open a saved profile: peak per device and category, leaks, what filled the peak;
        with `limit` (e.g. "80GiB"), whether it fits on `device`."""
        return answer(lambda: C.summary(path(file), limit=limit, device=device).document)

    @server.tool()
    def explain(file: str, device: str | None = None, rows: int = 8) -> dict[str, Any]:
        """What filled the peak of `device` (default: the highest), in a few groups that add
        up to it, what each is for and which what_if changes could cut it."""
        return answer(lambda: C.explain(path(file), device=device, rows=rows).document)

    @server.tool()
    def leaks(file: str) -> dict[str, Any]:
        """Memory that grows with every step, largest first (`ok` is false when any)."""
        return answer(lambda: C.leaks(path(file)).document)

    @server.tool()
    def diff(a: str, b: str, by: str = "category", device: str | None = None) -> dict[str, Any]:
        """The peaks of two saved profiles subtracted, by category, module, op or name."""
        return answer(lambda: C.diff(path(a), path(b), by=by, device=device).document)


def _run_tools(server, roots: list[str], answer) -> None:
    """The tools that run a function on fake tensors: estimate, fit."""

    @server.tool()
    def estimate(
        target: str,
        device: str = "cuda:0",
        limit: str | None = None,
        gpu: str | None = None,
        world_size: int | None = None,
        allocator: str | None = None,
        context: str | None = None,
        batch: int | None = None,
    ) -> dict[str, Any]:
        """Estimate the memory of MODULE:FUNCTION (or script.py:FUNCTION, in the allowed
        folders), a function that builds its model and batch and runs one step, on
        `device` without running it (no GPU needed); `limit` gives the verdict, `context`
        the CUDA context's bytes (e.g. "500MiB"), `allocator` PYTORCH_CUDA_ALLOC_CONF."""
        return answer(
            lambda: (
                C.estimate(
                    _target(target, roots),
                    device=device,
                    limit=limit,
                    gpu=gpu,
                    world_size=world_size,
                    allocator=allocator,
                    context=context,
                    batch=batch,
                    roots=roots,
                ).document
            )
        )

    @server.tool()
    def fit(
        target: str,
        limit: str,
        device: str = "cuda:0",
        low: int = 1,
        high: int | None = None,
        gpu: str | None = None,
        world_size: int | None = None,
        allocator: str | None = None,
        context: str | None = None,
    ) -> dict[str, Any]:
        """The largest batch size at which MODULE:FUNCTION's step fits `limit` on `device`
        (the function takes the batch size), found by estimates judged as `estimate`
        judges them (the same `gpu`, `world_size`, `allocator` and `context`)."""
        return answer(
            lambda: (
                C.fit(
                    _target(target, roots),
                    limit=limit,
                    device=device,
                    low=low,
                    high=high,
                    gpu=gpu,
                    world_size=world_size,
                    allocator=allocator,
                    context=context,
                    roots=roots,
                ).document
            )
        )


def _target(target: str, roots: Sequence[str]) -> str:
    """A script target's path made absolute inside the roots (modules are checked on import)."""
    where, sep, name = target.rpartition(":")
    if sep and (where.endswith(".py") or "/" in where):
        return f"{confine(where, roots)}:{name}"
    return target


def serve(roots: Sequence[str]) -> None:
    """Run the server on stdin and stdout until the client closes them."""
    build(roots).run("stdio")
