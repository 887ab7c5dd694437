"""What views read of a result: protocols, not the result types.

They are small protocols, so the views never import the result
layer (:mod:`jupyter_memprof._results`), which sits above them and draws with them.

A :class:`ProfileLike` is one profile's tables, its metadata and the few analyses the views
show; :class:`jupyter_memprof._results.profile.Profile` is the one implementation. A
:class:`ComparisonLike` is two of them and their diff
(:class:`jupyter_memprof._results.comparison.Comparison`).
"""

from __future__ import annotations

from typing import Any, Protocol

import pandas as pd


class ProfileLike(Protocol):
    """One profile as the views read it."""

    ops: pd.DataFrame
    allocations: pd.DataFrame
    versions: pd.DataFrame
    events: pd.DataFrame
    timeline: pd.DataFrame
    flows: pd.DataFrame
    uses: pd.DataFrame
    names: pd.DataFrame
    segments: pd.DataFrame
    steps: pd.DataFrame
    leaks_table: pd.DataFrame  # the ``leaks`` table, read with leaks()
    meta: dict[str, Any]

    @property
    def tables(self) -> dict[str, pd.DataFrame]: ...

    @property
    def label(self) -> str: ...

    @property
    def start_ns(self) -> int | None: ...

    @property
    def end_ns(self) -> int | None: ...

    @property
    def devices(self) -> list[str]: ...

    def peak(self, device: str | None = None) -> pd.DataFrame: ...

    def lineage(self, alloc_id: int) -> pd.DataFrame: ...

    def leaks(self) -> pd.DataFrame: ...


class ComparisonLike(Protocol):
    """Two profiles compared, as the comparison view reads them."""

    a: ProfileLike
    b: ProfileLike
    device: str | None

    def diff(self, by: str = "category") -> pd.DataFrame: ...

    @property
    def summary(self) -> str: ...
