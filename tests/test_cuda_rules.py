"""Estimates for CUDA follow CUDA's kernels: the attention backend CUDA picks, fused
dropout, cuDNN's LSTM and convolution, and the memory those kernels allocate, checked
against sizes measured on an H100 (torch 2.11.0+cu130, cuDNN 9.19; docs/estimate.md)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jupyter_memprof
from jupyter_memprof import EstimateError, estimate
from jupyter_memprof._producers import cuda_kernels as ck

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the estimate computed without a GPU"
)


def _blocks(prof, op_prefix: str) -> list[int]:
    """Sizes of the blocks allocated and freed inside ops whose name starts so."""
    ops = prof.ops.set_index("op_id")["name"].astype(str)
    a = prof.allocations
    inside = a["alloc_op_id"].map(ops).str.startswith(op_prefix, na=False)
    temp = inside & (a["alloc_op_id"] == a["free_op_id"])
    return [int(n) for n in a[temp].sort_values("alloc_ns")["size_bytes"]]


def _growth(prof, start: int) -> int:
    return prof.peak("cuda:0").attrs["peak_bytes"] - start


def _qkv(b, h, length, d, dtype):
    return [torch.randn(b, h, length, d, dtype=dtype, requires_grad=True) for _ in range(3)]


def _attention_step(causal):
    def step(q, k, v):
        F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()

    return step


# -- the GPU --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("gpu", "want"),
    [
        (None, ("H100", 9, 0)),
        ("a100", ("A100", 8, 0)),
        ("NVIDIA L4", ("L4", 8, 9)),
        ("sm_86", ("sm86", 8, 6)),
        ("sm120", ("sm120", 12, 0)),
        ("8.9", ("sm89", 8, 9)),
        ((9, 0), ("sm90", 9, 0)),
    ],
)
def test_gpu_by_name_or_compute_capability(gpu, want):
    assert tuple(ck.parse_gpu(gpu)) == want


@pytest.mark.parametrize("bad", ["Z80", "sm", (9,), 90, ""])
def test_a_bad_gpu_is_one_line_before_anything_runs(bad):
    ran = []
    with pytest.raises(EstimateError) as err:
        estimate(lambda: ran.append(1), device="cuda:0", gpu=bad)
    assert "\n" not in str(err.value) and "unknown gpu" in str(err.value)
    assert not ran


def test_the_profile_names_the_gpu_and_what_no_rule_covers():
    lin = nn.Linear(8, 8)
    prof = estimate(lambda m: m(torch.randn(4, 8)).sum().backward(), lin, device="cuda:0")
    assert prof.meta["gpu"] == "H100 (sm90)"
    assert "cuBLAS workspace" in prof.meta["kernel_memory_not_modelled"]["aten::addmm"]
    for device in ("cpu", None):  # no CUDA block: no GPU
        cpu = estimate(lambda m: m(torch.randn(4, 8)).sum(), lin, device=device)
        assert cpu.meta["gpu"] is None and cpu.meta["kernel_memory_not_modelled"] == {}


def test_the_summary_says_which_gpu_and_what_is_not_modelled():
    lin = nn.Linear(8, 8)
    prof = estimate(lambda m: m(torch.randn(4, 8)).sum(), lin, device="cuda:0", gpu="L4")
    last = repr(prof).splitlines()[-1]
    assert "with CUDA's kernels on an L4 (sm89)" in last
    assert "kernel memory not modelled in aten::addmm" in last


# -- which attention kernel -----------------------------------------------------------------
def _call(dtype=torch.float32, d=64, mask=None, dropout=0.0, causal=False, length=128):
    q, k, v = _qkv(2, 4, length, d, dtype)
    return ck.SdpaCall(q, k, v, mask, dropout, causal, None, False)


@pytest.mark.parametrize(
    ("call", "gpu", "backend"),
    [
        (_call(torch.float32), "H100", ck.SdpaBackend.EFFICIENT),  # measured
        (_call(torch.float16), "H100", ck.SdpaBackend.CUDNN),  # measured
        (_call(torch.bfloat16, d=80, length=77), "H100", ck.SdpaBackend.CUDNN),  # measured
        (_call(torch.float16), "A100", ck.SdpaBackend.FLASH),
        (_call(torch.float16, dropout=0.1), "H100", ck.SdpaBackend.CUDNN),  # measured
        (_call(torch.float16, mask=torch.zeros(128, 128)), "A100", ck.SdpaBackend.EFFICIENT),
        (_call(torch.float32, d=6), "H100", ck.SdpaBackend.MATH),  # d % 4
        (_call(torch.float16), "V100", ck.SdpaBackend.EFFICIENT),
        (_call(torch.float32), "P100", ck.SdpaBackend.EFFICIENT),
    ],
)
def test_the_attention_backend_is_cudas_choice(call, gpu, backend):
    assert ck.sdpa_backend(call, ck.parse_gpu(gpu)) is backend


def test_the_users_backend_switches_are_followed():
    call = _call(torch.float16)
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION]):
        assert ck.sdpa_backend(call, ck.parse_gpu("H100")) is ck.SdpaBackend.EFFICIENT


def test_the_encoder_layer_takes_the_efficient_kernel_and_fused_dropout():
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True)
    x = torch.randn(8, 32, 64)
    step = lambda m, x: m(x).pow(2).mean().backward()  # noqa: E731
    cuda = estimate(step, layer, x, device="cuda:0")
    names = set(cuda.ops["name"].astype(str))
    assert "aten::_scaled_dot_product_efficient_attention" in names
    assert "aten::_scaled_dot_product_efficient_attention_backward" in names
    assert "aten::native_dropout" in names and "aten::bernoulli_" not in names
    assert torch.nn.functional.dropout is ck_originals()["dropout"]  # put back
    cpu = estimate(step, layer, x, device="cpu")
    assert "aten::_scaled_dot_product_efficient_attention" not in set(cpu.ops["name"].astype(str))
    # measured inside the backward on the H100: the gradient's copy, delta's two
    # temporaries, delta, the workspace (one 64 x 64 dQ tile of 16,400 B per batch and head)
    assert _blocks(cuda, "aten::_scaled_dot_product_efficient_attention_backward") == [
        65536, 65536, 4096, 4096, 524800
    ]  # fmt: skip


def ck_originals() -> dict:
    from jupyter_memprof._producers.fake import modes as fake_modes

    return {"dropout": fake_modes._DROPOUT, "sdpa": fake_modes._SDPA}


# -- attention kernels' memory, against the H100 ----------------------------------------------
@pytest.mark.parametrize(
    ("shape", "dtype", "growth"),
    [  # (B, H, L, D), peak growth of forward + backward measured on the H100
        ((8, 4, 32, 16), torch.float32, 861_696),
        ((2, 4, 100, 64), torch.float32, 1_295_360),
        ((3, 5, 77, 80), torch.float32, 2_844_160),
        ((2, 2, 513, 32), torch.float32, 1_922_560),
        ((2, 4, 128, 64), torch.float16, 928_256),
        ((3, 5, 77, 80), torch.bfloat16, 1_306_112),
        ((1, 16, 1024, 128), torch.float16, 29_493_760),
        ((2, 2, 513, 32), torch.bfloat16, 940_032),
    ],
)
def test_attention_peak_is_the_h100s(shape, dtype, growth):
    q, k, v = _qkv(*shape, dtype)
    prof = estimate(_attention_step(True), q, k, v, device="cuda:0")
    start = 3 * -(-q.numel() * dtype.itemsize // 512) * 512
    assert _growth(prof, start) == growth
    assert prof.meta["kernel_memory_not_modelled"] == {}


@pytest.mark.parametrize(
    ("backend", "shape", "dtype", "growth"),
    [  # forced with sdpa_kernel on the H100 (which picks cuDNN for these dtypes)
        ("FLASH_ATTENTION", (2, 4, 100, 64), torch.float16, 886_272),
        ("FLASH_ATTENTION", (3, 5, 77, 80), torch.bfloat16, 1_861_120),
        ("FLASH_ATTENTION", (1, 16, 1024, 128), torch.float16, 33_687_552),
        ("EFFICIENT_ATTENTION", (2, 2, 513, 32), torch.float16, 1_267_200),
        ("EFFICIENT_ATTENTION", (4, 8, 256, 64), torch.bfloat16, 7_408_640),
    ],
)
def test_forced_attention_backends_peak_is_the_h100s(backend, shape, dtype, growth):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _qkv(*shape, dtype)
    with sdpa_kernel([getattr(SDPBackend, backend)]):
        prof = estimate(_attention_step(True), q, k, v, device="cuda:0")
    start = 3 * -(-q.numel() * dtype.itemsize // 512) * 512
    assert _growth(prof, start) == growth


def test_efficient_backward_workspace_from_the_kernel_tiles():
    kern = ck._eff_bwd_kernel(torch.float32, 64, False, ck.parse_gpu("H100"))
    assert (kern.block_i, kern.block_j, kern.max_k) == (64, 64, 64)
    assert ck.efficient_backward_workspace(2, 4, 128, 64, kern) == 262_400  # 262,656 block
    big = ck._eff_bwd_kernel(torch.float32, 128, True, ck.parse_gpu("A100"))
    assert (big.block_i, big.block_j, big.dropout) == (128, 64, True)
    assert ck._eff_bwd_kernel(torch.float32, 64, False, ck.parse_gpu("T4")) is None


# -- cuDNN's LSTM ---------------------------------------------------------------------------
class _Tagger(nn.Module):
    def __init__(self, inp, hidden, layers):
        super().__init__()
        self.lstm = nn.LSTM(inp, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


def _lstm_step(m, x):
    m(x).pow(2).mean().backward()


def test_an_lstm_for_cuda_runs_cudnns_kernels_with_their_memory():
    m, x = _Tagger(64, 256, 2), torch.randn(16, 64, 64)
    prof = estimate(_lstm_step, m, x, device="cuda:0")
    names = set(prof.ops["name"].astype(str))
    assert {"aten::_cudnn_rnn", "aten::_cudnn_rnn_backward"} <= names
    assert not any(n.startswith("aten::mkldnn_rnn") for n in names)
    a, ops = prof.allocations, prof.ops.set_index("op_id")["name"].astype(str)
    made = a[a["alloc_op_id"].map(ops) == "aten::_cudnn_rnn"]
    assert 11_534_848 in set(made["size_bytes"])  # the reserve space, saved for backward
    # inside (measured): the input's time-major copy and cuDNN's workspace
    assert _blocks(prof, "aten::_cudnn_rnn")[:2] == [262144, 26_018_304]
    back = _blocks(prof, "aten::_cudnn_rnn_backward")
    assert back == [32768, 32768, 262144, 1048576, 26_018_304, 262144, 26_018_304]
    # the weight gradients are views of one flat block, as cuDNN's are
    grads = prof.names[(prof.names["role"] == "gradient") & (prof.names["when"] == "end")]
    lstm_grads = grads[grads["name"].astype(str).str.contains("lstm")]
    assert lstm_grads["ptr"].nunique() == 1
    assert prof.meta["kernel_memory_not_modelled"].keys() <= {"aten::addmm", "aten::mm"}


def test_an_lstm_shape_not_measured_is_named():
    m, x = _Tagger(24, 40, 1), torch.randn(3, 7, 24)
    prof = estimate(_lstm_step, m, x, device="cuda:0")
    assert "aten::_cudnn_rnn" in prof.meta["kernel_memory_not_modelled"]


def test_the_reserve_space_rule():
    dims = ck.RnnDims(64, 16, 64, 256, 2, 1, torch.float32)
    assert -(-dims.reserve() // 512) * 512 == 11_534_848
    bi = ck.RnnDims(33, 5, 64, 200, 2, 2, torch.float16)
    assert -(-bi.reserve() // 512) * 512 == 1_452_544


def test_cudnn_off_estimates_pytorchs_own_kernels():
    m, x = _Tagger(64, 256, 2), torch.randn(16, 64, 64)
    with torch.backends.cudnn.flags(enabled=False):
        prof = estimate(_lstm_step, m, x, device="cuda:0")
    assert "aten::_cudnn_rnn" not in set(prof.ops["name"].astype(str))


# -- cuDNN's convolution ------------------------------------------------------------------------
def test_convolution_workspaces_are_cudnns_where_measured():
    conv = nn.Conv2d(16, 32, 3, padding=1)
    x = torch.randn(16, 16, 16, 16, requires_grad=True)
    prof = estimate(lambda c, x: c(x).sum().backward(), conv, x, device="cuda:0")
    assert _blocks(prof, "aten::convolution_backward") == [1_666_560]
    odd = nn.Conv2d(5, 7, 3)
    prof = estimate(lambda c: c(torch.randn(2, 5, 9, 9)).sum().backward(), odd, device="cuda:0")
    assert "aten::convolution_backward" in prof.meta["kernel_memory_not_modelled"]


# -- the benchmark's scenarios against the H100 ------------------------------------------------
def _scenarios():
    from bench_cuda import _all_scenarios

    return list(_all_scenarios().items())


@pytest.mark.parametrize(("name", "make"), _scenarios(), ids=[n for n, _ in _scenarios()])
def test_bench_cuda_estimate_is_within_the_h100_peak(name, make):
    from bench_cuda import H100_PEAKS, TOLERANCE
    from bench_estimate import estimate_closure

    ns, step = make()
    step()
    prof = estimate_closure(step, device="cuda:0")
    assert prof.meta["simulated_cuda"] is True
    peak, real = prof.peak("cuda:0").attrs["peak_bytes"], H100_PEAKS[name]
    assert abs(peak - real) / real <= TOLERANCE.get(name, 0.02), (name, peak, real)


def test_saved_profile_keeps_the_gpu_meta(tmp_path):
    prof = estimate(lambda m: m(torch.randn(2, 8)).sum(), nn.Linear(8, 8), device="cuda:0")
    back = jupyter_memprof.load(prof.save(tmp_path / "p.memprof"))
    assert back.meta["gpu"] == "H100 (sm90)"
    assert back.meta["kernel_memory_not_modelled"] == prof.meta["kernel_memory_not_modelled"]


# -- grouped-query attention (Llama's num_key_value_heads < num_attention_heads) ----------------
def _gqa_call(dtype, heads=8, kv_heads=2):
    q = torch.empty(2, heads, 64, 16, dtype=dtype)
    k, v = (torch.empty(2, kv_heads, 64, 16, dtype=dtype) for _ in range(2))
    return ck.SdpaCall(q, k, v, None, 0.0, True, None, True)


@pytest.mark.parametrize(
    ("dtype", "gpu", "backend"),
    [
        # the memory-efficient kernel takes no grouped heads (torch's sdp_utils.cpp:
        # check_batch_size_and_num_heads_dense<false>): f32 goes to math
        (torch.float32, "H100", ck.SdpaBackend.MATH),
        (torch.float32, "A100", ck.SdpaBackend.MATH),
        (torch.bfloat16, "H100", ck.SdpaBackend.CUDNN),
        (torch.bfloat16, "A100", ck.SdpaBackend.FLASH),
        (torch.float16, "V100", ck.SdpaBackend.MATH),
    ],
)
def test_grouped_query_attention_backend(dtype, gpu, backend):
    assert ck.sdpa_backend(_gqa_call(dtype), ck.parse_gpu(gpu)) is backend


def _llama(dtype, kv_heads=2):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=kv_heads, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(dtype)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _lm_step(model, opt, ids):
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_with_grouped_query_attention_estimates_for_cuda(dtype):
    """Before: "ScaledDotProductEfficientAttentionBackward0 returned an invalid gradient at
    index 1 - got [1, 8, 32, 8] but expected shape compatible with [1, 2, 32, 8]"."""
    model, opt = _llama(dtype)
    ids = torch.randint(0, 256, (1, 32))
    prof = estimate(_lm_step, model, opt, ids, device="cuda:0")
    names = set(prof.ops["name"].astype(str))
    assert "aten::_scaled_dot_product_efficient_attention_backward" not in names
    if dtype is torch.bfloat16:
        assert "aten::_scaled_dot_product_cudnn_attention_backward" in names
        assert (
            "grouped-query"
            in prof.meta["kernel_memory_not_modelled"][
                "aten::_scaled_dot_product_cudnn_attention_backward"
            ]
        )
    # every parameter's gradient, k_proj's and v_proj's of the grouped shape (2 x 8 x 64)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert prof.peak_by("category")["parameter"] >= params
    assert prof.meta["device"] == "cuda:0"
