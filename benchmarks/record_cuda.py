"""Record real CUDA memory behaviour on a GPU, as small JSON files for the tests.

    python benchmarks/record_cuda.py streams OUT_DIR   # one file per scenario and setting
    python benchmarks/record_cuda.py kernels OUT_DIR   # kernel memory: SDPA, cuDNN, cuBLAS

Needs a GPU. Nothing here imports jupyter_memprof: the files are ground truth taken from
torch and the caching allocator alone, so the package's models can be checked against them
on machines without a GPU.

``streams``: every scenario of ``scenarios.py``, the quickstart model, the LSTM and a step
made to fragment, each in a fresh process (an empty caching allocator), under the
allocator settings in ``SETTINGS``. The allocator's own history
(``torch.cuda.memory._record_memory_history``: alloc, free_requested, free_completed,
segment_alloc, segment_free, segment_map, segment_unmap with addresses, sizes and streams)
is kept from the first allocation; the model is built and warmed up by one step, then one
more step is run under torch's profiler with memory on. The file holds:

- ``trace``: ``[action, addr, size, stream]`` rows from the empty allocator on (``actions``
  names the codes); ``step``: the ``[first, end)`` rows of the profiled step;
- ``profiler``: torch's Allocation events of that step, ``[t_ns from the step's start, ptr,
  alloc_size (negative for a free), total_allocated, total_reserved, op]`` (``ops`` names the
  enclosing ops of each, up to three, outermost first, ``" > "`` between them; -1 for none);
- ``segments_at_step_start``: ``torch.cuda.memory_snapshot()`` just before the step,
  ``[address, total_size, stream, pool, [[size, requested_size, state], ...]]``;
- ``totals``: the allocator's counters (``torch.cuda.memory_stats``) at the step's start
  and end, the step's peaks after ``reset_peak_memory_stats``, the whole run's peaks, and
  ``torch.cuda.mem_get_info`` (free, total) at both ends.

``kernels``: what CUDA kernels allocate inside ops (scaled-dot-product attention under each
backend, cuDNN's LSTM, cuDNN convolution, cuBLAS's workspace): for each case, every block
made during the case with its size, the ops that made it and the ops that freed it (up to
three enclosing ops, outermost first; none for a block still alive), the case's ops in order, and the allocator's counters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

ACTIONS = [
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
    "user_defined",
]

# allocator setting name -> PYTORCH_CUDA_ALLOC_CONF
SETTINGS = {
    "default": "",
    "expandable": "expandable_segments:True",
    "max_split_20": "max_split_size_mb:20",
    "roundup_4": "roundup_power2_divisions:4",
}
# which scenarios run under which settings
SETTING_SCENARIOS = {
    "default": None,  # all
    "expandable": ["fragment", "quickstart TinyLM + AdamW", "LSTM + Adam"],
    "max_split_20": ["fragment", "quickstart TinyLM + AdamW"],
    "roundup_4": ["fragment", "MLP + Adam"],
}


def _profiler_flags() -> dict:
    import torch

    return {
        "activities": [torch.profiler.ProfilerActivity.CPU],
        "profile_memory": True,
        "record_shapes": True,
        # without Python stacks, torch 2.11 drops the frees of CUDA blocks freed outside
        # any op (a `del` between ops): 312 of 320 frees of the fragment step were missing
        "with_stack": True,
    }


KEEP_STATS = (
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "active_bytes.all.current",
    "active_bytes.all.peak",
    "requested_bytes.all.current",
    "requested_bytes.all.peak",
    "inactive_split_bytes.all.current",
    "segment.all.current",
    "segment.all.peak",
    "segment.large_pool.current",
    "segment.small_pool.current",
    "reserved_bytes.large_pool.current",
    "reserved_bytes.small_pool.current",
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
    "num_sync_all_streams",
)


def fragment():
    """A step made to fragment: blocks of many sizes, kept or freed in a fixed pattern."""
    import torch

    g = torch.Generator().manual_seed(0)
    device = torch.get_default_device()  # made under `with torch.device(...)`
    kept: list = []

    def step():
        live = []
        for i in range(120):
            mib = float(torch.rand((), generator=g)) * 24 + 0.05
            n = int(mib * 2**20 / 4)
            live.append(torch.empty(n, device=device))
            if i % 3 == 2:
                del live[int(torch.randint(0, len(live), (), generator=g))]
            if i % 10 == 9:
                kept.append(live.pop(0))
        small = [
            torch.empty(int(torch.randint(1, 300_000, (), generator=g)), device=device)
            for _ in range(200)
        ]
        del small[::2]
        kept.extend(small[::5])
        del live, small
        while len(kept) > 40:
            kept.pop(int(torch.randint(0, len(kept), (), generator=g)))

    return {"kept": kept}, step


def scenarios() -> dict:
    from bench_estimate import lstm_adam, quickstart
    from scenarios import SCENARIOS

    out = dict(SCENARIOS)
    out["quickstart TinyLM + AdamW"] = quickstart
    out["LSTM + Adam"] = lstm_adam
    out["fragment"] = fragment
    return out


def _stats(torch, device) -> dict:
    s = torch.cuda.memory_stats(device)
    return {k: int(s.get(k, 0)) for k in KEEP_STATS}


def _walk(events, path, out):
    """Allocation events with the names of their enclosing ops, outermost first."""
    for ev in events:
        kind = type(ev.extra_fields).__name__
        if kind == "_ExtraFields_Allocation":
            out.append((ev, " > ".join(path[-3:]) if path else None))
            continue
        _walk(ev.children, path + (ev.name,) if kind == "_ExtraFields_TorchOp" else path, out)


def profiler_allocations(prof, device_index: int | None):
    """torch's Allocation events in time order, with the innermost op of each."""
    rows: list = []
    _walk(prof.profiler.kineto_results.experimental_event_tree(), (), rows)
    rows.sort(key=lambda r: r[0].start_time_ns)
    out = []
    for ev, op in rows:
        x = ev.extra_fields
        dev = x.device
        if device_index is not None and (dev.type != "cuda" or dev.index != device_index):
            continue
        out.append(
            {
                "t": ev.start_time_ns,
                "ptr": int(x.ptr),
                "size": int(x.alloc_size),
                "total_allocated": int(x.total_allocated),
                "total_reserved": int(x.total_reserved),
                "device": str(dev),
                "op": op,
            }
        )
    return out


def record_stream(name: str, setting: str, out_dir: str) -> None:
    """One scenario in this (fresh) process: see the module's docstring."""
    import torch

    device = torch.device("cuda:0")
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(
        enabled="all", context=None, stacks="python", max_entries=2_000_000
    )
    make = scenarios()[name]
    with torch.device(device):
        ns, step = make()
    step()  # warm-up: gradients, optimizer state, workspaces
    torch.cuda.synchronize()
    start_snapshot = torch.cuda.memory_snapshot()
    first = len(torch.cuda.memory._snapshot()["device_traces"][0])
    info_start = torch.cuda.mem_get_info(device)
    stats_start = _stats(torch, device)
    torch.cuda.reset_peak_memory_stats(device)
    t0 = time.time_ns()
    with torch.profiler.profile(**_profiler_flags()) as prof:
        step()
        torch.cuda.synchronize()
    stats_end = _stats(torch, device)
    info_end = torch.cuda.mem_get_info(device)
    snap = torch.cuda.memory._snapshot()
    trace = snap["device_traces"][0]
    end = len(trace)
    torch.cuda.memory._record_memory_history(enabled=None)
    allocs = profiler_allocations(prof, 0)
    ops = sorted({a["op"] for a in allocs if a["op"]})
    op_index = {o: i for i, o in enumerate(ops)}
    segs = []
    for seg in start_snapshot:
        if seg.get("device", 0) != 0:
            continue
        segs.append(
            [
                int(seg["address"]),
                int(seg["total_size"]),
                int(seg["stream"]),
                seg["segment_type"],
                [
                    [int(b["size"]), int(b.get("requested_size", 0)), b["state"]]
                    for b in seg["blocks"]
                ],
            ]
        )
    act = {a: i for i, a in enumerate(ACTIONS)}
    data = {
        "format": "jupyter_memprof cuda stream 1",
        "scenario": name,
        "setting": setting,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "gpu": torch.cuda.get_device_name(device),
        "capability": list(torch.cuda.get_device_capability(device)),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "actions": ACTIONS,
        "trace": [
            [
                act.get(e["action"], -1),
                int(e.get("addr", 0)),
                int(e.get("size", 0)),
                int(e.get("stream", 0)),
            ]
            for e in trace
        ],
        "step": [first, end],
        "ops": ops,
        "profiler": [
            [
                a["t"] - t0,
                a["ptr"],
                a["size"],
                a["total_allocated"],
                a["total_reserved"],
                op_index.get(a["op"], -1),
            ]
            for a in allocs
        ],
        "segments_at_step_start": segs,
        "totals": {
            "step_start": stats_start,
            "step_end": stats_end,
            "step_max_memory_allocated": int(torch.cuda.max_memory_allocated(device)),
            "step_max_memory_reserved": int(torch.cuda.max_memory_reserved(device)),
            "mem_get_info_start": list(info_start),
            "mem_get_info_end": list(info_end),
        },
    }
    unknown = {e["action"] for e in trace if e["action"] not in act}
    if unknown:
        data["unknown_actions"] = sorted(unknown)
    slug = name.split(" (")[0].lower().replace(" + ", "_").replace(" ", "_").replace(",", "")
    slug = "".join(c for c in slug if c.isalnum() or c == "_")
    path = os.path.join(out_dir, f"{slug}__{setting}.json")
    with open(path, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    print(
        f"{name} [{setting}]: {len(trace)} trace rows, step {end - first}, "
        f"{len(allocs)} profiler events, step peaks reserved "
        f"{data['totals']['step_max_memory_reserved']:,} allocated "
        f"{data['totals']['step_max_memory_allocated']:,} -> {path}"
    )


def streams(out_dir: str) -> int:
    os.makedirs(out_dir, exist_ok=True)
    failed = 0
    for setting, conf in SETTINGS.items():
        names = SETTING_SCENARIOS[setting] or list(scenarios())
        for name in names:
            env = dict(os.environ)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if conf:
                env["PYTORCH_CUDA_ALLOC_CONF"] = conf
            r = subprocess.run([sys.executable, __file__, "_one", name, setting, out_dir], env=env)
            failed += r.returncode != 0
    return 1 if failed else 0


# -- kernels -----------------------------------------------------------------------------------
def kernel_case(torch, fn, device) -> dict:
    """Run fn under torch's profiler and return every block made during it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with torch.profiler.profile(**_profiler_flags()) as prof:
        keep = fn()
        torch.cuda.synchronize()
    after = torch.cuda.memory_allocated(device)
    peak = torch.cuda.max_memory_allocated(device)
    allocs = profiler_allocations(prof, device.index)
    live: dict = {}
    blocks = []
    for a in allocs:
        if a["size"] > 0:
            live[a["ptr"]] = len(blocks)
            blocks.append([a["op"], a["size"], None, a["t"], None])
        else:
            i = live.pop(a["ptr"], None)
            if i is None:
                blocks.append([None, a["size"], a["op"], None, a["t"]])
            else:
                blocks[i][2] = a["op"] or ""
                blocks[i][4] = a["t"]
    ops = []

    def walk(evs, depth):
        for ev in evs:
            if type(ev.extra_fields).__name__ == "_ExtraFields_TorchOp" and depth < 3:
                ops.append(ev.name)
                walk(ev.children, depth + 1)

    walk(prof.profiler.kineto_results.experimental_event_tree(), 0)
    del keep
    return {
        "blocks": [[b[0], b[1], b[2]] for b in blocks],
        "ops": ops[:400],
        "allocated_before": before,
        "allocated_after": after,
        "peak_growth": peak - before,
    }


def sdpa_cases(torch, device, out):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {
        "default": None,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }
    shapes = [
        (2, 4, 128, 64),
        (4, 8, 256, 64),
        (1, 16, 1024, 128),
        (2, 4, 100, 64),
        (3, 5, 77, 80),
        (8, 4, 32, 16),
        (2, 2, 513, 32),
    ]
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for B, H, L, D in shapes:
            for causal in (False, True):
                for bname, backend in backends.items():
                    q, k, v = (
                        torch.randn(B, H, L, D, device=device, dtype=dtype, requires_grad=True)
                        for _ in range(3)
                    )

                    def run(q=q, k=k, v=v, backend=backend, causal=causal):
                        if backend is None:
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        else:
                            with sdpa_kernel([backend]):
                                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        o.sum().backward()
                        return None

                    key = f"sdpa {str(dtype)[6:]} B{B} H{H} L{L} D{D} causal={causal} {bname}"
                    try:
                        out[key] = kernel_case(torch, run, device)
                    except Exception as exc:  # a backend that refuses the case
                        out[key] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                    del q, k, v


def mha_cases(torch, device, out):
    from torch import nn

    for dtype in (torch.float32, torch.bfloat16):
        for d_model, nhead, B, L in ((64, 4, 8, 32), (256, 8, 4, 128), (512, 8, 2, 200)):
            torch.manual_seed(0)
            layer = nn.TransformerEncoderLayer(
                d_model, nhead, 2 * d_model, dropout=0.1, batch_first=True
            ).to(device, dtype)
            x = torch.randn(B, L, d_model, device=device, dtype=dtype)

            def run(layer=layer, x=x):
                layer(x).pow(2).mean().backward()

            run()
            key = f"encoder_layer {str(dtype)[6:]} d{d_model} h{nhead} B{B} L{L}"
            out[key] = kernel_case(torch, run, device)
            del layer, x


def lstm_cases(torch, device, out):
    from torch import nn

    shapes = [
        # input, hidden, layers, batch, seq, bidirectional
        (64, 256, 2, 16, 64, False),
        (32, 96, 2, 6, 24, False),
        (16, 16, 1, 1, 1, False),
        (100, 300, 1, 4, 50, True),
        (128, 128, 3, 8, 17, False),
        (64, 200, 2, 5, 33, True),
    ]
    for dtype in (torch.float32, torch.float16):
        for inp, hid, layers, batch, seq, bi in shapes:
            torch.cuda.synchronize()
            a0 = torch.cuda.memory_allocated(device)
            torch.manual_seed(0)
            lstm = nn.LSTM(inp, hid, layers, batch_first=True, bidirectional=bi).to(device, dtype)
            torch.cuda.synchronize()
            built = torch.cuda.memory_allocated(device) - a0
            params = sum(p.numel() * p.element_size() for p in lstm.parameters())
            x = torch.randn(batch, seq, inp, device=device, dtype=dtype)

            def run(lstm=lstm, x=x):
                lstm(x)[0].float().pow(2).mean().backward()

            key = f"lstm {str(dtype)[6:]} in{inp} h{hid} L{layers} B{batch} T{seq} bi={bi}"
            case = kernel_case(torch, run, device)
            case["built_bytes"] = built
            case["param_bytes"] = params
            case["param_sizes"] = [list(p.shape) for p in lstm.parameters()]
            out[key] = case
            with torch.no_grad():
                case["eval"] = kernel_case(torch, lambda lstm=lstm, x=x: lstm(x), device)
            del lstm, x


def conv_cases(torch, device, out):
    from torch import nn

    shapes = [
        # N, C, H, W, out, kernel, stride, padding
        (16, 3, 32, 32, 16, 3, 1, 1),
        (16, 16, 16, 16, 32, 3, 1, 1),
        (8, 64, 56, 56, 64, 3, 1, 1),
        (4, 3, 224, 224, 64, 7, 2, 3),
        (32, 128, 14, 14, 256, 1, 1, 0),
    ]
    for dtype in (torch.float32, torch.float16):
        for N, C, H, W, out_c, k, s, p in shapes:
            torch.manual_seed(0)
            conv = nn.Conv2d(C, out_c, k, s, p).to(device, dtype)
            x = torch.randn(N, C, H, W, device=device, dtype=dtype, requires_grad=True)

            def run(conv=conv, x=x):
                conv(x).float().pow(2).mean().backward()

            run()
            key = f"conv2d {str(dtype)[6:]} N{N} C{C} H{H} W{W} O{out_c} k{k} s{s} p{p}"
            out[key] = kernel_case(torch, run, device)
            del conv, x


def cublas_case(out_dir: str) -> None:
    """The first matmul of a fresh process: cuBLAS's workspace, in the caching allocator."""
    import torch

    device = torch.device("cuda:0")
    out = {}
    a = torch.randn(256, 256, device=device)
    b = torch.randn(256, 256, device=device)
    out["first mm f32"] = kernel_case(torch, lambda: a @ b, device)
    out["second mm f32"] = kernel_case(torch, lambda: a @ b, device)
    h = a.half()
    out["first mm f16"] = kernel_case(torch, lambda: h @ h, device)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out["mm on a new stream"] = kernel_case(torch, lambda: a @ b, device)
    bb = torch.randn(4, 64, 64, device=device)
    out["bmm"] = kernel_case(torch, lambda: bb @ bb, device)
    out["env CUBLAS_WORKSPACE_CONFIG"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "")
    out["allocated_end"] = torch.cuda.memory_allocated(device)
    with open(os.path.join(out_dir, "kernels_cublas.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print("cublas:", {k: v.get("blocks") if isinstance(v, dict) else v for k, v in out.items()})


def kernels(out_dir: str) -> int:
    os.makedirs(out_dir, exist_ok=True)
    r = subprocess.run([sys.executable, __file__, "_cublas", out_dir])
    import torch

    device = torch.device("cuda:0")
    torch.zeros(1, device=device) @ torch.zeros(1, 1, device=device)  # cuBLAS ready
    meta = {
        "gpu": torch.cuda.get_device_name(device),
        "capability": list(torch.cuda.get_device_capability(device)),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }
    for part, fn in (
        ("sdpa", sdpa_cases),
        ("encoder_layer", mha_cases),
        ("lstm", lstm_cases),
        ("conv", conv_cases),
    ):
        out = {"meta": meta}
        t = time.perf_counter()
        try:
            fn(torch, device, out)
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
            print(part, "failed:", out["error"])
        with open(os.path.join(out_dir, f"kernels_{part}.json"), "w") as f:
            json.dump(out, f, separators=(",", ":"))
        print(f"{part}: {len(out) - 1} cases in {time.perf_counter() - t:.1f} s")
    return r.returncode


def main() -> int:
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "_one":
        record_stream(sys.argv[2], sys.argv[3], sys.argv[4])
        return 0
    if cmd == "_cublas":
        cublas_case(sys.argv[2])
        return 0
    if cmd == "streams":
        return streams(sys.argv[2])
    if cmd == "kernels":
        return kernels(sys.argv[2])
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
