"""Callsites: the innermost user frame, as ``file:line in function``.

A user frame is one whose file is not in the standard library, site-packages, torch or
this package; notebook cells are user frames, named by the capture (``In[3]``).
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from collections.abc import Callable

import torch


@functools.cache
def _library_prefixes() -> tuple[str, ...]:
    paths = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.add(os.path.dirname(torch.__file__))
    # this whole package (its front ends run the user's code), wherever it is installed
    paths.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    return tuple(sorted(p.rstrip(os.sep) + os.sep for p in paths if p))


_USER_FILES: dict[str, bool] = {}


class FrameNamer:
    """Formats the innermost user frame as ``file.py:123 in fn``.

    A frame is a user frame when its file is not in the standard library, site-packages,
    torch or this package (notebook cells are user frames). ``cell_names`` maps IPython's
    cell file names to labels like ``In[3]``.
    """

    def __init__(self, cell_names: Callable[[str], str | None] | None = None):
        self._prefixes = _library_prefixes()
        self._cell_names = cell_names
        self._is_user = _USER_FILES  # a file's kind does not change between captures
        self._labels: dict[tuple[str, int, str], str] = {}

    def is_user(self, filename: str) -> bool:
        hit = self._is_user.get(filename)
        if hit is None:
            hit = self._is_user[filename] = self._classify(filename)
        return hit

    def _classify(self, filename: str) -> bool:
        if not filename or filename.startswith(("<frozen", "<string>")):
            return False
        if filename.startswith("<"):  # <stdin>, <ipython-input-...>
            return True
        if not os.path.isabs(filename):
            # torch records library frames relative to their sys.path entry
            # ("torch/nn/modules/linear.py", "enum.py"): find the file to judge it.
            for base in sys.path:
                full = os.path.join(base or os.getcwd(), filename)
                if os.path.exists(full):
                    filename = os.path.abspath(full)
                    break
            else:
                return False
        return not filename.startswith(self._prefixes)

    def label(self, filename: str, line: int, function: str) -> str:
        key = (filename, line, function)
        hit = self._labels.get(key)
        if hit is None:
            cell = self._cell_names(filename) if self._cell_names else None
            where = cell or os.path.basename(filename)
            hit = self._labels[key] = f"{where}:{line} in {function}"
        return hit
