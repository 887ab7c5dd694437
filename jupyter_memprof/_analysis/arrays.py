"""Array helpers and codes the analysis passes share.

They cover runs of equal keys, sorted lookups,
the op tree level by level, and the codes of the op kind and phase vocabularies.

Public within the package (the table builders, the category and module rules use them);
each is a small, pure function of numpy arrays.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .._vocab import Phase
from . import schema as S

__all__ = ["BACKWARD", "FORWARD", "KIND", "OPTIMIZER", "OTHER", "PHASE", "find", "levels", "runs"]

KIND = S.codes_of(S.KIND_DTYPE)
PHASE = S.codes_of(S.PHASE_DTYPE)
FORWARD, BACKWARD, OPTIMIZER, OTHER = (
    PHASE[p.value] for p in (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER, Phase.OTHER)
)


def levels(depth: np.ndarray) -> list[np.ndarray]:
    """Op positions grouped by depth, shallowest first (the op tree, one level at a time)."""
    order = np.argsort(depth, kind="stable")
    return np.split(order, np.flatnonzero(np.diff(depth[order])) + 1)


def runs(keys: tuple, by: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions sorted by ``keys`` (the first key first; ties keep their order), and, in
    that order, a mask of the positions that start a run of equal values of the first
    ``by`` keys."""
    order = np.lexsort(keys[::-1])
    start = np.ones(len(order), dtype=bool)
    if len(order) > 1:
        start[1:] = False
        for k in keys[:by]:
            ks = k[order]
            start[1:] |= ks[1:] != ks[:-1]
    return order, start


def find(keys: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``query`` in the sorted unique ``keys``, and whether each was found."""
    if not len(keys):
        return np.zeros(len(query), dtype=np.int64), np.zeros(len(query), dtype=bool)
    j = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
    return j, keys[j] == query


def cuda_rows(devices: pd.Series) -> np.ndarray:
    """Whether each row's device is a CUDA device (each distinct device asked once)."""
    codes, uniques = pd.factorize(devices, use_na_sentinel=True)
    named = np.array([str(d).startswith("cuda") for d in uniques] + [False], dtype=bool)
    return named[codes]  # a missing device (-1): the last, not CUDA
