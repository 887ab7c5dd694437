"""The globals an estimated function reads, bound to fake copies.

``estimate(train_step)`` where ``train_step`` reads ``model`` and ``opt`` as notebook (or
module) globals is handled as ``%%memprofile --estimate`` handles a cell: the global names
the function uses, and those the functions of the same namespace it calls use (three levels
deep, :func:`.estimate.names_read`), that hold tensors, modules, optimizers or objects
reaching them (a scheduler) are copied with the arguments (one copy per real object, so a
model passed and read as a global is one fake model) and bound to the copies in the
function's own namespace while it runs. Afterwards every name is bound exactly as before:
names the function assigned with ``global`` (a step counter) are put back too.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

from .._producers.fake.copy import holds_torch


def function_of(fn: Callable) -> types.FunctionType | None:
    """The Python function behind ``fn`` (through ``functools.partial``, bound methods,
    ``functools.wraps`` and torch.compile's wrapper), or None."""
    for _ in range(8):
        if isinstance(fn, types.FunctionType):
            inner = getattr(fn, "__wrapped__", None) or getattr(
                fn, "_torchdynamo_orig_callable", None
            )
            if not isinstance(inner, types.FunctionType):
                return fn
            fn = inner
        elif isinstance(fn, functools.partial):
            fn = fn.func
        elif isinstance(fn, types.MethodType):
            fn = fn.__func__
        else:
            return None
    return None


def globals_read(fn: Callable) -> tuple[dict | None, dict[str, Any]]:
    """The namespace ``fn`` reads its globals from, and the real torch objects among the
    globals it (and the functions of that namespace it calls) uses, by name."""
    func = function_of(fn)
    if func is None or (func.__module__ or "").startswith("jupyter_memprof."):
        return None, {}
    ns = func.__globals__
    names = names_read([func.__code__], ns)
    return ns, {k: ns[k] for k in names if not k.startswith("__") and holds_torch(ns[k])}


@contextlib.contextmanager
def bound(ns: dict | None, fakes: dict[str, Any]) -> Iterator[None]:
    """``ns`` with ``fakes`` bound while the block lasts; every name as before afterwards."""
    if ns is None or not fakes:
        yield
        return
    before = dict(ns)
    ns.update(fakes)
    try:
        yield
    finally:
        restore_names(ns, before)
        before.clear()


def names_read(codes: list, namespace: dict, depth: int = 3) -> list[str]:
    """Global names the code objects use, and the names the notebook's own functions they
    call use in turn (``depth`` levels): the variables an estimated cell needs as fakes."""
    seen: set[str] = set()
    order: list[str] = []
    done: set[int] = set()
    todo = [(c, 0) for c in codes]
    while todo:
        code, level = todo.pop()
        if id(code) in done:
            continue
        done.add(id(code))
        for name in code.co_names:
            if name in seen or name not in namespace:
                continue
            seen.add(name)
            order.append(name)
            fn = namespace[name]
            if level < depth and isinstance(fn, types.FunctionType):
                if fn.__globals__ is namespace:
                    todo.append((fn.__code__, level + 1))
        todo.extend((c, level) for c in code.co_consts if isinstance(c, types.CodeType))
    return order


def restore_names(ns: dict, before: dict) -> None:
    """Bind every name as in ``before``: the cell's own bindings go (IPython's ``_``-prefixed
    bookkeeping stays, unless it holds a fake object)."""
    for key in list(ns):
        old = before.get(key, _MISSING)
        value = ns[key]
        if value is old:
            continue
        if key.startswith("_") and not holds_torch(value):
            continue  # In/Out history, _i3 and friends
        if old is _MISSING:
            del ns[key]
        else:
            ns[key] = old
    for key, old in before.items():
        if key not in ns:
            ns[key] = old


_MISSING = object()
