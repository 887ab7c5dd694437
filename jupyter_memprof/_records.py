"""The producer interface: the records every producer hands over.

A *producer* runs (or pretends to run) some PyTorch code and describes what happened as a
:class:`Capture`: ops with their nesting and timing (:class:`OpRecord`), the tensors each op
read or wrote (:class:`TensorRef`), allocator events (:class:`MemoryRecord`, or for millions
of them :class:`MemoryColumns`), storages that were used but never reported
(:class:`UntrackedTensor`), and the names the live session gives tensors (:class:`NameRow`). :func:`jupyter_memprof._analysis.pipeline.analyse` turns one
Capture into every table; it never sees the producer.

Producers today:

- :mod:`jupyter_memprof._producers.torch_profiler` reads the event tree of
  ``torch.profiler.profile`` (a real run, started by :mod:`~jupyter_memprof._producers.recorder`);
- estimate mode runs the code on fake tensors and records the same things through a
  dispatch mode (:mod:`jupyter_memprof._producers.fake`; see docs/estimate.md);
- a torch memory snapshot (``torch.cuda.memory._dump_snapshot``) read from a file
  (:mod:`jupyter_memprof._producers.snapshot`): allocator events with Python stacks
  (:class:`Stacks`), recorded segments (:class:`SegmentRecord`), blocks older than its
  history (:class:`OlderBlock`), and no ops but its annotations (see docs/snapshots.md).

Only producers touch torch's private APIs (``torch._C`` and friends: the profiler's event
tree, fake tensors, the autograd engine); from these records on, nothing does
(tests/test_architecture.py checks it).

Rules every producer keeps (the analysis relies on them):

- ids (``op_id``, ``tensor_id``, ``allocation_id``) are non-negative ints, unique within a
  capture; :data:`NO_ID` stands for "none" wherever an id is optional;
- ``op_id`` order is a pre-order of the op tree: a parent precedes its children;
- times are integer nanoseconds on one clock, non-decreasing in ``memory``;
- a free (``size < 0``) carries the same ``allocation_id`` and ``tensor_id`` as its
  allocation; blocks allocated before the capture may appear only as frees;
- ``device`` strings are ``"cpu"`` or ``"cuda:N"``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ._vocab import OpKind, Role

#: Names of the annotations the capture's module hooks emit: ``MODULE_MARKER + index``.
MODULE_MARKER = "memprof.module#"
#: The name of the annotation :func:`jupyter_memprof.step` emits: a step ends there.
STEP_MARKER = "memprof.step"
#: The annotation around a closure an optimizer calls (``optimizer.step(closure)``): what
#: runs inside is the user's training step (forward, loss, backward), not the optimizer's.
CLOSURE_MARKER = "memprof.closure"
#: The label estimate mode's stand-in for DistributedDataParallel makes its gradient buckets
#: under (``_producers/fake/dist.py``): the analysis names them as a real capture's buckets.
DDP_BUCKET_MARKER = "DDP::gradient_bucket"
#: The prefix of the annotations torch's ``profiler.step()`` opens (``ProfilerStep#3``):
#: each one starts a step.
PROFILER_STEP_PREFIX = "ProfilerStep#"


class TensorRef(NamedTuple):
    """One tensor an op received (as an argument, or inside a tensor-list argument)."""

    op_id: int
    tensor_id: int  # the profiler's storage identity
    mutable: bool  # the op's schema says it may write this argument in place


class UntrackedTensor(NamedTuple):
    """A storage ops used but the allocator never reported (it existed before the capture)."""

    tensor_id: int
    ptr: int  # storage data pointer
    device: str
    extent: int  # bytes up to the furthest element any view of it reached (a size lower bound)


#: Integer ids and indexes in records use NO_ID for "none", so the tables can turn them
#: into missing values in one vectorised step.
NO_ID = -1


class OpRecord(NamedTuple):
    op_id: int
    parent_id: int  # NO_ID for roots
    depth: int
    name: str
    kind: OpKind
    start_ns: int
    end_ns: int
    thread: int
    seq_nr: int  # NO_ID when autograd recorded none
    backward: bool  # runs inside an autograd node
    optimizer: bool  # runs inside optimizer.step / zero_grad
    module_index: int  # for kind == MODULE: index into the capture's module list, else NO_ID
    module_ctx: int  # innermost enclosing module call (its op_id), or NO_ID
    callsite: str | None
    input_shapes: list
    node_id: int  # the data-flow node (outermost dispatcher op / autograd node), or NO_ID


class MemoryRecord(NamedTuple):
    time_ns: int
    ptr: int
    size: int  # > 0 allocation, < 0 free
    tensor_id: int  # NO_ID for raw blocks with no tensor identity
    allocation_id: int
    device: str
    op_id: int  # innermost enclosing op, or NO_ID
    #: the device allocator's own totals right after this event (CUDA's caching allocator:
    #: ``memory_allocated`` and ``memory_reserved``); NO_ID where none is recorded
    total_allocated: int = NO_ID
    total_reserved: int = NO_ID


class MemoryColumns:
    """``Trace.memory`` as columns: what a producer of millions of records (a memory
    snapshot) hands over instead of :class:`MemoryRecord`\\ s. One int64 array per field of
    :class:`MemoryRecord`, position i being record i; ``device`` holds indexes into
    ``device_names``. The analysis reads both forms alike
    (:func:`jupyter_memprof._analysis.tables.memory_table`)."""

    FIELDS = MemoryRecord._fields

    def __init__(self, device_names: Sequence[str], **fields: np.ndarray) -> None:
        if set(fields) != set(self.FIELDS):
            raise TypeError(f"MemoryColumns needs exactly the fields {self.FIELDS}")
        self.device_names = list(device_names)
        self.fields = {k: np.asarray(fields[k], dtype=np.int64) for k in self.FIELDS}
        if len({len(a) for a in self.fields.values()}) > 1:
            raise ValueError("MemoryColumns: columns of different lengths")

    def __len__(self) -> int:
        return len(self.fields["time_ns"])

    def clear(self) -> None:
        """Let the columns go (as ``list.clear`` lets records go)."""
        self.fields = {k: np.zeros(0, np.int64) for k in self.FIELDS}


class Trace(NamedTuple):
    """The records of one run, in the order the rules above describe."""

    ops: list[OpRecord]
    tensors: list[TensorRef]
    memory: list[MemoryRecord] | MemoryColumns
    untracked: list[UntrackedTensor]
    event_count: int  # nodes in torch's event tree (for benchmarks and progress)
    #: modules seen by torch's Python tracer as ``(id(module), class name)``, by
    #: ``OpRecord.module_index``; empty when the producer names modules itself
    module_calls: Sequence[tuple[int, str]] = ()


class NameRow(NamedTuple):
    """A tensor the live session knows by name, read before (``"start"``) or after
    (``"end"``) the capture: a parameter, gradient, buffer, optimizer state or variable."""

    name: str
    role: Role
    device: str
    ptr: int  # storage data pointer (matched to blocks by the analysis)
    size_bytes: int
    when: str  # "start" or "end"
    #: path of the module holding the tensor (for a gradient or optimizer state: the module
    #: holding its parameter); None for tensors of no module
    module: str | None = None


class DeviceTotals(NamedTuple):
    """A CUDA device's memory read at one moment: the caching allocator's counters
    (``torch.cuda.memory_allocated`` / ``memory_reserved``) and the driver's
    (``torch.cuda.mem_get_info``: free and total bytes of the device)."""

    allocated: int
    reserved: int
    free: int
    total: int


class WatchedFree(NamedTuple):
    """A block the session named at the start, freed during the capture (seen by a weak
    reference on its storage: torch does not report such frees on the CPU)."""

    device: str
    ptr: int
    time_ns: int


class StackContext(str, enum.Enum):
    """What a Python stack says its allocation was part of (a producer's reading of the
    frames; the outermost frame it recognises decides): the analysis's frame rules
    (:mod:`jupyter_memprof._analysis.frame_rules`) turn it into categories."""

    FORWARD = "forward"  # inside a module's forward (nn.Module.__call__)
    BACKWARD = "backward"  # inside tensor.backward() / torch.autograd.backward / grad
    OPTIMIZER_STEP = "optimizer_step"  # inside optimizer.step()
    ZERO_GRAD = "zero_grad"  # inside zero_grad()
    DATA = "data"  # inside torch.utils.data (a DataLoader, collate)
    MODULE_TO = "module_to"  # inside Module.to() / .cuda() (Module._apply): parameters
    MODULE_INIT = "module_init"  # inside a torch.nn module's __init__ / torch.nn.init
    OTHER = "other"  # Python frames, none recognised
    NONE = "none"  # no Python frames recorded


class Frame(NamedTuple):
    """One frame of a recorded stack."""

    filename: str
    line: int
    name: str


class Stacks(NamedTuple):
    """The Python stacks of a producer that records one per allocator event (a memory
    snapshot), each distinct stack once: by stack index, its frames (innermost first), its
    :class:`StackContext` value and its callsite (the innermost user frame,
    ``file.py:12 in fn``, or None); by memory record (as ``Trace.memory``) and by
    :class:`OlderBlock`, the stack index or NO_ID."""

    frames: list[tuple[Frame, ...]]
    context: list[str]
    callsite: list[str | None]
    of_memory: Sequence[int]
    of_older: list[int]
    #: by memory record: the category the file itself gives the block it allocates (torch's
    #: ``profile_plot`` and :meth:`Profile.to_snapshot` write one), else None; None when no
    #: record has one
    recorded: list[str | None] | None = None


class SegmentRecord(NamedTuple):
    """A recorded change of the caching allocator's reserved memory: a segment allocated
    (``size > 0``) or freed (``size < 0``), or with expandable segments a range mapped or
    unmapped. ``time_ns`` on the capture's clock; ``pool``: ``"small"`` or ``"large"``."""

    time_ns: int
    device: str
    address: int
    size: int
    pool: str
    stream: int


class OlderBlock(NamedTuple):
    """A block alive when the recorded history begins, known only from the allocator's
    state at its end (a snapshot's ``segments``): alive throughout, no allocation or free
    recorded."""

    device: str
    ptr: int
    size: int


class UnnamedStorage(NamedTuple):
    """A storage live when a real run's capture started that no name reached: held by a
    tensor the garbage collector tracks (a closure's cell, a reference cycle, a frame) or
    saved by the autograd graph of such a tensor (:mod:`jupyter_memprof._producers.unnamed`)."""

    device: str
    ptr: int
    size: int


class Capture(NamedTuple):
    """Everything one producer hands to the analysis."""

    trace: Trace
    names: list[NameRow]
    module_paths: list[str]  # dotted path of each module, by OpRecord.module_index
    module_classes: list[str]  # class name of each module, by OpRecord.module_index
    devices: list[str]  # the devices whose memory was recorded
    start_ns: int | None  # time zero: the start of the profiled code (None: first record)
    #: per CUDA device, read just before the capture started and just after it stopped
    #: (empty when CUDA was not in use, and for producers that run nothing)
    totals_start: dict[str, DeviceTotals] | None = None
    totals_end: dict[str, DeviceTotals] | None = None
    watched_frees: list[WatchedFree] | None = None
    #: a producer that records Python stacks per allocator event instead of ops: the stacks
    #: (read by :mod:`jupyter_memprof._analysis.frame_rules`); None for the others
    stacks: Stacks | None = None
    #: the allocator's own record of its segments (replaces the modelled ``segments``)
    segments: list[SegmentRecord] | None = None
    #: blocks alive throughout, older than what was recorded (a snapshot's final state)
    older: list[OlderBlock] | None = None
    #: CPU storages live at the start that no name reached (a real run; None: not looked for)
    unnamed: list[UnnamedStorage] | None = None
