"""``load_many`` in a notebook: every rank's profile in the panel.

``jupyter_memprof.load_many`` in a notebook: a saved run's per-rank profiles as a
:class:`~jupyter_memprof._results.profile_set.ProfileSet`, each also listed in the Memory
profiles panel under its rank, where any two open side by side (select both, Compare)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from .._results import profile_set
from .._results.profile_set import ProfileSet
from . import session

__all__ = ["load_many"]


def load_many(
    paths_or_glob: str | os.PathLike | Iterable[str | os.PathLike], *, panel: bool = True
) -> ProfileSet:
    """Load the profiles of several ranks as a :class:`ProfileSet`, in rank order.

    Each profile's rank is its ``meta["rank"]`` when every profile has a distinct one, else
    its position in the sorted list of paths.

    Parameters
    ----------
    paths_or_glob : str or os.PathLike or list of them
        One glob pattern (``"run/rank*"``; ``{rank}`` counts as ``*``), a list of paths
        of saved profiles (zip files or Parquet folders) or of traces torch's profiler
        wrote, or memory snapshots (:func:`jupyter_memprof.load_snapshot`), or a folder of
        such traces, one per rank (``tensorboard_trace_handler``'s).
    panel : bool, default True
        Also list each profile in this kernel's Memory profiles panel, labelled with its
        rank (``"step (rank 1)"``); :func:`jupyter_memprof.release` takes them out again.

    Returns
    -------
    ProfileSet

    Raises
    ------
    FileNotFoundError
        The pattern matches nothing, or a path does not exist.
    ValueError
        An empty list.
    ProfileFileError
        A file that does not load.

    Examples
    --------
    >>> ps = jupyter_memprof.load_many("run/rank*")  # doctest: +SKIP
    >>> ps.peaks()  # doctest: +SKIP
    """
    from .traces import load_any, trace_files

    found = trace_files(paths_or_glob)
    ranks = profile_set.load_many(found or paths_or_glob, loader=load_any)
    if panel:
        for prof, rank in zip(ranks.profiles, ranks.ranks):
            if prof.session_id is not None:
                continue
            label, tag = prof.meta.get("label"), f"rank {rank}"
            if not label:
                prof.meta["label"] = tag
            elif tag not in str(label):
                prof.meta["label"] = f"{label} ({tag})"
            session.add(prof)
    return ranks
