"""The fake-tensor producer: a step on fake copies -> Capture.

It runs a step on fake copies of the user's objects and hands the
analysis the same :class:`~jupyter_memprof._records.Capture` the torch-profiler producer
hands it.

No real compute runs and no real memory of the estimated size is allocated: every tensor is
a :class:`FakeTensor` (shape, dtype, stride and device, no data). :mod:`.copy` makes the
copies, :mod:`.recorder` records the run.

Devices: the run computes on a fake device and attributes every block to the device asked
for. Where that is CUDA and this torch has no CUDA, the run computes on fake CPU tensors
(fake CUDA tensors cannot record autograd history without CUDA: the process aborts) and the
blocks are attributed to the CUDA device; kernels then follow their CPU path. Optimizers take
their multi-tensor (``foreach``) path for CUDA, simulated or not, as they do on CUDA by default
(torch's own choice tests exact tensor types, which fake tensors fail).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..._devices import is_present, parse_device
from ..._errors import DeviceError
from ..._records import CLOSURE_MARKER, Capture, Trace
from ..._vocab import OpKind
from ..cuda_kernels import Gpu
from ..live import SessionNames, held_rows, marked_closure
from ..recorder import cell_namer
from ..slot import exclusive
from ..torch_profiler import FrameNamer
from .copy import FakeCopier
from .dist import distributed_hooks
from .modes import PythonMode, RecordingMode, cuda_functions
from .recorder import FakeRecorder, cudnn_rnn_error
from .state import as_real, compiled_names, eager, internal_error, quiet_fake_logs, real_state_kept


class Plan(NamedTuple):
    """Where a fake run computes and where its blocks are said to live."""

    device: str | None  # the device asked for ("cpu", "cuda:N"), None: where each tensor lives
    compute: torch.device | None  # the device the fake tensors report
    simulated: bool  # CUDA asked for, computed on the CPU


def plan(device: str | None) -> Plan:
    if device is None:
        return Plan(None, None, False)
    name = parse_device(device, need_present=False)
    if name == "cpu":
        return Plan("cpu", torch.device("cpu"), False)
    if is_present(name):
        return Plan(name, torch.device(name), False)
    return Plan(name, torch.device("cpu"), True)


def targets_cuda(where: Plan) -> bool:
    """Whether blocks of the run may be CUDA blocks (CUDA asked for, or tensors left where
    they live, which may be a GPU): CUDA's kernel choices and size rules then apply to the
    ops on CUDA blocks."""
    return where.device is None or where.device.startswith("cuda")


class FakeRun:
    """One fake run: copy the objects, run ``fn`` on them, and read the records.

    ``namespace(fakes)`` returns the variables to name things by, given ``id(real) ->
    fake``; :meth:`capture` builds the Capture. :meth:`release` drops every fake object.
    """

    def __init__(
        self,
        where: Plan,
        namespace: Callable[[dict[int, Any]], dict] | None = None,
        gpu: Gpu | None = None,
    ):
        self.plan = where
        self._device_names: dict[torch.device, str] = {}
        self.mode = FakeTensorMode()
        self.copier = FakeCopier(self.mode, where.compute)
        self.recorder = FakeRecorder(self._device_of, FrameNamer(cell_namer()))
        self.recorder.foreach_optimizers = where.simulated
        self.recorder.gpu = gpu if targets_cuda(where) else None
        self.recorder.mode_fake = self.mode
        self.copier.known = self.recorder.known
        self._namespace = namespace
        self.start_rows: list = []
        self.end_rows: list = []
        self.names: SessionNames | None = None
        self._holding = False  # inside slot()
        self.compiled_as_eager: list[str] = []  # torch.compile'd code run eagerly

    def _device_of(self, device: torch.device) -> str | None:
        if device.type == "meta":
            return None
        if self.plan.device is not None and (self.plan.simulated or device == self.plan.compute):
            return self.plan.device
        name = self._device_names.get(device)
        if name is None:  # once per device, not per storage
            try:
                name = parse_device(device, need_present=False)
            except DeviceError:  # a device we do not model: keep torch's name for it
                name = str(device)
            self._device_names[device] = name
        return name

    def convert(self, obj: Any, passed: int = 1) -> Any:
        return self.copier.convert(obj, passed)

    def ns(self) -> dict:
        return self._namespace(self.copier.fakes) if self._namespace else {}

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Hold the process's one capture slot (the run's hooks are global): raises
        :class:`~jupyter_memprof.CaptureError` while a capture or another estimate runs.
        Taken before the arguments are copied, so that a busy slot is reported before that
        work, not after it."""
        with exclusive("estimate"):
            self._holding = True
            try:
                yield
            finally:
                self._holding = False

    def run(self, fn: Callable, args: tuple, kwargs: dict) -> None:
        """Call ``fn`` on the fake copies (made already with :meth:`convert`), holding the
        capture slot (:meth:`slot`, taken here unless it is held already)."""
        if self._holding:
            self._run(fn, args, kwargs)
            return
        with self.slot():
            self._run(fn, args, kwargs)

    def _run(self, fn: Callable, args: tuple, kwargs: dict) -> None:
        rec = self.recorder
        if self.plan.device is not None and self.plan.device != "cpu":
            # scalars kept on the CPU (step counters) are CPU blocks, also when simulated
            rec.pinned = {t.untyped_storage()._cdata: "cpu" for t in self.copier.cpu_scalars}
        copies = self.copier.copied()
        for obj in copies:
            _register_held(rec, obj)
        self.compiled_as_eager = compiled_names([fn, *copies])
        del copies
        self.copier.forget_copies()
        self.start_rows = SessionNames(self.ns(), deep=False).rows("start", rec.storage)
        remap = self.plan.compute if self.plan.simulated else None
        with contextlib.ExitStack() as stack:
            stack.enter_context(real_state_kept())
            stack.enter_context(as_real())
            stack.enter_context(quiet_fake_logs())
            if self.compiled_as_eager:
                stack.enter_context(eager())
            if self.plan.compute is not None and self.plan.compute.type == "cuda":
                stack.enter_context(self.plan.compute)  # factories default to the device
            stack.enter_context(distributed_hooks(rec))
            stack.enter_context(self.mode)
            stack.enter_context(RecordingMode(rec))
            stack.enter_context(PythonMode(rec, remap))
            stack.enter_context(cuda_functions(rec))
            rec.start()
            stack.callback(rec.stop)
            stack.enter_context(_closures_marked(rec))
            try:
                # what fn returns stays alive until the recording stops, as a variable holding
                # it would in a capture (kept: a list of every step's losses is still there)
                result = fn(*args, **kwargs)
            except Exception as exc:
                error = cudnn_rnn_error(exc, rec) or internal_error(exc, rec.namer)
                if error is None:
                    raise
                raise error from None
        self.names = SessionNames(self.ns(), rec.modules, rec.optimizers, deep=False)
        self.end_rows = [
            *self.names.rows("end", rec.storage),
            # what fn returned is named as its call: `evaluate()[3]`
            *held_rows(
                self.names,
                {**self.ns(), f"{getattr(fn, '__name__', 'fn')}()": result},
                rec.storage,
            ),
        ]

    def capture(self) -> Capture:
        rec = self.recorder
        names = self.names or SessionNames(self.ns(), rec.modules, rec.optimizers, deep=False)
        trace = Trace(
            rec.op_records(), rec.tensors, rec.memory, rec.untracked, len(rec.ops) + len(rec.memory)
        )
        devices = sorted({m.device for m in rec.memory} | {u.device for u in rec.untracked})
        return Capture(
            trace=trace,
            names=[*self.start_rows, *self.end_rows],
            module_paths=[names.module_path(m) for m in rec.modules],
            module_classes=[type(m).__name__ for m in rec.modules],
            devices=devices or [self.plan.device or "cpu"],
            start_ns=0,
        )

    def release(self) -> None:
        self.recorder.release()
        self.copier.release()
        self.names = None


@contextlib.contextmanager
def _closures_marked(rec: FakeRecorder) -> Iterator[None]:
    """While the run records: every closure an optimizer gets (``optimizer.step(closure)``)
    runs inside a :data:`CLOSURE_MARKER` annotation the recorder records, as a capture's
    hooks put one around it (its work is the user's step, not the optimizer's)."""
    from torch.optim import optimizer as optim_module

    def wrap(closure: Callable) -> Callable:
        def closure_marked(*args, **kwargs):
            if not rec._ours():
                return closure(*args, **kwargs)
            op = rec.open(CLOSURE_MARKER, OpKind.ANNOTATION)
            try:
                return closure(*args, **kwargs)
            finally:
                rec.close(op)

        return closure_marked

    # after the recorder's own hook, which opens the optimizer's step
    handle = optim_module.register_optimizer_step_pre_hook(
        lambda _optimizer, args, kwargs: marked_closure(args, kwargs, wrap)
    )
    try:
        yield
    finally:
        handle.remove()


def _register_held(rec: FakeRecorder, fake: Any) -> None:
    """Blocks held by a fake tensor, module or optimizer from the start."""
    if isinstance(fake, torch.Tensor):
        rec.block(fake, -1, False)
        if fake.is_leaf and fake.grad is not None:
            rec.block(fake.grad, -1, False)
    elif isinstance(fake, torch.nn.Module):
        for t in (*fake.parameters(), *fake.buffers()):
            rec.block(t, -1, False)
            if t.grad is not None:
                rec.block(t.grad, -1, False)
    elif isinstance(fake, torch.optim.Optimizer):
        for state in fake.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    rec.block(v, -1, False)
