"""``Profile``: one capture's tables and what can be asked of them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from .._analysis import schema as _schema
from .._devices import device_sort_key

#: the table whose field has another name: ``leaks`` (``Profile.leaks()`` reads it)
TABLE_FIELDS = {"leaks": "leaks_table"}
_TABLE_OF = {v: k for k, v in TABLE_FIELDS.items()}
#: tables a profile may be made without (empty; ``leaks`` found from the others)
_OPTIONAL = ("segments", "steps", "leaks")

# the columns of the tables that hold times on the profiler's clock
_TIME_COLUMNS = {
    "ops": ("start_ns", "end_ns"),
    "events": ("time_ns",),
    "allocations": ("alloc_ns", "free_ns"),
}


@dataclass(init=False)
class Profile:
    """One captured profile: pandas tables plus the analyses and views built on them.

    A profile comes from :func:`jupyter_memprof.profile`, ``%%memprofile``,
    :func:`jupyter_memprof.estimate` or :func:`jupyter_memprof.load`; it is not made by hand.
    Its tables are attributes, each an ordinary DataFrame with declared dtypes (docs/tables.md
    documents every column):

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
      growth (a step ends at each ``optimizer.step()`` or :func:`jupyter_memprof.step`);
    - ``leaks`` (read with :meth:`leaks`; held as ``leaks_table``): memory that grows with
      every step, one row per group.

    ``meta`` holds what the capture knew (devices, label, timings, ``estimate``, ``oom``,
    ``rank``, the reserved peaks); ``kept`` a long run's kept windows, each a Profile.

    Examples
    --------
    >>> with jupyter_memprof.profile() as prof:  # doctest: +SKIP
    ...     train_step()
    >>> prof.peak_by("category")  # doctest: +SKIP
    >>> print(prof.lineage_text(prof.peak().alloc_id[0]))  # doctest: +SKIP
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
    #: the ``leaks`` table (:meth:`leaks` reads it): found when the run was analysed
    leaks_table: pd.DataFrame = field(default_factory=lambda: _schema.empty(_schema.LEAKS))
    meta: dict[str, Any] = field(default_factory=dict)
    #: a long run's kept steps ("first", "peak", "last", step numbers) -> their window's
    #: profile (``profile(steps=N)``), saved with it (:mod:`.kept`); empty otherwise
    kept: dict[Any, Profile] = field(default_factory=dict, compare=False, repr=False)
    #: CUDA's own allocator snapshot recorded during the capture (``profile(snapshot=True)``):
    #: plain data as ``torch.cuda.memory._snapshot()`` returns it; None otherwise
    snapshot: dict | None = field(default=None, compare=False, repr=False)
    session_id: int | None = field(default=None, compare=False)

    # -- construction -------------------------------------------------------------------
    def __init__(
        self,
        *,
        meta: dict[str, Any] | None = None,
        kept: dict[Any, Profile] | None = None,
        snapshot: dict | None = None,
        session_id: int | None = None,
        **tables: pd.DataFrame,
    ) -> None:
        """A profile of ``tables`` (by name, as :attr:`tables` gives them). ``segments`` and
        ``steps`` may be left out (empty); ``leaks`` left out or None is found from the
        others (:func:`jupyter_memprof._analysis.leaks.leaks`)."""
        self.meta = {} if meta is None else meta
        self.kept = {} if kept is None else kept
        self.snapshot, self.session_id = snapshot, session_id
        given = {_TABLE_OF.get(k, k): v for k, v in tables.items()}
        unknown = sorted(set(given) - set(_schema.TABLES))
        if unknown:
            raise TypeError(f"Profile() got tables it does not hold: {', '.join(unknown)}")
        missing = [n for n in _schema.TABLES if n not in given and n not in _OPTIONAL]
        if missing:
            raise TypeError(f"Profile() needs the tables {', '.join(missing)}")
        for name in ("segments", "steps"):
            given.setdefault(name, _schema.empty(_schema.TABLES[name]))
        if given.get("leaks") is None:
            from .._analysis.leaks import leaks

            given["leaks"] = leaks(given)
        self.set_tables(given)

    def set_tables(self, tables: dict[str, pd.DataFrame]) -> None:
        """Replace the tables named in ``tables`` (by name, as :attr:`tables` gives them)."""
        for name, df in tables.items():
            setattr(self, TABLE_FIELDS.get(name, name), df)

    @classmethod
    def empty(cls, **meta: Any) -> Profile:
        """A profile with every table empty (typed) and ``meta``: what a capture of nothing
        gives."""
        return cls(**{name: _schema.empty(s) for name, s in _schema.TABLES.items()}, meta=meta)

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table by name (``ops``, ``allocations``, ... ``steps``), in schema order."""
        return {name: getattr(self, TABLE_FIELDS.get(name, name)) for name in _schema.TABLES}

    @property
    def label(self) -> str:
        """The name shown in summaries and the panel: ``meta["label"]`` or ``profile N``."""
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
        """The story of one block: one row per step of its life, time ordered.

        Parameters
        ----------
        alloc_id : int
            The block (``prof.allocations.alloc_id``, ``prof.peak().alloc_id``).

        Returns
        -------
        pandas.DataFrame
            Its creation, every read and in-place write (with the tensor version), the
            forward op that saved it for backward, the backward op that used it, its free.

        Raises
        ------
        KeyError
            No block has that ``alloc_id`` (the message names the valid range).
        """
        from .._analysis.lineage import lineage

        return lineage(self.tables, alloc_id)

    def lineage_text(self, alloc_id: int) -> str:
        """:meth:`lineage` as readable text for a terminal (the same parameters and errors).

        Returns
        -------
        str
            A heading (name, size, device, category and why), then one line per step.
        """
        from .._views.text import lineage_text

        start = self.start_ns
        return lineage_text(
            self.tables,
            alloc_id,
            0 if start is None else start,
            records=bool(self.meta.get("estimate")),
        )

    def peak(self, device: str | None = None) -> pd.DataFrame:
        """The blocks live at the peak, largest first.

        Parameters
        ----------
        device : str, optional
            ``"cpu"``, ``"cuda:0"``, ...; default: the device with the highest peak.

        Returns
        -------
        pandas.DataFrame
            Rows of :attr:`allocations`; ``.attrs`` holds ``peak_bytes``, ``peak_ns`` and
            ``device``.

        Raises
        ------
        ValueError
            ``device`` is not one of :attr:`devices`.
        """
        from .._analysis.peak import peak

        return peak(self.tables, device)

    def peak_by(self, by: str = "category", device: str | None = None) -> pd.Series:
        """Bytes live at the peak, grouped.

        Parameters
        ----------
        by : {"category", "module", "op", "name"}
            The grouping (``"op"``: the allocating op's name).
        device : str, optional
            As in :meth:`peak`.

        Returns
        -------
        pandas.Series
            Bytes per group, largest first.

        Raises
        ------
        ValueError
            An unknown ``by`` or ``device``.
        """
        from .._analysis.peak import peak_by

        return peak_by(self.tables, by, device)

    def explain(self, device: str | None = None, rows: int = 8) -> pd.DataFrame:
        """The peak in a few groups, category x module family, largest first.

        Parameters
        ----------
        device : str, optional
            As in :meth:`peak`.
        rows : int, default 8
            At most this many groups, then one row for everything else.

        Returns
        -------
        pandas.DataFrame
            ``group``, ``category``, ``modules`` (``model.blocks.*``), ``bytes`` (the rows
            add up to the peak exactly), ``share``, ``what`` that memory is for, and the
            :func:`jupyter_memprof.what_if` ``changes`` that could cut it.

        Raises
        ------
        ValueError
            ``rows`` below 1, or an unknown ``device``.
        """
        from .._analysis.explain import explain

        return explain(self.tables, device, rows)

    def explain_text(self, device: str | None = None, rows: int = 8) -> str:
        """:meth:`explain` as readable text for a terminal (the same parameters).

        Returns
        -------
        str
            The peak, then one block of lines per group: bytes, share, for what, what to try.
        """
        from .._views.explain import explain_text

        return explain_text(self.explain(device, rows))

    def leaks(self) -> pd.DataFrame:
        """Memory that grows with every step.

        Blocks made in one step and still alive at the end, made again step after step
        (a step ends at ``optimizer.step()`` or :func:`jupyter_memprof.step`).

        Returns
        -------
        pandas.DataFrame
            One row per group of such blocks, largest first: the ``holder`` (the variable or
            module path keeping them, when the session reached them), the ``callsite`` that
            made them, ``bytes_per_step``, ``steps``, ``alloc_ids`` and a short ``why``.
            Empty for a clean loop.
        """
        return self.leaks_table.copy()

    def summary(self) -> dict[str, Any]:
        """Headline numbers: peak per device, top categories at the peak, counts, timings.

        Returns
        -------
        dict
            What ``print(prof)`` shows, as data.
        """
        from .._views.summary import summary

        return summary(self)

    # -- views --------------------------------------------------------------------------
    def show(self, *, header: bool = True):
        """The interactive dashboard (ipywidgets + Bokeh) for a notebook.

        Parameters
        ----------
        header : bool, default True
            ``False`` leaves out the summary line at its top.

        Returns
        -------
        ipywidgets.Widget
            Display it (the last expression of a cell) to see it.
        """
        from .._views.dashboard.widget import Dashboard

        return Dashboard(self, header=header)

    def to_html(self, path: str | os.PathLike, *, overwrite: bool = False) -> str:
        """Write the dashboard as one standalone interactive HTML file (works offline).

        Parameters
        ----------
        path : str or os.PathLike
            The file to write.
        overwrite : bool, default False
            Replace ``path`` even when it is not an earlier HTML report.

        Returns
        -------
        str
            The path written.

        Raises
        ------
        FileExistsError
            ``path`` exists and is not such a report (without ``overwrite``); nothing is
            written.
        """
        from .._views.dashboard.html import write_html

        return write_html(self, path, overwrite=overwrite)

    def export(
        self, path: str | os.PathLike, *, device: str | None = None, overwrite: bool = False
    ) -> str | list[str]:
        """Write the profile for other tools, the format chosen by the file name.

        Parameters
        ----------
        path : str or os.PathLike
            ``*.raw.json.gz`` and ``*.json`` (``*.json.gz``) as torch's memory-timeline
            export writes them, ``*.trace.json[.gz]`` (Chrome trace events, for Perfetto),
            ``*.html`` (the dashboard). ``{rank}`` becomes ``meta["rank"]`` (0 outside
            ``torch.distributed``); ``{device}`` the device, for the torch formats.
        device : str, optional
            For the torch formats: the one device to write (default: one file each).
        overwrite : bool, default False
            Replace a file that is not an earlier export.

        Returns
        -------
        str or list of str
            The path written, or a list when the torch formats write one file per device.

        Raises
        ------
        ExportError
            (a ValueError) An unknown suffix, a missing folder, a device the profile does
            not have; nothing is written.
        FileExistsError
            A file in the way that is not an earlier export (without ``overwrite``).
        """
        from .._views.exports import export

        return export(self, self._expand(path), device=device, overwrite=overwrite)

    def to_snapshot(self, path: str | os.PathLike, *, overwrite: bool = False) -> str:
        """Write the profile as a torch memory snapshot, the pickle memory_viz opens.

        What ``torch.cuda.memory._dump_snapshot`` writes, from any profile (a capture on any
        device, an estimate, a loaded trace): every allocation and free with the op chain
        and callsite as its frames and our ``category`` on each allocation (as torch's
        ``profile_plot`` writes it), the blocks alive at the end as segments. Plain data,
        pickle protocol 4; written atomically (see docs/traces.md).

        Parameters
        ----------
        path : str or os.PathLike
            The file to write; ``{rank}`` becomes ``meta["rank"]``.
        overwrite : bool, default False
            Replace a file that is not a snapshot.

        Returns
        -------
        str
            The absolute path written.

        Raises
        ------
        FileExistsError
            ``path`` exists and is not a snapshot (without ``overwrite``).

        Examples
        --------
        >>> prof.to_snapshot("step.pickle")  # doctest: +SKIP
        >>> # then drag step.pickle onto https://pytorch.org/memory_viz
        """
        from .._views.snapshot_export import write_snapshot

        return write_snapshot(self, self._expand(path), overwrite=overwrite)

    # -- persistence --------------------------------------------------------------------
    def save(self, path: str | os.PathLike, format: str = "zip", *, overwrite: bool = False) -> str:
        """Save every table and the metadata losslessly, without pickle.

        Atomic: written under a temporary name in the target folder and renamed into place,
        so a failed save leaves the previous file or folder as it was. :func:`load` reads
        both formats back.

        Parameters
        ----------
        path : str or os.PathLike
            The file (zip) or folder (Parquet); ``{rank}`` becomes ``meta["rank"]`` (0
            outside ``torch.distributed``).
        format : {"zip", "parquet"}
            One file, a zip of JSON; or a folder with one Parquet file per table and
            ``meta.json``.
        overwrite : bool, default False
            Replace a target that is not a saved profile of that format.

        Returns
        -------
        str
            The absolute path written.

        Raises
        ------
        ValueError
            An unknown ``format``.
        FileExistsError
            The target exists and is not a saved profile (without ``overwrite``).
        """
        from .saved import save

        return save(self, self._expand(path), format, overwrite=overwrite)

    def _expand(self, path: str | bytes | os.PathLike) -> str:
        path = os.path.expanduser(fs_path(path))
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

    Never executes code from the file; checks sizes before decompressing anything, then
    every table and metadata field, so a profile that loads works.

    Parameters
    ----------
    path : str or os.PathLike
        The zip file or the Parquet folder. ``{rank}`` in it becomes this process's rank,
        as in :meth:`Profile.save` (0 outside ``torch.distributed``).

    Returns
    -------
    Profile
        With its kept windows (``.kept``) when it was a long run.

    Raises
    ------
    ProfileFileError
        The file is damaged, truncated, crafted or not a saved profile: one line naming
        the file and what is wrong.
    FileNotFoundError
        ``path`` does not exist.

    Examples
    --------
    >>> prof.save("step.memprof")  # doctest: +SKIP
    >>> jupyter_memprof.load("step.memprof").peak_by("category")  # doctest: +SKIP
    """
    from .saved import read

    tables, meta, windows, snapshot = read(fs_path(path))
    prof = Profile(**tables, meta=meta, snapshot=snapshot)
    for keep, own, own_meta in windows:  # a long run's kept windows
        p = Profile(**own, meta=own_meta)
        for what in keep:
            prof.kept[what] = p
    return prof


def fs_path(path: str | bytes | os.PathLike) -> str:
    """A file system path as text (a bytes path decoded as the file system does); TypeError
    (one line) for anything else."""
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise TypeError(
            f"a path must be a str, bytes or os.PathLike, not {type(path).__name__}"
        ) from None


def as_profile(p: Profile | str | os.PathLike, which: str) -> Profile:
    """``p`` as a Profile: itself, or the saved one at its path (``which`` names it in the
    TypeError for anything else)."""
    if isinstance(p, Profile):
        return p
    if isinstance(p, (str, bytes, os.PathLike)):
        return load(p)
    raise TypeError(f"{which} must be a Profile or the path of a saved one, not {type(p).__name__}")
