"""The changes of ``jupyter_memprof.what_if`` made by hand to real objects, as a user would
make them in their code: what ``tests/test_whatif.py`` and ``bench_whatif.py`` capture for
real and compare with the estimates.
"""

from __future__ import annotations

import functools
import types

import torch
from torch.utils.checkpoint import checkpoint


def run_closure(code, globals_, cells):
    """Call a closure (a scenario's ``step``) with its cells replaced: what_if() is given the
    objects it closes over as arguments, so that it copies them to fake."""
    fn = types.FunctionType(code, globals_, None, None, tuple(types.CellType(c) for c in cells))
    return fn()


def cells_of(step) -> list:
    """The objects a closure closes over."""
    return [c.cell_contents for c in step.__closure__ or ()]


def checkpoint_by_hand(model: torch.nn.Module, paths: list[str]) -> None:
    """Each submodule at ``paths`` runs its forward under non-reentrant checkpointing
    (``blocks.*``: each child of ``blocks``)."""
    for path in paths:
        if path.endswith(".*"):
            parent = model.get_submodule(path[:-2])
            subs = list(parent.children())
        else:
            subs = [model.get_submodule(path)]
        for sub in subs:
            sub.forward = functools.partial(checkpoint, sub.forward, use_reentrant=False)


def autocast_by_hand(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """``model``'s forward runs under ``torch.autocast("cpu", dtype)`` (as
    ``with torch.autocast(...): out = model(x)`` in the step; loss and backward outside)."""
    forward = model.forward

    def autocast(*args, **kwargs):
        with torch.autocast("cpu", dtype=dtype):
            return forward(*args, **kwargs)

    model.forward = autocast


def doubled(cells: list) -> list:
    """The input tensors among ``cells`` (not parameters, not held by a model) with twice as
    many rows, each row repeated; views of one storage stay views of one storage twice as
    large (``x, y = tokens[:, :-1], tokens[:, 1:]``)."""
    models = [c for c in cells if isinstance(c, torch.nn.Module)]
    held = {id(t) for m in models for t in (*m.parameters(), *m.buffers())}
    bases: dict[int, torch.Tensor] = {}
    out = []
    for c in cells:
        if not isinstance(c, torch.Tensor) or id(c) in held or isinstance(c, torch.nn.Parameter):
            out.append(c)
            continue
        key = c.untyped_storage().data_ptr()
        if key not in bases:
            flat = torch.empty(0, dtype=c.dtype).set_(c.untyped_storage())
            bases[key] = torch.cat([flat, flat])
        shape = (2 * c.shape[0], *c.shape[1:])
        out.append(bases[key].as_strided(shape, c.stride(), c.storage_offset()))
    return out


def swapped_optimizer(cells: list, old: torch.optim.Optimizer, factory, model) -> tuple:
    """``cells`` with ``old`` replaced by ``factory(model.parameters(), lr=1e-3)``; returns
    the new cells and the new optimizer (not warmed up yet)."""
    new = factory(model.parameters(), lr=1e-3)
    return [new if c is old else c for c in cells], new
