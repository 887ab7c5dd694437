"""A notebook cell compiled and run as IPython runs it.

The cell runs as it would without the magic: IPython's input transforms (other magics,
``!cmd``), its AST transformers, its ``ast_node_interactivity`` (the last expression's value
is displayed, a trailing ``;`` silences it) and top-level ``await`` where an event loop can be
run. The code is compiled under the cell's own ``In[N]`` name with the line numbers the user
sees, so tracebacks and ``callsite`` point at the right cell line. When it raises, IPython
shows only the user's own frames, through the ``_render_traceback_`` hook it offers
exceptions for exactly this (:meth:`Code.own_traceback`).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
from typing import Any

from IPython.core.displayhook import DisplayHook
from IPython.core.error import UsageError

__all__ = ["Code"]


class Code:
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
