"""The result object: the tables of one capture and what can be asked of them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ._analysis import schema as _schema


@dataclass
class Profile:
    """One captured profile: pandas tables plus the analyses and views built on them.

    The tables (see the README's "Tables" section for every column):

    - ``ops``: one row per op, module call, annotation, autograd node and optimizer call;
    - ``allocations``: one row per memory block, from allocation to free;
    - ``versions``: one row per (tensor, version); in-place writes make new versions;
    - ``events``: one row per memory event, time ordered;
    - ``timeline``: live bytes per (device, category) after each event;
    - ``flows``: forward op -> backward op links by autograd sequence number;
    - ``uses``: which data-flow op read or wrote which tensor version;
    - ``names``: tensors the session knows by name (parameters, gradients, optimizer state,
      notebook variables).
    """

    ops: pd.DataFrame
    allocations: pd.DataFrame
    versions: pd.DataFrame
    events: pd.DataFrame
    timeline: pd.DataFrame
    flows: pd.DataFrame
    uses: pd.DataFrame
    names: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    session_id: int | None = field(default=None, compare=False)

    # -- construction -------------------------------------------------------------------
    @classmethod
    def empty(cls, **meta: Any) -> Profile:
        return cls(**{name: _schema.empty(s) for name, s in _schema.TABLES.items()}, meta=meta)

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        return {name: getattr(self, name) for name in _schema.TABLES}

    @property
    def label(self) -> str:
        return str(
            self.meta.get("label")
            or (f"profile {self.session_id}" if self.session_id else "profile")
        )

    # -- analyses -----------------------------------------------------------------------
    def lineage(self, alloc_id: int) -> pd.DataFrame:
        """The story of one block, one row per step, time ordered (see :mod:`_lineage`)."""
        from ._analysis.lineage import lineage

        return lineage(self.tables, alloc_id)

    def lineage_text(self, alloc_id: int) -> str:
        """:meth:`lineage` as readable text for a terminal."""
        from ._analysis.lineage import lineage_text

        return lineage_text(self.tables, alloc_id)

    def peak(self, device: str | None = None) -> pd.DataFrame:
        """The blocks live at the peak of ``device`` (default: the device with the highest
        peak), largest first; ``.attrs`` holds ``peak_bytes``, ``peak_ns`` and ``device``."""
        from ._analysis.peak import peak

        return peak(self.tables, device)

    def peak_by(self, by: str = "category", device: str | None = None) -> pd.Series:
        """Bytes live at the peak grouped by ``"category"``, ``"module"``, ``"op"`` (the
        allocating op's name) or ``"name"``, largest first."""
        from ._analysis.peak import peak_by

        return peak_by(self.tables, by, device)

    def summary(self) -> dict[str, Any]:
        """Headline numbers: peak per device, top categories at the peak, counts, timings."""
        from ._views.summary import summary

        return summary(self)

    # -- views --------------------------------------------------------------------------
    def show(self, *, header: bool = True):
        """The interactive dashboard (ipywidgets + Bokeh) for a notebook; ``header=False``
        leaves out the summary line at its top."""
        from ._views.dashboard_widget import Dashboard

        return Dashboard(self, header=header)

    def to_html(self, path: str | os.PathLike) -> str:
        """Write the dashboard as one standalone interactive HTML file; returns the path."""
        from ._views.dashboard_html import write_html

        return write_html(self, path)

    # -- persistence --------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> str:
        """Save every table and the metadata losslessly (a zip of JSON; no pickle)."""
        from ._storage import write

        return write(self.tables, self.meta, path)

    # -- display ------------------------------------------------------------------------
    def __repr__(self) -> str:
        from ._views.summary import summary_text

        return summary_text(self)

    def _repr_html_(self) -> str:
        from ._views.summary import summary_html

        return summary_html(self)


def load(path: str | os.PathLike) -> Profile:
    """Load a profile written by :meth:`Profile.save` (never executes code from the file)."""
    from ._storage import read

    tables, meta = read(path)
    return Profile(**tables, meta=meta)


def _as_profile(p: Profile | str | os.PathLike, which: str) -> Profile:
    if isinstance(p, Profile):
        return p
    if isinstance(p, (str, os.PathLike)):
        return load(p)
    raise TypeError(f"{which} must be a Profile or the path of a saved one, not {type(p).__name__}")


def diff(
    a: Profile | str | os.PathLike,
    b: Profile | str | os.PathLike,
    by: str = "category",
    *,
    device: str | None = None,
):
    """Bytes live at the peak of ``a`` and of ``b`` per ``by`` (``"category"``,
    ``"module"``, ``"op"`` or ``"name"``): a DataFrame indexed by the key with columns
    ``a``, ``b``, ``delta`` (b - a) and ``ratio`` (b / a), largest change first; ``.attrs``
    holds both peaks and a one-line ``summary``. ``a`` and ``b`` may be saved files."""
    from ._analysis.diff import diff as _diff

    pa, pb = _as_profile(a, "a"), _as_profile(b, "b")
    return _diff(pa.tables, pb.tables, by, device=device, labels=(pa.label, pb.label))
