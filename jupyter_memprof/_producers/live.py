"""What the live session knows: modules and optimizers that ran, and names for tensors.

The profiler sees storages and pointers; users think in ``fc1.weight`` and
``opt.state[fc1.weight].exp_avg``. During a capture, global hooks remember every
``nn.Module`` that is called and every optimizer that steps. Before and after the capture we
read parameters, buffers, gradients, optimizer state and the user's tensor variables straight
from those objects (and from the notebook namespace) into plain rows of the ``names`` table:
(name, role, device, storage pointer, storage bytes). Matching those rows to blocks is left to
the tables, so the analysis stays a pure function of tables.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from .._records import MODULE_MARKER, NameRow
from .._vocab import Role


class ModuleHooks:
    """Global forward hooks that bracket every module call with a profiler annotation.

    The annotation (``memprof.module#<index>``) puts module calls in the event tree whether or
    not Python stacks are recorded, and the index leads back to the live module object for
    its dotted path. Forward hooks run with ``always_call=True`` so a module that raises still
    closes its annotation.
    """

    def __init__(self) -> None:
        self.modules: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self._index: dict[int, int] = {}
        self._local = threading.local()
        self._handles: list[Any] = []

    def install(self) -> None:
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        self._handles = [
            nn_module.register_module_forward_pre_hook(self._pre),
            nn_module.register_module_forward_hook(self._post, always_call=True),
            optim_module.register_optimizer_step_pre_hook(self._optimizer_step),
        ]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        # close annotations left open by a module interrupted mid-forward
        stack = getattr(self._local, "stack", None)
        while stack:
            stack.pop().__exit__(None, None, None)

    def _pre(self, module, args):
        key = id(module)
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self.modules)
            self.modules.append(module)
        rf = torch.autograd.profiler.record_function(f"{MODULE_MARKER}{index}")
        rf.__enter__()
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        stack.append(rf)

    def _post(self, module, args, output):
        stack = getattr(self._local, "stack", None)
        if stack:
            stack.pop().__exit__(None, None, None)

    def _optimizer_step(self, optimizer, args, kwargs):
        if all(o is not optimizer for o in self.optimizers):
            self.optimizers.append(optimizer)


def _public(namespace: dict | None) -> list[tuple[str, Any]]:
    if not namespace:
        return []
    return [(k, v) for k, v in list(namespace.items()) if not k.startswith("_")]


def _storage(t: torch.Tensor) -> tuple[str, int, int] | None:
    try:
        s = t.untyped_storage()
        if t.device.type == "meta":
            return None
        return str(t.device), s.data_ptr(), s.nbytes()
    except (RuntimeError, NotImplementedError):  # sparse, nested, fake tensors...
        return None


class SessionNames:
    """Module paths and tensor names from the namespace and the hooked objects."""

    def __init__(self, namespace: dict | None, hooks: ModuleHooks | None):
        items = _public(namespace)
        self.var_modules = [(k, v) for k, v in items if isinstance(v, torch.nn.Module)]
        self.var_optimizers = [(k, v) for k, v in items if isinstance(v, torch.optim.Optimizer)]
        self.var_tensors = [(k, v) for k, v in items if isinstance(v, torch.Tensor)]
        called = hooks.modules if hooks else []
        self.hooked_modules = called
        opts = hooks.optimizers if hooks else []
        self.roots = self._roots(called)
        self.paths = self._paths()
        self.param_names = self._param_names()
        self.optimizers = self._optimizers(opts)

    def _roots(self, called: list[torch.nn.Module]) -> list[tuple[str, torch.nn.Module]]:
        """Root modules with a display name: notebook variables first, then modules that ran
        and are not inside any other known module (named by class)."""
        roots: list[tuple[str, torch.nn.Module]] = []
        inside: set[int] = set()
        for name, m in self.var_modules:
            if id(m) in inside:
                continue
            roots.append((name, m))
            inside.update(id(s) for s in m.modules())
        for m in called:  # call order: outer modules are called before their children
            if id(m) not in inside:
                roots.append((type(m).__name__, m))
                inside.update(id(s) for s in m.modules())
        return roots

    def _paths(self) -> dict[int, str]:
        paths: dict[int, str] = {}
        for root_name, root in self.roots:
            for sub_name, sub in root.named_modules(remove_duplicate=False):
                paths.setdefault(id(sub), sub_name or root_name)
        return paths

    def module_path(self, module: torch.nn.Module) -> str:
        return self.paths.get(id(module)) or type(module).__name__

    def _param_names(self) -> dict[int, str]:
        """id(parameter) -> ``fc1.weight`` (the path in its root module; prefixed with the
        root's name when several roots hold parameters)."""
        with_params = [(n, r) for n, r in self.roots if next(r.parameters(), None) is not None]
        prefix = len(with_params) > 1
        names: dict[int, str] = {}
        for root_name, root in with_params:
            for pname, p in root.named_parameters(remove_duplicate=False):
                names.setdefault(id(p), f"{root_name}.{pname}" if prefix else pname)
        for var, t in self.var_tensors:
            if isinstance(t, torch.nn.Parameter):
                names.setdefault(id(t), var)
        return names

    def _optimizers(self, hooked: list) -> list[tuple[str, torch.optim.Optimizer]]:
        out = list(self.var_optimizers)
        known = {id(o) for _, o in out}
        for o in hooked:
            if id(o) not in known:
                known.add(id(o))
                out.append(("optimizer" if len(hooked) == 1 else f"optimizer{len(out)}", o))
        return out

    def rows(self, when: str, storage=None) -> list[NameRow]:
        """Read every named tensor's storage now. ``storage(tensor)`` gives (device, address,
        bytes) or None; by default the real storage (a producer of fake tensors, whose
        storages have no address, passes its own)."""
        rows: list[NameRow] = []
        storage = storage or _storage

        def add(name: str, role: Role, t: Any) -> None:
            if isinstance(t, torch.Tensor):
                st = storage(t)
                if st is not None and st[1]:
                    rows.append(NameRow(name, role, st[0], st[1], st[2], when))

        seen_params: set[int] = set()
        for root_name, root in self.roots:
            many = len(self.roots) > 1
            for pname, p in root.named_parameters(remove_duplicate=True):
                if id(p) in seen_params:
                    continue
                seen_params.add(id(p))
                name = self.param_names.get(id(p), pname)
                add(name, Role.PARAMETER, p)
                if p.grad is not None:
                    add(f"{name}.grad", Role.GRADIENT, p.grad)
            for bname, b in root.named_buffers():
                add(f"{root_name}.{bname}" if many else bname, Role.BUFFER, b)
        for var, t in self.var_tensors:
            if isinstance(t, torch.nn.Parameter):
                if id(t) not in seen_params:
                    seen_params.add(id(t))
                    add(var, Role.PARAMETER, t)
                    if t.grad is not None:
                        add(f"{var}.grad", Role.GRADIENT, t.grad)
            else:
                add(var, Role.VARIABLE, t)
        for opt_name, opt in self.optimizers:
            index = 0
            for group in opt.param_groups:
                for p in group["params"]:
                    pname = self.param_names.get(id(p), f"param{index}")
                    index += 1
                    if id(p) not in seen_params:
                        seen_params.add(id(p))
                        add(pname, Role.PARAMETER, p)
                        if p.grad is not None:
                            add(f"{pname}.grad", Role.GRADIENT, p.grad)
                    for key, value in opt.state.get(p, {}).items():
                        add(f"{opt_name}.state[{pname}].{key}", Role.OPTIMIZER_STATE, value)
        return rows
