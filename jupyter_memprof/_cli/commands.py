"""What each subcommand does, for the command line and MCP.

Shared by the command line (:mod:`.main`) and the MCP server
(:mod:`.mcp_server`): each returns an :class:`Outcome`, the JSON document of
:mod:`.schema`, the text for people and the exit code.

Saved files are opened with :func:`jupyter_memprof.load` only, so every format it reads
works here; torch is imported only by the commands that run code (``estimate``, ``fit``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._units import format_bytes
from . import report as _report
from .schema import header

#: Exit codes: the command's answer was good (the step fits, no leak); it was bad (over the
#: limit, a leak, no batch fits); the command could not run (usage, file, import error).
OK, BAD, ERROR = 0, 1, 2

#: The formats ``convert`` writes, by the output's suffix.
CONVERT_SUFFIXES = {".zip": "zip", ".parquet": "parquet", ".pickle": "snapshot", ".pkl": "snapshot"}


class CommandError(ValueError):
    """A command cannot run as asked: one line for the user, exit code 2."""


class UsageError(CommandError):
    """Bad arguments: the line already names the command (``jupyter-memprof summary: error:
    ...``)."""


class Outcome:
    """A command's answer: its JSON document and its text, each made when first asked for
    (the command line prints one of them), and the exit code: ``ok`` when given, else the
    document's ``ok``."""

    def __init__(
        self,
        document: dict[str, Any] | Callable[[], dict[str, Any]],
        text: str | Callable[[], str],
        ok: bool | None = None,
    ) -> None:
        self._document, self._text, self._ok = document, text, ok

    @property
    def document(self) -> dict[str, Any]:
        if callable(self._document):
            self._document = self._document()
        return self._document

    @property
    def text(self) -> str:
        if callable(self._text):
            self._text = self._text()
        return self._text

    @property
    def code(self) -> int:
        ok = self.document.get("ok", True) if self._ok is None else self._ok
        return OK if ok else BAD


class Progress:
    """Lines on stderr about long work (``--progress``); silent when off."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.on:
            print(f"[{time.perf_counter() - self.t0:6.1f}s] {message}", file=sys.stderr, flush=True)


QUIET = Progress(False)


def size(text: Any, what: str = "limit") -> int | None:
    """A size option (``80GiB``, ``24 GB``, bytes) in bytes; CommandError for anything else."""
    from .._frontends.options import check_limit, raised_as

    with raised_as(CommandError):
        return check_limit(text, what)


def open_profile(path: str):
    """The profile in ``path``, through :func:`jupyter_memprof.load`."""
    if not os.path.exists(path):
        raise CommandError(f"no such file or folder: {path}")
    from .. import load

    return load(path)


def one_line(err: BaseException) -> str:
    """The error as one line: its message (with its type when that says more)."""
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, CommandError) or type(err).__module__.startswith("jupyter_memprof"):
        return text
    if isinstance(err, OSError) and err.filename is not None:
        return f"{err.strerror or text}: {err.filename}"
    return f"{type(err).__name__}: {text}"


# -- commands on saved files -------------------------------------------------------------
def _lines(*lines: str | None) -> str:
    return "\n".join(line for line in lines if line)


def summary(path: str, *, limit: Any = None, device: str | None = None, rows: int = 8) -> Outcome:
    nbytes = size(limit)  # a bad size is said before the file is read
    prof = open_profile(path)
    verdict = _report.limit_verdict(prof, nbytes, device)
    return Outcome(
        lambda: _report.report(
            prof, command="summary", source=path, device=device, rows=rows, verdict=verdict
        ),
        lambda: _lines(repr(prof), _report.verdict_text(verdict)),
        ok=verdict is None or verdict["fits"],
    )


def explain(path: str, *, limit: Any = None, device: str | None = None, rows: int = 8) -> Outcome:
    nbytes = size(limit)  # a bad size is said before the file is read
    prof = open_profile(path)
    verdict = _report.limit_verdict(prof, nbytes, device)
    return Outcome(
        lambda: _report.report(
            prof, command="explain", source=path, device=device, rows=rows, verdict=verdict
        ),
        lambda: _lines(prof.explain_text(device, rows), _report.verdict_text(verdict)),
        ok=verdict is None or verdict["fits"],
    )


def leaks(path: str) -> Outcome:
    prof = open_profile(path)
    verdict = _report.limit_verdict(prof)
    rows = _report.leaks_part(prof)
    return Outcome(
        lambda: _report.report(prof, command="leaks", source=path, verdict=verdict, leaks=rows),
        lambda: _report.leaks_text(rows),
        ok=not rows and (verdict is None or verdict["fits"]),
    )


def diff(
    a: str, b: str, *, by: str = "category", device: str | None = None, rows: int = 30
) -> Outcome:
    from .. import diff as _diff

    pa, pb = open_profile(a), open_profile(b)
    try:
        d = _diff(pa, pb, by, device=device)
    except KeyError as err:
        raise CommandError(f"diff: {err.args[0] if err.args else err}") from None
    return Outcome(_report.diff_document(d, a, b), d.text(rows))


def html(path: str, output: str, *, force: bool = False, progress: Progress = QUIET) -> Outcome:
    prof = open_profile(path)
    progress(f"writing the dashboard of {path}")
    written = prof.to_html(output, overwrite=force)
    doc = {**header("html"), "source": path, "output": written, "format": "html", "ok": True}
    return Outcome(doc, f"wrote {written}")


def convert_format(output: str, to: str | None) -> str:
    if to is not None:
        return to
    suffix = os.path.splitext(output.rstrip(os.sep))[1].lower()
    if suffix in CONVERT_SUFFIXES:
        return CONVERT_SUFFIXES[suffix]
    if os.path.isdir(output):
        return "parquet"
    raise CommandError(
        f"cannot tell the format from {output!r}: name it *.zip, *.parquet or *.pickle, or give --to"
    )


def _overwrite(write: Callable, force: bool) -> dict[str, bool]:
    """``overwrite=force`` when ``write`` takes it."""
    import inspect

    try:
        takes = "overwrite" in inspect.signature(write).parameters
    except (TypeError, ValueError):
        takes = False
    return {"overwrite": force} if takes else {}


def convert(
    path: str,
    output: str,
    *,
    to: str | None = None,
    force: bool = False,
    progress: Progress = QUIET,
) -> Outcome:
    fmt = convert_format(output, to)
    prof = open_profile(path)
    progress(f"writing {path} as {fmt}")
    if fmt == "snapshot":
        to_snapshot = getattr(prof, "to_snapshot", None)
        if to_snapshot is None:
            raise CommandError(
                "converting to a torch memory snapshot is not available in this version"
            )
        written = to_snapshot(output, **_overwrite(to_snapshot, force))
    else:
        written = prof.save(output, format=fmt, overwrite=force)
    doc = {**header("convert"), "source": path, "output": str(written), "format": fmt, "ok": True}
    return Outcome(doc, f"wrote {written} ({fmt})")


# -- commands that run a function on fake tensors ----------------------------------------
def _resolve(target: str, roots: Sequence[str] | None, progress: Progress) -> Callable:
    from .target import TargetError, resolve

    progress(f"importing {target}")
    try:
        return resolve(target, roots)
    except TargetError as err:
        raise CommandError(str(err)) from None


def estimate(
    target: str,
    *,
    device: str | None = "cuda:0",
    limit: Any = None,
    gpu: str | None = None,
    world_size: Any = None,
    allocator: str | None = None,
    context: Any = None,
    batch: int | None = None,
    save: str | None = None,
    html_out: str | None = None,
    rows: int = 8,
    roots: Sequence[str] | None = None,
    progress: Progress = QUIET,
) -> Outcome:
    """Estimate ``target``'s step on ``device``: its report, and the verdict on ``limit``."""
    from .._frontends.options import EstimateOptions

    given = dict(device=device, limit=limit, gpu=gpu, world_size=world_size)
    options = _checked(EstimateOptions.parse, allocator=allocator, context=context, **given)
    fn = _resolve(target, roots, progress)
    from .._frontends.estimate import estimate_with
    from .target import TargetError, arguments

    try:
        args, kwargs = arguments(fn, batch, target)
    except TargetError as err:
        raise CommandError(str(err)) from None
    progress(
        f"estimating {target} on {device or 'its devices'} (fake tensors: nothing is allocated)"
    )
    prof = estimate_with(options, fn, args, kwargs)
    progress(f"estimated in {prof.meta.get('wall_s') or 0:.1f} s")
    return _estimate_outcome(prof, target, device, rows, save, html_out, progress)


def _checked(parse: Callable, **given: Any) -> Any:
    """``parse(**given)``, a bad option one CommandError line (before the target is
    imported)."""
    from .._frontends.options import raised_as

    with raised_as(CommandError):
        return parse(**given)


def _estimate_outcome(prof, target, device, rows, save, html_out, progress) -> Outcome:
    """The estimate's document and text, after it is saved where asked."""
    doc = _report.report(prof, command="estimate", source=target, device=device, rows=rows)
    saved = []
    if save:
        saved.append(prof.save(save, overwrite=True))
    if html_out:
        progress(f"writing the dashboard to {html_out}")
        saved.append(prof.to_html(html_out, overwrite=True))
    if saved:
        doc["saved"] = [str(s) for s in saved]
    lines = [repr(prof), prof.explain_text(device, rows)]
    verdict = _report.verdict_text(doc["limit"])
    if verdict:
        lines.append(verdict)
    lines += [f"saved {s}" for s in saved]
    progress("reported")
    return Outcome(doc, "\n".join(lines))


def fit(
    target: str,
    *,
    limit: Any,
    device: str | None = "cuda:0",
    gpu: str | None = None,
    world_size: Any = None,
    allocator: str | None = None,
    context: Any = None,
    low: int = 1,
    high: int | None = None,
    roots: Sequence[str] | None = None,
    progress: Progress = QUIET,
) -> Outcome:
    """The largest batch size at which ``target``'s step fits ``limit`` on ``device``."""
    from .._frontends.options import EstimateOptions

    given = dict(device=device, limit=limit, gpu=gpu, world_size=world_size)
    options = _checked(EstimateOptions.parse, allocator=allocator, context=context, **given)
    if options.limit is None:
        raise CommandError("fit needs --limit, such as --limit 80GiB")
    fn = _resolve(target, roots, progress)
    from .._frontends.fit import fit_with
    from .target import TargetError, with_batch

    try:
        step = with_batch(fn, target)
    except TargetError as err:
        raise CommandError(str(err)) from None

    def probe(batch: int) -> Any:
        progress(f"estimating batch {batch}")
        return step(batch)

    probe.__name__ = step.__name__
    result = fit_with(options, probe, (), low, high)
    doc = _report.fit_document(result, target)
    text = result.text()
    if result.profile is None:
        text += f"\n(limit {format_bytes(options.limit)})"
    return Outcome(doc, text)
