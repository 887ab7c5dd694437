"""Opening a big Kineto trace: ``jupyter_memprof.load_trace`` against a bare ``json.load``.

A real trace of a few Adam steps of a small MLP (``profile_memory=True``, ``with_stack=True``,
written by torch's profiler here) is repeated, shifted in time and address, until the file
holds ``--mb`` megabytes of JSON. Each reader then runs in its own process (so their peak
memory is their own): the wall time and the peak resident memory above the process's start
(after imports), the median of ``--rounds`` rounds, and the ratios.

Run: ``.venv/bin/python benchmarks/bench_trace.py [--mb 20] [--rounds 3] [--gzip]``
(the issue's target: ``--mb 500`` within 1.5x json.load's time and memory).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _seed_trace(path: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.LayerNorm(512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as p:
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    p.export_chrome_trace(path)


def write_big(path: str, mb: float, gz: bool) -> int:
    """Write a trace of about ``mb`` megabytes of JSON at ``path``; returns its events."""
    with tempfile.TemporaryDirectory() as tmp:
        seed = os.path.join(tmp, "seed.json")
        _seed_trace(seed)
        with open(seed) as fh:
            doc = json.load(fh)
    events = [e for e in doc["traceEvents"] if e.get("ph") in ("X", "i")]
    span = max(e["ts"] + e.get("dur", 0) for e in events) - min(e["ts"] for e in events)
    top = {k: v for k, v in doc.items() if k != "traceEvents"}
    opener = gzip.open if gz else open
    target, written, count, k = mb * 1e6, 0, 0, 0
    with opener(path, "wt", encoding="utf-8") as out:
        head = json.dumps(top)[:-1] + ', "traceEvents": ['
        out.write(head)
        written += len(head)
        while written < target:
            shift, addr_shift = k * (span + 10.0), k << 36
            parts = []
            for e in events:
                e2 = dict(e, ts=round(e["ts"] + shift, 3))
                if "Addr" in e.get("args", {}):
                    e2["args"] = dict(e["args"], Addr=e["args"]["Addr"] + addr_shift)
                parts.append(json.dumps(e2))
            chunk = ("," if k else "") + ",".join(parts)
            out.write(chunk)
            written += len(chunk)
            count += len(events)
            k += 1
        out.write("]}")
    return count


def _status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (``VmHWM``: this process's peak resident memory;
    unlike ``ru_maxrss`` it does not inherit the parent's peak across fork and exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _one(kind: str, path: str) -> None:
    """Run one reader in this (child) process and print its time and peak memory."""
    if kind == "trace":
        import jupyter_memprof

        # import the loader before measuring: load_trace imports the reader and the analysis
        # (and with them torch, about 1 s and 200 MiB) on its first call, not at import
        from jupyter_memprof._frontends import finish, traces  # noqa: F401
        from jupyter_memprof._producers import kineto  # noqa: F401
    base = _status_kib("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    if kind == "json":
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as fh:
            doc = json.load(fh)
        n = len(doc["traceEvents"])
    else:
        prof = jupyter_memprof.load_trace(path)
        n = len(prof.events)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = _status_kib("VmHWM")
    print(json.dumps({"s": dt, "cpu": cpu, "mib": (peak - base) / 1024, "n": n}))


def _measure(kind: str, path: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--one", kind, path], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gzip", action="store_true")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        _one(*args.one)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "big.pt.trace.json" + (".gz" if args.gzip else ""))
        n = write_big(path, args.mb, args.gzip)
        size = os.path.getsize(path)
        print(f"trace: {n} events, {size / 1e6:.1f} MB on disk{' (gzip)' if args.gzip else ''}")
        # the readers take turns, so that a busy machine slows both alike
        res: dict = {"json": [], "trace": []}
        for _ in range(args.rounds):
            for k in res:
                res[k].append(_measure(k, path))
    keys = ("s", "cpu", "mib")
    med = {k: {m: statistics.median(r[m] for r in v) for m in keys} for k, v in res.items()}
    for k, label in (("json", "json.load"), ("trace", "load_trace")):
        m = med[k]
        print(
            f"{label:>11}: {m['s']:7.2f} s ({m['cpu']:.2f} s CPU)  "
            f"{m['mib']:8.1f} MiB peak above start"
        )
    print(
        f"      ratio: {med['trace']['s'] / med['json']['s']:7.2f} x time "
        f"({med['trace']['cpu'] / med['json']['cpu']:.2f} x CPU)  "
        f"{med['trace']['mib'] / max(med['json']['mib'], 1e-9):8.2f} x memory"
    )


if __name__ == "__main__":
    main()
