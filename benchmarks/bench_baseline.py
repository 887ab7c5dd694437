"""What finding the baseline costs: the blocks live when a capture starts, named.

Every capture walks the namespace at its start (and again at its end, to name what the code
made) to find every tensor storage the session reaches (see docs/tables.md, "The
baseline"), and watches each with a weak reference. This prints, as medians of several
rounds in one process:

- the fixed cost of an empty ``%%memprofile`` cell in an IPython shell holding the
  quickstart's namespace (its TinyLM model after one AdamW step, the batch), against the
  same cell without the magic;
- the start's naming (walk, names, weak references) for that namespace, and for a namespace
  of about 1M Python objects and 10k tensors (250k small dicts in a list, 10k tensors in a
  dict, a model): the walk alone, and the walk with the names and weak references;
- the CPU's survey of the storages no name reaches (``_producers/unnamed.py``: every object
  the garbage collector tracks looked at), with the naming it needs, for the big namespace
  with 10k tensors more that no variable names: in this process (both namespaces live),
  then with 700k more objects the collector tracks (small objects and one-item lists; the
  big namespace's dicts hold only numbers and strings, which the collector does not track).

Run: ``.venv/bin/python benchmarks/bench_baseline.py [--rounds 7]``
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_estimate import quickstart

from jupyter_memprof._producers.live import SessionNames
from jupyter_memprof._producers.reach import reach
from jupyter_memprof._producers.recorder import _FreeWatch
from jupyter_memprof._producers.unnamed import unnamed_storages


def quickstart_namespace() -> dict:
    ns, step = quickstart()
    step()
    return ns


def big_namespace() -> dict:
    """About 1M Python objects and 10k tensors."""
    torch.manual_seed(0)
    records = [{"id": i, "score": float(i), "tag": f"r{i % 100}"} for i in range(250_000)]
    tensors = {f"t{i}": torch.zeros(4) for i in range(10_000)}
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    return {"records": records, "tensors": tensors, "model": model}


def count_objects(ns: dict) -> int:
    """Objects the namespace holds: containers and what they contain, counted once."""
    seen, todo = set(), list(ns.values())
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, dict):
            todo.extend(o.values())
        elif isinstance(o, (list, tuple)):
            todo.extend(o)
    return len(seen)


def timed(fn, rounds: int) -> tuple[list[float], list[float]]:
    """Wall-clock and CPU seconds of ``fn`` per round (CPU time tells this process's own
    work apart from waiting for a busy machine)."""
    wall, cpu = [], []
    for _ in range(rounds):
        gc.collect()
        c, t = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return wall, cpu


def start_names(ns: dict) -> int:
    watch = _FreeWatch()
    rows = SessionNames(ns).rows("start", watch=watch)
    watch.close()
    return len(rows)


class _Record:
    def __init__(self, i: int) -> None:
        self.i = i


def survey(ns: dict) -> int:
    """The start's survey of what no name reaches, given the names; the objects it saw."""
    watch = _FreeWatch()
    named = {(r.device, r.ptr) for r in SessionNames(ns).rows("start")}
    found = unnamed_storages(named, watch=watch)
    watch.close()
    return found.objects


def survey_rounds(big: dict, rounds: int) -> list[tuple[int, tuple[list, list]]]:
    """The survey's objects and times with 10k tensors more that no variable names, then
    with 700k more objects the collector tracks."""
    hidden = [torch.zeros(4) for _ in range(10_000)]
    out = [(survey(big), timed(lambda: survey(big), rounds))]
    filler = [_Record(i) for i in range(350_000)] + [[i] for i in range(350_000)]
    out.append((survey(big), timed(lambda: survey(big), rounds)))
    assert len(hidden) == 10_000 and len(filler) == 700_000
    return out


def empty_cell(ns: dict, rounds: int) -> tuple[list[float], list[float]]:
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.user_ns.update(ns)
    shell.run_line_magic("load_ext", "jupyter_memprof")
    magic, plain = ([], []), ([], [])
    with contextlib.redirect_stdout(io.StringIO()):
        shell.run_cell("%%memprofile\npass\n")  # first use: imports, the tracer's set-up
        for _ in range(rounds):
            for cell, sink in (("%%memprofile\npass\n", magic), ("pass\n", plain)):
                gc.collect()
                c, t = time.process_time(), time.perf_counter()
                shell.run_cell(cell)
                sink[0].append(time.perf_counter() - t)
                sink[1].append(time.process_time() - c)
    return magic, plain


def ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.1f} ms ({min(xs) * 1e3:.1f}–{max(xs) * 1e3:.1f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    q = quickstart_namespace()
    big = big_namespace()
    n_big = count_objects(big)
    rows_q = start_names(q)
    rows_big = start_names(big)
    r = {
        "quickstart walk": timed(lambda: reach(q), args.rounds),
        "quickstart names": timed(lambda: start_names(q), args.rounds),
        "big walk": timed(lambda: reach(big), args.rounds),
        "big names": timed(lambda: start_names(big), args.rounds),
    }
    surveys = survey_rounds(big, args.rounds)
    big.clear()  # the empty cell: in a process of the quickstart's size
    objects_q = len(gc.get_objects())
    magic, plain = empty_cell(q, args.rounds)
    print(f"torch {torch.__version__}; medians of {args.rounds} rounds (min–max)\n")
    print("| namespace | named storages | walk | walk, names and weak references |")
    print("|---|---:|---:|---:|")
    for label, key, rows in (
        ("quickstart (TinyLM after one AdamW step)", "quickstart", rows_q),
        (f"{n_big:,} Python objects, 10k tensors", "big", rows_big),
    ):
        walk, names = r[f"{key} walk"], r[f"{key} names"]
        print(
            f"| {label} | {rows:,} | {ms(walk[0])}, CPU {ms(walk[1])} "
            f"| {ms(names[0])}, CPU {ms(names[1])} |"
        )
    print("\nThe survey of what no name reaches (with the naming it needs):\n")
    print("| objects the collector tracks | survey and naming | naming alone |")
    print("|---:|---:|---:|")
    for n, (wall, cpu) in surveys:
        print(f"| {n:,} | {ms(wall)}, CPU {ms(cpu)} | {ms(r['big names'][0])} |")
    print(
        f"\nEmpty cell with the quickstart's namespace (IPython shell; {objects_q:,} objects "
        "the collector tracks):\n"
    )
    print("| cell | wall | CPU |")
    print("|---|---:|---:|")
    print(f"| `%%memprofile` + `pass` | {ms(magic[0])} | {ms(magic[1])} |")
    print(f"| `pass` | {ms(plain[0])} | {ms(plain[1])} |")
    fixed = [statistics.median(m) - statistics.median(p) for m, p in zip(magic, plain)]
    print(f"| the magic's fixed cost | {fixed[0] * 1e3:.1f} ms | {fixed[1] * 1e3:.1f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
