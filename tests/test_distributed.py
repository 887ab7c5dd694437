"""FSDP2 and DDP: real two-process captures on the CPU (gloo), every rank's profile read
through DTensors and FSDP's own steps."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from _dist_models import BLOCKS, DIM, OUT, Net, local_bytes, shard_bytes
from _spawn import spawn_ranks

import jupyter_memprof

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with gloo is not available",
)

WORLD = 2
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    """Two gloo ranks that each profile one FSDP2 Adam step and save ``rank{rank}``."""
    out = tmp_path_factory.mktemp("fsdp")
    spawn_ranks("_fsdp_worker.py", WORLD, str(out), TIMEOUT_S)
    return jupyter_memprof.load_many(str(out / "rank*"))


def _shapes() -> dict[str, tuple[int, ...]]:
    """Every parameter's full shape, by the name the session gives it."""
    return {f"model.{k}": tuple(p.shape) for k, p in Net().named_parameters()}


def _at_peak(prof):
    a = prof.allocations
    return a[a["alloc_id"].isin(prof.peak()["alloc_id"])]


def test_sharded_parameters_and_adam_state_are_exact_per_rank(fsdp_run):
    shapes = _shapes()
    per_rank = sum(shard_bytes(s, WORLD) for s in shapes.values())
    # the head (7 rows) is padded to 4 rows on each rank
    assert per_rank == (BLOCKS * (128 * 64 + 128 + 32 * 256 + 32) + (4 * 64 + 4)) * 4
    assert fsdp_run.ranks == [0, 1]
    for r in fsdp_run.ranks:
        prof = fsdp_run[r]
        assert (prof.meta["rank"], prof.meta["world_size"]) == (r, WORLD)
        a = prof.allocations
        live = a[a["free_ns"].isna()]
        params = live[live["reason"] == "module parameter"]
        # each parameter is named by its path and counted at its local shard's bytes
        assert dict(zip(params["name"], params["size_bytes"])) == {
            n: shard_bytes(s, WORLD) for n, s in shapes.items()
        }
        assert (params["category"] == "parameter").all()
        assert set(params["module"]) == {n.rsplit(".", 1)[0] for n in shapes}
        state = live[live["reason"] == "optimizer.state"]
        assert (state["category"] == "optimizer_state").all()
        sizes = dict(zip(state["name"], state["size_bytes"]))
        # Adam's state is made from the shard without its padding: on rank 1 the head's
        # state holds 3 rows where its parameter's storage holds 4
        unpadded = sum(local_bytes(s, WORLD, r) for s in shapes.values())
        assert unpadded == per_rank - (0 if r == 0 else (64 + 1) * 4)
        for n, s in shapes.items():
            assert sizes[f"opt.state[{n}].exp_avg"] == local_bytes(s, WORLD, r)
            assert sizes[f"opt.state[{n}].exp_avg_sq"] == local_bytes(s, WORLD, r)
            assert sizes[f"opt.state[{n}].step"] == 4  # a plain CPU scalar
        assert int(state["size_bytes"].sum()) == 2 * unpadded + 4 * len(shapes)
        # the sharded gradients FSDP leaves in .grad: one flat block per sharded module
        grads = live[live["reason"] == ".grad of a parameter"]
        assert int(grads["size_bytes"].sum()) == per_rank
        assert (grads["category"] == "gradient").all()
        # at the peak: parameters and optimizer state at least their shards, nothing unknown
        by_cat = prof.peak_by("category")
        assert by_cat.get("unknown", 0) <= 0.01 * int(by_cat.sum())
        peak = _at_peak(prof)
        named = peak[peak["reason"].isin(["module parameter", "optimizer.state"])]
        assert int(named["size_bytes"].sum()) == per_rank + 2 * unpadded + 4 * len(shapes)


def test_unsharded_parameters_are_parameters_of_their_block(fsdp_run):
    block = DIM * 4 * DIM * 2 + 4 * DIM + DIM  # one block's parameters, unsharded
    for r in fsdp_run.ranks:
        a = fsdp_run[r].allocations
        for k in range(BLOCKS):
            path = f"model.blocks.{k}"
            unsharded = a[a["reason"] == f"unsharded by FSDP for {path}"]
            # forward and backward each unshard the block: fc1/fc2 weights and biases
            assert sorted(unsharded["size_bytes"]) == sorted(
                [DIM * 4 * DIM * 4] * 4 + [4 * DIM * 4] * 2 + [DIM * 4] * 2
            )
            assert int(unsharded["size_bytes"].sum()) == 2 * block * 4
            assert (unsharded["category"] == "parameter").all()
            # module attribution follows the unsharded block, also in backward
            assert (unsharded["module"] == path).all()
            assert (unsharded["module_reason"] == "its parameters, unsharded by FSDP").all()
            gathered = a[a["reason"] == f"all-gathered by FSDP for {path}"]
            # the flat buffer of forward's and of backward's all-gather (and gloo's copies)
            assert (gathered["size_bytes"] == block * 4).all() and len(gathered) >= 2
            assert (gathered["category"] == "parameter").all()
            reduced = a[a["reason"] == f"reduce-scattered by FSDP for {path}"]
            assert len(reduced) >= 1 and (reduced["category"] == "gradient").all()
            assert (reduced["size_bytes"] == block * 4).all()
            assert (reduced["module"] == path).all()
        # the root's own group, the head: unsharded once (the root stays unsharded from
        # forward to backward), gathered with each rank's padding (8 rows for 7)
        root = a[a["reason"] == "unsharded by FSDP for model"]
        padded = 2 * -(-OUT // 2)
        assert sorted(root["size_bytes"]) == [padded * 4, padded * DIM * 4]
        assert (root["module"] == "model").all()
        assert not a["reason"].str.startswith("existed before the capture, read").any() or (
            a.loc[a["reason"].str.startswith("existed before the capture, read"), "name"]
            .isin(["x", "y"])
            .all()
        )


def test_which_rank_peaks(fsdp_run):
    """The README's question, answered from the files: every rank's peak, split by category."""
    peaks = fsdp_run.peaks()
    assert list(peaks["rank"]) == [0, 1]
    wide = fsdp_run.peak_by("category")
    assert list(wide.index) == [0, 1]
    assert (wide["parameter"] > 0).all() and (wide["optimizer_state"] > 0).all()
    for r in fsdp_run.ranks:
        assert int(wide.loc[r].sum()) == int(peaks.loc[peaks["rank"] == r, "peak_bytes"].item())
