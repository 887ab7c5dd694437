"""The ``%%memprofile`` and ``%memprofile`` magics: a thin adapter.

The options are declared and checked in :mod:`.magic_options`, the cell is compiled and run
as IPython runs it by :mod:`.cell`, and profiled (or estimated) and shown by
:mod:`.cell_profile`; this module only wires them to IPython.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import (
    Magics,
    line_cell_magic,
    line_magic,
    magics_class,
    needs_local_scope,
    no_var_expand,
    output_can_be_silenced,
)

from .._producers.recorder import LATER
from .cell import Code
from .cell_profile import estimate_cell, profile_cell
from .magic_open import OPEN_MAGIC, decorate_open, open_file
from .magic_options import MAGIC, decorate, read_options, split_statement
from .session import LAST

_MAGIC = MAGIC


@magics_class
class MemprofMagics(Magics):
    """``%%memprofile`` / ``%memprofile``: profile the PyTorch memory of a cell."""

    @decorate
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
        name = f"%%{MAGIC}" if cell is not None else f"%{MAGIC}"
        if cell is None:
            options, statement = split_statement(line)
            opts = read_options(shell, parser, options, name)
            if not statement:
                raise UsageError(
                    "%memprofile needs a statement to run, e.g. `%memprofile loss = step()`; "
                    "use %%memprofile on the first line of a cell to profile the whole cell"
                )
            source, header = statement, None
        else:
            opts = read_options(shell, parser, line, name)
            source, header = cell, f"%%{MAGIC} {line}".rstrip()
            local_ns = None
        code = Code(
            shell, source, header=header, statement=cell is None, display=opts.estimate is None
        )
        code.check_runnable()
        label = opts.label or opts.output or f"In[{code.number}]"
        if opts.estimate is not None:
            return estimate_cell(shell, code, opts, label)
        return profile_cell(shell, code, opts, label, local_ns)

    @decorate_open
    @no_var_expand
    @line_magic
    def memprofile_open(self, line: str = ""):
        """Open a file as a profile and show it as %%memprofile shows a cell's.

        PATH is any file jupyter_memprof.load opens: a torch memory snapshot (what
        torch.cuda.memory._dump_snapshot writes), a trace of torch's profiler, a profile
        saved with Profile.save. The profile is stored in `_memprof` (and in VAR with
        -o VAR), listed in the Memory profiles panel and displayed: a summary and, in a
        notebook, the dashboard. A missing or unreadable file is one UsageError line.

        Usage::

            %memprofile_open snapshot.pickle -o prof
        """
        open_file(self.shell, self.memprofile_open, line)


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
    """Register ``%%memprofile``/``%memprofile``/``%memprofile_open`` and start the panel's comm (idempotent)."""
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
    if _is_ours(manager.magics["line"].get(OPEN_MAGIC)):
        del manager.magics["line"][OPEN_MAGIC]
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
