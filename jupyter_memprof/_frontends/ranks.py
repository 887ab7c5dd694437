"""``jupyter_memprof.load_many`` in a notebook: a saved run's per-rank profiles as a
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
    """Load the profiles of several ranks (``"run/rank*"``, ``"run/rank{rank}"`` or a list of
    paths) as a :class:`ProfileSet` in rank order (see
    :func:`jupyter_memprof._results.profile_set.load_many`). With ``panel`` (the default)
    each profile also goes into this kernel's list of profiles, labelled with its rank
    (``"step (rank 1)"``, unless its label names its rank already), so the panel shows every rank; :func:`jupyter_memprof.release`
    takes them out again."""
    ranks = profile_set.load_many(paths_or_glob)
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
