"""The pytest plugin's light front: memory budgets for tests.

It is registered by the package (entry point
``pytest11``; or ``-p jupyter_memprof.pytest_plugin``). See docs/cli.md.

- ``@pytest.mark.memory_limit("24 GiB", device="cuda:0")``: the test body runs as an
  estimate on that device (fake tensors: no GPU needed) and the test fails, with the summary
  and what filled the peak, when it does not fit; ``estimate=False`` runs it for real under
  a capture. Several marks: several budgets (CPU and each device).
- the ``memprof`` fixture: ``with memprof as prof: ...`` captures part of the body,
  ``memprof.estimate(fn, ...)`` estimates a function, ``memprof.assert_fits(limit)``.
- ``--memprof-save DIR``: the profiles (zip) and dashboards (HTML) of every failing test.

This module is imported by every pytest run where the package is installed, so it imports
nothing heavy, and a test without the mark pays one marker lookup.
"""

from __future__ import annotations

import pytest

_KEPT = pytest.StashKey[list]()

MARK_HELP = (
    "memory_limit(limit, device=None, estimate=True, gpu=None, allocator=None, world_size=None):"
    " fail the test when its body needs more than `limit` (e.g. '24 GiB') on `device`;"
    " estimate=True runs the body on fake tensors (no GPU needed), False for real"
    " (jupyter_memprof, docs/cli.md)"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memprof", "jupyter_memprof memory budgets")
    group.addoption(
        "--memprof-save",
        metavar="DIR",
        default=None,
        help="keep the profile (zip) and dashboard (HTML) of every failing test in DIR",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARK_HELP)
    directory = config.getoption("memprof_save", None)
    if directory:
        config.pluginmanager.register(_Saver(str(directory)), "jupyter_memprof_saver")


def _kept(item: pytest.Item) -> list:
    kept = item.stash.get(_KEPT, None)
    if kept is None:
        kept = item.stash[_KEPT] = []
    return kept


# old-style wrappers (hookwrapper=True): they work with every pytest since 7, and this module
# is imported by every pytest run where the package is installed
@pytest.hookimpl(hookwrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    if pyfuncitem.get_closest_marker("memory_limit") is None:
        yield
        return
    from ._cli.budget import MARK, wrap

    original = pyfuncitem.obj
    marks = list(pyfuncitem.iter_markers(MARK))
    pyfuncitem.obj = wrap(original, marks, pyfuncitem, _kept(pyfuncitem))
    try:
        yield
    finally:
        pyfuncitem.obj = original


@pytest.fixture
def memprof(request: pytest.FixtureRequest):
    """Profiles of parts of the test body: ``with memprof as prof: ...``,
    ``memprof.estimate(fn, ...)``, ``memprof.profile``, ``memprof.assert_fits(limit)``."""
    from ._cli.budget import Memprof

    return Memprof(request.node.name, _kept(request.node))


class _Saver:
    """Registered only with ``--memprof-save``: saves the profiles of failing tests."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call):
        outcome = yield
        report = outcome.get_result()
        kept = item.stash.get(_KEPT, None)
        if report.when == "call" and report.failed and kept:
            from ._cli.budget import save_all

            written = save_all(self.directory, item.nodeid, kept)
            report.sections.append(("jupyter_memprof", "saved " + ", ".join(written)))
