"""``load_snapshot()``: a torch memory snapshot as a Profile.

Open a torch memory snapshot as a :class:`~jupyter_memprof.Profile`:
:func:`load_snapshot` (and :func:`jupyter_memprof.load`, :mod:`.traces`, which tells a
snapshot from a saved profile or a trace by its content).

The snapshot producer (:mod:`jupyter_memprof._producers.snapshot`) reads the file as plain
data and makes the records; the same analysis as a capture's makes the tables
(:func:`.finish.fill`), with the allocator settings the snapshot recorded.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .._analysis.allocator.config import AllocatorConfig, parse_config
from .._analysis.pipeline import paused_gc
from .._errors import AllocatorConfigError, DeviceError, ProfileFileError
from .._producers.snapshot.blocks import Rules
from .._producers.snapshot.read import Bad, read_snapshot
from .._producers.snapshot.unpickle import read_file, shown
from .._records import Capture
from .._results.profile import Profile
from . import finish, snapshot_cache

__all__ = ["NOT_RECORDED", "load_snapshot"]

#: What a memory snapshot does not record (``meta["not_recorded"]``): the analysis invents
#: none of it.
NOT_RECORDED = ["tensor_id", "versions", "ops"]


def _device_index(device: Any) -> int | None:
    if device is None:
        return None
    if type(device) is int and device >= 0:
        return device
    from .._devices import parse_device

    try:
        d = parse_device(device, need_present=False)
    except DeviceError as e:
        raise ValueError(str(e)) from None
    if not d.startswith("cuda:"):
        raise ValueError(f"a memory snapshot records CUDA devices only, not {d!r}")
    return int(d.split(":")[1])


def load_snapshot(
    path_or_snapshot: str | os.PathLike | dict, *, device: Any = None, label: str | None = None
) -> Profile:
    """Open a torch memory snapshot as a :class:`~jupyter_memprof.Profile`.

    Reads what ``torch.cuda.memory._dump_snapshot`` writes (a pickle of protocol 2 to 5,
    through an unpickler that refuses every global, so nothing in the file runs), its JSON
    form, or the dict ``torch.cuda.memory._snapshot()`` returns, into the same tables as a
    capture: ``allocations`` (``ptr`` is the block's address), ``events``, ``timeline``,
    ``segments`` (as the allocator recorded them), ``steps``; categories come from each
    allocation's Python stack and the time order. What a snapshot cannot say (tensor ids,
    versions, an op tree) is listed in ``meta["not_recorded"]``. See docs/snapshots.md.

    Parameters
    ----------
    path_or_snapshot : str or os.PathLike or dict
        The snapshot file, or the snapshot itself.
    device : str or int, optional
        Only this CUDA device (``"cuda:1"`` or ``1``); default every device recorded
        (``device_traces[i]`` is ``cuda:i``).
    label : str, optional
        The profile's label; default the file's name.

    Returns
    -------
    Profile
        Also listed in this kernel's Memory profiles panel. A big file's profile is cached
        (a Parquet folder, ``$JUPYTER_MEMPROF_CACHE``) so the next open of it is fast.

    Raises
    ------
    ProfileFileError
        The file is damaged, truncated, crafted or not a snapshot: one line naming the
        file and what is wrong.
    ValueError
        A ``device`` that is not a CUDA device.
    FileNotFoundError
        ``path_or_snapshot`` does not exist.

    Examples
    --------
    >>> prof = jupyter_memprof.load_snapshot("snapshot.pickle")  # doctest: +SKIP
    >>> prof.peak_by("category")  # doctest: +SKIP
    """
    return open_snapshot(path_or_snapshot, device=device, label=label, remember=True)


def open_snapshot(
    path_or_snapshot: str | os.PathLike | dict,
    *,
    device: Any = None,
    label: str | None = None,
    remember: bool = True,
) -> Profile:
    """:func:`load_snapshot`; the profile goes into the session's list only with
    ``remember``."""
    index = _device_index(device)
    bar = _progress()
    try:
        if isinstance(path_or_snapshot, dict):
            name, held = "snapshot", [path_or_snapshot]
        else:
            path = os.fsdecode(os.fspath(path_or_snapshot))
            cached = snapshot_cache.lookup(path, index)
            if cached is not None:
                cached.meta["label"] = label or shown(path)
                return finish.register(cached, remember=remember)
            bar("reading the file", 0, _STEPS)
            with paused_gc():  # a million dicts made: collections would triple the time
                name, held = shown(path), [read_file(path)]
        own = not isinstance(path_or_snapshot, dict)  # read here: the reader's to empty
        prof, read, conf_note = _analysed(held, name, index, bar, own)
    finally:
        bar.close()
    prof.meta.update(read.meta)
    prof.meta.update(
        producer="snapshot",
        not_recorded=list(NOT_RECORDED),
        devices=list(read.capture.devices),
        label=label or name,
        **({"snapshot_alloc_conf_error": conf_note} if conf_note else {}),
    )
    if not isinstance(path_or_snapshot, dict):
        snapshot_cache.store(prof, path, index)
    return finish.register(prof, remember=remember)


#: the progress bar's steps: the file, its records, then the analysis's stages
_STEPS = 8


def _progress():
    """A progress bar in a Jupyter kernel (shown when opening takes over a second), else a
    callable that does nothing."""
    from .progress import Progress, in_kernel

    ipython = sys.modules.get("IPython")  # a kernel has imported it: no import here
    shell = ipython.get_ipython() if ipython is not None else None
    if in_kernel(shell):
        return Progress()
    return _NoProgress()


class _NoProgress:
    def __call__(self, stage: str, done: int, total: int) -> None:
        pass

    def close(self) -> None:
        pass


def _analysed(held: list, name: str, index: int | None, bar, own: bool = False):
    """The profile of the snapshot ``held[0]`` (its tables and the analysis's meta), the
    producer's read, and why the recorded allocator settings could not be followed (or
    None). The snapshot is let go once its records are read (``held`` is emptied): read
    from a file, its memory is free again before the analysis runs."""
    allocator, conf_note = _allocator(_alloc_conf(held[0]))
    reads: list = []

    def produce(reading) -> Capture:
        bar("reading its records", 1, _STEPS)
        rules = _rules(allocator)  # held's one reference is handed over: it is let go there
        reads.append(read_snapshot(held.pop(), device=index, rules=rules, consume=own))
        return reads[0].capture

    def analysing(stage: str, done: int, total: int) -> None:
        bar(stage, 2 + done * (_STEPS - 2) // max(total, 1), _STEPS)

    prof = Profile.empty()
    try:  # read with the collector paused, as every producer's records are
        finish.fill(prof, produce, finish.FinishOptions(allocator=allocator, analysing=analysing))
    except Bad as e:
        raise ProfileFileError(f"{name}: {e}") from None
    except RecursionError:
        raise ProfileFileError(f"{name}: nested too deeply") from None
    return prof, reads[0], conf_note


def _alloc_conf(snap: object) -> str | None:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` the snapshot recorded, if any."""
    settings = snap.get("allocator_settings") if isinstance(snap, dict) else None
    conf = settings.get("PYTORCH_CUDA_ALLOC_CONF") if isinstance(settings, dict) else None
    return conf if isinstance(conf, str) else None


def _rules(config: AllocatorConfig | None) -> Rules:
    """What the producer needs of the settings to size blocks as the allocator did."""
    if config is None:
        return Rules()
    rounded = any(d > 1 for d in config.roundup_power2_divisions)
    return Rules(
        rounding=config.round_size if rounded else Rules().rounding,
        max_split_size=config.max_split_size,
        expandable=config.expandable_segments,
    )


def _allocator(conf: str | None) -> tuple[AllocatorConfig | None, str | None]:
    """The recorded allocator settings as the model reads them (torch's defaults when none
    were recorded), and why they could not be read, if so."""
    if not conf:
        return None, None
    try:
        return parse_config(conf), None
    except AllocatorConfigError as e:
        return None, str(e)
