"""A fake run on N ranks: ``fully_shard``, DDP and collectives.

``estimate(fn, ..., world_size=N)`` runs ``fn`` in this one process as rank 0 of N, on torch's
fake process group (backend ``"fake"`` with ``torch.testing._internal.distributed.fake_pg.
FakeStore``): every collective returns at once, moves no data, and gives its outputs the
shapes N ranks would give them, so FSDP2 shards parameters in N and DDP builds its buckets
as on N ranks. What that needs from a fake run, beyond the fake group:

- a ``DeviceMesh`` (``fully_shard``'s default one, or the user's) is built outside the fake
  modes: it computes with a small real tensor of ranks and reads its values;
- FSDP frees and makes again its unsharded parameters by resizing their storages in place
  (``UntypedStorage.resize_``), which no op shows: every resize during the run is reported to
  the recorder (:meth:`~jupyter_memprof._producers.fake.recorder.FakeRecorder.resized`).

The group is made before ``fn`` runs and destroyed after, also when it raises. A process that
has a process group already (a real job) cannot also hold the fake one: that is refused.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

from ..._errors import EstimateError
from ..._records import DDP_BUCKET_MARKER

#: The most ranks an estimate simulates (torch's fake group costs time and memory per rank;
#: the largest training runs have about 10**5 GPUs).
MAX_WORLD_SIZE = 2**20


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[None]:
    """This process as rank 0 of ``world_size`` on torch's fake process group, destroyed on
    the way out."""
    dist = torch.distributed
    if dist.is_initialized():
        raise EstimateError(
            "estimate(world_size=...) runs the step on a fake process group of its own, but "
            "this process has a process group already: estimate in a process without one"
        )
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError:  # pragma: no cover - a torch build without its testing helpers
        raise EstimateError(
            "world_size needs torch's fake process group, not in this torch"
        ) from None
    try:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    except BaseException as err:  # nothing left behind: a later estimate finds no group
        if dist.is_initialized():
            dist.destroy_process_group()
        if isinstance(err, Exception):
            raise EstimateError(
                f"world_size={world_size}: torch's fake process group failed "
                f"({type(err).__name__}: {' '.join(str(err).split())[:120]})"
            ) from None
        raise
    from torch.nn.parallel import DistributedDataParallel as ddp

    own_new = "__new__" in ddp.__dict__
    original_new = ddp.__dict__.get("__new__")
    ddp.__new__ = _simulated_ddp
    try:
        yield
    finally:
        if own_new:
            ddp.__new__ = original_new
        else:
            del ddp.__new__
        dist.destroy_process_group()


def _simulated_ddp(cls, *args, **kwargs):
    """``DistributedDataParallel(...)`` while a fake group runs: a :class:`SimulatedDDP`."""
    return SimulatedDDP(*args, **kwargs)


#: DDP's default bucket sizes: the first bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``), the
#: rest (``bucket_cap_mb``'s default, 25 MiB).
FIRST_BUCKET_BYTES = 1024 * 1024
BUCKET_BYTES = 25 * 1024 * 1024


class SimulatedDDP(torch.nn.Module):
    """``DistributedDataParallel`` as its memory goes, for a fake run on the fake group.

    torch's DDP cannot run there: its C++ reducer reads tensor values (checking parameter
    shapes across ranks at construction, rebuilding its buckets in the first forward). This
    stand-in keeps what DDP holds and does: the wrapped model as ``.module``; gradient buckets
    made at construction and kept (parameters in reverse order, a first bucket of 1 MiB and
    then 25 MiB ones or ``bucket_cap_mb``, one dtype and device per bucket); in backward each
    gradient, once accumulated, copied into its bucket and divided by the world size, each
    full bucket all-reduced and copied back into the gradients. It is no subclass of DDP
    (``isinstance(model, DistributedDataParallel)`` is False in the estimated code);
    ``gradient_as_bucket_view=True`` (gradients that are views of the buckets) is refused.
    """

    def __init__(self, module: torch.nn.Module, *args, bucket_cap_mb=None, **kwargs) -> None:
        if kwargs.get("gradient_as_bucket_view"):
            raise EstimateError(
                "estimate(world_size=...) simulates DistributedDataParallel without "
                "gradient_as_bucket_view=True"
            )
        super().__init__()
        self.module = module
        params = [p for p in module.parameters() if p.requires_grad]
        cap = BUCKET_BYTES if bucket_cap_mb is None else int(bucket_cap_mb * 1024 * 1024)
        first = FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap
        self._buckets = []
        for group in _bucket_groups(params[::-1], first, cap):
            numel = sum(p.numel() for p in group)
            with torch.profiler.record_function(DDP_BUCKET_MARKER):
                bucket = torch.zeros(numel, dtype=group[0].dtype, device=group[0].device)
            offsets, at = {}, 0
            for p in group:
                offsets[id(p)] = at
                at += p.numel()
            state = {"ready": 0, "params": group, "bucket": bucket, "offsets": offsets}
            self._buckets.append(state)
            for p in group:
                p.register_post_accumulate_grad_hook(functools.partial(_ready, state))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def _bucket_groups(params: list, first: int, cap: int) -> list[list]:
    """Parameters in buckets, as DDP fills them: a parameter goes into the open bucket of
    its dtype and device, which closes once it holds ``first`` bytes (the first bucket) or
    ``cap`` (the others)."""
    groups: list[list] = []
    open_: dict[tuple, tuple[list, int]] = {}  # (dtype, device) -> (bucket, bytes)
    for p in params:
        key = (p.dtype, p.device)
        bucket, size = open_.get(key, (None, 0))
        if bucket is None:
            bucket = []
            groups.append(bucket)
        bucket.append(p)
        size += p.numel() * p.element_size()
        limit = first if len(groups) == 1 else cap
        open_[key] = (None, 0) if size >= limit else (bucket, size)
    return groups


@torch.no_grad()
def _ready(state: dict, param: torch.Tensor) -> None:
    """A gradient accumulated: copied into its bucket (DDP's reducer does so in the same
    hook); once the bucket is full, its all-reduce is queued to run when the backward pass
    ends (as DDP finishes its buckets), outside the autograd node that is running now."""
    offset = state["offsets"][id(param)]
    if param.grad is not None:
        state["bucket"][offset : offset + param.numel()].view_as(param.grad).copy_(param.grad)
    state["ready"] += 1
    if state["ready"] == len(state["params"]):
        state["ready"] = 0
        torch.autograd.Variable._execution_engine.queue_callback(functools.partial(_reduce, state))


@torch.no_grad()
def _reduce(state: dict) -> None:
    """A full bucket divided by the world size, all-reduced, copied back into the gradients."""
    bucket = state["bucket"]
    bucket.div_(torch.distributed.get_world_size())
    torch.distributed.all_reduce(bucket)
    for p in state["params"]:
        if p.grad is not None:
            offset = state["offsets"][id(p)]
            p.grad.copy_(bucket[offset : offset + p.numel()].view_as(p.grad))


def _outside_fake_modes(init):
    """``DeviceMesh.__init__`` run with no dispatch or function mode: a mesh is made of
    real rank numbers, read while it is built. ``init_device_mesh`` hands it its rank map
    made inside the run, a fake ``arange``: it is made again, for real."""

    @functools.wraps(init)
    def wrapper(*args, **kwargs):
        from torch._subclasses.fake_tensor import FakeTensor
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes(), torch._C.DisableTorchFunction():
            ranks = kwargs.get("_rank_map")
            if isinstance(ranks, FakeTensor):
                kwargs["_rank_map"] = torch.arange(ranks.numel(), dtype=ranks.dtype)
            return init(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def distributed_hooks(recorder) -> Iterator[None]:
    """While a fake run runs: meshes built outside the fake modes, and storage resizes made
    by the run's thread reported to ``recorder``. Everything is put back on the way out."""
    storage_cls = torch.UntypedStorage
    own = "resize_" in storage_cls.__dict__
    original_resize = storage_cls.resize_

    def resize_(storage, size):
        out = original_resize(storage, size)
        if recorder.active and recorder._ours():
            recorder.resized(storage, int(size))
        return out

    mesh_cls = None
    if torch.distributed.is_available():
        from torch.distributed.device_mesh import DeviceMesh as mesh_cls
    original_init = mesh_cls.__init__ if mesh_cls is not None else None
    storage_cls.resize_ = resize_
    if mesh_cls is not None:
        mesh_cls.__init__ = _outside_fake_modes(original_init)
    try:
        yield
    finally:
        if own:
            storage_cls.resize_ = original_resize
        else:
            del storage_cls.resize_
        if mesh_cls is not None:
            mesh_cls.__init__ = original_init
