"""A snapshot's Python stacks, each read once, and what each says.

Stacks are shared objects in a snapshot (the pickle memo hands the same frame list to many
entries): :class:`StackReader` keys them by the list's identity, so a file whose shared
references would expand to 2**60 frames is read in time proportional to its size. Equal
stacks from unshared lists (the JSON form) become one stack too.

What a stack says, read from its frames (outermost first: the first frame recognised says
what the user's call was), is a :class:`~jupyter_memprof._records.StackContext`; the
callsite is the innermost user frame (not torch's, not an installed package's, not the
standard library's).
"""

from __future__ import annotations

import os

from ..._records import NO_ID, Frame, StackContext

__all__ = ["Bad", "StackReader", "callsite", "context"]

#: Path parts of frames that are not the user's code.
_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ", "/torch/")
_C = StackContext
#: frame name -> context, for frames of torch's autograd (torch/autograd/, torch/_tensor.py)
_AUTOGRAD = {"backward", "_engine_run_backward", "grad", "run_backward"}
_MODULE_TO = {"_apply", "to", "cuda", "xpu", "half", "float", "bfloat16", "to_empty"}


class Bad(ValueError):
    """What is wrong with a snapshot, one phrase (the front end names the file)."""


def _part(filename: str, *parts: str) -> bool:
    f = filename.replace("\\", "/")
    return any(p in f for p in parts)


def _frame_context(fr: Frame) -> StackContext | None:
    """What one frame says, or None."""
    f, name = fr.filename.replace("\\", "/"), fr.name
    if "torch/optim/" in f:
        if name == "zero_grad":
            return _C.ZERO_GRAD
        return None if name == "__init__" else _C.OPTIMIZER_STEP
    if ("torch/autograd/" in f or f.endswith("torch/_tensor.py")) and name in _AUTOGRAD:
        return _C.BACKWARD
    if "torch/utils/data/" in f:
        return _C.DATA
    if f.endswith("torch/nn/modules/module.py"):
        if name in ("_call_impl", "_wrapped_call_impl"):
            return _C.FORWARD
        if name in _MODULE_TO:
            return _C.MODULE_TO
        if name == "zero_grad":
            return _C.ZERO_GRAD
        return None
    if "torch/nn/modules/" in f and name in ("__init__", "reset_parameters"):
        return _C.MODULE_INIT
    if f.endswith("torch/nn/init.py"):
        return _C.MODULE_INIT
    if name == "forward":
        return _C.FORWARD
    return None


def context(frames: tuple[Frame, ...]) -> StackContext:
    """The stack's context: the outermost frame that says one (what the user called), else
    OTHER (Python frames, none recognised) or NONE (no Python frames)."""
    python = False
    for fr in reversed(frames):
        if not fr.filename.endswith(".py") and not fr.filename.startswith("<"):
            continue  # a C++ frame (stacks='all')
        python = True
        c = _frame_context(fr)
        if c is not None:
            return c
    return _C.OTHER if python else _C.NONE


def callsite(frames: tuple[Frame, ...]) -> str | None:
    """The innermost user frame as ``file.py:12 in fn``, or None."""
    for fr in frames:
        f = fr.filename
        if not (f.endswith(".py") or f.startswith("<ipython")) or _part(f, *_LIBRARY_PARTS):
            continue
        return f"{os.path.basename(f)}:{fr.line} in {fr.name}"
    return None


class StackReader:
    """Distinct stacks in order of first sight; :meth:`index` reads a frame list once."""

    def __init__(self) -> None:
        self.frames: list[tuple[Frame, ...]] = []
        self.context: list[str] = []
        self.callsite: list[str | None] = []
        self.by_id: dict[int, int] = {}
        self._by_value: dict[tuple[Frame, ...], int] = {}
        self._alive: list = []  # the lists read, so their ids stay theirs

    def let_go(self) -> None:
        """Forget the lists read (no more :meth:`index` calls): they may be freed."""
        self.by_id.clear()
        self._alive.clear()

    def index(self, frames: object) -> int:
        """The index of the stack ``frames`` (a list of frame dicts), NO_ID for none."""
        if frames is None:
            return NO_ID
        got = self.by_id.get(id(frames))
        if got is not None:
            return got
        if not isinstance(frames, (list, tuple)):
            raise Bad(f"frames must be a list, not {type(frames).__name__}")
        stack = tuple(_frame(f) for f in frames)
        i = self._by_value.get(stack)
        if i is None:
            i = self._by_value[stack] = len(self.frames)
            self.frames.append(stack)
            self.context.append(context(stack).value)
            self.callsite.append(callsite(stack))
        self.by_id[id(frames)] = i
        self._alive.append(frames)
        return i


def _frame(f: object) -> Frame:
    if not isinstance(f, dict):
        raise Bad(f"a frame must be a dict, not {type(f).__name__}")
    filename, line, name = f.get("filename"), f.get("line"), f.get("name")
    if not isinstance(filename, str) or not isinstance(name, str):
        raise Bad("a frame's filename and name must be text")
    if type(line) is not int or not 0 <= line < 2**31:
        raise Bad(f"a frame's line must be a small non-negative int, not {line!r:.40}")
    return Frame(filename, line, name)
