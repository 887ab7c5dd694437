"""One notebook cell profiled or estimated, then shown.

What the magic does once its options are read (:mod:`.magic_options`) and its code compiled
(:mod:`.cell`): :func:`profile_cell` runs the code inside a capture, :func:`estimate_cell`
on fake tensors; both end in :func:`deliver`, which stores the profile in ``_memprof`` (and
``-o VAR``), writes ``--html`` and shows the summary and the dashboard. When the cell raises
(or is interrupted), the partial profile is stored and shown, and the exception is raised
again.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError

from .cell import Code
from .magic_options import Options, html_refusal
from .progress import in_kernel, progress_for
from .session import LAST

__all__ = ["deliver", "estimate_cell", "profile_cell"]


def profile_cell(shell, code: Code, opts: Options, label: str, local_ns: dict | None) -> Any:
    """Run ``code`` inside a capture; returns the cell's value (a line magic's statement)."""
    from .._errors import CaptureError
    from .capture import profile

    name = opts.name
    progress = None if opts.no_display else progress_for(shell)
    try:
        capture = profile.from_options(
            opts.capture, namespace=shell.user_ns, label=label, progress=progress
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
        if type(err).__name__ == "MemoryBudgetExceeded" and not opts.no_display:
            print(
                f"{name}: the capture went over its memory budget; reading what it recorded…",
                flush=True,
            )
        if isinstance(err, KeyboardInterrupt) and not opts.no_display:
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

    if prof.meta.get("analysis_interrupted") and prof.meta.get("long_run"):
        deliver(shell, prof, opts)  # a long run keeps every window analysed: shown
        print(
            f"{name}: the analysis was interrupted ({prof.meta['analysis_error']}); "
            f"{LAST} holds the steps analysed (the summary says which are missing)",
            file=sys.stderr,
        )
    elif prof.meta.get("analysis_interrupted"):  # Ctrl-C while analysing: show nothing
        _store(shell, prof, opts)
        print(
            f"{name}: the analysis was interrupted ({prof.meta['analysis_error']}); "
            f"{LAST} holds the profile without its tables",
            file=sys.stderr,
        )
    elif isinstance(failure, Exception):
        _store(shell, prof, opts)
        reason = f"{type(failure).__name__}: {failure}"
        print(
            f"{name}: the code ran, but {capture.failed_step or 'profiling'} failed "
            f"({reason}); {LAST} holds what was built",
            file=sys.stderr,
        )
    else:
        deliver(shell, prof, opts)

    if raised is not None:
        raise raised
    if failure is not None and not isinstance(failure, Exception):
        raise failure  # the code ran fine; the interrupt was ours to pass on
    return value


def estimate_cell(shell, code: Code, opts: Options, label: str) -> None:
    """``--estimate``: run the cell on fake copies and show the estimate."""
    from .._errors import CaptureError, EstimateError
    from .estimate import estimate_cell as run_estimate_cell

    est = opts.estimate
    if opts.label is None:
        label = f"{label} (estimate)"
    try:
        prof = run_estimate_cell(shell, code, est, label=label)
    except (EstimateError, CaptureError) as err:  # CaptureError: another one is running
        raise UsageError(f"{opts.name} --estimate: {err}") from None

    def savings():
        from .whatif import cell_savings

        return cell_savings(shell, code, prof, est)

    deliver(shell, prof, opts, savings=savings if opts.explain else None)


def _store(shell, prof, opts: Options) -> None:
    """The profile in ``_memprof`` and ``-o VAR``: a module there is never replaced, and
    replacing any other value that is not a profile is said (one line)."""
    import types

    from .._results.profile import Profile

    shell.user_ns[LAST] = prof
    if not opts.output:
        return
    name, old = opts.output, shell.user_ns.get(opts.output)
    if isinstance(old, types.ModuleType):  # the cell bound it: the module stays
        print(
            f"{opts.name}: -o {name}: {name!r} holds a module, left as it is; the profile "
            f"is in {LAST}",
            file=sys.stderr,
        )
        return
    if old is not None and not isinstance(old, Profile):
        print(
            f"{opts.name}: -o {name} replaces {name!r} (a {type(old).__name__}) with the profile",
            file=sys.stderr,
        )
    shell.user_ns[name] = prof


def deliver(shell, prof, opts: Options, *, savings: Callable[[], Any] | None = None) -> None:
    """The profile to the user: stored in ``_memprof`` (and ``-o VAR``), written to
    ``--html``, shown (unless ``--no-display``), with ``--explain`` the ``savings()`` of
    the changes an estimate suggests."""
    _store(shell, prof, opts)
    if opts.html is not None:
        _write_html(prof, opts.html, opts.name, force=opts.force)
    if not opts.no_display:
        _show(
            shell,
            prof,
            opts.name,
            explain=opts.explain,
            savings=None if savings is None else savings(),
        )


def _write_html(prof, path: str, name: str, *, force: bool = False) -> None:
    import os

    from .._io import WriteRefused

    try:
        written = prof.to_html(os.path.expanduser(path), overwrite=force)
    except WriteRefused as exc:  # appeared while the cell ran
        print(f"{name}: {html_refusal(path, exc)}; {LAST} holds the profile", file=sys.stderr)
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
