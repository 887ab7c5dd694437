"""Live CPU storages no name reaches, found among tracked tensors.

On CUDA the caching allocator counts what it holds, so the part of the baseline that no name
reaches is its count less every block known. The CPU keeps no such count (torch's CPU
reporter counts only while a profiler runs). What it holds is found instead among the
objects the garbage collector tracks: every tensor Python holds is one of them, wherever it
is held (a closure's cell, a class attribute, a reference cycle not yet collected, a frame
of a traceback), and so is every tensor an autograd graph saved that once was a Python
object (torch keeps the object alive with the tensor). The graphs of those tensors are
walked too, for what they saved that never was one (a result inside a fused op).

:func:`unnamed_storages` lists, once per storage, the CPU storages that are not among those
named; the analysis puts what is not otherwise a block into one block of address 0, as on
CUDA. Not seen: storages only C++ holds that no graph of a Python tensor reaches (a
library's C++ cache), and objects ``gc.freeze()`` moved out of the collector's lists.

Cost: ``gc.get_objects()`` and a look at each object's type, in C: about 0.1 to 0.2 s of
CPU per million tracked objects (docs/reliability.md has the numbers), a few µs
per tensor found, and the graph walk, bounded by
:data:`~jupyter_memprof._producers.live.GRAPH_BUDGET` nodes.
"""

from __future__ import annotations

import gc
import itertools
import time
import warnings
from collections.abc import Callable, Container
from typing import Any, NamedTuple

import torch

from .._records import UnnamedStorage
from .dtensor import local_tensor
from .live import GRAPH_BUDGET, saved_tensors
from .reach import collector_paused

#: Whether a real run's capture looks for them (tests/conftest.py turns it off for the tests
#: whose exact sizes must not count the tensors other tests and fixtures keep alive).
ENABLED = True


class Survey(NamedTuple):
    """What :func:`unnamed_storages` found, and what it looked at."""

    storages: list[UnnamedStorage]
    objects: int  # objects the collector tracked
    tensors: int  # of those, tensors
    graph_nodes: int  # autograd nodes walked
    seconds: float


def tensor_types() -> set[type]:
    """``torch.Tensor`` and every subclass of it defined in this process (``Parameter``,
    ``FakeTensor``, a user's): the types whose objects are tensors."""
    out: set[type] = {torch.Tensor}
    todo = [torch.Tensor]
    while todo:
        for sub in type.__subclasses__(todo.pop()):
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


def tracked_tensors() -> tuple[list[torch.Tensor], int]:
    """Every tensor among the objects the garbage collector tracks, and how many objects it
    tracks. One pass in C (``map``, ``compress``) against the set of tensor types; the
    collector is paused so that the list of every object does not start a collection."""
    wanted = tensor_types()
    with collector_paused():
        objects = gc.get_objects()
        n = len(objects)
        tensors = list(itertools.compress(objects, map(wanted.__contains__, map(type, objects))))
        del objects
    return tensors, n


def cpu_storage(t: torch.Tensor) -> tuple[str, int, int] | None:
    """``("cpu", address, bytes)`` of a CPU tensor's storage; None for a tensor of another
    device or with no storage to read (sparse; a fake tensor's address is 0). The
    survey's hot path: no device object is made."""
    try:
        if not t.is_cpu:
            return None
        s = t.untyped_storage()
        return "cpu", s.data_ptr(), s.nbytes()
    except Exception:  # sparse, nested; a tensor subclass whose attributes raise
        return None


class _Found:
    """Storages found so far, each once, none of them named."""

    def __init__(self, named: Container, storage, watch) -> None:
        self.named = named
        self.storage = storage
        self.watch = watch
        self.seen: set[tuple[str, int]] = set()
        self.out: list[UnnamedStorage] = []

    def add(self, t: Any) -> bool:
        """Note ``t``'s storage when it is named by nothing and new; True when ``t``'s
        storage is not named (its graph is worth a walk)."""
        try:
            t = local_tensor(t)
        except Exception:  # a tensor subclass whose attributes raise
            return False
        st = self.storage(t) if isinstance(t, torch.Tensor) else None
        if st is None or not st[1]:
            return False
        key = (st[0], st[1])
        if key in self.named:
            return False
        if key not in self.seen:
            self.seen.add(key)
            self.out.append(UnnamedStorage(*st))
            if self.watch is not None:
                self.watch(t, st)
        return True


def _walk_graphs(roots: list[Any], found: _Found, budget: int) -> int:
    """Add what the autograd graphs behind ``roots`` (``grad_fn`` nodes) saved; returns the
    nodes walked. A graph whose backward ran has freed what it saved: its walk stops at the
    first node that says so. Visited nodes are kept, so no id is reused meanwhile."""
    visited: list[Any] = []
    seen: set[int] = set()
    for root in roots:
        nodes = [root]
        while nodes and len(visited) < budget:
            node = nodes.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            visited.append(node)
            saved = saved_tensors(node)
            if saved is None:
                break
            for _, t in saved:
                found.add(t)
            nodes.extend(nxt for nxt, _ in getattr(node, "next_functions", ()))
    return len(visited)


def unnamed_storages(
    named: Container[tuple[str, int]],
    *,
    storage: Callable[[torch.Tensor], tuple[str, int, int] | None] = cpu_storage,
    watch: Callable[[torch.Tensor, tuple[str, int, int]], object] | None = None,
    graph_budget: int = GRAPH_BUDGET,
) -> Survey:
    """The CPU storages (``storage``: which and how read) that Python's tensors hold, or
    that the autograd graphs of those tensors saved, less those ``named`` (``(device,
    address)`` keys: the session's names and what their graphs hold), each once, in the
    order found. ``watch(tensor, (device, address, bytes))`` is called for each (the
    recorder watches for frees)."""
    t0 = time.perf_counter()
    tensors, objects = tracked_tensors()
    found = _Found(named, storage, watch)
    n_tensors, roots = len(tensors), []
    with collector_paused(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a deprecated attribute read must not warn
        for t in tensors:
            if found.add(t):
                try:
                    grad_fn = t.grad_fn
                except Exception:
                    grad_fn = None
                if grad_fn is not None:
                    roots.append(grad_fn)
        del tensors
        nodes = _walk_graphs(roots, found, graph_budget) if roots else 0
    return Survey(found.out, objects, n_tensors, nodes, time.perf_counter() - t0)
