"""Every tensor, module and optimizer the session's names hold.

A profile counts every byte live when the capture starts, and names what it can. Memory the
profiled code never touches is still held by something the user wrote: a variable, a list
of cached batches, an object's attribute (``trainer.model``), a module's plain attribute
(``model.cache``), a function's closure, a forward hook's closure, IPython's output cache
(``Out[5]``). :func:`reach` walks from the namespace's public variables through containers,
object attributes and closures, breadth first, and returns each object once with the
shortest path that reaches it.

What it does not enter: modules, classes, plain values (numbers, strings), numpy arrays and
the objects of libraries that hold no tensors of the user's (pandas, IPython, Bokeh, ...),
tensors (their storages are what is looked for), modules' own parameters and buffers and
optimizers' state (named by :class:`~jupyter_memprof._producers.live.SessionNames`). An
object's attributes are read as stored (``object.__getattribute__``), so no user property
or ``__getattr__`` runs. The walk stops after :data:`MAX_OBJECTS` objects or
:data:`MAX_DEPTH` steps from a variable; :attr:`Reached.truncated` says when it did.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import types
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

#: Objects visited at most (containers count their elements), and steps from a variable.
MAX_OBJECTS = 2_000_000
MAX_DEPTH = 8

#: Values that hold nothing (checked by exact type: the walk's hot path).
_ATOMS = frozenset(
    {int, float, complex, str, bytes, bool, type(None), bytearray, range, slice, type(...)}
)
#: Containers whose contents ``gc.get_referents`` lists exactly (no hidden references).
_PLAIN = _ATOMS | {dict, list, tuple, set, frozenset}
#: Libraries whose objects hold no tensors of the user's: never entered.
_OPAQUE_MODULES = (
    "numpy",
    "pandas",
    "pyarrow",
    "IPython",
    "ipykernel",
    "ipywidgets",
    "traitlets",
    "jupyter_client",
    "zmq",
    "tornado",
    "asyncio",
    "bokeh",
    "jupyter_bokeh",
    "matplotlib",
    "jupyter_memprof",
    "logging",
    "threading",
    "_io",
    "io",
)
#: Module attributes that are no user data (read by SessionNames, or torch's bookkeeping).
_MODULE_OWN = frozenset({"training", "_parameters", "_buffers", "_modules"})
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


class Reached(NamedTuple):
    """Objects found, each once, as ``(path, object)`` in breadth-first order."""

    tensors: list[tuple[str, torch.Tensor]]
    modules: list[tuple[str, torch.nn.Module]]
    optimizers: list[tuple[str, torch.optim.Optimizer]]
    visited: int
    truncated: bool


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while the session is read. Reading makes little
    garbage, but a collection its allocations trigger traverses every object the namespace
    holds: seconds for a million, against tens of milliseconds for the walk itself."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _opaque(t: type) -> bool:
    mod = getattr(t, "__module__", None) or ""
    return mod.split(".", 1)[0] in _OPAQUE_MODULES


def _stored(obj: Any, name: str) -> Any:
    """An attribute as stored on the object, without running the class's code; None when
    there is none."""
    try:
        return object.__getattribute__(obj, name)
    except Exception:
        return None


def _index_label(i: int) -> str:
    return f"[{i}]"


def _attr_label(name: str) -> str:
    return f".{name}"


def _item_label(key: Any) -> str:
    return f"[{key!r}]" if type(key) in _ATOMS and len(repr(key)) <= 40 else "[...]"


class _Walk:
    """One breadth-first walk; :meth:`run` returns what it found."""

    def __init__(self, max_objects: int) -> None:
        self.max_objects = max_objects
        self.seen: set[int] = set()
        self.queue: collections.deque = collections.deque()
        self.tensors: list = []
        self.modules: list = []
        self.optimizers: list = []
        self.visited = 0
        self.truncated = False
        self._kinds: dict[type, int] = {}

    # kinds of object, decided once per type
    TENSOR, MODULE, OPTIMIZER, MAPPING, SEQUENCE, SET, FUNCTION, PARTIAL, METHOD, SKIP, OBJECT = (
        range(11)
    )

    def kind(self, t: type) -> int:
        k = self._kinds.get(t)
        if k is None:
            k = self._kinds[t] = self._classify(t)
        return k

    def _classify(self, t: type) -> int:
        if issubclass(t, torch.Tensor):
            return self.TENSOR
        if issubclass(t, torch.nn.Module):
            return self.MODULE
        if issubclass(t, torch.optim.Optimizer):
            return self.OPTIMIZER
        if issubclass(t, (types.ModuleType, type)) or t in _ATOMS:
            return self.SKIP
        if issubclass(t, dict):
            return self.MAPPING
        if issubclass(t, (list, tuple, collections.deque)):
            return self.SEQUENCE
        if issubclass(t, (set, frozenset)):
            return self.SET
        if issubclass(t, types.FunctionType):
            return self.FUNCTION
        if issubclass(t, functools.partial):
            return self.PARTIAL
        if issubclass(t, types.MethodType):
            return self.METHOD
        if _opaque(t) or issubclass(
            t, (types.BuiltinFunctionType, types.CodeType, types.FrameType, types.GeneratorType)
        ):
            return self.SKIP
        return self.OBJECT

    def push(self, path: str, obj: Any, depth: int) -> None:
        t = type(obj)
        if t in _ATOMS:
            return
        key = id(obj)
        if key in self.seen:
            return
        self.seen.add(key)
        self.queue.append((path, obj, depth))

    def push_items(self, path: str, values: list, depth: int, keys=None, label=None) -> None:
        """Push the values of a container (``keys[i]`` labels ``values[i]`` through
        ``label``; no keys: a set). Fast paths: a container of plain values holds nothing;
        a container of plain containers (a list of records) whose contents are all plain
        values holds nothing either, found with one C call for all of them."""
        self.visited += len(values)
        kinds = set(map(type, values))
        if kinds <= _ATOMS:
            return
        if kinds <= _PLAIN:
            inner = gc.get_referents(*values)  # keys and values of dicts, items of the rest
            self.visited += len(inner)
            if set(map(type, inner)) <= _ATOMS:
                return
        if keys is None:
            for v in values:
                if type(v) not in _ATOMS:
                    self.push(f"{path}[...]", v, depth)
            return
        for k, v in zip(keys, values):
            if type(v) not in _ATOMS:
                self.push(path + label(k), v, depth)

    def run(self, roots) -> Reached:
        """Walk from ``roots`` (the collector paused: see :func:`collector_paused`)."""
        with collector_paused():
            for name, value in roots:
                self.push(name, value, 0)
            while self.queue:
                if self.visited > self.max_objects:
                    self.truncated = True
                    break
                path, obj, depth = self.queue.popleft()
                self.visited += 1
                self.visit(path, obj, depth)
        return Reached(self.tensors, self.modules, self.optimizers, self.visited, self.truncated)

    def visit(self, path: str, obj: Any, depth: int) -> None:
        k = self.kind(type(obj))
        if k == self.TENSOR:
            self.tensors.append((path, obj))
            return
        if k == self.MODULE:
            self.modules.append((path, obj))
            if depth < MAX_DEPTH:
                self.module_extras(path, obj, depth + 1)
            return
        if k == self.OPTIMIZER:
            self.optimizers.append((path, obj))
            return
        if k == self.SKIP or depth >= MAX_DEPTH:
            return
        d = depth + 1
        if k == self.MAPPING:
            try:
                keys, values = list(obj.keys()), list(obj.values())
            except Exception:
                return
            self.push_items(path, values, d, keys, _item_label)
            if not set(map(type, keys)) <= _ATOMS:  # tensors as keys (rare, but held)
                for key in keys:
                    if type(key) not in _ATOMS and self.kind(type(key)) == self.TENSOR:
                        self.push(f"{path}.keys()[...]", key, d)
        elif k == self.SEQUENCE:
            try:
                values = list(obj)
            except Exception:
                return
            self.push_items(path, values, d, range(len(values)), _index_label)
        elif k == self.SET:
            try:
                values = list(obj)
            except Exception:
                return
            self.push_items(path, values, d)
        elif k == self.FUNCTION:
            self.closure(path, obj, d)
        elif k == self.PARTIAL:
            self.push(f"{path}.func", _stored(obj, "func"), d)
            args = list(_stored(obj, "args") or ())
            self.push_items(f"{path}.args", args, d, range(len(args)), _index_label)
            kw = _stored(obj, "keywords") or {}
            self.push_items(f"{path}.keywords", list(kw.values()), d, list(kw), _item_label)
        elif k == self.METHOD:
            self.push(f"{path}.__self__", _stored(obj, "__self__"), d)
        else:
            self.attributes(path, obj, d)

    def closure(self, path: str, fn: types.FunctionType, depth: int) -> None:
        cells = _stored(fn, "__closure__")
        code = _stored(fn, "__code__")
        if not cells or code is None:
            return
        for name, cell in zip(code.co_freevars, cells):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            self.push(f"{path}.<closure>.{name}", value, depth)

    def attributes(self, path: str, obj: Any, depth: int) -> None:
        d = _stored(obj, "__dict__")
        if isinstance(d, dict):
            names = [k for k in list(d) if isinstance(k, str)]
            self.push_items(path, [d.get(k) for k in names], depth, names, _attr_label)
        for cls in type(obj).__mro__:
            slots = cls.__dict__.get("__slots__")
            if isinstance(slots, str):
                slots = (slots,)
            for s in slots or ():
                if isinstance(s, str) and s not in ("__dict__", "__weakref__"):
                    self.push(f"{path}.{s}", _stored(obj, s), depth)

    def module_extras(self, path: str, module: torch.nn.Module, depth: int) -> None:
        """A module's plain attributes (``self.cache``) and its hooks' closures, for it and
        every submodule; parameters, buffers and submodules are named elsewhere."""
        try:
            subs = list(module.named_modules(remove_duplicate=True))
        except Exception:
            return
        for sub_name, sub in subs:
            self.seen.add(id(sub))
            where = f"{path}.{sub_name}" if sub_name else path
            d = _stored(sub, "__dict__")
            if not isinstance(d, dict):
                continue
            for attr, value in list(d.items()):
                if attr in _MODULE_OWN or type(value) in _ATOMS:
                    continue
                if attr in _HOOK_DICTS and isinstance(value, dict):
                    for hook_id, hook in list(value.items()):
                        self.push(f"{where}.<{attr.strip('_')} {hook_id}>", hook, depth)
                elif not attr.startswith("_"):
                    self.push(f"{where}.{attr}", value, depth)


def reach(namespace: dict | None, max_objects: int = MAX_OBJECTS) -> Reached:
    """Tensors, modules and optimizers reachable from the public variables of ``namespace``
    (names not starting with ``_``; IPython's ``Out`` cache included), each with the first
    path, in breadth-first order, that reaches it."""
    if not namespace:
        return Reached([], [], [], 0, False)
    roots = [(k, v) for k, v in list(namespace.items()) if isinstance(k, str) and k[:1] != "_"]
    return _Walk(max_objects).run(roots)
