"""The pytest plugin's work: memory budgets on tests.

Its light front is :mod:`jupyter_memprof.pytest_plugin`. The work:
memory budgets on tests, the ``memprof`` fixture, and keeping the profiles of failing tests.

``@pytest.mark.memory_limit("24 GiB", device="cuda:0")`` runs the test body as an estimate
on that device (fake tensors, no GPU needed) and fails the test, with the summary and what
filled the peak, when the step does not fit; ``estimate=False`` runs the body for real under
a capture and judges that. Several marks are several budgets: each estimate mark runs the
body once on fake tensors; the real marks share one real run.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import report as _report

#: The mark's name: ``@pytest.mark.memory_limit(limit, device=None, estimate=True, ...)``.
MARK = "memory_limit"

__all__ = ["MARK", "Budget", "BudgetError", "Memprof", "save_all", "wrap"]


class BudgetError(ValueError):
    """A memory_limit mark that cannot be used as written."""


@dataclass(frozen=True)
class Budget:
    """One ``memory_limit`` mark, checked: its estimate's options (``options.limit`` the
    limit) and the limit as written."""

    options: Any  # EstimateOptions
    text: str
    estimate: bool

    @property
    def limit(self) -> int:
        return self.options.limit

    @property
    def device(self) -> str | None:
        return self.options.device

    @classmethod
    def of(cls, mark) -> Budget:
        from .._frontends.options import EstimateOptions, raised_as

        args, kw = mark.args, dict(mark.kwargs)
        if len(args) != 1 and "limit" not in kw:
            raise BudgetError("memory_limit needs one limit, such as memory_limit('24 GiB')")
        limit = kw.pop("limit", None) if not args else args[0]
        known = {"device", "estimate", "gpu", "allocator", "world_size"}
        unknown = sorted(set(kw) - known)
        if unknown:
            raise BudgetError(f"memory_limit has no option {', '.join(unknown)}")
        estimate = bool(kw.pop("estimate", True))
        with raised_as(BudgetError, "memory_limit: "):
            options = EstimateOptions.from_kwargs(limit=limit, **kw)
        if options.limit is None:
            raise BudgetError("memory_limit needs a limit, such as memory_limit('24 GiB')")
        return cls(options=options, text=str(limit), estimate=estimate)

    def describe(self) -> str:
        where = f", device={self.device!r}" if self.device else ""
        how = "" if self.estimate else ", estimate=False"
        return f"memory_limit({self.text!r}{where}{how})"


def failure(budget_text: str, prof, verdict: dict[str, Any]) -> str:
    """What a failing budget says: the verdict, the summary, what filled the peak."""
    device = verdict["device"]
    over = verdict["first_over"] or {}
    lines = [
        f"{budget_text}: {_report.verdict_text(verdict)}",
        "",
        repr(prof),
        "",
        prof.explain_text(over.get("device") or device),
    ]
    return "\n".join(lines)


def _estimate(original: Callable, testargs: dict, budget: Budget, label: str):
    from .._frontends.estimate import run_estimate

    return run_estimate(
        lambda kw: original(**kw), (testargs,), {}, budget.options, names={}, label=label,
        remember=False,
    )  # fmt: skip


def _check(budget: Budget, prof) -> str | None:
    """The failure text when ``prof`` goes over the budget, else None. An estimate was run
    with the budget's limit and device, and judged then (``meta["oom"]``)."""
    if budget.estimate:
        verdict = _report.limit_verdict(prof)
    else:
        verdict = _report.limit_verdict(prof, budget.limit, budget.device)
    if verdict is None or verdict["fits"]:
        return None
    return failure(budget.describe(), prof, verdict)


def wrap(original: Callable, marks: list, item, kept: list) -> Callable:
    """``original`` (the test function) run under its budgets; the profiles go to ``kept``."""
    try:
        budgets, bad = [Budget.of(m) for m in marks], None
    except BudgetError as err:
        budgets, bad = [], str(err)

    @functools.wraps(original)
    def run(**testargs: Any) -> Any:
        import pytest

        if bad is not None:
            pytest.fail(bad, pytrace=False)
        failures = []
        for b in (b for b in budgets if b.estimate):
            prof = _estimate(original, testargs, b, f"{item.name} (estimate)")
            kept.append(prof)
            failures.append(_check(b, prof))
        real = [b for b in budgets if not b.estimate]
        result = None
        if real:
            from .. import profile, release

            with _test_alone(), profile(label=item.name, namespace={}) as prof:
                result = original(**testargs)
            release(prof)
            kept.append(prof)
            failures += [_check(b, prof) for b in real]
        failures = [f for f in failures if f]
        if failures:
            pytest.fail("\n\n".join(failures), pytrace=False)
        return result

    return run


@contextlib.contextmanager
def _test_alone():
    """A test's capture counts what the test makes and uses: not, on the CPU, the tensors
    that other tests, fixtures and test modules of the session keep alive, which a capture
    elsewhere counts as reachable by no name (``_producers/unnamed.py``)."""
    from .._producers import unnamed

    was, unnamed.ENABLED = unnamed.ENABLED, False
    try:
        yield
    finally:
        unnamed.ENABLED = was


class Memprof:
    """The ``memprof`` fixture: profiles of parts of the test body to assert on.

    ``with memprof as prof: step()`` captures the block for real (``prof`` is a
    :class:`~jupyter_memprof.Profile`, filled when the block ends);
    ``memprof.estimate(fn, *args, device="cuda:0")`` estimates ``fn`` on fake tensors;
    ``memprof.profile`` is the latest profile; ``memprof.assert_fits("2 GiB", device="cpu")``
    fails the test as a ``memory_limit`` mark would. With ``--memprof-save DIR`` every
    profile of a failing test is kept there.
    """

    def __init__(self, name: str, kept: list) -> None:
        self.name = name
        self.profiles = kept
        self._capture = None

    @property
    def profile(self):
        if not self.profiles:
            raise LookupError(
                "memprof has no profile yet: use `with memprof:` or memprof.estimate()"
            )
        return self.profiles[-1]

    def __enter__(self):
        from .. import profile

        if self._capture is not None:
            raise RuntimeError("memprof is capturing already: one `with memprof:` at a time")
        self._capture = profile(label=self.name, namespace={})
        with _test_alone():
            prof = self._capture.__enter__()
        self.profiles.append(prof)
        return prof

    def __exit__(self, *exc):
        capture, self._capture = self._capture, None
        try:
            return capture.__exit__(*exc)
        finally:
            from .. import release

            release(self.profiles[-1])

    def estimate(self, fn: Callable, *args: Any, **kwargs: Any):
        """:func:`jupyter_memprof.estimate` of ``fn(*args, **kwargs)``; kept as the latest."""
        from .. import estimate, release

        prof = estimate(fn, *args, **kwargs)
        release(prof)
        self.profiles.append(prof)
        return prof

    def assert_fits(self, limit: Any, device: str | None = None) -> None:
        """Fail the test when the latest profile goes over ``limit`` on ``device``."""
        import pytest

        verdict = _report.limit_verdict(self.profile, _report_size(limit), device)
        if verdict is not None and not verdict["fits"]:
            pytest.fail(
                failure(f"memprof.assert_fits({limit!r})", self.profile, verdict), pytrace=False
            )


def _report_size(limit: Any) -> int:
    from .commands import size

    n = size(limit)
    if n is None:
        raise BudgetError("assert_fits needs a limit, such as '2 GiB'")
    return n


def save_all(directory: str, nodeid: str, profiles: list) -> list[str]:
    """Save each profile (a zip) and its dashboard (HTML) in ``directory``, named after the
    test; returns the paths written."""
    os.makedirs(directory, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:150] or "test"
    written = []
    for i, prof in enumerate(profiles):
        base = os.path.join(directory, stem if len(profiles) == 1 else f"{stem}-{i + 1}")
        written.append(prof.save(base + ".zip", overwrite=True))
        written.append(prof.to_html(base + ".html", overwrite=True))
    return written
