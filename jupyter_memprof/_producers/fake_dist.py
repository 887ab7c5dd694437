"""Distributed steps in a fake run: ``fully_shard``, DDP and collectives as on N ranks.

``estimate(fn, ..., world_size=N)`` runs ``fn`` in this one process as rank 0 of N, on torch's
fake process group (backend ``"fake"`` with ``torch.testing._internal.distributed.fake_pg.
FakeStore``): every collective returns at once, moves no data, and gives its outputs the
shapes N ranks would give them, so FSDP2 shards parameters in N and DDP builds its buckets
as on N ranks. What that needs from a fake run, beyond the fake group:

- a ``DeviceMesh`` (``fully_shard``'s default one, or the user's) is built outside the fake
  modes: it computes with a small real tensor of ranks and reads its values;
- FSDP frees and makes again its unsharded parameters by resizing their storages in place
  (``UntypedStorage.resize_``), which no op shows: every resize during the run is reported to
  the recorder (:meth:`~jupyter_memprof._producers.fake_recorder.FakeRecorder.resized`).

The group is made before ``fn`` runs and destroyed after, also when it raises. A process that
has a process group already (a real job) cannot also hold the fake one: that is refused.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

from .._errors import EstimateError


def check_world_size(world_size) -> int | None:
    """``None`` (no process group) or a whole number of ranks from 1 up; anything else, or a
    torch without ``torch.distributed``, raises :class:`EstimateError` with one line."""
    if world_size is None:
        return None
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise EstimateError(
            f"world_size must be a whole number of ranks from 1 up, not {world_size!r}"
        )
    if not torch.distributed.is_available():
        raise EstimateError("world_size needs torch.distributed, which this torch build lacks")
    return world_size


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
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    from torch.nn.parallel import DistributedDataParallel as ddp

    ddp_init = ddp.__init__
    ddp.__init__ = _refused(ddp_init)
    try:
        yield
    finally:
        ddp.__init__ = ddp_init
        dist.destroy_process_group()


#: Why DDP is refused on the fake group (measured: docs/dev-notes.md, "FSDP2 and DTensors").
DDP_REFUSED = (
    "DistributedDataParallel cannot run on torch's fake process group: its C++ reducer reads "
    "tensor values (checking shapes across ranks, rebuilding buckets), which fake tensors do "
    "not have. Estimate the model without the DDP wrapper and add one gradient bucket: DDP "
    "holds a copy of every gradient (docs/estimate.md, 'Many ranks')"
)


def _refused(init):
    """``DistributedDataParallel.__init__`` while a fake group runs: refused, one line."""

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        raise EstimateError(DDP_REFUSED)

    return wrapper


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
