"""The result of one capture or estimate: its tables and what can be asked of them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from .._analysis import schema as _schema
from .._devices import device_sort_key

# the columns of the tables that hold times on the profiler's clock
_TIME_COLUMNS = {
    "ops": ("start_ns", "end_ns"),
    "events": ("time_ns",),
    "allocations": ("alloc_ns", "free_ns"),
}


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
      notebook variables);
    - ``segments``: the CUDA caching allocator's segments, modelled from the blocks (or
      recorded), with ``meta["reserved_peak_bytes"]``.
    - ``steps``: one row per (step, device): live bytes at its start and end, its peak and
      growth (a step ends at each ``optimizer.step()`` or :func:`jupyter_memprof.step`).
    """

    ops: pd.DataFrame
    allocations: pd.DataFrame
    versions: pd.DataFrame
    events: pd.DataFrame
    timeline: pd.DataFrame
    flows: pd.DataFrame
    uses: pd.DataFrame
    names: pd.DataFrame
    segments: pd.DataFrame = field(default_factory=lambda: _schema.empty(_schema.SEGMENTS))
    steps: pd.DataFrame = field(default_factory=lambda: _schema.empty(_schema.STEPS))
    meta: dict[str, Any] = field(default_factory=dict)
    #: a long run's kept steps ("first", "peak", "last", step numbers) -> their window's
    #: profile (``profile(steps=N)``), saved with it (:mod:`.kept`); empty otherwise
    kept: dict[Any, Profile] = field(default_factory=dict, compare=False, repr=False)
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

    @property
    def start_ns(self) -> int | None:
        """When the capture began, in ns on the profiler's clock (the clock of every ``*_ns``
        column): ``meta['start_ns']`` when the capture recorded it, else the earliest time in
        the tables; ``None`` when neither says. Views measure times from here."""
        start = self.meta.get("start_ns")
        if start is not None:
            return int(start)
        times = self._times()
        return min(times) if times else None

    @property
    def end_ns(self) -> int | None:
        """When the capture ended: the latest of ``meta['end_ns']`` and every time in the
        tables (a block can be freed after the last op ended); ``None`` when neither says."""
        times = self._times()
        end = self.meta.get("end_ns")
        if end is not None:
            times.append(int(end))
        return max(times) if times else None

    def _times(self) -> list[int]:
        """The first and last time of every time column (NA left out)."""
        out = []
        for name, cols in _TIME_COLUMNS.items():
            table = getattr(self, name)
            for c in cols:
                v = pd.to_numeric(table[c], errors="coerce").dropna()
                if len(v):
                    out += [int(v.min()), int(v.max())]
        return out

    @property
    def devices(self) -> list[str]:
        """The devices with memory activity in this profile, CPU first, then ``cuda:0``,
        ``cuda:1``, ... (:func:`jupyter_memprof._devices.device_sort_key`). Every view lists
        devices in this order; ``meta['devices']`` is what the capture was asked to record."""
        seen: set[str] = set()
        for name in ("events", "allocations", "timeline"):
            seen |= {str(d) for d in getattr(self, name)["device"].dropna().unique()}
        return sorted(seen, key=device_sort_key)

    # -- analyses -----------------------------------------------------------------------
    def lineage(self, alloc_id: int) -> pd.DataFrame:
        """The story of one block, one row per step, time ordered (see :mod:`_lineage`)."""
        from .._analysis.lineage import lineage

        return lineage(self.tables, alloc_id)

    def lineage_text(self, alloc_id: int) -> str:
        """:meth:`lineage` as readable text for a terminal."""
        from .._views.text import lineage_text

        start = self.start_ns
        return lineage_text(
            self.tables,
            alloc_id,
            0 if start is None else start,
            records=bool(self.meta.get("estimate")),
        )

    def peak(self, device: str | None = None) -> pd.DataFrame:
        """The blocks live at the peak of ``device`` (default: the device with the highest
        peak), largest first; ``.attrs`` holds ``peak_bytes``, ``peak_ns`` and ``device``."""
        from .._analysis.peak import peak

        return peak(self.tables, device)

    def peak_by(self, by: str = "category", device: str | None = None) -> pd.Series:
        """Bytes live at the peak grouped by ``"category"``, ``"module"``, ``"op"`` (the
        allocating op's name) or ``"name"``, largest first."""
        from .._analysis.peak import peak_by

        return peak_by(self.tables, by, device)

    def explain(self, device: str | None = None, rows: int = 8) -> pd.DataFrame:
        """The peak of ``device`` (default: the highest peak) in a few groups, category x
        module family (``activation saved by model.blocks.*``), largest first: ``bytes``
        (the rows add up to the peak exactly), what that memory is for, and the
        :func:`jupyter_memprof.what_if` changes that could cut it (see :mod:`_explain`).
        At most ``rows`` groups, then one row for everything else."""
        from .._analysis.explain import explain

        return explain(self.tables, device, rows)

    def explain_text(self, device: str | None = None, rows: int = 8) -> str:
        """:meth:`explain` as readable text for a terminal."""
        from .._views.explain import explain_text

        return explain_text(self.explain(device, rows))

    def leaks(self) -> pd.DataFrame:
        """Memory that grows with every step: one row per group of blocks made in one step
        and still alive at the end, made again step after step, largest first, with the
        ``holder`` (the variable or module path keeping them, when the session reached
        them), the ``callsite`` that made them, ``bytes_per_step`` and a short ``why``.
        Empty for a clean loop (see :mod:`jupyter_memprof._analysis.steps`)."""
        if "leaks" in self.meta:  # a long run: found over all its windows
            from .._analysis.windows import leaks_from_meta

            return leaks_from_meta(self.meta["leaks"])
        from .._analysis.steps import leaks

        return leaks(self.tables)

    def summary(self) -> dict[str, Any]:
        """Headline numbers: peak per device, top categories at the peak, counts, timings."""
        from .._views.summary import summary

        return summary(self)

    # -- views --------------------------------------------------------------------------
    def show(self, *, header: bool = True):
        """The interactive dashboard (ipywidgets + Bokeh) for a notebook; ``header=False``
        leaves out the summary line at its top."""
        from .._views.dashboard_widget import Dashboard

        return Dashboard(self, header=header)

    def to_html(self, path: str | os.PathLike, *, overwrite: bool = False) -> str:
        """Write the dashboard as one standalone interactive HTML file; returns the path.

        An existing file is replaced only when it is such an HTML report, or with
        ``overwrite=True``; otherwise ``FileExistsError`` names it and nothing is written."""
        from .._views.dashboard_html import write_html

        return write_html(self, path, overwrite=overwrite)

    def export(
        self, path: str | os.PathLike, *, device: str | None = None, overwrite: bool = False
    ) -> str | list[str]:
        """Write the profile for other tools, the format chosen by the file name:
        ``*.raw.json.gz`` and ``*.json`` (``*.json.gz``) as torch's memory-timeline export
        writes them, ``*.trace.json[.gz]`` (Chrome trace events, for Perfetto), ``*.html``
        (the dashboard). ``{rank}`` in the path becomes ``meta["rank"]`` (0 outside
        ``torch.distributed``). Returns the path written (a list when the torch formats
        write one file per device; see :mod:`_views.exports`)."""
        from .._views.exports import export

        return export(self, self._expand(path), device=device, overwrite=overwrite)

    # -- persistence --------------------------------------------------------------------
    def save(self, path: str | os.PathLike, format: str = "zip", *, overwrite: bool = False) -> str:
        """Save every table and the metadata losslessly, no pickle: ``format="zip"`` (one
        file, a zip of JSON) or ``"parquet"`` (a folder: one Parquet file per table and
        ``meta.json``). ``{rank}`` in the path becomes ``meta["rank"]`` (0 outside
        ``torch.distributed``). :func:`load` reads both. Returns the absolute path.

        Atomic: written under a temporary name in the target folder and renamed into place,
        so a failed save leaves the previous file or folder as it was. An existing target is
        replaced only when it is a saved profile (of that format), or with
        ``overwrite=True``; otherwise :class:`jupyter_memprof._io.WriteRefused`."""
        path = self._expand(path)
        if format not in ("zip", "parquet"):
            raise ValueError(f"unknown format {format!r}: use 'zip' or 'parquet'")
        from .kept import windows_of

        kept = windows_of(self.tables, self.kept)
        if format == "parquet":
            from .parquet import write_folder

            return write_folder(self.tables, self.meta, path, overwrite=overwrite, kept=kept)
        from .storage import write

        return write(self.tables, self.meta, path, overwrite=overwrite, kept=kept)

    def _expand(self, path: str | bytes | os.PathLike) -> str:
        path = os.path.expanduser(_path(path))
        if "{rank}" in path:
            path = path.replace("{rank}", str(int(self.meta.get("rank") or 0)))
        return path

    # -- display ------------------------------------------------------------------------
    def __repr__(self) -> str:
        from .._views.summary import summary_text

        return summary_text(self)

    def _repr_html_(self) -> str:
        from .._views.summary import summary_html

        return summary_html(self)


def load(path: str | os.PathLike) -> Profile:
    """Load a profile written by :meth:`Profile.save`, a zip file or a Parquet folder.

    Never executes code from the file, checks sizes before decompressing anything and checks
    every table and metadata field (see :mod:`jupyter_memprof._results.checks`): a damaged or
    crafted file raises :class:`~jupyter_memprof.ProfileFileError` (one line naming the file
    and what is wrong), and a profile that loads works. A path that does not exist raises
    FileNotFoundError."""
    path = _path(path)
    if os.path.isdir(path):
        from .parquet import read_folder

        tables, meta, kept = read_folder(path)
    else:
        from .storage import read

        tables, meta, kept = read(path)
    if tables["steps"].empty and not tables["timeline"].empty:  # saved before steps existed
        tables["steps"] = _rebuilt_steps(tables, meta)
    prof = Profile(**tables, meta=meta)
    for window in kept:  # a long run's kept windows; a shared one takes the profile's tables
        own = {**prof.tables, **window.tables} if window.shares_tables else window.tables
        p = Profile(**own, meta=window.meta)
        for what in window.keep:
            prof.kept[what] = p
    return prof


def _path(path: str | bytes | os.PathLike) -> str:
    """A file system path as text (a bytes path decoded as the file system does); TypeError
    (one line) for anything else."""
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise TypeError(
            f"a path must be a str, bytes or os.PathLike, not {type(path).__name__}"
        ) from None


def _rebuilt_steps(tables: dict[str, pd.DataFrame], meta: dict) -> pd.DataFrame:
    """The ``steps`` table of a profile saved without one, from its other tables."""
    from .._analysis.steps import build_steps

    timeline = tables["timeline"]
    start = meta.get("start_ns")
    start = int(timeline["time_ns"].min()) if start is None else int(start)
    end = meta.get("end_ns")
    return build_steps(
        tables["ops"], tables["events"], timeline, start, start if end is None else int(end)
    )


def as_profile(p: Profile | str | os.PathLike, which: str) -> Profile:
    if isinstance(p, Profile):
        return p
    if isinstance(p, (str, bytes, os.PathLike)):
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
    from .._analysis.diff import diff as _diff

    pa, pb = as_profile(a, "a"), as_profile(b, "b")
    return Diff.of(_diff(pa.tables, pb.tables, by, device=device, labels=(pa.label, pb.label)))


class Diff(pd.DataFrame):
    """The result of :func:`diff`: a DataFrame indexed by the key, with integer columns
    ``a``, ``b``, ``delta`` and a float ``ratio``. ``.attrs``: ``by``, ``peak_a``,
    ``peak_b``, ``device_a``, ``device_b``, ``label_a``, ``label_b``, ``summary``.

    It prints sizes with units (:mod:`jupyter_memprof._views.text`); derived frames (``d.head()``,
    ``d.loc[...]``) are plain DataFrames with the same numbers.
    """

    @property
    def _constructor(self):
        return pd.DataFrame

    @classmethod
    def of(cls, table: pd.DataFrame) -> Diff:
        """The table :func:`jupyter_memprof._analysis.diff.diff` gives, with its attrs."""
        out = cls(table)
        out.attrs.update(table.attrs)
        return out

    def text(self, rows: int | None = 30) -> str:
        """The table for a terminal: the headline, then one line per key."""
        from .._views.text import diff_text

        return diff_text(self, rows)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        from .._views.text import diff_html

        return diff_html(self)
