"""``jupyter-memprof``: the command line's parser and dispatch.

Built on the standard library's argparse: no dependency to install, pin or break, and the
subcommands are few and flat. What each subcommand does is in :mod:`.commands`; this module
reads the arguments, prints the text or the JSON document, and turns errors into one line
and exit code 2. Nothing heavy is imported before a subcommand needs it, so ``summary`` of a
saved file never imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from .. import __version__
from . import commands as C

PROG = "jupyter-memprof"

DESCRIPTION = """\
Where did my PyTorch memory go? Read saved profiles, and estimate a training step's memory
on any device without running it (no GPU needed).

exit codes: 0 ok (the step fits, no leak); 1 over the limit, a leak found, no batch fits;
2 usage, file or import error (one line on stderr)."""

EPILOG = "Each subcommand has --help. Docs: docs/cli.md. JSON schema: jupyter-memprof schema"


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line instead of the usage and the error."""

    def error(self, message: str):
        raise C.UsageError(f"{self.prog}: error: {message} (see --help)")


def _common(p: argparse.ArgumentParser, *, progress: bool = False) -> None:
    p.add_argument("--json", action="store_true", help="print the JSON document (see `schema`)")
    if progress:
        p.add_argument(
            "--progress",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="progress lines on stderr (default: when stderr is a terminal)",
        )


def _device_limit(p: argparse.ArgumentParser, device_help: str) -> None:
    p.add_argument("--device", help=device_help)
    p.add_argument("--limit", help="a memory budget such as 80GiB: exit code 1 when over it")


def _estimate_options(p: argparse.ArgumentParser) -> None:
    """The target and the estimate's options (``estimate()``'s), for estimate and fit."""
    p.add_argument(
        "target",
        metavar="MODULE:FUNCTION",
        help="the step, by import path or path/to/script.py:FUNCTION",
    )
    p.add_argument(
        "--device", default="cuda:0", help="cpu, cuda or cuda:N (default cuda:0; no GPU needed)"
    )
    p.add_argument("--limit", help="device memory, such as 80GiB")
    p.add_argument(
        "--gpu", help="the GPU whose kernels to follow: H100 (default), A100, L4, sm80, ..."
    )
    p.add_argument("--world-size", metavar="N", help="estimate rank 0 of N ranks (FSDP2, DDP)")
    p.add_argument(
        "--allocator", help="PYTORCH_CUDA_ALLOC_CONF settings, e.g. expandable_segments:True"
    )
    p.add_argument(
        "--context",
        metavar="SIZE",
        help="with --limit: memory a CUDA device holds outside PyTorch (default 751MiB)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    _file_commands(sub)
    _output_commands(sub)
    _estimate_commands(sub)
    sub.add_parser("schema", help="print the JSON schema of every --json document")
    p = sub.add_parser("mcp", help="a Model Context Protocol server on stdio (needs the mcp extra)")
    p.add_argument(
        "--root",
        action="append",
        required=True,
        metavar="DIR",
        help="a folder the server may read (repeatable)",
    )
    return parser


def _file_commands(sub) -> None:
    """The commands that read saved profiles: summary, explain, leaks, diff."""
    p = sub.add_parser("summary", help="peak per device and category of a saved profile")
    p.add_argument("file", metavar="FILE", help="a file jupyter_memprof.load() opens")
    _device_limit(p, "the device the limit is for (default: the highest peak)")
    _common(p)

    p = sub.add_parser(
        "explain", help="what filled the peak, in a few groups, and what could cut it"
    )
    p.add_argument("file", metavar="FILE")
    _device_limit(p, "the device whose peak to explain (default: the highest peak)")
    p.add_argument("--rows", type=int, default=8, help="groups shown, the rest summed (default 8)")
    _common(p)

    p = sub.add_parser("leaks", help="memory that grows with every step: exit code 1 when found")
    p.add_argument("file", metavar="FILE")
    _common(p)

    p = sub.add_parser("diff", help="the peaks of two profiles, subtracted")
    p.add_argument("a", metavar="A")
    p.add_argument("b", metavar="B")
    p.add_argument("--by", default="category", choices=["category", "module", "op", "name"])
    p.add_argument("--device", help="compare this device's peaks (default: each one's highest)")
    p.add_argument("--rows", type=int, default=30, help="rows shown (default 30)")
    _common(p)


def _output_commands(sub) -> None:
    """The commands that write a saved profile in another form: html, convert."""
    p = sub.add_parser("html", help="the interactive dashboard as one HTML file")
    p.add_argument("file", metavar="FILE")
    p.add_argument("-o", "--output", required=True, metavar="OUT.html")
    p.add_argument("--force", action="store_true", help="replace any file at OUT.html")
    _common(p, progress=True)

    p = sub.add_parser("convert", help="save a profile in another format (zip, Parquet, snapshot)")
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="*.zip, *.parquet (a folder) or *.pickle",
    )
    p.add_argument(
        "--to", choices=["zip", "parquet", "snapshot"], help="the format (default: from OUT's name)"
    )
    p.add_argument("--force", action="store_true", help="replace whatever is at OUT")
    _common(p, progress=True)


def _estimate_commands(sub) -> None:
    """The commands that run a step on fake tensors: estimate, fit. Their option values are
    text, checked by the estimate's own validators (:mod:`.._frontends.options`)."""
    p = sub.add_parser(
        "estimate", help="a step's memory on a device, on fake tensors (no GPU needed)"
    )
    _estimate_options(p)
    p.add_argument(
        "--batch", type=int, help="the batch size, passed as batch_size=, batch= or first argument"
    )
    p.add_argument("--rows", type=int, default=8, help="groups of the peak shown (default 8)")
    p.add_argument("--save", metavar="OUT.zip", help="also save the profile")
    p.add_argument("--html", metavar="OUT.html", help="also write the dashboard")
    _common(p, progress=True)

    p = sub.add_parser("fit", help="the largest batch size that fits --limit on the device")
    _estimate_options(p)
    p.add_argument("--low", type=int, default=1, help="smallest batch tried (default 1)")
    p.add_argument("--high", type=int, help="largest batch tried (default: no bound)")
    _common(p, progress=True)


def _progress(args: argparse.Namespace) -> C.Progress:
    on = getattr(args, "progress", None)
    return C.Progress(sys.stderr.isatty() if on is None else on)


def dispatch(args: argparse.Namespace) -> C.Outcome:
    """Run the parsed command; its outcome."""
    cmd = args.command
    if cmd == "summary":
        return C.summary(args.file, limit=args.limit, device=args.device)
    if cmd == "explain":
        return C.explain(args.file, limit=args.limit, device=args.device, rows=args.rows)
    if cmd == "leaks":
        return C.leaks(args.file)
    if cmd == "diff":
        return C.diff(args.a, args.b, by=args.by, device=args.device, rows=args.rows)
    progress = _progress(args)
    if cmd == "html":
        return C.html(args.file, args.output, force=args.force, progress=progress)
    if cmd == "convert":
        return C.convert(args.file, args.output, to=args.to, force=args.force, progress=progress)
    if cmd == "estimate":
        return C.estimate(
            args.target,
            device=args.device,
            limit=args.limit,
            gpu=args.gpu,
            world_size=args.world_size,
            allocator=args.allocator,
            context=args.context,
            batch=args.batch,
            save=args.save,
            html_out=args.html,
            rows=args.rows,
            progress=progress,
        )
    if cmd == "fit":
        return C.fit(
            args.target,
            limit=args.limit,
            device=args.device,
            gpu=args.gpu,
            world_size=args.world_size,
            allocator=args.allocator,
            context=args.context,
            low=args.low,
            high=args.high,
            progress=progress,
        )
    raise C.UsageError(f"{PROG}: error: unknown command {cmd!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    want_json = "--json" in argv
    command = None
    try:
        args = build_parser().parse_args(argv)
        command = args.command
        if command == "schema":
            from .schema import SCHEMA

            print(json.dumps(SCHEMA, indent=2))
            return C.OK
        if command == "mcp":
            from .mcp_server import serve

            serve(args.root)
            return C.OK
        outcome = dispatch(args)
        answer = json.dumps(outcome.document, indent=2) if args.json else outcome.text
        code = outcome.code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # every failure is one line and exit code 2
        line = C.one_line(err)
        if want_json:
            from .schema import header

            print(json.dumps({**header(command), "error": line, "ok": False}))
        usage = isinstance(err, C.UsageError)
        print(line if usage else f"{PROG}: error: {line}", file=sys.stderr)
        if os.environ.get("JUPYTER_MEMPROF_TRACEBACK"):
            raise
        return C.ERROR
    try:
        print(answer, flush=True)
    except BrokenPipeError:  # `| head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code


def run() -> None:
    """The console script's entry point."""
    sys.exit(main())
