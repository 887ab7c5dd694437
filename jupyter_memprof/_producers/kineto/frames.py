"""What a ``python_function`` event's name says: callsite or module.

What a ``python_function`` event's name says (``torch/nn/modules/linear.py(124): forward``,
``train.py(12): step``, ``nn.Module: Linear_0``): is it the user's code (a callsite), a module
call, or the backward pass itself; and whether the reader needs to keep it at all.

A frame of library code (torch's own, the standard library's, site-packages, built-ins) that
is not the backward pass changes nothing: ops inside it take the callsite and phase of the
frames around it. The reader drops such frames as it reads (most of a ``with_stack`` trace).
"""

from __future__ import annotations

import re

__all__ = ["MODULE_PREFIX", "frame_facts", "kept"]

MODULE_PREFIX = "nn.Module: "
_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<fn>.+)$")
#: python_function files that are not the user's code
_LIBRARY = ("torch/", "<built-in", "threading.py", "contextlib.py", "site-packages/", "/lib/python")
#: Python frames whose ops are the backward pass itself (the seed gradient)
_BACKWARD_ENTRY = (("torch/_tensor.py", "backward"), ("torch/autograd/__init__.py", "backward"))


def frame_facts(name: str) -> tuple[str | None, bool]:
    """The callsite ``file:line in fn`` when the frame is user code (else None), and
    whether it is the backward pass itself."""
    m = _FRAME.match(name)
    if not m:
        return None, False
    file, fn = m["file"], m["fn"]
    user = not any(lib in file for lib in _LIBRARY)
    autograd = any(file.endswith(f) and fn == n for f, n in _BACKWARD_ENTRY)
    return (f"{file}:{m['line']} in {fn}" if user else None), autograd


def kept(name: str) -> bool:
    """Whether a python_function event named ``name`` matters: a module call, user code,
    or the backward pass."""
    if name.startswith(MODULE_PREFIX):
        return True
    callsite, autograd = frame_facts(name)
    return callsite is not None or autograd
