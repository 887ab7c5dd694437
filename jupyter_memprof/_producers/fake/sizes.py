"""Size rules on a fake op: real output sizes, kernel blocks.

A fake (meta) kernel makes only an op's outputs, some of them empty where the real kernel's
are not, and none of the blocks the real kernel allocates and frees inside. Where a size rule
covers the op on its device (:data:`..cpu_kernels.CPU_SIZE_RULES`,
:data:`..cuda_kernels.CUDA_SIZE_RULES`), the recorder records the real sizes of the outputs and
those blocks (:class:`SizedOutputs`, a part of :class:`.recorder.FakeRecorder`).
"""

from __future__ import annotations

import torch

from ..._devices import block_bytes
from ..._records import MemoryRecord
from .. import cuda_kernels
from ..cpu_kernels import CPU_SIZE_RULES
from ..cpu_kernels import not_modelled as cpu_not_modelled
from ..dtensor import local_tensor

#: Apply the size rules (the accuracy benchmark turns them off to show what they close).
SIZE_RULES = True


class SizedOutputs:
    """The recorder's part that records an op's outputs and its kernel's own blocks."""

    def _record_outputs(self, func, op_id: int, out, args: tuple, kwargs: dict) -> None:
        """Record the op's new blocks: as the fake kernel made them, or, where a size rule
        for the device covers the op, with the real kernel's sizes and its own blocks."""
        tensors = _slots(out)
        first = next((t for t in tensors if t is not None), None)
        device = self.device_of(first.device) if first is not None else None
        sizes = None
        if device == "cpu":
            rule = CPU_SIZE_RULES.get(func) if SIZE_RULES else None
            sizes = rule(_bind(func, args, kwargs)) if rule is not None else None
            missing = cpu_not_modelled(func, args) if sizes is None else None
            if missing is not None:
                self.not_modelled.setdefault(func._schema.name, missing)
        elif device is not None and self.gpu is not None:
            sizes = self._cuda_sizes(func, device, args, kwargs)
        outs, temps = sizes or ({}, [])
        placed = {
            _storage_key(tensors[e.index])
            for e in _flat(temps)
            if isinstance(e, cuda_kernels.Out) and tensors[e.index] is not None
        }  # outputs a rule places among its blocks (views of one storage go together)
        for i, t in enumerate(tensors):
            if t is not None and _storage_key(t) not in placed:
                self._output(op_id, t, outs.get(i))
        if temps:
            self._temporaries(op_id, device, temps, tensors, outs)

    def _output(self, op_id: int, t: torch.Tensor | None, size) -> None:
        """Record a new output block (``size``: a size rule's bytes, or ``ON_CPU``). A
        DTensor's block is its local shard's: the op it dispatches to on the shard runs
        below this recorder, unseen, so the shard is this op's output."""
        t = local_tensor(t)
        if t is None:
            return
        if size == cuda_kernels.ON_CPU:  # made on the CPU by CUDA's kernel
            self.pinned[t.untyped_storage()._cdata] = "cpu"
            size = None
        self.block(t, op_id, True, size)

    def _cuda_sizes(self, func, device: str, args: tuple, kwargs: dict):
        """The CUDA size rule's sizes for this op, or None; notes the ops whose CUDA kernel
        memory no rule covers (``not_modelled``)."""
        name = func._schema.name
        rule = cuda_kernels.CUDA_SIZE_RULES.get(func) if SIZE_RULES else None
        sizes = rule(_bind(func, args, kwargs), self.gpu) if rule is not None else None
        if rule is not None and sizes is None:
            self.not_modelled.setdefault(name, f"no size rule for these shapes on {self.gpu.name}")
        elif rule is None and name in cuda_kernels.NOT_MODELLED:
            self.not_modelled.setdefault(name, cuda_kernels.NOT_MODELLED[name])
        return sizes

    def _temporaries(self, op_id: int, device: str, temps: list, tensors: list, outs: dict):
        """Blocks the real kernel allocates and frees inside the op: an int lives until the
        op returns (freed in reverse order); a tuple is allocated in order and its ints
        freed, in reverse, before the next entry; ``Out(i)`` places output ``i``."""
        live = []
        for entry in temps:
            if isinstance(entry, tuple) and not isinstance(entry, cuda_kernels.Out):
                phase = []
                for n in entry:
                    if isinstance(n, cuda_kernels.Out):
                        self._output(op_id, tensors[n.index], outs.get(n.index))
                    else:
                        phase.append(self._alloc(op_id, device, n))
                self._free_all(op_id, device, phase)
            elif isinstance(entry, cuda_kernels.Out):
                self._output(op_id, tensors[entry.index], outs.get(entry.index))
            else:
                live.append(self._alloc(op_id, device, entry))
        self._free_all(op_id, device, live)

    def _alloc(self, op_id: int, device: str, n: int) -> tuple[int, int, int]:
        n = block_bytes(device, n)
        tid, ptr = self._new_block(device, n)
        self.memory.append(MemoryRecord(self.tick(), ptr, n, tid, tid, device, op_id))
        return ptr, n, tid

    def _free_all(self, op_id: int, device: str, blocks: list) -> None:
        for ptr, n, tid in reversed(blocks):
            self.memory.append(MemoryRecord(self.tick(), ptr, -n, tid, tid, device, op_id))


def _bind(func, args: tuple, kwargs: dict) -> dict:
    """The op's arguments by schema name."""
    names = [a.name for a in func._schema.arguments]
    return {**dict(zip(names, args)), **kwargs}


def _slots(out) -> list:
    """An op's outputs by position (``None`` where it returned no tensor); lists inside
    the result (``Tensor[]`` outputs) are flattened in place."""
    if isinstance(out, torch.Tensor):
        return [out]
    slots: list = []
    if isinstance(out, (list, tuple)):
        for x in out:
            if isinstance(x, (list, tuple)):
                slots.extend(y if isinstance(y, torch.Tensor) else None for y in x)
            else:
                slots.append(x if isinstance(x, torch.Tensor) else None)
    return slots


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _flat(temps: list):
    """A size rule's block list with its phases (tuples) opened."""
    for e in temps:
        if isinstance(e, tuple) and not isinstance(e, cuda_kernels.Out):
            yield from e
        else:
            yield e
