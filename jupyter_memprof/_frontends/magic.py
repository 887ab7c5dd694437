"""The ``%%memprofile`` cell magic and ``%memprofile STATEMENT`` line magic.

The cell runs as it would without the magic: IPython's input transforms (other magics,
``!cmd``), its AST transformers, its ``ast_node_interactivity`` (the last expression's value
is displayed, a trailing ``;`` silences it) and top-level ``await`` where an event loop can be
run. The code is compiled under the cell's own ``In[N]`` name with the line numbers the user
sees, so tracebacks and ``callsite`` point at the right cell line.

When the cell raises (or is interrupted), the partial profile is stored and shown, and the
exception is raised again; IPython then shows only the user's own frames, through the
``_render_traceback_`` hook it offers exceptions for exactly this.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import contextlib
import inspect
import keyword
import os
import re
import sys
import warnings
from typing import Any

from IPython.core import magic_arguments
from IPython.core.displayhook import DisplayHook
from IPython.core.error import UsageError
from IPython.core.magic import (
    Magics,
    line_cell_magic,
    magics_class,
    needs_local_scope,
    no_var_expand,
    output_can_be_silenced,
)

from .._producers.recorder import LATER
from .progress import in_kernel, progress_for
from .session import LAST

_MAGIC = "memprofile"
_ASSIGN_NODES = (ast.AugAssign, ast.AnnAssign, ast.Assign)


# -- running the user's code ----------------------------------------------------------------
class _Code:
    """User code compiled the way IPython compiles a cell, ready to run in the namespace.

    ``header`` is the magic's own line: it becomes line 1 of the cached source, so the
    body's line numbers are the ones the user sees in the cell.
    """

    def __init__(
        self, shell, source: str, *, header: str | None, statement: bool, display: bool = True
    ) -> None:
        self.shell = shell
        transformed = shell.transform_cell(source)
        lead = "" if header is None else header + "\n"
        self.number = _cell_number(shell)
        name = shell.compile.cache(lead + transformed, self.number, raw_code=lead + source)
        tree = shell.compile.ast_parse(lead.count("\n") * "\n" + transformed, filename=name)
        tree = shell.transform_ast(tree)
        nodes = list(tree.body)
        if statement:
            # A line magic returns the value of a lone expression, like %time does.
            plan = [(nodes[-1], "eval")] if len(nodes) == 1 and _is_expr(nodes[0]) else None
            plan = plan or [(node, "exec") for node in nodes]
        else:
            quiet = not display or DisplayHook.semicolon_at_end_of_expression(transformed)
            plan = _interactive_plan(nodes, "none" if quiet else shell.ast_node_interactivity)
        flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0) if shell.autoawait else 0
        self.codes = []
        # each statement is started from a line of the cell (see _entry)
        self.entries = [_entry(name, getattr(node, "lineno", 1)) for node, _ in plan]
        with shell.compile.extra_flags(flags):
            for node, mode in plan:
                if mode == "eval":
                    mod = ast.Expression(node.value)
                elif mode == "single":
                    mod = ast.Interactive([node])
                else:
                    mod = ast.Module([node], [])
                self.codes.append((shell.compile(mod, name, mode), mode))
        self.is_async = any(code.co_flags & inspect.CO_COROUTINE for code, _ in self.codes)

    def check_runnable(self) -> None:
        """Top-level ``await`` needs an event loop we can run; a kernel's own loop is busy
        running this very cell, so there it cannot work."""
        if not self.is_async:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        raise UsageError(
            "top-level await cannot run inside %%memprofile here (the event loop is busy "
            "running this cell): use `with jupyter_memprof.profile() as prof:` around the "
            "awaits instead"
        )

    def run(self, local_ns: dict | None = None) -> Any:
        shell = self.shell
        glob = shell.user_global_ns
        loc = shell.user_ns if local_ns is None else local_ns
        value = None
        with shell.builtin_trap, shell.display_trap:
            for (code, mode), entry in zip(self.codes, self.entries):
                if code.co_flags & inspect.CO_COROUTINE:
                    result = shell.loop_runner(eval(code, glob, loc))
                else:
                    run = exec if mode == "exec" else eval
                    result = eval(entry, {"run": run, "code": code, "g": glob, "l": loc})
                value = result if mode == "eval" else None
        return value

    def own_traceback(self, err: BaseException) -> None:
        """Make IPython show ``err`` with the user's frames only (from the first frame of
        this code on), through IPython's ``_render_traceback_`` hook."""
        if hasattr(err, "_render_traceback_"):
            return
        ours = {code for code, _ in self.codes}
        tb = err.__traceback__
        while tb is not None and tb.tb_frame.f_code not in ours:
            tb = tb.tb_next
        if tb is None:
            return
        shell, etype = self.shell, type(err)

        def render() -> list[str]:
            return shell.InteractiveTB.structured_traceback(etype, err, tb, tb_offset=0)

        try:
            err._render_traceback_ = render
        except (AttributeError, TypeError):  # exceptions with __slots__
            pass


def _entry(name: str, line: int):
    """``run(code, g, l)`` compiled at ``line`` of the cell ``name``: a statement started
    from it is called from the cell's line, which is where torch's profiler finds the
    callsite of ops made on the cell's top level (``b = a @ a`` calls no Python function)."""
    return compile("\n" * (line - 1) + "run(code, g, l)", name, "eval")


def _is_expr(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr)


def _interactive_plan(nodes: list, interactivity: str) -> list[tuple[ast.AST, str]]:
    """Which nodes run in 'single' mode (their value displayed): IPython's rules from
    ``InteractiveShell.run_ast_nodes``.

    The rules are repeated here rather than calling ``run_ast_nodes`` itself: that method
    is a coroutine (driving it synchronously from inside a running kernel needs IPython's
    private ``_pseudo_sync_runner``), it runs every node through ``run_code``, which catches
    the cell's exception (KeyboardInterrupt included) and prints its traceback before the
    magic can stop the profiler and show the partial profile, and it always runs in
    ``user_ns``. IPython offers no public function for the plan alone.
    ``tests/test_magic.py::test_values_shown_are_the_ones_ipython_shows`` runs cells with
    and without the magic under every ``ast_node_interactivity`` and compares the output.
    """
    if not nodes:
        return []
    if interactivity == "last_expr_or_assign":
        last = nodes[-1]
        target = None
        if isinstance(last, ast.Assign) and len(last.targets) == 1:
            target = last.targets[0]
        elif isinstance(last, (ast.AugAssign, ast.AnnAssign)):
            target = last.target
        if isinstance(target, ast.Name):
            echo = ast.Expr(ast.Name(target.id, ast.Load()))
            ast.copy_location(echo, last)
            ast.fix_missing_locations(echo)
            nodes = [*nodes, echo]
        interactivity = "last_expr"
    if interactivity == "last_expr":
        interactivity = "last" if _is_expr(nodes[-1]) else "none"
    if interactivity == "all":
        return [(node, "single") for node in nodes]
    if interactivity == "last":
        return [(node, "exec") for node in nodes[:-1]] + [(nodes[-1], "single")]
    return [(node, "exec") for node in nodes]


def _cell_number(shell) -> int:
    """The ``N`` of the running cell's ``In[N]``."""
    running = getattr(shell.displayhook, "exec_result", None)
    number = getattr(running, "execution_count", None)
    return int(number) if number is not None else int(shell.execution_count)


# -- options ---------------------------------------------------------------------------------
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


def _split_statement(line: str, parser) -> tuple[str, str]:
    """Split ``%memprofile`` arguments into the options and the statement after them,
    keeping the statement exactly as typed. ``--`` ends the options explicitly."""
    takes_value = {}
    for action in parser._actions:
        for opt in action.option_strings:
            takes_value[opt] = action.nargs != 0
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


def _unquote(value: str | None) -> str | None:
    """IPython's magic argument splitter keeps quotes: ``--label "step 1"`` -> ``step 1``."""
    if value is not None and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _parse_options(parser, options: str, name: str):
    """The magic's options, parsed by IPython's own argument parser; a line it cannot split
    (an unclosed quote) is one UsageError line, not a ValueError."""
    try:
        return parser.parse_argstring(options)
    except ValueError as err:
        raise UsageError(f"{name}: cannot read the options {options.strip()!r} ({err})") from None


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


def _devices(values: list[str] | None) -> str | list[str] | None:
    if not values:
        return None
    from .._devices import split_devices

    out = split_devices(values)
    if not out:
        raise UsageError("--device needs a device: 'cpu', 'cuda' or 'cuda:N'")
    return out[0] if len(out) == 1 else out


# -- the magic -------------------------------------------------------------------------------
@magics_class
class MemprofMagics(Magics):
    """``%%memprofile`` / ``%memprofile``: profile the PyTorch memory of a cell."""

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        "-o",
        "--output",
        metavar="VAR",
        help="Store the profile in the notebook variable VAR (it is always in `_memprof`).",
    )
    @magic_arguments.argument(
        "--no-display",
        action="store_true",
        help="Do not display the profile (nor analysis progress) after the cell.",
    )
    @magic_arguments.argument(
        "--no-stack",
        action="store_true",
        help="Do not record Python stacks: a cheaper capture, with no `callsite` on ops.",
    )
    @magic_arguments.argument(
        "--device",
        action="append",
        metavar="DEV",
        help="Devices whose memory to record: cpu, cuda, cuda:N. Repeat it or give a "
        "comma-separated list. Default: the CPU and every visible CUDA device.",
    )
    @magic_arguments.argument(
        "--html",
        metavar="PATH",
        help="Also write the interactive report to PATH as one standalone HTML file.",
    )
    @magic_arguments.argument(
        "--force",
        action="store_true",
        help="With --html: replace PATH even when it is not an earlier HTML report (without "
        "it such a file is left alone).",
    )
    @magic_arguments.argument(
        "--estimate",
        action="store_true",
        help="Estimate the cell's memory without running it for real: the cell runs on "
        "fake tensors (no compute, no memory). The notebook names it reads (and that the "
        "notebook functions it calls read) are bound to fake copies while it runs; "
        "afterwards every name is bound as before the cell, so names the cell assigns are "
        "not kept (they would hold fake tensors). With --device cuda[:N] it works without a "
        "GPU.",
    )
    @magic_arguments.argument(
        "--limit",
        metavar="SIZE",
        help="With --estimate: a memory limit such as 24GiB; the profile then says where "
        "the cell would run out of memory.",
    )
    @magic_arguments.argument(
        "--allocator",
        metavar="SETTING",
        help="PYTORCH_CUDA_ALLOC_CONF settings for the model of CUDA's caching allocator "
        "(reserved memory, segments), e.g. expandable_segments:True; default: the "
        "environment's.",
    )
    @magic_arguments.argument(
        "--context",
        metavar="SIZE",
        help="With --estimate --limit: the memory a CUDA device holds outside PyTorch (CUDA "
        "context, library handles); default 751MiB (measured on an H100).",
    )
    @magic_arguments.argument(
        "--explain",
        action="store_true",
        help="Also show the peak explained: its few largest groups (category x module "
        "family), what each is for and the what_if() changes that could cut it. With "
        "--estimate, each change is also estimated on the cell (one more estimate each) "
        "and the biggest saving named.",
    )
    @magic_arguments.argument(
        "--gpu",
        metavar="GPU",
        help="With --estimate for CUDA: the GPU whose kernels the estimate follows, a name "
        "(H100, the default; A100, L4, ...) or a compute capability (sm80).",
    )
    @magic_arguments.argument(
        "--label",
        metavar="TEXT",
        help="Name shown in summaries and the Memory profiles panel "
        "(default: the -o name, else In[N]).",
    )
    @no_var_expand
    @needs_local_scope
    @output_can_be_silenced
    @line_cell_magic
    def memprofile(self, line: str = "", cell: str | None = None, local_ns: dict | None = None):
        """Profile the PyTorch memory used by a cell (or by one statement).

        The cell runs exactly as it would without the magic; afterwards its profile, a
        jupyter_memprof.Profile with pandas tables (ops, allocations, versions,
        events, timeline, flows, uses, names), is stored in `_memprof` (and in VAR with
        -o VAR) and displayed: a summary and the interactive views in a notebook, a text
        summary in a terminal. If the cell raises or is interrupted, the profile up to
        that point is kept and shown, and the error is shown as usual. One capture or
        estimate runs at a time in a process (a second one, e.g. from another thread, is a
        UsageError).

        --html PATH also writes the interactive report to PATH; it replaces an earlier
        report there but refuses (before the cell runs) any other file, unless --force.

        Usage, as a cell magic::

            %%memprofile -o prof
            loss = model(x).sum()
            loss.backward()

        As a line magic, it profiles one statement and returns its value::

            %memprofile -o prof loss = model(x).sum()

        With --estimate the cell does not run for real: it runs on fake tensors (shapes,
        no data) and the profile is an estimate, on any device (--device cuda:0 needs no
        GPU), optionally against a --limit. The notebook names it reads are bound to fake
        copies while it runs; afterwards every name is bound as before the cell, so names
        the cell assigns are not kept::

            %%memprofile --estimate --device cuda:0 --limit 24GiB -o est
            train_step()
        """
        shell = self.shell
        parser = self.memprofile.parser
        name = f"%%{_MAGIC}" if cell is not None else f"%{_MAGIC}"
        if cell is None:
            options, statement = _split_statement(line, parser)
            args = _parse_options(parser, options, name)
            if not statement:
                raise UsageError(
                    "%memprofile needs a statement to run, e.g. `%memprofile loss = step()`; "
                    "use %%memprofile on the first line of a cell to profile the whole cell"
                )
            source, header = statement, None
        else:
            args = _parse_options(parser, line, name)
            source, header = cell, f"%%{_MAGIC} {line}".rstrip()
            local_ns = None
        args.label, args.html = _unquote(args.label), _unquote(args.html)
        args.limit = _unquote(args.limit)
        args.allocator, args.context = _unquote(args.allocator), _unquote(args.context)

        _check_output_name(shell, args.output)
        if args.estimate:
            estimate_options = _estimate_options(args, name)
        elif args.limit is not None:
            raise UsageError("--limit needs --estimate (a limit for an estimated cell)")
        elif args.context is not None:
            raise UsageError("--context needs --estimate (with --limit)")
        elif args.gpu is not None:
            raise UsageError("--gpu needs --estimate (the GPU an estimate's kernels follow)")
        else:
            devices = _devices(args.device)
            allocator = _allocator_option(args.allocator)
        if args.html is not None:
            # relative to the folder the cell starts in (the cell may change folders)
            args.html = os.path.abspath(os.path.expanduser(args.html))
            folder = os.path.dirname(args.html)
            if not os.path.isdir(folder):
                raise UsageError(f"--html: the folder {folder!r} does not exist")
            if not args.force:
                _check_html_target(args.html)
        elif args.force:
            raise UsageError("--force needs --html (it lets --html replace a file)")

        code = _Code(
            shell, source, header=header, statement=cell is None, display=not args.estimate
        )
        code.check_runnable()
        label = args.label or args.output or f"In[{code.number}]"
        if args.estimate:
            return self._estimate(code, args, name, label, local_ns, **estimate_options)

        from .._errors import CaptureError
        from .capture import profile

        progress = None if args.no_display else progress_for(shell)
        try:
            capture = profile(
                device=devices,
                with_stack=not args.no_stack,
                namespace=shell.user_ns,
                label=label,
                progress=progress,
                allocator=allocator,
            )
            prof = capture.start()
        except CaptureError as err:
            raise UsageError(str(err)) from None

        value, raised = None, None
        try:
            value = code.run(local_ns)
        except BaseException as err:  # the user's own error: shown as theirs, raised again
            raised = err
            code.own_traceback(err)
            if isinstance(err, KeyboardInterrupt) and not args.no_display:
                # at once: torch's stop and the reading take seconds on a long capture
                print(f"{name}: interrupted; reading the partial capture…", flush=True)

        failure = None  # ours, after the code ran: finish raises it only if the code did not
        try:
            capture.finish(raised)
        except BaseException as err:
            failure = err
        finally:
            if progress is not None:
                progress.close()

        shell.user_ns[LAST] = prof
        if args.output:
            shell.user_ns[args.output] = prof

        if prof.meta.get("analysis_interrupted"):  # Ctrl-C while analysing: show nothing
            print(
                f"{name}: the analysis was interrupted ({prof.meta['analysis_error']}); "
                f"{LAST} holds the profile without its tables",
                file=sys.stderr,
            )
        elif isinstance(failure, Exception):
            reason = f"{type(failure).__name__}: {failure}"
            print(
                f"{name}: the code ran, but {capture.failed_step or 'profiling'} failed "
                f"({reason}); {LAST} holds what was built",
                file=sys.stderr,
            )
        else:
            if args.html is not None:
                _write_html(prof, args.html, name, force=args.force)
            if not args.no_display:
                _show(shell, prof, name, explain=args.explain)

        if raised is not None:
            raise raised
        if failure is not None and not isinstance(failure, Exception):
            raise failure  # the code ran fine; the interrupt was ours to pass on
        return value

    def _estimate(
        self, code, args, name: str, label: str, local_ns, *, device, limit, allocator, context, gpu
    ):
        """``--estimate``: run the cell on fake copies and show the estimate."""
        from .._errors import CaptureError, EstimateError
        from .estimate import estimate_cell

        shell = self.shell
        if args.label is None:
            label = f"{label} (estimate)"
        try:
            prof = estimate_cell(
                shell,
                code,
                device=device,
                limit=limit,
                label=label,
                allocator=allocator,
                context=context,
                gpu=gpu,
            )
        except (EstimateError, CaptureError) as err:  # CaptureError: another one is running
            raise UsageError(f"{name} --estimate: {err}") from None
        shell.user_ns[LAST] = prof
        if args.output:
            shell.user_ns[args.output] = prof
        if args.html is not None:
            _write_html(prof, args.html, name, force=args.force)
        if not args.no_display:
            savings = None
            if args.explain:
                from .whatif import cell_savings

                savings = cell_savings(shell, code, prof, device=device)
            _show(shell, prof, name, explain=args.explain, savings=savings)


def _estimate_options(args, name: str) -> dict:
    """--device, --limit, --allocator, --context and --gpu of an estimate, checked before
    anything runs."""
    from .._devices import split_devices
    from .._errors import EstimateError
    from .estimate import check_allocator, check_context, check_device, check_gpu, check_limit

    wanted = split_devices(args.device or [])
    if len(wanted) > 1:
        raise UsageError(f"{name} --estimate takes one --device, not {', '.join(wanted)}")
    try:
        return {
            "device": check_device(wanted[0] if wanted else None),
            "limit": check_limit(args.limit),
            "allocator": check_allocator(args.allocator),
            "context": check_context(args.context),
            "gpu": check_gpu(_unquote(args.gpu)),
        }
    except EstimateError as err:
        raise UsageError(f"{name} --estimate: {err}") from None


def _allocator_option(setting):
    """--allocator of a real capture, checked before anything runs (None: the
    environment's)."""
    from .._analysis.allocator import config_from_env, parse_config
    from .._errors import AllocatorConfigError

    try:
        return config_from_env(os.environ) if setting is None else parse_config(setting)
    except AllocatorConfigError as err:
        raise UsageError(f"--allocator: {err}") from None


def _refusal(path: str, exc: Exception | None = None) -> str:
    from .._io import NotARegularFile

    if isinstance(exc, NotARegularFile):  # a FIFO, a device: --force does not help
        return f"--html: {exc}"
    return (
        f"--html: {path!r} exists and is not a jupyter_memprof HTML report; add --force to "
        "replace it"
    )


def _check_html_target(path: str) -> None:
    """Refuse, before the cell runs, to replace a file that is not an earlier report."""
    from .._io import WriteRefused, check_target

    def is_report(target: str) -> bool:  # bokeh is imported only when a file is there
        from .._views.dashboard_html import is_our_page

        return is_our_page(target)

    try:
        check_target(os.path.expanduser(path), is_own_kind=is_report)
    except WriteRefused as exc:
        raise UsageError(_refusal(path, exc)) from None
    except OSError:  # a folder in the way: reported after the cell, its profile kept
        pass


def _write_html(prof, path: str, name: str, *, force: bool = False) -> None:
    from .._io import WriteRefused

    try:
        written = prof.to_html(os.path.expanduser(path), overwrite=force)
    except WriteRefused as exc:  # appeared while the cell ran
        print(f"{name}: {_refusal(path, exc)}; {LAST} holds the profile", file=sys.stderr)
    except Exception as err:
        print(
            f"{name}: could not write the report to {path!r}: {type(err).__name__}: {err}",
            file=sys.stderr,
        )
    else:
        print(f"report written to {written}")


def _show(shell, prof, name: str, *, explain: bool = False, savings=None) -> None:
    """Display ``prof``: the summary (HTML in notebooks, text elsewhere), with ``explain``
    the peak explained (and for an estimate the ``savings`` of the changes it suggests),
    then in a kernel the interactive dashboard. A dashboard that cannot be built leaves the
    summary alone."""
    from IPython.display import display

    from .._views.summary import summary_html, summary_text

    try:
        display({"text/plain": summary_text(prof), "text/html": summary_html(prof)}, raw=True)
        if explain:
            _show_explain(prof, savings)
    except Exception as err:  # never break the user's cell over a summary
        print(f"{name}: could not summarise the profile: {err!r}", file=sys.stderr)
        return
    active = prof.events["action"].astype(object) != "preexisting"
    if not in_kernel(shell) or not active.any():  # no memory activity: nothing to draw
        return
    try:
        view = prof.show(header=False)  # the summary was displayed just above
    except Exception as err:  # never break the user's cell over the views
        print(
            f"{name}: interactive view unavailable: {type(err).__name__}: {err}",
            file=sys.stderr,
        )
        return
    display(view)


# -- extension entry points -----------------------------------------------------------------
def _is_ours(fn: Any) -> bool:
    owner = getattr(fn, "__self__", None)
    return (
        owner is not None
        and type(owner).__name__ == MemprofMagics.__name__
        and (type(owner).__module__ == __name__)
    )


def _comm_call(action: str, shell) -> None:
    """Start or stop the JupyterLab panel's comm; the magics work without it."""
    try:
        from . import comm as _comm

        getattr(_comm, action)(shell)
    except Exception as err:
        warnings.warn(
            f"jupyter_memprof: the Memory profiles panel could not {action}: {err}",
            RuntimeWarning,
            stacklevel=3,
        )


def load_extension(shell) -> None:
    """Register ``%%memprofile``/``%memprofile`` and start the panel's comm (idempotent)."""
    if _is_ours(shell.magics_manager.magics["cell"].get(_MAGIC)):
        return
    shell.register_magics(MemprofMagics)
    _comm_call("start", shell)
    # torch's raw result of a capture is freed after the cell, once its output is out
    shell.events.register("post_run_cell", LATER.free)
    LATER.enabled = True


def unload_extension(shell) -> None:
    """Remove the magics, the ``_memprof`` variable and the panel's comm."""
    manager = shell.magics_manager
    for kind in ("line", "cell"):
        if _is_ours(manager.magics[kind].get(_MAGIC)):
            del manager.magics[kind][_MAGIC]
    registered = manager.registry.get(MemprofMagics.__name__)
    if registered is not None and type(registered).__module__ == __name__:
        del manager.registry[MemprofMagics.__name__]
    last = shell.user_ns.get(LAST)
    if type(last).__name__ == "Profile" and type(last).__module__.startswith(
        __name__.split(".")[0] + "."
    ):
        del shell.user_ns[LAST]
    _comm_call("stop", shell)
    LATER.enabled = False
    with contextlib.suppress(ValueError):  # not registered
        shell.events.unregister("post_run_cell", LATER.free)
    LATER.free()


def _show_explain(prof, savings=None) -> None:
    """Display :meth:`Profile.explain` (text and HTML), then the savings of the changes
    tried on an estimate."""
    from IPython.display import display

    from .._views.explain import explain_html, explain_text, savings_html, savings_text

    table = prof.explain()
    text, page = explain_text(table), explain_html(table)
    if savings is not None and not savings.empty:
        text, page = f"{text}\n{savings_text(savings)}", page + savings_html(savings)
    display({"text/plain": text, "text/html": page}, raw=True)
