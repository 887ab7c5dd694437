"""What the live session knows: modules, optimizers, tensor names.

The profiler sees storages and pointers; users think in ``model.fc1.weight`` and
``opt.state[model.fc1.weight].exp_avg``. During a capture, torch's Python tracer (with Python
stacks) or global hooks (without) see every ``nn.Module`` that is called, and a global hook
every optimizer that steps. Before and after the capture we
read parameters, buffers, gradients, optimizer state and the user's tensor variables straight
from those objects (and from the notebook namespace) into plain rows of the ``names`` table:
(name, role, device, storage pointer, storage bytes). Matching those rows to blocks is left to
the tables, so the analysis stays a pure function of tables.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._devices import block_bytes
from .._records import CLOSURE_MARKER, MODULE_MARKER, STEP_MARKER, NameRow
from .._vocab import Role
from .dtensor import local_tensor
from .reach import collector_paused, reach
from .torch_profiler import annotation

# -- step marks -------------------------------------------------------------------------------
#: producers that record step marks themselves (estimate mode's recorder, while it runs)
STEP_LISTENERS: list[Callable[[], object]] = []


def mark_step() -> None:
    """Mark the end of a step: an annotation named :data:`STEP_MARKER` in torch's trace (a
    no-op when no profiler runs), and a mark in every listening producer."""
    with annotation(STEP_MARKER):
        pass
    for listener in list(STEP_LISTENERS):
        listener()


class ModuleHooks:
    """Global hooks: one on optimizer steps (which optimizers ran), and, with ``modules``,
    forward hooks that bracket every module call with a profiler annotation.

    The annotation (``memprof.module#<index>``) puts module calls in the event tree when
    Python stacks are not recorded, and the index leads back to the live module object for
    its dotted path. Forward hooks run with ``always_call=True`` so a module that raises still
    closes its annotation. With Python stacks the capture goes without them: torch's Python
    tracer records module calls itself, and any global forward hook sends every module call
    through ``nn.Module``'s slow path, about 20 more events each (see ``read_trace``).

    The hooks run inside the capture, and with Python stacks recorded every call they make
    (even ``len`` or ``list.append``) is an event torch must store, stop and hand back. So
    they make as few calls as they can, and the annotation is torch's C++ one.
    """

    def __init__(self, modules: bool = True) -> None:
        self._hook_modules = modules
        self.modules: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self._index: dict[int, str] = {}  # id(module) -> its annotation's name
        self._local = threading.local()
        self._handles: list[Any] = []

    def install(self) -> None:
        """Register the global hooks; if one cannot be registered, those already registered
        are removed again before the error propagates."""
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        try:
            hooks = [(optim_module.register_optimizer_step_pre_hook, self._optimizer_step, {})]
            if self._hook_modules:
                hooks[:0] = [
                    (nn_module.register_module_forward_pre_hook, self._pre, {}),
                    (nn_module.register_module_forward_hook, self._post, {"always_call": True}),
                ]
            for register, hook, kwargs in hooks:
                self._handles.append(register(hook, **kwargs))
        except BaseException:
            with contextlib.suppress(Exception):  # the install's error is the one to report
                self.remove()
            raise

    def remove(self) -> None:
        """Remove every hook and close the annotations left open. Each removal runs even
        when another raises; the first error is raised once all have been tried."""
        handles, self._handles = self._handles, []
        first: BaseException | None = None
        for h in handles:
            try:
                h.remove()
            except BaseException as err:
                if first is None:
                    first = err
        # close annotations left open by a module interrupted mid-forward
        stack = getattr(self._local, "stack", None)
        while stack:
            try:
                stack.pop().__exit__(None, None, None)
            except BaseException as err:
                if first is None:
                    first = err
        if first is not None:
            raise first

    def _pre(self, module, args):
        key = id(module)  # not the module: a subclass may define __eq__ and be unhashable
        try:
            name = self._index[key]
        except KeyError:
            name = self._index[key] = f"{MODULE_MARKER}{len(self.modules)}"
            self.modules.append(module)
        rf = annotation(name)
        rf.__enter__()
        try:
            self._local.stack.append(rf)
        except AttributeError:
            self._local.stack = [rf]

    def _post(self, module, args, output):
        try:
            rf = self._local.stack.pop()
        except (AttributeError, IndexError):
            return
        rf.__exit__(None, None, None)

    def _optimizer_step(self, optimizer, args, kwargs):
        if all(o is not optimizer for o in self.optimizers):
            self.optimizers.append(optimizer)
        return marked_closure(args, kwargs)


def _in_closure_annotation(closure: Callable) -> Callable:
    def closure_marked(*args, **kwargs):
        with annotation(CLOSURE_MARKER):
            return closure(*args, **kwargs)

    return closure_marked


def marked_closure(
    args: tuple, kwargs: dict, wrap: Callable[[Callable], Callable] = _in_closure_annotation
) -> tuple[tuple, dict] | None:
    """An optimizer step pre-hook's answer: the same arguments, with the closure (LBFGS's
    ``step(closure)``, Lightning's automatic optimisation) run inside a
    :data:`CLOSURE_MARKER` annotation (``wrap``: how; estimate mode records it itself), so
    that its work is the user's step and not the optimizer's; None (nothing changed)
    without a closure."""
    if len(args) > 1 and callable(args[1]):
        return (args[0], wrap(args[1]), *args[2:]), kwargs
    if callable(kwargs.get("closure")):
        return args, {**kwargs, "closure": wrap(kwargs["closure"])}
    return None


def modules_by_id(calls, namespace: dict | None) -> list[torch.nn.Module | None]:
    """The live module objects behind ``Trace.module_calls`` (``(id, class name)`` pairs),
    None for a module that is gone.

    Modules reachable from the namespace are found by walking it: variables holding a module,
    and modules held in an attribute of a variable's object (``trainer.model``). Any other
    module that ran is looked up among the objects the garbage collector tracks (about
    0.1 s per 300k objects, paid only when such a module ran). An id matches only a module
    of the recorded class, so an address reused by a new object after the module was freed
    is not mistaken for it.
    """
    wanted = {key: cls for key, cls in calls}
    found: dict[int, torch.nn.Module] = {}

    def walk(v: Any) -> None:
        for m in v.modules():
            if id(m) in wanted:
                found[id(m)] = m

    for _, v in _public(namespace):
        if _is(v, torch.nn.Module):
            walk(v)
    if len(found) < len(wanted):
        for _, v in _public(namespace):
            if _is(v, (torch.nn.Module, type)):
                continue
            try:  # a user object's attribute lookup may run its code and raise
                attrs = getattr(v, "__dict__", None)
            except Exception:
                continue
            if _is(attrs, dict):
                for a in list(attrs.values()):
                    if _is(a, torch.nn.Module) and id(a) not in found:
                        walk(a)
    if len(found) < len(wanted):
        for obj in gc.get_objects():
            key = id(obj)
            if key in wanted and key not in found and _is(obj, torch.nn.Module):
                found[key] = obj
    return [
        m if m is not None and type(m).__name__ == cls else None
        for m, cls in ((found.get(key), cls) for key, cls in calls)
    ]


def _is(obj: Any, cls) -> bool:
    """``isinstance`` by the object's real type: a notebook object that fakes ``__class__``
    (or raises on it) is judged without running its code."""
    return issubclass(type(obj), cls)


def _public(namespace: dict | None) -> list[tuple[str, Any]]:
    if not namespace:
        return []
    return [(k, v) for k, v in list(namespace.items()) if not k.startswith("_")]


def storage_of(t: torch.Tensor) -> tuple[str, int, int] | None:
    """``(device, address, bytes)`` of a tensor's storage (its allocator block's bytes);
    None for a tensor with none to read (meta, sparse, nested, fake)."""
    try:
        s = t.untyped_storage()
        if t.device.type == "meta":
            return None
        device = str(t.device)
        return device, s.data_ptr(), block_bytes(device, s.nbytes())
    except (RuntimeError, NotImplementedError):  # sparse, nested, fake tensors...
        return None


def _bare_parameter(t: torch.Tensor) -> bool:
    """A tensor trained like a parameter: an ``nn.Parameter``, or a leaf that requires grad
    and has received a gradient (``w = torch.randn(..., requires_grad=True)``, after a
    backward)."""
    if isinstance(t, torch.nn.Parameter):
        return True
    try:
        return bool(t.is_leaf and t.requires_grad and t.grad is not None)
    except Exception:  # a tensor subclass whose attributes raise
        return False


class SessionNames:
    """Module paths and tensor names from the namespace and the hooked objects.

    Naming rules (the same in every table):

    - a *root* is a module held by a notebook variable and not inside another such module,
      named by the variable (``model``); a module that ran but sits in no variable is a root
      named by its class (``Sequential``, then ``Sequential_2``, ... so two roots never share
      a name);
    - every module path starts with its root's name: ``model.encoder.layers.0.linear1``;
    - a parameter or buffer is named by the path of the module that holds it plus its own
      name (``model.0.weight``); its gradient adds ``.grad``; optimizer state is
      ``opt.state[model.0.weight].exp_avg``;
    - an ``nn.Parameter`` held directly by a variable (no module) is named by the variable.

    Each name row also carries the *owner*: the path of the module that holds the parameter
    or buffer (for gradients and optimizer state, the module of their parameter). A
    parameter held by a variable and by no module is its own owner (``w1``), so a model
    written with bare parameters still gets its bytes attributed.
    """

    def __init__(
        self,
        namespace: dict | None,
        modules: Sequence[torch.nn.Module] = (),
        optimizers: Sequence[torch.optim.Optimizer] = (),
        *,
        deep: bool = True,
    ):
        """``modules`` and ``optimizers``: those that ran in the capture (call order).
        ``deep``: also name what the variables hold (containers, attributes, closures: see
        :func:`~jupyter_memprof._producers.reach.reach`), not only the variables."""
        self.deep = deep
        if deep:
            found = reach(namespace)
            self.var_modules = found.modules
            self.var_optimizers = found.optimizers
            self.var_tensors = found.tensors
            self.truncated = found.truncated
        else:
            items = _public(namespace)
            self.var_modules = [(k, v) for k, v in items if _is(v, torch.nn.Module)]
            self.var_optimizers = [(k, v) for k, v in items if _is(v, torch.optim.Optimizer)]
            self.var_tensors = [(k, v) for k, v in items if _is(v, torch.Tensor)]
            self.truncated = False
        self.roots = self._roots(modules)
        self.paths = self._paths()
        self.param_names, self.owners = self._param_names()
        self.optimizers = self._optimizers(optimizers)

    def _roots(self, called: Sequence[torch.nn.Module]) -> list[tuple[str, torch.nn.Module]]:
        """Root modules with a display name: notebook variables holding a module that no
        other variable's module contains, then modules that ran and are inside no known
        module (named by class, numbered from the second on)."""
        contents = {id(m): {id(s) for s in m.modules()} for _, m in self.var_modules}
        roots: list[tuple[str, torch.nn.Module]] = []
        taken: set[int] = set()
        for name, m in self.var_modules:
            if id(m) in taken:  # the same module under a second name
                continue
            if any(id(m) in inner and id(m) != oid for oid, inner in contents.items()):
                continue  # a part of another variable's module
            roots.append((name, m))
            taken.add(id(m))
        inside: set[int] = set()
        for _, m in roots:
            inside |= contents[id(m)]
        used = {name for name, _ in roots}
        for m in called:  # call order: outer modules are called before their children
            if id(m) in inside:
                continue
            base = name = type(m).__name__
            k = 1
            while name in used:
                k += 1
                name = f"{base}_{k}"
            used.add(name)
            roots.append((name, m))
            inside.update(id(s) for s in m.modules())
        return roots

    def _paths(self) -> dict[int, str]:
        paths: dict[int, str] = {}
        for root_name, root in self.roots:
            for sub_name, sub in root.named_modules(remove_duplicate=False):
                paths.setdefault(id(sub), f"{root_name}.{sub_name}" if sub_name else root_name)
        return paths

    def module_path(self, module: torch.nn.Module) -> str:
        return self.paths.get(id(module)) or type(module).__name__

    def _param_names(self) -> tuple[dict[int, str], dict[int, str]]:
        """id(parameter) -> ``model.fc1.weight``, and id(parameter or buffer) -> the path of
        the module holding it (the first path when a tensor is shared)."""
        names: dict[int, str] = {}
        owners: dict[int, str] = {}
        for _, root in self.roots:
            for sub in root.modules():
                path = self.paths[id(sub)]
                for pname, p in sub.named_parameters(recurse=False):
                    names.setdefault(id(p), f"{path}.{pname}")
                    owners.setdefault(id(p), path)
                for b in sub.buffers(recurse=False):
                    owners.setdefault(id(b), path)
        for var, t in self.var_tensors:
            if _bare_parameter(t):
                names.setdefault(id(t), var)
                owners.setdefault(id(t), var)  # a parameter of no module stands for itself
        return names, owners

    def _optimizers(self, hooked: Sequence) -> list[tuple[str, torch.optim.Optimizer]]:
        out = list(self.var_optimizers)
        known = {id(o) for _, o in out}
        for o in hooked:
            if id(o) not in known:
                known.add(id(o))
                out.append(("optimizer" if len(hooked) == 1 else f"optimizer{len(out)}", o))
        return out

    def rows(self, when: str, storage=None, watch=None) -> list[NameRow]:
        """Read every named tensor's storage now. ``storage(tensor)`` gives (device, address,
        bytes) or None; by default the real storage (a producer of fake tensors, whose
        storages have no address, passes its own). ``watch(tensor, (device, address,
        bytes))`` is called for each named tensor (the recorder watches for frees)."""
        with collector_paused():
            return self._rows(when, storage or storage_of, watch)

    def _rows(self, when: str, storage, watch) -> list[NameRow]:
        rows: list[NameRow] = []

        def add(name: str, role: Role, t: Any, owner: str | None) -> None:
            t = local_tensor(t)  # a DTensor's bytes are its local shard's
            if isinstance(t, torch.Tensor):
                st = storage(t)
                if st is not None and st[1]:
                    rows.append(NameRow(name, role, st[0], st[1], st[2], when, owner))
                    if watch is not None:
                        watch(t, st)

        seen_params: set[int] = set()

        def add_param(name: str, p: torch.Tensor) -> None:
            seen_params.add(id(p))
            owner = self.owners.get(id(p))
            add(name, Role.PARAMETER, p, owner)
            if p.grad is not None:
                add(f"{name}.grad", Role.GRADIENT, p.grad, owner)

        seen_buffers: set[int] = set()
        for _, root in self.roots:
            for sub in root.modules():
                path = self.paths[id(sub)]
                for pname, p in sub.named_parameters(recurse=False):
                    if id(p) not in seen_params:
                        add_param(self.param_names.get(id(p), f"{path}.{pname}"), p)
                for bname, b in sub.named_buffers(recurse=False):
                    if id(b) not in seen_buffers:
                        seen_buffers.add(id(b))
                        add(f"{path}.{bname}", Role.BUFFER, b, self.owners.get(id(b)))
        for var, t in self.var_tensors:
            if _bare_parameter(t):
                if id(t) not in seen_params:
                    add_param(var, t)
            elif id(t) not in seen_params:
                add(var, Role.VARIABLE, t, None)
        for opt_name, opt in self.optimizers:
            index = 0
            for group in opt.param_groups:
                for p in group["params"]:
                    pname = self.param_names.get(id(p), f"{opt_name}.param{index}")
                    index += 1
                    if id(p) not in seen_params:
                        add_param(pname, p)
                    owner = self.owners.get(id(p))
                    for key, value in opt.state.get(p, {}).items():
                        name = f"{opt_name}.state[{pname}].{key}"
                        if isinstance(value, (list, tuple)):  # LBFGS's history
                            for i, v in enumerate(value):
                                add(f"{name}[{i}]", Role.OPTIMIZER_STATE, v, owner)
                        else:
                            add(name, Role.OPTIMIZER_STATE, value, owner)
        return rows


# -- what keeps tensors alive at the end ------------------------------------------------------
#: how many autograd nodes :func:`held_rows` looks at, at most (about 25 µs each)
GRAPH_BUDGET = 20_000

_SAVED_ATTRS: dict[type, tuple[str, ...]] = {}


def _saved_attrs(node: Any) -> tuple[str, ...]:
    """The ``_saved_*`` attributes of an autograd node's class (``dir`` once per class)."""
    kind = type(node)
    hit = _SAVED_ATTRS.get(kind)
    if hit is None:
        hit = _SAVED_ATTRS[kind] = tuple(a for a in dir(node) if a.startswith("_saved_"))
    return hit


def saved_tensors(node: Any) -> list[tuple[str, torch.Tensor]] | None:
    """The tensors an autograd node saved for backward (``_saved_self``, ...); None when
    backward has freed them already (then it has freed the whole graph's)."""
    out = []
    for attr in _saved_attrs(node):
        try:
            value = getattr(node, attr)
        except RuntimeError:  # freed by backward
            return None
        except AttributeError:
            continue
        if isinstance(value, torch.Tensor):
            out.append((attr, value))
        elif isinstance(value, (list, tuple)):
            out += [(f"{attr}[{i}]", v) for i, v in enumerate(value) if isinstance(v, torch.Tensor)]
    return out


class _Graphs:
    """The tensors autograd graphs keep, each graph walked from the tensor holding it."""

    def __init__(self, storage, when: str = "end") -> None:
        self.storage = storage
        self.when = when
        self.budget = GRAPH_BUDGET
        self.seen: set[int] = set()
        self.rows: list[NameRow] = []

    def add(self, path: str, t: torch.Tensor) -> None:
        st = self.storage(local_tensor(t))
        if st is not None and st[1]:
            self.rows.append(NameRow(path, Role.HELD, st[0], st[1], st[2], self.when, None))

    def walk(self, path: str, root: Any) -> None:
        """Tensors saved by the graph behind ``root``, named ``path.attr`` or
        ``path…Node.attr``. A graph whose backward ran has freed them all: the walk stops at
        the first node that says so (the common case after a training step)."""
        nodes = [root]
        while nodes and self.budget > 0:
            node = nodes.pop()
            if node is None or id(node) in self.seen:
                continue
            self.seen.add(id(node))
            self.budget -= 1
            saved = saved_tensors(node)
            if saved is None:
                return
            for attr, t in saved:
                self.add(f"{path}.{attr}" if node is root else f"{path}…{node.name()}.{attr}", t)
            nodes.extend(nxt for nxt, _ in getattr(node, "next_functions", ()))


def _aliases(namespace: dict | None, found: list) -> list[tuple[str, torch.Tensor]]:
    """Tensors in the variables' own lists and dicts that the walk found under another path:
    the walk names each object once, and the last step's ``loss`` is also ``losses[-1]``."""
    first = {id(t): path for path, t in found}
    out = []
    for name, value in _public(namespace):
        if _is(value, dict):
            items = [(f"[{k!r}]", v) for k, v in list(value.items())]
        elif _is(value, (list, tuple)):
            items = [(f"[{i}]", v) for i, v in enumerate(list(value))]
        else:
            continue
        for label, v in items:
            path = name + label
            if _is(v, torch.Tensor) and first.get(id(v), path) != path:
                out.append((path, v))
    return out


def held_rows(
    names: SessionNames, namespace: dict | None, storage=None, when: str = "end"
) -> list[NameRow]:
    """Tensors reached at the end of the capture through what the variables hold, as
    ``names`` rows of role ``held`` named by their path: the tensors the autograd graph of a
    reached tensor saved (``losses[3].grad_fn._saved_self``, ``total.grad_fn…AddmmBackward0
    ._saved_mat1``), and, when ``names`` did not walk the namespace itself (``deep=False``),
    the tensors inside containers, attributes, closures and hooks
    (:func:`~jupyter_memprof._producers.reach.reach`: ``losses[3]``, ``net.cache['a']``).
    ``when="start"``: the same at the capture's start, so memory that only autograd graphs
    of live tensors hold counts in what was live before (the baseline), named by path."""
    with warnings.catch_warnings():  # reading a deprecated attribute must not warn the user
        warnings.simplefilter("ignore")
        graphs = _Graphs(storage or storage_of, when)
        tensors = list(names.var_tensors if names.deep else reach(namespace).tensors)
        if not names.deep:
            for path, t in tensors:
                if not path.isidentifier():  # a variable's own tensor has its own row
                    graphs.add(path, t)
        for path, t in _aliases(namespace, tensors):
            graphs.add(path, t)
            tensors.append((path, t))
        # held first: a graph the last step's `loss` and `losses[-1]` share is the list's
        for path, t in sorted(tensors, key=lambda item: item[0].isidentifier()):
            grad_fn = getattr(t, "grad_fn", None)
            if grad_fn is not None:
                graphs.walk(f"{path}.grad_fn", grad_fn)
        return graphs.rows
