"""A ``DTensor``'s bytes: the local shard behind it.

FSDP2 (``fully_shard``) keeps every parameter as a DTensor, and so are its gradient and the
optimizer state made from it (Adam's ``exp_avg`` of a DTensor parameter is a DTensor). A
DTensor is a wrapper: it has no storage of its own; the memory this rank holds is its local
tensor's storage (for FSDP2 a view of the padded shard, so the storage counts the padding).
The producers name that storage with the parameter's path (``model.blocks.3.fc1.weight``).
"""

from __future__ import annotations

from typing import Any

import torch


def _dtensor_type() -> type | None:
    """The DTensor class, or None when this torch has no ``torch.distributed.tensor``."""
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - builds without distributed tensors
        return None
    return DTensor


def local_tensor(t: Any) -> Any:
    """The tensor whose storage holds ``t``'s bytes on this rank: a DTensor's local shard,
    else ``t`` itself (anything that is no DTensor comes back unchanged)."""
    if not isinstance(t, torch.Tensor) or type(t) is torch.Tensor:
        return t
    cls = _dtensor_type()
    if cls is None or not isinstance(t, cls):
        return t
    try:
        local = t._local_tensor  # the shard itself, no autograd view (``to_local`` makes one)
    except AttributeError:  # pragma: no cover - a DTensor being built
        return t
    return local if isinstance(local, torch.Tensor) else t
