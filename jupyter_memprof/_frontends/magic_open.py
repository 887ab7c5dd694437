"""``%memprofile_open PATH``: a file opened and shown.

One line opens a file as a profile, shown as ``%%memprofile``
shows a cell's.

Any file :func:`jupyter_memprof.load` opens: a torch memory snapshot (what
``torch.cuda.memory._dump_snapshot`` writes, or its JSON form), a trace of torch's profiler,
a profile saved by :meth:`Profile.save` (zip or Parquet folder). The profile goes to
``_memprof`` (and ``-o VAR``), into the Memory profiles panel, and is displayed: the summary,
and in a kernel the dashboard. A missing, damaged or foreign file is one
:class:`~IPython.core.error.UsageError` line and nothing else changes.
"""

from __future__ import annotations

import os

from IPython.core import magic_arguments
from IPython.core.error import UsageError

from .._errors import ProfileFileError
from .magic_options import Options, check_output_name, unquote

__all__ = ["OPEN_MAGIC", "decorate_open", "open_file"]

OPEN_MAGIC = "memprofile_open"


def decorate_open(fn):
    """``fn`` with the argument parser of ``%memprofile_open`` (which ``?`` shows)."""
    arguments = (
        magic_arguments.argument(
            "path", metavar="PATH", help="The file: a memory snapshot, a trace, a saved profile."
        ),
        magic_arguments.argument(
            "-o",
            "--output",
            metavar="VAR",
            help="Store the profile in the notebook variable VAR (it is always in `_memprof`).",
        ),
        magic_arguments.argument(
            "--label", metavar="TEXT", help="Its name in summaries (default: the file's name)."
        ),
        magic_arguments.argument(
            "--device",
            metavar="DEV",
            help="A memory snapshot's one CUDA device to open (cuda:N; default every one).",
        ),
        magic_arguments.argument(
            "--no-display", action="store_true", help="Store the profile; display nothing."
        ),
    )
    for argument in reversed(arguments):
        fn = argument(fn)
    return magic_arguments.magic_arguments()(fn)


def _parse(fn, line: str):
    name = f"%{OPEN_MAGIC}"
    if not line.strip():
        raise UsageError(f"{name} needs a file, e.g. `{name} snapshot.pickle -o prof`")
    try:
        return magic_arguments.parse_argstring(fn, line)
    except UsageError as err:
        raise UsageError(f"{name}: {err}") from None
    except ValueError as err:  # an unclosed quote
        raise UsageError(f"{name}: cannot read {line.strip()!r} ({err})") from None


def _load(path: str, device: str | None, label: str | None):
    """The profile of the file at ``path``; one UsageError line for whatever is wrong."""
    from .._producers.snapshot.unpickle import is_snapshot_file
    from .snapshot import load_snapshot
    from .traces import load_any

    name = f"%{OPEN_MAGIC}"
    if not os.path.exists(path):
        raise UsageError(f"{name}: no such file or folder: {path!r}")
    try:
        if device is not None:
            if os.path.isdir(path) or not is_snapshot_file(path):
                raise UsageError(f"{name}: --device is for a memory snapshot; {path!r} is not one")
            return load_snapshot(path, device=device, label=label)
        prof = load_any(path)
    except ProfileFileError as err:
        raise UsageError(f"{name}: {err}") from None
    except (ValueError, OSError) as err:  # a bad --device; an unreadable file
        raise UsageError(f"{name}: {type(err).__name__}: {err}") from None
    if label:
        prof.meta["label"] = label
    return prof


def open_file(shell, fn, line: str) -> None:
    """Run ``%memprofile_open line`` in ``shell`` (``fn``: the magic, for its parser)."""
    from .cell_profile import deliver

    args = _parse(fn, line)
    output, label = unquote(args.output), unquote(args.label)
    check_output_name(shell, output)
    path = os.path.expanduser(unquote(args.path) or "")
    prof = _load(path, unquote(args.device), label)
    opts = Options(
        name=f"%{OPEN_MAGIC}",
        output=output,
        label=label,
        html=None,
        force=False,
        no_display=args.no_display,
    )
    deliver(shell, prof, opts)
