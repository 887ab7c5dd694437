"""Values a fake run knows: integer and boolean inputs, followed.

These are inputs such as token ids, attention masks and labels,
and what is computed from them alone.

Library code reads such values to choose its path: transformers checks that an attention
mask has no padding (``padding_mask.all()``) before it lets attention skip the mask. A fake
tensor has no value, so the check cannot be answered, and guessing would take a path the
real step may not take. The inputs' values are known, though (they are the user's real
tensors), and so is everything computed only from them: :class:`KnownValues` keeps a private
clone of each integer or boolean input and, for every op whose tensor arguments are all
known (or that makes a small tensor from no tensor at all, such as ``arange``), runs the op
on those values too, outside the fake modes. A data-dependent read of a known tensor
(``.item()``, ``bool()``, ``nonzero``) gets the real answer. Anything that touches a
parameter or an activation stays unknown, and a write into a known tensor from something
unknown forgets every value (it could be a view of any of them).
"""

from __future__ import annotations

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.weak import WeakIdKeyDictionary

#: Largest tensor (elements) whose value is kept or computed: masks and ids of a batch.
LIMIT = 1 << 22
#: An op whose value is not known.
UNKNOWN = object()
_KEPT_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


class KnownValues:
    """Real values of fake tensors, by fake tensor."""

    def __init__(self):
        self._values = WeakIdKeyDictionary()
        self._storages: set[int] = set()  # storages of known tensors (views share them)

    def seed(self, real: torch.Tensor, fake: torch.Tensor) -> None:
        """Keep ``real``'s value for its fake copy, when it is an integer or boolean tensor
        without gradients of at most :data:`LIMIT` elements."""
        if real.dtype in _KEPT_DTYPES and not real.requires_grad and real.numel() <= LIMIT:
            if real.device.type != "meta":
                with _disable_current_modes():
                    self._values[fake] = real.detach().to("cpu", copy=True)
                self._storages.add(_storage(fake))

    def value(self, t):
        return self._values.get(t) if isinstance(t, torch.Tensor) else None

    def run(self, func, args: tuple, kwargs: dict, written: list):
        """The op's real outputs, when all its tensor arguments are known; :data:`UNKNOWN`
        otherwise (and every value is forgotten when the op writes into the storage of a
        known tensor: ``written`` are the arguments it writes)."""
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not tensors or torch.Tag.nondeterministic_seeded in func.tags:
            return UNKNOWN
        values = [self._values.get(t) for t in tensors]
        if any(v is None for v in values):
            if any(_storage(t) in self._storages for t in pytree.tree_leaves(written)):
                self.clear()
            return UNKNOWN
        return self._compute(func, args, kwargs)

    def run_factory(self, func, args: tuple, kwargs: dict, out):
        """The real value of a small tensor made from no tensor (``arange``, ``ones``)."""
        if any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves((args, kwargs))):
            return UNKNOWN
        if torch.Tag.nondeterministic_seeded in func.tags:
            return UNKNOWN
        outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not outs or sum(t.numel() for t in outs) > LIMIT:
            return UNKNOWN
        return self._compute(func, args, kwargs)

    def _compute(self, func, args: tuple, kwargs: dict):
        def real(x):
            if isinstance(x, torch.Tensor):
                return self._values[x]
            if isinstance(x, torch.device):
                return torch.device("cpu")
            return x

        r_args, r_kwargs = pytree.tree_map(real, (args, kwargs))
        if "device" in r_kwargs:
            r_kwargs["device"] = torch.device("cpu")
        try:
            with _disable_current_modes(), torch.no_grad():
                return func(*r_args, **r_kwargs)
        except Exception:  # an op that fails on the values: simply not known
            return UNKNOWN

    def learn(self, out, real_out) -> None:
        """Remember the real value of each fake output."""
        if real_out is UNKNOWN:
            return
        fakes = pytree.tree_leaves(out)
        reals = pytree.tree_leaves(real_out)
        if len(fakes) != len(reals):
            return
        for f, r in zip(fakes, reals):
            if isinstance(f, torch.Tensor) and isinstance(r, torch.Tensor):
                if r.numel() <= LIMIT and tuple(f.shape) == tuple(r.shape):
                    self._values[f] = r
                    self._storages.add(_storage(f))

    def fake_of(self, mode, real_out):
        """The fake output of a data-dependent op from its real output (a number stays a
        number; a tensor becomes a fake one of the real shape)."""

        def fake(x):
            if isinstance(x, torch.Tensor):
                with _disable_current_modes():
                    return mode.fake_tensor_converter.from_real_tensor(mode, x)
            return x

        return pytree.tree_map(fake, real_out)

    def clear(self) -> None:
        self._values.clear()
        self._storages.clear()


def _storage(t) -> int | None:
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, TypeError):
        return None
