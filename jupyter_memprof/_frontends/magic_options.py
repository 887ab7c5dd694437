"""The magic's options, declared once, read into checked ``Options``.

:data:`OPTIONS` gives each option's flags, value and help; from it come the magic's argument
decorators (IPython's :mod:`~IPython.core.magic_arguments`, which parses them and writes
``%memprofile?``) and the split of ``%memprofile [options] STATEMENT`` into its options and
the statement, kept exactly as typed. :func:`read_options` checks every option before the
cell runs: whatever is wrong is one :class:`~IPython.core.error.UsageError` line.
"""

from __future__ import annotations

import builtins
import keyword
import os
import re
import types
from dataclasses import dataclass

from IPython.core import magic_arguments
from IPython.core.error import UsageError

from .._devices import split_devices
from .._units import shown
from .options import CaptureOptions, EstimateOptions, raised_as

__all__ = ["OPTIONS", "Option", "Options", "decorate", "read_options", "split_statement"]

MAGIC = "memprofile"


@dataclass(frozen=True)
class Option:
    """One option: its flags, the name of its value (None: a flag that takes none), whether
    it may be repeated, and its help."""

    flags: tuple[str, ...]
    value: str | None
    help: str
    repeat: bool = False
    #: the value may be left out (the option alone then reads as True)
    optional: bool = False

    def argument(self):
        """The :func:`magic_arguments.argument` decorator of this option."""
        if self.value is None:
            return magic_arguments.argument(*self.flags, action="store_true", help=self.help)
        if self.optional:
            return magic_arguments.argument(
                *self.flags, nargs="?", const=True, default=None, metavar=self.value,
                help=self.help,
            )  # fmt: skip
        action = "append" if self.repeat else "store"
        return magic_arguments.argument(
            *self.flags, action=action, metavar=self.value, help=self.help
        )


OPTIONS: tuple[Option, ...] = (
    Option(
        ("-o", "--output"),
        "VAR",
        "Store the profile in the notebook variable VAR (it is always in `_memprof`).",
    ),
    Option(
        ("--no-display",),
        None,
        "Do not display the profile (nor analysis progress) after the cell.",
    ),
    Option(
        ("--no-stack",),
        None,
        "Do not record Python stacks: a cheaper capture, with no `callsite` on ops.",
    ),
    Option(
        ("--device",),
        "DEV",
        "Devices whose memory to record: cpu, cuda, cuda:N. Repeat it or give a "
        "comma-separated list. Default: the CPU and every visible CUDA device.",
        repeat=True,
    ),
    Option(
        ("--html",),
        "PATH",
        "Also write the interactive report to PATH as one standalone HTML file.",
    ),
    Option(
        ("--force",),
        None,
        "With --html: replace PATH even when it is not an earlier HTML report (without "
        "it such a file is left alone).",
    ),
    Option(
        ("--estimate",),
        None,
        "Estimate the cell's memory without running it for real: the cell runs on "
        "fake tensors (no compute, no memory). The notebook names it reads (and that the "
        "notebook functions it calls read) are bound to fake copies while it runs; "
        "afterwards every name is bound as before the cell, so names the cell assigns are "
        "not kept (they would hold fake tensors). With --device cuda[:N] it works without a "
        "GPU.",
    ),
    Option(
        ("--limit",),
        "SIZE",
        "With --estimate: a memory limit such as 24GiB; the profile then says where "
        "the cell would run out of memory.",
    ),
    Option(
        ("--allocator",),
        "SETTING",
        "PYTORCH_CUDA_ALLOC_CONF settings for the model of CUDA's caching allocator "
        "(reserved memory, segments), e.g. expandable_segments:True; default: the "
        "environment's.",
    ),
    Option(
        ("--context",),
        "SIZE",
        "With --estimate --limit: the memory a CUDA device holds outside PyTorch (CUDA "
        "context, library handles); default 751MiB (measured on an H100).",
    ),
    Option(
        ("--explain",),
        None,
        "Also show the peak explained: its few largest groups (category x module "
        "family), what each is for and the what_if() changes that could cut it. With "
        "--estimate, each change is also estimated on the cell (one more estimate each) "
        "and the biggest saving named.",
    ),
    Option(
        ("--gpu",),
        "GPU",
        "With --estimate for CUDA: the GPU whose kernels the estimate follows, a name "
        "(H100, the default; A100, L4, ...) or a compute capability (sm80).",
    ),
    Option(
        ("--steps",),
        "N",
        "A long run: record the cell's loop in windows of N steps, each analysed as it "
        "ends, so memory does not grow with the loop (every step keeps its row in "
        "prof.steps; prof.leaks() covers the whole run).",
    ),
    Option(
        ("--keep",),
        "STEPS",
        "With --steps: the steps whose window keeps its full tables (prof.kept), "
        "comma-separated: first, peak, last (the default) and step numbers.",
    ),
    Option(
        ("--world-size",),
        "N",
        "With --estimate: run the cell as rank 0 of N ranks on torch's fake process group, "
        "so fully_shard (FSDP2), DDP and collectives behave as on N ranks.",
    ),
    Option(
        ("--snapshot",),
        "PATH",
        "CUDA only: also record the caching allocator's own history during the cell; "
        "prof.snapshot holds its snapshot (at an out-of-memory error: that moment), and "
        "with PATH it is also written there as the pickle memory_viz opens.",
        optional=True,
    ),
    Option(
        ("--label",),
        "TEXT",
        "Name shown in summaries and the Memory profiles panel (default: the -o name, else In[N]).",
    ),
)


def decorate(fn):
    """``fn`` with IPython's argument parser for :data:`OPTIONS` (options listed in order)."""
    for option in reversed(OPTIONS):
        fn = option.argument()(fn)
    return magic_arguments.magic_arguments()(fn)


def _takes_value() -> dict[str, bool]:
    # an option whose value may be left out takes one in a statement's line only as
    # ``--snapshot=PATH``: the word after it is the statement
    return {flag: o.value is not None and not o.optional for o in OPTIONS for flag in o.flags}


# -- splitting ``%memprofile [options] STATEMENT`` -------------------------------------------
def _token_end(text: str, pos: int) -> int:
    """End of the shell-like word starting at ``pos`` (quotes keep spaces inside)."""
    quote = None
    while pos < len(text):
        ch = text[pos]
        if quote:
            if ch == "\\" and quote == '"':
                pos += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch.isspace():
            break
        pos += 1
    return pos


def split_statement(line: str) -> tuple[str, str]:
    """Split ``%memprofile`` arguments into the options and the statement after them,
    keeping the statement exactly as typed. ``--`` ends the options explicitly; a long
    option may be abbreviated, as the parser allows."""
    takes_value = _takes_value()
    long_opts = [o for o in takes_value if o.startswith("--")]
    pos, expect_value = 0, False
    while True:
        while pos < len(line) and line[pos].isspace():
            pos += 1
        if pos >= len(line):
            return line, ""
        end = _token_end(line, pos)
        word = line[pos:end]
        if expect_value:
            expect_value = False
        elif word == "--":
            return line[:pos], line[end:].strip()
        elif word.startswith("-") and len(word) > 1:
            if "=" in word:
                pass
            elif word in takes_value:
                expect_value = takes_value[word]
            elif word.startswith("--"):
                matches = [o for o in long_opts if o.startswith(word)]
                expect_value = bool(matches) and all(takes_value[o] for o in matches)
            # "-oNAME": the value is attached.
        else:
            return line[:pos], line[pos:].strip()
        pos = end


# -- reading and checking --------------------------------------------------------------------
@dataclass(frozen=True)
class Options:
    """The magic's options, read and checked. ``name`` is how the magic was called
    (``%%memprofile`` or ``%memprofile``); ``capture`` holds a real run's checked options,
    ``estimate`` those of ``--estimate`` (the other one is None)."""

    name: str
    output: str | None
    label: str | None
    html: str | None
    force: bool
    no_display: bool
    explain: bool = False
    capture: CaptureOptions | None = None
    estimate: EstimateOptions | None = None


def _unquote(value: str | None) -> str | None:
    """IPython's magic argument splitter keeps quotes: ``--label "step 1"`` -> ``step 1``."""
    if value is not None and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _parse(parser, options: str, name: str):
    """The options, parsed by IPython's own argument parser; a line it cannot split (an
    unclosed quote) is one UsageError line, not a ValueError."""
    try:
        return parser.parse_argstring(options)
    except ValueError as err:
        raise UsageError(f"{name}: cannot read the options {options.strip()!r} ({err})") from None


#: the options whose value may come quoted
_QUOTED = ("label", "html", "limit", "allocator", "context", "gpu", "steps", "keep", "world_size")

#: the options only an estimate takes: (flag, attribute, what it is for)
_ESTIMATE_ONLY = (
    ("--limit", "limit", "a limit for an estimated cell"),
    ("--context", "context", "with --limit"),
    ("--gpu", "gpu", "the GPU an estimate's kernels follow"),
    ("--world-size", "world_size", "ranks simulated in an estimate"),
)


def read_options(shell, parser, options: str, name: str) -> Options:
    """``options`` read with ``parser`` (the magic's) and every option checked before the
    cell runs: one :class:`UsageError` line for whatever is wrong."""
    args = _parse(parser, options, name)
    for key in _QUOTED:
        setattr(args, key, _unquote(getattr(args, key)))
    _check_output_name(shell, args.output)
    _check_together(args, name)
    with raised_as(UsageError):  # a bad value: the line every entry point gives
        if args.estimate:
            capture, estimate = None, _estimate_options(args)
        else:
            capture, estimate = _capture_options(args), None
    html = args.html
    if html is not None:
        html = _html_path(html)
        if not args.force:
            check_html_target(html)
    elif args.force:
        raise UsageError("--force needs --html (it lets --html replace a file)")
    return Options(
        name=name,
        output=args.output,
        label=args.label,
        html=html,
        force=args.force,
        no_display=args.no_display,
        explain=args.explain,
        capture=capture,
        estimate=estimate,
    )


def _check_together(args, name: str) -> None:
    """Options that do not go together (a real run's with ``--estimate``, an estimate's
    without it)."""
    if args.estimate:
        if args.snapshot is not None:
            raise UsageError("--snapshot records CUDA's allocator in a real run, not --estimate")
        if args.steps is not None or args.keep is not None:
            raise UsageError("--steps and --keep need a real run, not --estimate")
        wanted = split_devices(args.device or [])
        if len(wanted) > 1:
            raise UsageError(f"{name} --estimate takes one --device, not {', '.join(wanted)}")
        return
    if args.keep is not None and args.steps is None:
        raise UsageError("--keep needs --steps (it says which windows of a long run to keep)")
    for flag, key, why in _ESTIMATE_ONLY:
        if getattr(args, key) is not None:
            raise UsageError(f"{flag} needs --estimate ({why})")


def _estimate_options(args) -> EstimateOptions:
    """``--estimate``'s --device, --limit, --allocator, --context, --gpu and --world-size."""
    wanted = split_devices(args.device or [])
    return EstimateOptions.parse(
        device=wanted[0] if wanted else None,
        limit=args.limit,
        allocator=args.allocator,
        context=args.context,
        gpu=args.gpu,
        world_size=args.world_size,
    )


def _capture_options(args) -> CaptureOptions:
    """A real run's --device, --no-stack, --allocator, --steps, --keep and --snapshot."""
    return CaptureOptions.from_kwargs(
        device=split_devices(args.device) if args.device else None,
        allocator=args.allocator,
        with_stack=not args.no_stack,
        steps=args.steps,
        keep=args.keep,
        snapshot=False if args.snapshot is None else args.snapshot,
    )


#: names IPython keeps its history and itself under (``_3``, ``_i3``, ``_ii``, ...)
_HISTORY_NAME = re.compile(r"_+|_i+|_i?\d+")


def _check_output_name(shell, name: str | None) -> None:
    """``-o NAME`` must be a variable of the user's own: not a keyword, a builtin (``print``),
    nor a name IPython keeps (``In``, ``get_ipython``, ``_``, ``_i3``, dunders)."""
    if name is None:
        return
    if not name.isidentifier() or keyword.iskeyword(name):
        raise UsageError(f"-o needs a Python variable name, not {name!r}")
    reserved = (
        name in getattr(shell, "user_ns_hidden", {})
        or hasattr(builtins, name)
        or _HISTORY_NAME.fullmatch(name) is not None
        or (name.startswith("__") and name.endswith("__"))
    )
    if reserved:
        raise UsageError(
            f"-o {name}: {name!r} is a name Python or IPython uses itself; choose another name"
        )
    held = getattr(shell, "user_ns", {}).get(name)
    if isinstance(held, types.ModuleType):
        raise UsageError(
            f"-o {name}: {name!r} holds the module {shown(held.__name__)}; choose another name"
        )


def html_refusal(path: str, exc: Exception | None = None) -> str:
    """Why --html will not write ``path``."""
    from .._io import NotARegularFile

    if isinstance(exc, NotARegularFile):  # a FIFO, a device: --force does not help
        return f"--html: {exc}"
    return (
        f"--html: {path!r} exists and is not a jupyter_memprof HTML report; add --force to "
        "replace it"
    )


def _html_path(given: str) -> str:
    """--html's file, absolute (relative to the folder the cell starts in: the cell may
    change folders), refused in one line before the cell runs when it cannot be written:
    no name, a folder, a folder that does not exist or cannot be written to."""
    if not given.strip() or "\0" in given:
        raise UsageError(f"--html needs the name of a file to write, not {shown(given)}")
    if given.endswith(("/", os.sep)):
        raise UsageError(f"--html: {shown(given)} names a folder; give a file name in it")
    path = os.path.abspath(os.path.expanduser(given))
    if os.path.isdir(path):
        raise UsageError(f"--html: {shown(path, 80)} is a folder; give a file name in it")
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise UsageError(f"--html: the folder {shown(folder, 80)} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--html: the folder {shown(folder, 80)} cannot be written to")
    return path


def check_html_target(path: str) -> None:
    """Refuse, before the cell runs, to replace a file that is not an earlier report."""
    from .._io import WriteRefused, check_target

    def is_report(target: str) -> bool:  # bokeh is imported only when a file is there
        from .._views.dashboard.html import is_our_page

        return is_our_page(target)

    try:
        check_target(os.path.expanduser(path), is_own_kind=is_report)
    except WriteRefused as exc:
        raise UsageError(html_refusal(path, exc)) from None
    except OSError:  # a folder in the way: reported after the cell, its profile kept
        pass


#: The checks the other magics (``%memprofile_open``) share.
check_output_name = _check_output_name
unquote = _unquote
