"""fit(): the largest batch that fits a limit, by estimates; search() on known curves."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jupyter_memprof
from jupyter_memprof import EstimateError, estimate, fit
from jupyter_memprof._analysis.limit import CUDA_CONTEXT_BYTES
from jupyter_memprof._frontends.fit import footprint, search

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from bench_estimate import TinyLM


def lm_step(batch, model, opt):
    """The quickstart's step; it makes its own batch of ``batch`` sequences."""
    tokens = torch.randint(0, 2000, (batch, 65))
    x, y = tokens[:, :-1], tokens[:, 1:]
    opt.zero_grad()
    F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    opt.step()


@pytest.fixture(scope="module")
def quickstart():
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lm_step(2, model, opt)  # warmed up
    return model, opt


def test_quickstart_on_a_24_gib_gpu_in_at_most_12_estimates(quickstart):
    model, opt = quickstart
    result = fit(lm_step, model, opt, limit="24GiB", device="cuda:0")
    tried = result.tried
    assert len(tried) <= 12
    assert list(tried.columns) == ["batch", "peak_bytes", "fits"]
    assert result.limit == 24 * 2**30 and result.device == "cuda:0"
    b = result.batch
    peaks = dict(zip(tried["batch"], tried["peak_bytes"]))
    assert peaks[b] <= 24 * 2**30 < peaks[b + 1]  # the answer and one more, both estimated
    assert all(tried["fits"] == (tried["peak_bytes"] <= 24 * 2**30))
    # on CUDA the limit is set against the modelled reserved peak plus the CUDA context
    reserved = result.profile.meta["reserved_peak_bytes"]["cuda:0"]
    assert peaks[b] == footprint(result.profile, "cuda:0") == reserved + CUDA_CONTEXT_BYTES
    assert reserved >= result.profile.peak("cuda:0").attrs["peak_bytes"]
    assert result.profile.meta["device"] == "cuda:0"
    assert 5000 < b < 20000  # about 2.3 MiB per sequence on top of 17 MiB
    assert result.text().startswith(f"batch {b} fits 24.0 GiB on cuda:0: peak ")


def test_fit_takes_the_estimates_options(quickstart):
    """fit() takes estimate()'s options for every estimate and its judgement: without the
    CUDA context the reserved peak may use the whole limit, and the kernels followed are
    the GPU's asked for."""
    model, opt = quickstart
    limit = 2**30
    usual = fit(lm_step, model, opt, limit=limit, device="cuda:0")
    bare = fit(lm_step, model, opt, limit=limit, device="cuda:0", context=0, gpu="A100")
    assert bare.batch > usual.batch
    peaks = dict(zip(bare.tried["batch"], bare.tried["peak_bytes"]))
    reserved = bare.profile.meta["reserved_peak_bytes"]["cuda:0"]
    assert peaks[bare.batch] == footprint(bare.profile, "cuda:0", 0) == reserved <= limit
    assert bare.profile.meta["gpu"] == "A100 (sm80)" and bare.profile.meta["context"] == 0
    with pytest.raises(EstimateError, match="^world_size must be a whole number"):
        fit(lm_step, model, opt, limit=limit, world_size=0)


def test_the_batch_found_is_the_largest_estimate_under_the_limit(quickstart):
    model, opt = quickstart
    at_8 = estimate(lm_step, 8, model, opt).peak().attrs["peak_bytes"]
    at_9 = estimate(lm_step, 9, model, opt).peak().attrs["peak_bytes"]
    limit = (at_8 + at_9) // 2
    result = fit(lm_step, model, opt, limit=limit, device="cpu", high=64)
    assert result.batch == 8
    assert result.profile.peak().attrs["peak_bytes"] == at_8


def test_nothing_fits_and_high_fits(quickstart):
    model, opt = quickstart
    none = fit(lm_step, model, opt, limit="1MiB")
    assert none.batch is None and none.profile is None
    assert list(none.tried["batch"]) == [1] and not none.tried["fits"].any()
    assert none.text().startswith("no batch fits 1.0 MiB on its devices (1 estimate)")
    high = fit(lm_step, model, opt, limit="1GiB", low=2, high=4)
    assert high.batch == 4 and list(high.tried["batch"]) == [2, 4]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "fit\\(\\) needs a limit"),
        ({"limit": "lots"}, "limit"),
        ({"limit": "1GiB", "low": 0}, "low=...\\) must be a batch size of at least 1"),
        ({"limit": "1GiB", "low": 4, "high": 2}, "at least low=4, not 2"),
        ({"limit": "1GiB", "device": "tpu"}, "tpu"),
    ],
)
def test_bad_arguments_are_one_line_before_anything_runs(kwargs, match):
    calls = []

    def step(batch):
        calls.append(batch)

    with pytest.raises(EstimateError, match=match) as err:
        fit(step, **kwargs)
    assert "\n" not in str(err.value) and calls == []


def test_probes_are_not_kept_in_the_session(quickstart):
    from jupyter_memprof._frontends import session

    model, opt = quickstart
    before = len(session.items())
    result = fit(lm_step, model, opt, limit="64MiB", high=64)
    assert len(session.items()) == before + 1  # the estimate at the batch found
    assert session.items()[-1][1] is result.profile
    jupyter_memprof.release(result.profile)


# -- the search on known curves ---------------------------------------------------------------------
def _brute(peak, limit, low, high):
    best = None
    for b in range(low, high + 1):
        if peak(b) <= limit:
            best = b
    return best


@pytest.mark.parametrize(
    "name, peak",
    [
        ("linear", lambda b: 1000 + 37 * b),
        ("rounded", lambda b: 512 * -(-(1000 + 37 * b) // 512)),
        ("quadratic", lambda b: 1000 + 3 * b + b * b),
        ("steps", lambda b: 1000 + 4096 * (b // 16)),
        ("flat then steep", lambda b: 1000 if b < 700 else 1000 + 10**6 * (b - 699)),
    ],
)
@pytest.mark.parametrize("limit", [1000, 5000, 123_456, 10**6])
def test_search_finds_the_largest_size_under_the_limit(name, peak, limit):
    calls = []

    def counted(b):
        calls.append(b)
        return peak(b)

    found = search(counted, limit, 1, 5000)
    assert found == _brute(peak, limit, 1, 5000)
    assert len(calls) == len(set(calls)) or len(calls) <= 40
    assert len(calls) <= 40  # a bisection of 1..5000 takes 13


def test_search_without_a_bound_on_a_linear_curve_is_quick():
    calls = []

    def peak(b):
        calls.append(b)
        return 17 * 2**20 + 2_400_000 * b

    limit = 24 * 2**30
    found = search(peak, limit, 1, None)
    assert found == (limit - 17 * 2**20) // 2_400_000
    assert len(calls) <= 6


def test_search_of_a_curve_that_never_rises_stops_at_the_top():
    assert search(lambda b: 10, 100, 1, None) == 2**31
    assert search(lambda b: 10, 100, 3, 40) == 40


class _Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x):
        return self.fc(x)


def test_fit_on_the_cpu_matches_direct_estimates():
    model = _Wide()

    def step(batch, model):
        model(torch.randn(batch, 32)).sum().backward()

    result = fit(step, model, limit="200KiB", device="cpu")
    b = result.batch
    assert estimate(step, b, model).peak().attrs["peak_bytes"] <= 200 * 1024
    assert estimate(step, b + 1, model).peak().attrs["peak_bytes"] > 200 * 1024


def _cache_then_bigger(batch):
    """A block of 1 MiB per row is freed, then one of 1.25 MiB per row is made: with nothing
    limiting it the cache keeps the first block's segment (reserved 2.25 MiB per row), but
    within a limit the allocator gives it back and needs only the larger block."""
    a = torch.empty(batch, 1 << 18, device="cuda")
    a.mul_(2)
    del a
    b = torch.empty(batch, (1 << 18) + (1 << 16), device="cuda")
    b.mul_(2)


def test_fit_answers_b_fitting_and_b_plus_1_not_as_estimate_judges():
    """Before: fit compared the reserved peak with nothing limiting the cache and answered
    576 where estimate(limit=) said 577 (and up to 1036) fit."""
    limit = 2 * 1024**3
    result = jupyter_memprof.fit(_cache_then_bigger, limit=limit, device="cuda:0", high=4096)
    b = result.batch
    fits = jupyter_memprof.estimate(_cache_then_bigger, b, device="cuda:0", limit=limit)
    over = jupyter_memprof.estimate(_cache_then_bigger, b + 1, device="cuda:0", limit=limit)
    assert fits.meta["oom"] is None and over.meta["oom"] is not None
    assert b == 1036
    tried = result.tried.set_index("batch")
    assert bool(tried.loc[b, "fits"]) and not bool(tried.loc[b + 1, "fits"])
