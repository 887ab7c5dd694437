"""Dashboard size and speed on real captures: the time to build the notebook widget and to write
the standalone HTML in Python, the HTML's size, and its time to first render in headless
Chromium (Debian's, via tests/_browser.py).

Run by hand (``make bench`` or ``.venv/bin/python benchmarks/bench_dashboard.py``); prints one
table. Cases: one Adam step of a 64-block MLP of Linear+LayerNorm+ReLU (~30k events of torch's
event tree, ``prof.meta["event_count"]``, after a warm-up capture as in the other benchmarks),
and 29 such steps in one capture (~1M events). ``--quick`` runs only the first case.

``--events N`` (e.g. ``--events 10000000``) runs the size case instead: a synthetic profile of
N memory events (tests/_synthetic.py: a long job's sawtooth with spikes), whose targets for 10M
events are the dashboard's first render within 10 s (the widget's build in Python plus the
page's first render), each zoom or pan within 300 ms (in the page, from the range's change to
the redrawn frame; and the kernel's answer to a zoom beyond the levels sent), the standalone
HTML at most 25 MB, and every local peak within one pixel column of the true value (checked
after each zoom against the tables).

Each case first shows and writes its dashboard once (the first dashboard of a process also
pays imports, the document template of its layout and packing BokehJS). Then each round takes
the profile as new (its selection of what to draw forgotten, as for the next capture of the same
step) and times ``prof.show(header=False)`` (the widget under ``%%memprofile``), ``to_html``
right after it (which reuses the show's selection), and ``to_html`` of the profile taken as new
again (nothing shown before). Time to first render is ``performance.now()`` (ms since
navigation started) when the page has built every view and painted once
(``window.memprofReady``). Times are the median (min-max) of ``--rounds`` rounds and fresh
page loads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, HERE)

from _browser import chromium_page  # noqa: E402
from bench_analysis import warm_up_profiler  # noqa: E402

import jupyter_memprof  # noqa: E402

# (label, MLP blocks, steps in one capture, size target MB, render target s)
CASES = [
    ("1 Adam step, 64-block MLP", 64, 1, 2.0, 2.0),
    ("29 Adam steps, 64-block MLP", 64, 29, 10.0, 3.0),
]


def capture(blocks: int, steps: int, width: int = 64, batch: int = 32):
    torch.manual_seed(0)
    layers = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(batch, width)

    def step():
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    step()
    warm_up_profiler(step)
    with jupyter_memprof.profile(namespace={"model": model, "opt": opt, "x": x}) as prof:
        for _ in range(steps):
            step()
    return prof


def spread(xs: list[float]) -> str:
    """Median (min-max) of a list of seconds."""
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def dashboard_times(prof, path: str, rounds: int) -> tuple[list, list, list]:
    """Seconds of ``show(header=False)``, of ``to_html`` after it, and of ``to_html`` alone,
    per round, each round on the profile taken as new (see the module docstring)."""
    from jupyter_memprof._views.dashboard.page import forget

    prof.show(header=False).close()  # the first of the process: imports, template, BokehJS
    prof.to_html(path)
    show_s, after_s, alone_s = [], [], []
    for _ in range(rounds):
        forget(prof)
        t = time.perf_counter()
        widget = prof.show(header=False)
        show_s.append(time.perf_counter() - t)
        widget.close()
        t = time.perf_counter()
        prof.to_html(path)
        after_s.append(time.perf_counter() - t)
        forget(prof)
        t = time.perf_counter()
        prof.to_html(path)
        alone_s.append(time.perf_counter() - t)
    return show_s, after_s, alone_s


def first_render_s(path: str, runs: int = 3) -> list[float]:
    times = []
    for _ in range(runs):
        with chromium_page(viewport=(1400, 1000)) as page:
            page.goto("file://" + path)
            page.wait_for_function(
                "window.memprofReady !== undefined || window.memprofError !== undefined",
                timeout=120_000,
            )
            err = page.evaluate("window.memprofError")
            if err:
                raise RuntimeError(err)
            times.append(page.evaluate("window.memprofReady") / 1000)
    return times


ZOOM_JS = """async ([lo, hi]) => {
  const r = Bokeh.documents[0].get_model_by_name('memprof-time');
  const t0 = performance.now();
  r.setv({start: lo, end: hi});
  await new Promise((ok) => requestAnimationFrame(() => requestAnimationFrame(ok)));
  const d = Bokeh.documents[0].get_model_by_name('memprof-timeline-cuda:0').data;
  const plot = [...Bokeh.documents[0].all_models].find(
    (m) => m.type === 'Plot' && m.title && m.title.text.startsWith('cuda:0'));
  return {ms: performance.now() - t0, t: Array.from(d.t), total: Array.from(d.total),
    px: plot.inner_width, zoom: window.memprofZoom};
}"""


def size_case(events: int) -> None:
    """The synthetic profile of ``events`` memory events (see the module docstring)."""
    from _synthetic import local_peaks, synthetic_profile
    from test_dashboard_zoom import _peaks_within_a_column

    from jupyter_memprof._views.dashboard import data as dd
    from jupyter_memprof._views.dashboard import levels
    from jupyter_memprof._views.dashboard.page import forget

    t = time.perf_counter()
    prof = synthetic_profile(events)
    print(f"synthetic profile of {len(prof.events):,} events: {time.perf_counter() - t:.1f} s")
    prof.show(header=False).close()  # the first of the process: imports, template, BokehJS
    forget(prof)
    t = time.perf_counter()
    widget = prof.show(header=False)
    show_s = time.perf_counter() - t
    src, _req, tl, stacked = widget._built.zoom["cuda:0"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "big.html")
        t = time.perf_counter()
        prof.to_html(path)
        html_s = time.perf_counter() - t
        mb = os.path.getsize(path) / 1e6
        render = first_render_s(path, 1)[0]
        end = dd.window(prof).end_ms
        zooms, checked = [], 0
        with chromium_page(viewport=(1400, 1000)) as page:
            page.goto("file://" + path)
            page.wait_for_function("window.memprofReady !== undefined", timeout=120_000)
            lo, hi = 0.0, end
            for k in range(6):  # three zooms in (3x each), a pan, a zoom out, a pan
                if k < 3:
                    lo, hi = lo + (hi - lo) * 0.41, lo + (hi - lo) * 0.41 + (hi - lo) / 3
                elif k in (3, 5):
                    lo, hi = lo + (hi - lo) * 0.5, hi + (hi - lo) * 0.5
                else:
                    lo, hi = max(0.0, lo - (hi - lo)), min(end, hi + (hi - lo))
                got = page.evaluate(ZOOM_JS, [lo, hi])
                zooms.append(got["ms"] / 1000)
                if got["zoom"]["level"] == got["zoom"]["want"]:  # within the levels sent
                    truth = local_peaks(prof, round(lo * 1e6), round(hi * 1e6), got["px"])
                    t_ns = [x * 1e6 for x in got["t"]]
                    _peaks_within_a_column(t_ns, got["total"], truth, lo * 1e6, hi * 1e6)
                    checked += 1
    kernel = []
    for width in (1e-3, 1e-4, 1e-5):  # beyond the levels sent: the kernel answers
        lo = end * 0.63
        t = time.perf_counter()
        cols = levels.zoomed(prof, tl, lo, lo + end * width, 1400)
        kernel.append(time.perf_counter() - t)
        truth = local_peaks(prof, round(lo * 1e6), round((lo + end * width) * 1e6), 1400)
        t_ns = [x * 1e6 for x in cols["t"]]
        _peaks_within_a_column(t_ns, cols["total"], truth, lo * 1e6, (lo + end * width) * 1e6)
    widget.close()
    print(
        f"widget build (show) s: {show_s:.2f}; first render of the page s: {render:.2f}; "
        f"together {show_s + render:.2f} (<= 10)"
    )
    print(f"to_html s: {html_s:.2f}; HTML MB: {mb:.1f} (<= 25)")
    print(
        f"zoom/pan in the page s: {spread(zooms)} (each <= 0.3); peaks checked after "
        f"{checked} of {len(zooms)} (the others beyond the levels sent)"
    )
    print(f"kernel's answer to a zoom beyond the levels s: {spread(kernel)}; peaks checked")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the one-step case")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds and page loads (median)")
    ap.add_argument("--events", type=int, help="the size case: a synthetic profile of N events")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.events:
        size_case(args.events)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, blocks, steps, mb_target, s_target in CASES[:1] if args.quick else CASES:
            t = time.perf_counter()
            prof = capture(blocks, steps)
            capture_s = time.perf_counter() - t
            events = prof.meta.get("event_count")
            path = os.path.join(tmp, f"dash-{blocks}-{steps}.html")
            show_s, after_s, alone_s = dashboard_times(prof, path, args.rounds)
            mb = os.path.getsize(path) / 1e6
            renders = first_render_s(path, args.rounds)
            render_s = statistics.median(renders)
            ok = "yes" if mb <= mb_target and render_s <= s_target else "NO"
            rows.append(
                (
                    label,
                    f"{events:,}" if events is not None else "?",
                    f"{len(prof.ops):,}",
                    f"{len(prof.allocations):,}",
                    f"{capture_s:.1f}",
                    spread(show_s),
                    spread(after_s),
                    spread(alone_s),
                    f"{mb:.2f} (<= {mb_target:g})",
                    f"{spread(renders)} (<= {s_target:g})",
                    ok,
                )
            )
            del prof
    head = (
        "case",
        "profiler events",
        "ops",
        "blocks",
        "capture s",
        "show s",
        "to_html after show s",
        "to_html alone s",
        "HTML MB",
        "first render s",
        "meets targets",
    )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    print(line(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))


if __name__ == "__main__":
    main()
