"""The vocabularies every layer shares, as enums.

They sit below everything else so that producers (which tag records with an :class:`OpKind`
or a :class:`Role`) and the analysis (which stores them as categorical columns) agree on one
spelling. Each is a string enum whose members compare equal to their values.
"""

from __future__ import annotations

import enum


class Vocabulary(str, enum.Enum):
    """A string enum whose members compare equal to their values."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def values(cls) -> list[str]:
        return [m.value for m in cls]


class Category(Vocabulary):
    """What a block of memory is for (the order is the display order)."""

    PARAMETER = "parameter"
    OPTIMIZER_STATE = "optimizer_state"
    INPUT = "input"
    TEMPORARY = "temporary"
    ACTIVATION = "activation"
    GRADIENT = "gradient"
    AUTOGRAD_DETAIL = "autograd_detail"
    UNKNOWN = "unknown"


class Phase(Vocabulary):
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    OTHER = "other"


class OpKind(Vocabulary):
    OP = "op"  # dispatcher op (aten::..., and other namespaced ops)
    MODULE = "module"  # an nn.Module call
    ANNOTATION = "annotation"  # a user record_function label
    BACKWARD = "backward"  # an autograd node run by the engine
    OPTIMIZER = "optimizer"  # optimizer.step / zero_grad


class Action(Vocabulary):
    """Memory event actions: the vocabulary of torch's raw memory-timeline export."""

    PREEXISTING = "preexisting"
    CREATE = "create"
    INCREMENT_VERSION = "increment_version"
    DESTROY = "destroy"


class Relation(Vocabulary):
    """How an op relates to a block in :meth:`Profile.lineage`."""

    PREEXISTING = "preexisting"
    ALLOCATED = "allocated"
    READ = "read"
    MUTATED = "mutated"
    SAVED_FOR_BACKWARD = "saved_for_backward"
    USED_IN_BACKWARD = "used_in_backward"
    FREED = "freed"


class Role(Vocabulary):
    """What the live session says a named tensor is (see the ``names`` table)."""

    PARAMETER = "parameter"
    BUFFER = "buffer"
    GRADIENT = "gradient"
    OPTIMIZER_STATE = "optimizer_state"
    VARIABLE = "variable"
    #: a tensor an autograd graph keeps, reached at the end of the capture from a tensor the
    #: session reaches (``losses[3].grad_fn._saved_self``; see ``prof.leaks()``)
    HELD = "held"


class Pool(Vocabulary):
    """The caching allocator's pool a segment belongs to (see ``prof.segments``)."""

    SMALL = "small"  # requests of 1 MiB or less, from 2 MiB segments
    LARGE = "large"  # everything else


class Source(Vocabulary):
    """Where a row of ``prof.segments`` comes from."""

    RECORDED = "recorded"  # the allocator's own trace (cudaMalloc / cuMemMap calls)
    MODELLED = "modelled"  # replayed by the model of the caching allocator


class Change(Vocabulary):
    """A change to a training step that :func:`jupyter_memprof.what_if` can estimate (each
    value is the keyword ``what_if`` takes), and that :meth:`Profile.explain` suggests."""

    CHECKPOINT = "checkpoint"  # activation checkpointing of modules (non-reentrant)
    AUTOCAST = "autocast"  # the forward in bfloat16 / float16
    OPTIMIZER = "optimizer"  # another optimizer class, or its keywords (foreach, fused)
    SET_TO_NONE = "set_to_none"  # zero_grad(set_to_none=...)
    BATCH = "batch"  # the batch dimension of the inputs scaled
