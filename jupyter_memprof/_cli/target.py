"""The function a command estimates, and how it gets its batch.

The function a command estimates, found by ``MODULE:FUNCTION`` or ``path/to/script.py:FUNCTION``,
and the one convention for giving it a batch size.

The function builds its own model, optimizer and batch and runs one step; estimate mode
makes every tensor it creates fake (nothing is allocated for real). The batch size, when
asked for (``--batch N``, and every size ``fit`` tries), is passed as the keyword argument
``batch_size`` or ``batch`` when the function has a parameter of that name, else as its
first positional argument.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

#: Parameter names that receive the batch size, in order of preference.
BATCH_NAMES = ("batch_size", "batch")


class TargetError(ValueError):
    """The target cannot be found, imported or called as asked: one line."""


def within(path: str, roots: Sequence[str]) -> bool:
    """True when ``path`` (its real path, links followed) is one of ``roots`` or inside one."""
    real = os.path.realpath(path)
    for root in roots:
        base = os.path.realpath(root)
        if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
            return True
    return False


def _split(target: str) -> tuple[str, str]:
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise TargetError(f"{target!r} is not MODULE:FUNCTION or path/to/script.py:FUNCTION")
    return where, name


def _is_script(where: str) -> bool:
    return where.endswith(".py") or os.sep in where or "/" in where


def _load_script(path: str) -> Any:
    if not os.path.isfile(path):
        raise TargetError(f"no such script: {path}")
    name = "_memprof_target_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot import {path} as Python")
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)  # the script's own imports, as `python script.py` finds them
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _import(module: str, roots: Sequence[str] | None) -> Any:
    """Import ``module``, from the current folder first (as ``python -m`` does); with
    ``roots``, only a module whose top-level package is a file in one of them, found there
    before anything is imported."""
    top = module.split(".")[0]
    if roots is not None:
        spec = importlib.machinery.PathFinder.find_spec(top, [os.path.abspath(r) for r in roots])
        loaded = sys.modules.get(top)
        origin = getattr(loaded, "__file__", None) if loaded is not None else None
        if spec is None or spec.origin is None or not within(spec.origin, roots):
            raise TargetError(f"module {module!r} is not a file inside the allowed folders")
        if loaded is not None and (origin is None or not within(origin, roots)):
            raise TargetError(f"module {module!r} is not a file inside the allowed folders")
    path = list(roots) if roots else [os.getcwd()]
    for folder in reversed(path):
        folder = os.path.abspath(folder)
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        if roots is not None and module in sys.modules:  # a server: the file as it is now
            return importlib.reload(sys.modules[module])
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name and top == err.name.split(".")[0]:
            raise TargetError(f"no module named {module!r}") from None
        raise


def resolve(target: str, roots: Sequence[str] | None = None) -> Callable:
    """The function ``target`` names. With ``roots`` (the MCP server's folders), the module
    or script must be a file inside one of them, or :class:`TargetError`."""
    where, name = _split(target)
    if _is_script(where):
        if roots is not None and not within(where, roots):
            raise TargetError(f"{where} is outside the allowed folders")
        module = _load_script(where)
    else:
        module = _import(where, roots)
        origin = getattr(module, "__file__", None)
        if roots is not None and (origin is None or not within(origin, roots)):
            raise TargetError(f"module {where!r} is not a file inside the allowed folders")
    obj: Any = module
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(f"{where} has no {name!r}") from None
    if not callable(obj):
        raise TargetError(f"{target} is a {type(obj).__name__}, not a function")
    return obj


def batch_parameter(fn: Callable) -> str | int | None:
    """Where ``fn`` takes the batch size: a parameter name of :data:`BATCH_NAMES`, else
    ``0`` (its first positional parameter), else None."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return 0
    for name in BATCH_NAMES:
        p = params.get(name)
        if p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            return name
    positional = [
        p
        for p in params.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return 0 if positional else None


def arguments(fn: Callable, batch: int | None, target: str) -> tuple[tuple, dict]:
    """``(args, kwargs)`` to call ``fn`` with: nothing, or the batch size by the convention
    of this module."""
    if batch is None:
        try:
            inspect.signature(fn).bind()
        except TypeError:
            raise TargetError(
                f"{target} needs arguments; it must build its own model and batch"
                " (give --batch N if it takes the batch size)"
            ) from None
        except ValueError:
            pass
        return (), {}
    where = batch_parameter(fn)
    if where is None:
        raise TargetError(
            f"{target} takes no batch size (a `batch_size` parameter or a first argument)"
        )
    return ((batch,), {}) if where == 0 else ((), {where: batch})


def with_batch(fn: Callable, target: str) -> Callable[[int], Any]:
    """``fn`` as ``step(batch)`` (what :func:`jupyter_memprof.fit` calls), named as ``fn``."""
    where = batch_parameter(fn)
    if where is None:
        raise TargetError(
            f"{target} takes no batch size (a `batch_size` parameter or a first argument)"
        )

    def step(batch: int) -> Any:
        return fn(batch) if where == 0 else fn(**{where: batch})

    step.__name__ = getattr(fn, "__name__", "step")
    return step
