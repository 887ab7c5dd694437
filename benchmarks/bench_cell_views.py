"""What the views under a ``%%memprofile`` cell cost: the summary's text, its HTML and the
dashboard's page (``page(live=True)``, what the widget shows), and how often the peak
analysis (``_analysis.peak.peak_point``) ran for them.

Run by hand: ``.venv/bin/python benchmarks/bench_cell_views.py [--steps 1 29] [--rounds 7]``.
Cases: bench_dashboard.py's capture of Adam steps of a 64-block MLP. Each round takes a new
``Profile`` of the same tables (what the views keep per profile starts empty, as for the
next cell) after one untimed round (imports, the template of the layout). Times are this
process's CPU seconds (``time.process_time``: on a shared machine, wall-clock times swing
with the others' load), the median (min-max) of ``--rounds``. ``--src DIR`` imports the package from ``DIR`` instead
(e.g. ``git archive main jupyter_memprof | tar -x -C DIR``), to compare two versions.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _use_source(src: str) -> None:
    """Import jupyter_memprof from ``src`` (ahead of the editable install)."""
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, src)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 29], help="steps per capture")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds (median)")
    ap.add_argument("--src", help="import the package from this folder")
    args = ap.parse_args()
    if args.src:
        _use_source(args.src)
    sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "tests")]

    import torch
    from bench_dashboard import capture, spread

    import jupyter_memprof
    from jupyter_memprof._analysis import peak as _peak
    from jupyter_memprof._views.dashboard import data as dashboard_data
    from jupyter_memprof._views.dashboard.page import page
    from jupyter_memprof._views.summary import summary_html, summary_text

    torch.set_num_threads(1)
    print(f"jupyter_memprof from {os.path.dirname(jupyter_memprof.__file__)}")
    calls = [0]
    real = _peak.peak_point

    def counted(*a, **k):
        calls[0] += 1
        return real(*a, **k)

    _peak.peak_point = counted
    if hasattr(dashboard_data, "peak_point"):  # a version that imported it by name
        dashboard_data.peak_point = counted

    def cell(prof) -> None:
        summary_text(prof)
        summary_html(prof)
        page(prof, header=False, live=True)

    for steps in args.steps:
        prof = capture(64, steps)
        again = type(prof)
        cell(again(**prof.tables, meta=dict(prof.meta)))
        times = []
        for _ in range(args.rounds):
            fresh = again(**prof.tables, meta=dict(prof.meta))
            calls[0] = 0
            t = time.process_time()
            cell(fresh)
            times.append(time.process_time() - t)
        print(
            f"{steps} step(s), {len(prof.events):,} events: views {spread(times)} CPU s, "
            f"peak computed {calls[0]} time(s) on {len(prof.devices)} device(s)"
        )
        del prof


if __name__ == "__main__":
    main()
