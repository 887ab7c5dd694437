"""How long a torch memory snapshot takes to open, against ``pickle.load`` of the same file.

A synthetic snapshot of ``--entries`` trace entries (default 1,500,000; ``--quick``:
150,000), made here without a GPU the way ``_dump_snapshot`` writes one: training steps of
a 24-layer model on one device (each layer's activations made in forward and freed in
backward, gradients made in backward, the optimizer's temporaries), every entry with its
Python stack, 60 distinct stacks shared through the pickle memo as torch's are, segments
allocated as the blocks need them, the final ``segments`` state, ``ProfilerStep#N``
annotations. Written with ``pickle.dump`` at the default protocol.

Each measurement runs in a fresh process (``--rounds`` times, the median), timed after its
imports (a notebook has them already): the wall time and what the process's peak resident
memory (``ru_maxrss``) grew by, of ``pickle.load`` alone, and of
``jupyter_memprof.load_snapshot`` up to its summary (reading, checking, the analysis), and
where torch is installed, of torch's own Python reader of a snapshot's trace
(``torch.cuda._memory_viz.trace``, printing to /dev/null). The ratios are what
docs/snapshots.md reports.

``--dashboard``: then, in a fresh process that opens the snapshot from its cached copy, the
seconds of its dashboard: the widget's build (``prof.show(header=False)``, after a first
dashboard of a small profile has paid the imports), ``to_html`` and the HTML's size, the
page's first render in headless Chromium (``window.memprofReady``), a zoom in the page (3x
in, from the range's change to the redrawn frame) and the kernel's answer to a zoom beyond
the levels sent (``levels.zoomed``), and the process's peak memory.

Run: ``.venv/bin/python benchmarks/bench_snapshot.py [--entries 1500000] [--quick]
[--dashboard]``
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile

MiB = 2**20
SITE = "/opt/conda/lib/python3.11/site-packages/torch/"


def _stacks() -> dict[str, list]:
    user = [{"filename": "/home/u/train.py", "line": 80, "name": "main"}]
    out = {}
    for i in range(24):
        out[f"fwd{i}"] = [
            {"filename": SITE + "nn/modules/linear.py", "line": 125, "name": "forward"},
            {"filename": SITE + "nn/modules/module.py", "line": 1750, "name": "_call_impl"},
            {"filename": "/home/u/model.py", "line": 30 + i, "name": "forward"},
            {"filename": SITE + "nn/modules/module.py", "line": 1750, "name": "_call_impl"},
            {"filename": "/home/u/train.py", "line": 60, "name": "step"},
            *user,
        ]
        out[f"bwd{i}"] = [
            {"filename": SITE + "autograd/graph.py", "line": 824, "name": "_engine_run_backward"},
            {"filename": SITE + "_tensor.py", "line": 626, "name": "backward"},
            {"filename": "/home/u/train.py", "line": 62, "name": "step"},
            *user,
        ]
    for i in range(12):
        out[f"opt{i}"] = [
            {"filename": SITE + "optim/adam.py", "line": 400 + i, "name": "_single_tensor_adam"},
            {"filename": SITE + "optim/adam.py", "line": 230, "name": "step"},
            {"filename": "/home/u/train.py", "line": 64, "name": "step"},
            *user,
        ]
    return out


def make_snapshot(entries: int, seed: int = 0) -> dict:
    """A snapshot of about ``entries`` trace entries (see the module's docstring)."""
    rng = random.Random(seed)
    stacks = _stacks()
    trace: list = []
    t = 0
    seg_at = 1 << 40
    sizes = [rng.choice([2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB]) for _ in range(24)]

    def add(action, addr, size, frames):
        nonlocal t
        t += rng.randint(1, 40)  # times and sizes vary as a real run's do
        trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                      "time_us": t, "frames": frames})  # fmt: skip

    # one segment per layer's activations, allocated once and cached
    for i in range(len(sizes)):
        add("segment_alloc", seg_at + i * 32 * MiB, 32 * MiB, stacks[f"fwd{i}"])
    annotations = []
    step = 0
    while len(trace) < entries:
        annotations.append({"name": f"ProfilerStep#{step}", "stage": "START", "time_us": t,
                            "device": 0})  # fmt: skip
        made = {}
        for k in range(40):  # forward: activations and small temporaries
            i = k % 24
            base = seg_at + i * 32 * MiB
            made[k] = sizes[i] // 8 - 512 * rng.randint(0, 256)
            add("alloc", base + (k // 24) * 4 * MiB, made[k], stacks[f"fwd{i}"])
        for k in reversed(range(40)):  # backward frees them; gradients come and go
            i = k % 24
            base = seg_at + i * 32 * MiB
            for action in ("free_requested", "free_completed"):
                add(action, base + (k // 24) * 4 * MiB, made[k], stacks[f"bwd{i}"])
            add("alloc", base + 24 * MiB, 4096, stacks[f"bwd{i}"])
            add("free_requested", base + 24 * MiB, 4096, stacks[f"bwd{i}"])
            add("free_completed", base + 24 * MiB, 4096, stacks[f"bwd{i}"])
        for k in range(12):
            add("alloc", seg_at + k * 32 * MiB + 28 * MiB, 8192, stacks[f"opt{k}"])
            add("free_completed", seg_at + k * 32 * MiB + 28 * MiB, 8192, stacks[f"opt{k}"])
        annotations.append({"name": f"ProfilerStep#{step}", "stage": "END", "time_us": t,
                            "device": 0})  # fmt: skip
        step += 1
    segments = [
        {"device": 0, "address": seg_at + i * 32 * MiB, "total_size": 32 * MiB,
         "allocated_size": 0, "active_size": 0, "requested_size": 0, "stream": 0,
         "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
         "frames": [], "blocks": [{"address": seg_at + i * 32 * MiB, "size": 32 * MiB,
                                   "requested_size": 0, "state": "inactive", "frames": []}]}
        for i in range(24)
    ]  # fmt: skip
    return {"segments": segments, "device_traces": [trace], "external_annotations": annotations,
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}  # fmt: skip


_IMPORTS = (
    "import jupyter_memprof as jm; from jupyter_memprof._frontends import snapshot_cache; "
    "snapshot_cache.MIN_BYTES = 0; "  # --quick's file is under the size cached by default
    "import jupyter_memprof._results.parquet; "  # its imports (pyarrow) are not the open's
    "jm.load_snapshot"  # the public name imports its module (a notebook has it already)
)


#: what each child imports before the clock starts, and what it then runs
def write(path: str, entries: int) -> None:
    with open(path, "wb") as f:
        pickle.dump(make_snapshot(entries), f)


_CHILD = {
    "pickle.load": ("import pickle", "pickle.load(open(PATH, 'rb'))"),
    "load_snapshot": (
        _IMPORTS,
        "p = jm.load_snapshot(PATH); p.summary()",
    ),
    "load_snapshot, again": (
        _IMPORTS,
        "p = jm.load_snapshot(PATH); p.summary(); assert p.meta['snapshot_cached']",
    ),
    "torch _memory_viz.trace": (
        "import pickle, contextlib; from torch.cuda import _memory_viz as v",
        "d = pickle.load(open(PATH, 'rb'))\n"
        "with open(os.devnull, 'w') as f, contextlib.redirect_stdout(f): v.trace(d)",
    ),
}


def measure(what: str, path: str, cache: str, use_cache: bool = False) -> tuple[float, int, float]:
    """(seconds, resident bytes its peak added, CPU seconds) of ``what`` in a fresh process,
    after its imports (a notebook has them already). The CPU seconds vary less than the
    wall time on a machine other work shares."""
    imports, run = _CHILD[what]
    code = (
        f"import os, time, resource, json\nPATH = {path!r}\n{imports}\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"t, c = time.perf_counter(), time.process_time()\n{run}\n"
        "print(json.dumps([time.perf_counter() - t, "
        "(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024, "
        "time.process_time() - c]))"
    )
    env = dict(os.environ, JUPYTER_MEMPROF_CACHE=cache if use_cache else "off")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # fmt: skip
    if out.returncode:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    s, rss, cpu = json.loads(out.stdout.strip().splitlines()[-1])
    return s, rss, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_500_000)
    ap.add_argument("--quick", action="store_true", help="150,000 entries, one round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true", help="leave out torch's own reader")
    ap.add_argument("--dashboard", action="store_true", help="time its dashboard too")
    args = ap.parse_args()
    entries, rounds = (150_000, 1) if args.quick else (args.entries, args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "snapshot.pickle")
        cache = os.path.join(tmp, "cache")
        # written by another process: a child's peak memory (ru_maxrss) starts at the
        # parent's, which must stay small
        write = f"import bench_snapshot as b; b.write({path!r}, {entries})"
        here = os.path.dirname(os.path.abspath(__file__))
        subprocess.run([sys.executable, "-c", write], cwd=here, check=True)
        print(f"{entries:,} entries, {os.path.getsize(path) / MiB:.1f} MiB on disk")
        base = None
        got: dict[str, tuple[float, float]] = {}
        for what in _CHILD:
            if args.no_torch and what.startswith("torch"):
                continue
            try:
                if "again" in what:  # the first open writes the cached copy
                    measure("load_snapshot", path, cache, use_cache=True)
                runs = [measure(what, path, cache, "again" in what) for _ in range(rounds)]
            except RuntimeError as e:
                print(f"{what:>24}: did not run ({e})")
                continue
            s, rss, cpu = (statistics.median(r[k] for r in runs) for k in range(3))
            base = base or (s, rss)
            got[what] = (s, rss, cpu)
            print(f"{what:>24}: {s:7.2f} s ({s / base[0]:4.1f}x), peak memory +{rss / MiB:6.0f} MiB "
                  f"({rss / base[1]:4.2f}x), CPU {cpu:6.2f} s")  # fmt: skip
        _ratios(got)
        if args.dashboard:
            dashboard(path, cache)


def _ratios(got: dict[str, tuple[float, float, float]]) -> None:
    """The issue's two ratios: the open against ``pickle.load`` (time and memory), the
    cached reopen against the first open; wall time, then CPU time."""
    if "pickle.load" in got and "load_snapshot" in got:
        (p, pm, pc), (o, om, oc) = got["pickle.load"], got["load_snapshot"]
        print(f"open / pickle.load: {o / p:.2f}x the time (CPU {oc / pc:.2f}x; target 2x), "
              f"{om / pm:.2f}x the memory (target 1.5x)")  # fmt: skip
    if "load_snapshot" in got and "load_snapshot, again" in got:
        (o, _, oc), (a, _, ac) = got["load_snapshot"], got["load_snapshot, again"]
        print(
            f"cached reopen / first open: {a / o:.2f}x the time (CPU {ac / oc:.2f}x; target 0.1x)"
        )


_DASHBOARD = """
import json, os, resource, sys, tempfile, time
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "tests")]
import jupyter_memprof as jm
from bench_dashboard import ZOOM_JS, first_render_s
from _browser import chromium_page
from jupyter_memprof._views.dashboard import data as dd, levels
from bench_snapshot import make_snapshot
from jupyter_memprof._frontends import snapshot_cache
snapshot_cache.MIN_BYTES = 0  # as the measurements above: --quick's file is small
p = jm.load_snapshot(PATH)
assert p.meta["snapshot_cached"]
with tempfile.TemporaryDirectory() as tmp:
    html = os.path.join(tmp, "big.html")
    small = jm.load_snapshot(make_snapshot(2000))  # the first dashboard pays the imports
    small.show(header=False).close()
    small.to_html(html)
    t = time.perf_counter(); widget = p.show(header=False); show = time.perf_counter() - t
    t = time.perf_counter(); p.to_html(html); to_html = time.perf_counter() - t
    render = first_render_s(html, 1)[0]
    end = dd.window(p).end_ms
    with chromium_page(viewport=(1400, 1000)) as page:
        page.goto("file://" + html)
        page.wait_for_function("window.memprofReady !== undefined", timeout=600_000)
        zoom = page.evaluate(ZOOM_JS, [end * 0.41, end * 0.41 + end / 3])["ms"] / 1000
    src, _req, tl, stacked = widget._built.zoom[p.devices[0]]
    t = time.perf_counter(); levels.zoomed(p, tl, end * 0.63, end * 0.63 + end * 1e-4, 1400)
    kernel = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps([show, to_html, os.path.getsize(html), render, zoom, kernel, rss]))
"""


def dashboard(path: str, cache: str) -> None:
    """The dashboard of the snapshot at ``path`` (opened from its cached copy in ``cache``),
    timed in a fresh process (see the module docstring)."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = f"PATH = {path!r}\nHERE = {here!r}\n" + _DASHBOARD
    env = dict(os.environ, JUPYTER_MEMPROF_CACHE=cache)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=os.path.dirname(here))  # fmt: skip
    if out.returncode:
        print(f"dashboard: did not run ({out.stderr.strip().splitlines()[-1]})")
        return
    show, to_html, size, render, zoom, kernel, rss = json.loads(out.stdout.splitlines()[-1])
    print(f"dashboard: widget build {show:.2f} s, to_html {to_html:.2f} s ({size / 1e6:.1f} MB), "
          f"first render {render:.2f} s, a zoom in the page {zoom * 1000:.0f} ms, the kernel's "
          f"zoom beyond the levels {kernel * 1000:.0f} ms; peak memory {rss / MiB:.0f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
