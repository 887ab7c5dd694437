"""oneDNN's bf16 matmul scratch on the CPU (``cpu_kernels``): the rule's bytes against the
block the real kernel allocates and frees inside ``aten::mm``/``addmm``/``bmm`` (captured),
for 1 and 2 threads, and the estimate of a bf16 step against the real one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jupyter_memprof
from jupyter_memprof._producers.cpu_kernels import (
    CPU_SIZE_RULES,
    measured_cpu,
    onednn_bf16_matmul_scratch,
)

bf16 = torch.bfloat16
needs_measured_cpu = pytest.mark.skipif(
    not measured_cpu(), reason="the rule was measured on AVX-512 bf16 CPUs without AMX"
)


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _inside(prof, op_name: str) -> list[list[int]]:
    """Per call of ``op_name``: the blocks allocated and freed inside it (not its output)."""
    ops = prof.ops.set_index("op_id")
    calls = ops.index[ops["name"] == op_name]
    a = prof.allocations.dropna(subset=["alloc_op_id", "free_op_id"])
    return [
        [int(s) for s in a["size_bytes"][(a["alloc_op_id"] == op) & (a["free_op_id"] == op)]]
        for op in calls
    ]


# (M, K, N, A read transposed): the ViT step's matmuls (272 tokens), a padded K (200),
# K over 512, more rows than one block (300, 375, 544, 768), few rows (17) and columns (16)
SHAPES = [
    (272, 64, 128, False),
    (272, 128, 64, False),
    (64, 272, 128, True),
    (128, 272, 64, True),
    (17, 200, 1024, False),
    (300, 768, 100, False),
    (544, 64, 16, False),
    (768, 1536, 64, False),
    (256, 512, 1024, True),
    (48, 96, 192, True),
    (177, 64, 128, True),
    (375, 17, 2174, False),
]


@needs_measured_cpu
@pytest.mark.parametrize("m,k,n,transposed", SHAPES)
def test_the_rule_is_the_real_scratch_block_of_mm_and_addmm(threads, m, k, n, transposed):
    a = torch.randn(k, m, dtype=bf16).t() if transposed else torch.randn(m, k, dtype=bf16)
    b, bias = torch.randn(k, n, dtype=bf16), torch.randn(n, dtype=bf16)
    with jupyter_memprof.profile() as real:
        a.mm(b)
        torch.addmm(bias, a, b)
    expected = onednn_bf16_matmul_scratch(m, k, n, threads, transposed)
    assert expected is not None and expected > 0
    assert _inside(real, "aten::mm") == [[expected]]
    assert _inside(real, "aten::addmm") == [[expected]]


@needs_measured_cpu
def test_exact_bytes_for_known_shapes():
    """Numbers read off the captures (torch 2.13.0+cpu, oneDNN 3.12, AVX-512 bf16)."""
    assert onednn_bf16_matmul_scratch(256, 64, 64, 1) == 74_752
    assert onednn_bf16_matmul_scratch(256, 64, 64, 2) == 83_584
    assert onednn_bf16_matmul_scratch(512, 64, 64, 2) == 149_120
    assert onednn_bf16_matmul_scratch(64, 272, 128, 2, a_transposed=True) == 128_768
    assert onednn_bf16_matmul_scratch(16, 16, 16, 2) == 0  # torch keeps it from oneDNN
    assert onednn_bf16_matmul_scratch(64, 4096, 64, 2) is None  # K beyond the measured


@needs_measured_cpu
def test_bmm_takes_one_scratch_block_for_the_batch(threads):
    x, y = torch.randn(4, 17, 16, dtype=bf16), torch.randn(4, 16, 17, dtype=bf16)
    with jupyter_memprof.profile() as real:
        torch.bmm(x, y)
    rule = CPU_SIZE_RULES[torch.ops.aten.bmm.default]
    assert _inside(real, "aten::bmm") == [rule({"self": x, "mat2": y})[1]]
    assert _inside(real, "aten::bmm") == [
        [onednn_bf16_matmul_scratch(17, 16, 17, threads, batch=4)]
    ]


def test_f32_matmuls_take_no_scratch_and_no_note(threads):
    """f32 goes to MKL's sgemm: nothing allocated inside, nothing to name."""
    a, b = torch.randn(272, 64), torch.randn(64, 128)
    with jupyter_memprof.profile() as real:
        a.mm(b)
    assert _inside(real, "aten::mm") == [[]]
    prof = jupyter_memprof.estimate(lambda a, b: a.mm(b), a, b)
    assert prof.meta["kernel_memory_not_modelled"] == {}


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), nn.Linear(64, 10))


def _bf16_step(model, x, y):
    with torch.autocast("cpu", dtype=bf16):
        out = model(x)
    F.cross_entropy(out.float(), y).backward()


@needs_measured_cpu
def test_a_bf16_step_is_estimated_to_the_byte(threads):
    """Forward addmm, backward mm with A read as is and transposed (the weights' gradients),
    272 rows as in the ViT step: the estimate's peak and every scratch block are the real
    ones, for the thread count torch runs with when the estimate runs."""
    model, x, y = _mlp(), torch.randn(272, 64), torch.randint(0, 10, (272,))
    _bf16_step(model, x, y)
    est = jupyter_memprof.estimate(_bf16_step, model, x, y, device="cpu")
    with jupyter_memprof.profile() as real:
        _bf16_step(model, x, y)
    assert est.meta["kernel_memory_not_modelled"] == {}
    for op in ("aten::addmm", "aten::mm"):
        assert sorted(sum(_inside(est, op), [])) == sorted(sum(_inside(real, op), []))
    assert sum(_inside(est, "aten::mm"), [])  # there is scratch to model
    assert est.peak().attrs["peak_bytes"] == real.peak().attrs["peak_bytes"]


@needs_measured_cpu
def test_the_scratch_follows_the_thread_count_at_estimate_time():
    before = torch.get_num_threads()
    a, b = torch.randn(512, 64, dtype=bf16), torch.randn(64, 64, dtype=bf16)
    try:
        sizes = {}
        for n in (1, 2):
            torch.set_num_threads(n)
            prof = jupyter_memprof.estimate(lambda a, b: a.mm(b), a, b)
            sizes[n] = sum(_inside(prof, "aten::mm"), [])
    finally:
        torch.set_num_threads(before)
    assert sizes == {1: [74_752], 2: [149_120]}


def test_shapes_outside_the_measured_ones_are_named():
    a, b = torch.randn(4096, 64, dtype=bf16).t(), torch.randn(4096, 32, dtype=bf16)
    prof = jupyter_memprof.estimate(lambda a, b: a.mm(b), a, b)
    assert "oneDNN's bf16 matmul scratch" in prof.meta["kernel_memory_not_modelled"]["aten::mm"]
    assert "kernel memory not modelled in" in prof.summary()["note"]


@needs_measured_cpu
def test_no_scratch_where_onednn_is_switched_off():
    a, b = torch.randn(256, 64, dtype=bf16), torch.randn(64, 64, dtype=bf16)
    with torch.backends.mkldnn.flags(enabled=False):
        with jupyter_memprof.profile() as real:
            a.mm(b)
        prof = jupyter_memprof.estimate(lambda a, b: a.mm(b), a, b)
    assert _inside(real, "aten::mm") == [[]] == _inside(prof, "aten::mm")
    assert prof.meta["kernel_memory_not_modelled"] == {}


@needs_measured_cpu
def test_onednn_held_below_avx512_bf16_is_named(monkeypatch):
    """ONEDNN_MAX_CPU_ISA=AVX2 (or AVX512_CORE) makes oneDNN run other kernels: named."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    a, b = torch.randn(256, 64, dtype=bf16), torch.randn(64, 64, dtype=bf16)
    prof = jupyter_memprof.estimate(lambda a, b: a.mm(b), a, b)
    assert "not for these shapes or this CPU" in prof.meta["kernel_memory_not_modelled"]["aten::mm"]


@needs_measured_cpu
def test_bmm_with_a_transposed_shares_the_batch_out_among_threads(threads):
    """A batch of 4 is work for 2 threads already: M is not cut further (94 rows, not 47)."""
    x = torch.randn(4, 18, 94, dtype=bf16).transpose(1, 2)
    y = torch.randn(4, 18, 15, dtype=bf16)
    with jupyter_memprof.profile() as real:
        torch.bmm(x, y)
    rule = CPU_SIZE_RULES[torch.ops.aten.bmm.default]
    assert _inside(real, "aten::bmm") == [rule({"self": x, "mat2": y})[1]]
    assert _inside(real, "aten::bmm") == [[{1: 16_904, 2: 33_296}[threads]]]
