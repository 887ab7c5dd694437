"""oneDNN's bf16 matmul scratch: the size rule against the real kernel, on random shapes.

    python benchmarks/check_cpu_matmul_rule.py [N] [SEED]   # N shapes (default 300)

Each shape (M, K and N up to 3,000, batch 1 to 4, A read as is or transposed, 1 or 2
threads) runs once as ``mm``, ``addmm`` or ``bmm`` under torch's profiler with memory
events; the bytes allocated inside the call other than its output are compared with the
rule's (``cpu_kernels.CPU_SIZE_RULES``). Rerun it after a torch (oneDNN) upgrade or on
another CPU: misses are printed, shapes the rule leaves out (named in an estimate's
``kernel_memory_not_modelled``) are counted. docs/estimate.md has the numbers.
"""

from __future__ import annotations

import random
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from jupyter_memprof._producers.cpu_kernels import CPU_SIZE_RULES, measured_cpu

OPS = {
    "mm": torch.ops.aten.mm.default,
    "addmm": torch.ops.aten.addmm.default,
    "bmm": torch.ops.aten.bmm.default,
}


def scratch(fn) -> int:
    """Bytes allocated while ``fn`` runs, less its first block (the output)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    sizes = [e.nbytes() for e in sorted(events, key=lambda e: e.start_ns())]
    return sum(n for n in sizes[1:] if n > 0)


def case(rng: random.Random):
    """One random call: (description, the call, the rule's arguments by name, op)."""
    m, k, n = (rng.choice([rng.randint(1, 40), rng.randint(1, 600), rng.randint(200, 3000)])
               for _ in range(3))  # fmt: skip
    op, transposed, batch = rng.choice(list(OPS)), rng.random() < 0.4, rng.randint(1, 4)
    lead = (batch,) if op == "bmm" else ()
    x = torch.empty(*lead, k, m, dtype=torch.bfloat16).transpose(-1, -2) if transposed else (
        torch.empty(*lead, m, k, dtype=torch.bfloat16))  # fmt: skip
    y = torch.empty(*lead, k, n, dtype=torch.bfloat16)
    if op == "addmm":
        bias = torch.empty(n, dtype=torch.bfloat16)
        call, args = (lambda: torch.addmm(bias, x, y)), {"self": bias, "mat1": x, "mat2": y}
    else:
        fn = torch.bmm if op == "bmm" else torch.mm
        call, args = (lambda: fn(x, y)), {"self": x, "mat2": y}
    what = f"{op} {'x'.join(map(str, (*lead, m, k, n)))}{' A transposed' if transposed else ''}"
    return what, call, args, OPS[op], batch * m * k * n


def main(count: int = 300, seed: int = 0) -> int:
    if not measured_cpu():
        print("this CPU is not of the kind the rule was measured on (AVX-512 bf16, no AMX)")
    rng = random.Random(seed)
    checked = missed = outside = 0
    while checked + outside < count:
        threads = rng.choice([1, 2])
        torch.set_num_threads(threads)
        what, call, args, op, work = case(rng)
        if work > 3e8:
            continue
        rule = CPU_SIZE_RULES[op](args)
        if rule is None:
            outside += 1
            continue
        checked += 1
        real, predicted = scratch(call), sum(rule[1])
        if real != predicted:
            missed += 1
            print(f"{what}, {threads} thread(s): real {real:,} B, rule {predicted:,} B")
    print(f"{checked} shapes checked, {checked - missed} exact; {outside} left to the note")
    return 0


if __name__ == "__main__":
    sys.exit(main(*(int(a) for a in sys.argv[1:3])))
