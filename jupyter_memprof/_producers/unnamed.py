"""Live CPU storages no name reaches, found among tracked tensors.

On CUDA the caching allocator counts what it holds, so the part of the baseline that no name
reaches is its count less every block known. The CPU keeps no such count (torch's CPU
reporter counts only while a profiler runs). What it holds is found instead among the
objects the garbage collector tracks: every tensor Python holds is one of them, wherever it
is held (a closure's cell, a class attribute, a reference cycle not yet collected, a frame
of a traceback), and so is every tensor an autograd graph saved that once was a Python
object (torch keeps the object alive with the tensor). The graphs of those tensors are
walked too, for what they saved that never was one (a result inside a fused op).

:func:`unnamed_storages` lists, once per storage, the storages on the wanted devices that
are not among those named; the analysis puts what is not otherwise a block into one block
of address 0 per device, as on CUDA. Not seen: storages only C++ holds that no graph of a
Python tensor reaches (a library's C++ cache).

Cost: ``gc.get_objects()`` and one type test per distinct type, about 0.2 s per million
tracked objects on a 2-core machine (docs/reliability.md has the numbers), plus the graph
walk, bounded by :data:`~jupyter_memprof._producers.live.GRAPH_BUDGET` nodes.
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
from .live import GRAPH_BUDGET, saved_tensors, storage_of
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


def tracked_tensors() -> tuple[list[torch.Tensor], int]:
    """Every tensor among the objects the garbage collector tracks, and how many objects it
    tracks. One type test per distinct type, the rest in C (``map``, ``compress``); the
    collector is paused so that the list of every object does not start a collection."""
    with collector_paused():
        objects = gc.get_objects()
        n = len(objects)
        kinds = list(map(type, objects))
        wanted = {k for k in set(kinds) if issubclass(k, torch.Tensor)}
        tensors = list(itertools.compress(objects, map(wanted.__contains__, kinds)))
        del objects, kinds
    return tensors, n


class _Found:
    """Storages found so far, each once, none of them named."""

    def __init__(self, named: Container, devices: Container[str], storage, watch) -> None:
        self.named = named
        self.devices = devices
        self.storage = storage
        self.watch = watch
        self.seen: set[tuple[str, int]] = set()
        self.out: list[UnnamedStorage] = []

    def add(self, t: Any) -> bool:
        """Note ``t``'s storage when it is on a wanted device, named by nothing and new;
        True when ``t``'s storage is not named (its graph is worth a walk)."""
        try:
            t = local_tensor(t)
            st = self.storage(t) if isinstance(t, torch.Tensor) else None
        except Exception:  # a tensor subclass whose attributes raise
            return False
        if st is None or not st[1] or st[0] not in self.devices:
            return False
        key = (st[0], st[1])
        if key in self.named:
            return False
        if key not in self.seen:
            self.seen.add(key)
            self.out.append(UnnamedStorage(st[0], st[1], st[2]))
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
    devices: Container[str],
    *,
    storage: Callable[[torch.Tensor], tuple[str, int, int] | None] = storage_of,
    watch: Callable[[torch.Tensor, tuple[str, int, int]], object] | None = None,
    graph_budget: int = GRAPH_BUDGET,
) -> Survey:
    """The storages on ``devices`` that Python's tensors hold, or that the autograd graphs
    of those tensors saved, less those ``named`` (``(device, address)`` keys: the session's
    names and what their graphs hold), each once, in the order found. ``watch(tensor,
    (device, address, bytes))`` is called for each (the recorder watches for frees)."""
    t0 = time.perf_counter()
    tensors, objects = tracked_tensors()
    found = _Found(named, devices, storage, watch)
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
