"""``ProfileSet``: many profiles side by side, one per rank.

Under ``torch.distributed`` every rank captures its own profile (``meta["rank"]`` and
``meta["world_size"]`` are recorded) and saves it, e.g. ``prof.save("run/rank{rank}",
format="parquet")``. :func:`load_many` reads them back as a :class:`ProfileSet`, whose tables
are every profile's table concatenated under a leading ``rank`` column, and whose
:meth:`ProfileSet.peak_by` answers "which rank peaks, and why?" as one DataFrame.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable

import pandas as pd

from .._analysis import schema as S
from .._units import shown
from .profile import Profile, load

__all__ = ["ProfileSet", "load_many"]

_GLOB_CHARS = set("*?[")


def _expand(paths_or_glob: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    if isinstance(paths_or_glob, (str, os.PathLike)):
        pattern = os.path.expanduser(os.fspath(paths_or_glob)).replace("{rank}", "*")
        if _GLOB_CHARS & set(pattern):
            found = sorted(glob.glob(pattern))
            if not found:
                raise FileNotFoundError(f"no saved profiles match {os.fspath(paths_or_glob)!r}")
            return found
        return [pattern]
    paths = [os.path.expanduser(os.fspath(p)) for p in paths_or_glob]
    if not paths:
        raise ValueError("load_many needs at least one path")
    return paths


def _refuse_repeats(paths: list[str]) -> None:
    """One ValueError line when two paths name the same file or folder (they would count as
    two ranks)."""
    seen: dict[object, str] = {}
    for p in paths:
        try:
            st = os.stat(p)
            key: object = (st.st_dev, st.st_ino)
        except (OSError, ValueError):  # load says what is wrong with it
            key = os.path.realpath(p)
        if key in seen:
            raise ValueError(
                f"load_many: {shown(p, 80)} is the same profile as {shown(seen[key], 80)}; "
                "each rank's file once"
            )
        seen[key] = p


def _concat(frames: list[pd.DataFrame], ranks: list[int], schema: dict) -> pd.DataFrame:
    """Concatenate tables of one schema under a leading ``rank`` column, keeping dtypes
    (open categorical columns get the union of the profiles' categories)."""
    frames = [f.copy(deep=False) for f in frames]
    for col, dtype in schema.items():
        if isinstance(dtype, str) and dtype == S.OPEN_CATEGORY:
            seen: dict = {}
            for f in frames:
                seen.update(dict.fromkeys(f[col].cat.categories))
            union = pd.CategoricalDtype(list(seen))
            for f in frames:
                f[col] = f[col].astype(union)
    for f, rank in zip(frames, ranks):
        f.insert(0, "rank", rank)
    out = pd.concat(frames, ignore_index=True)
    out["rank"] = out["rank"].astype("int64")
    return out


class ProfileSet:
    """Profiles of several ranks (or runs), in rank order; made by
    :func:`jupyter_memprof.load_many`.

    Each table (``ops``, ``allocations``, ``versions``, ``events``, ``timeline``, ``flows``,
    ``uses``, ``names``, ...) is an attribute: every profile's table concatenated, with a
    leading ``rank`` column. Ids (``op_id``, ``alloc_id``, ...) are unique within a rank, so
    join on ``(rank, id)``. ``ps[rank]`` is one rank's :class:`Profile`.

    Parameters
    ----------
    profiles : list of Profile
        The profiles.
    ranks : list of int
        Their ranks, parallel to ``profiles``, distinct.
    paths : list of str, optional
        Where each came from.

    Raises
    ------
    ValueError
        ``ranks`` is not one distinct rank per profile.

    Examples
    --------
    >>> ps = jupyter_memprof.load_many("run/rank*")  # doctest: +SKIP
    >>> ps.peak_by("category")  # ranks x categories  # doctest: +SKIP
    """

    def __init__(
        self, profiles: list[Profile], ranks: list[int], paths: list[str] | None = None
    ) -> None:
        if len(profiles) != len(ranks):
            raise ValueError("one rank per profile is needed")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ranks must be distinct, got {ranks}")
        order = sorted(range(len(ranks)), key=ranks.__getitem__)
        self.profiles = [profiles[i] for i in order]
        self.ranks = [int(ranks[i]) for i in order]
        self.paths = [paths[i] for i in order] if paths is not None else None
        self._tables: dict[str, pd.DataFrame] = {}

    def __len__(self) -> int:
        return len(self.profiles)

    def __getitem__(self, rank: int) -> Profile:
        """The profile of ``rank``; KeyError when there is none."""
        try:
            return self.profiles[self.ranks.index(rank)]
        except ValueError:
            raise KeyError(f"no profile of rank {rank} (ranks: {self.ranks})") from None

    def table(self, name: str) -> pd.DataFrame:
        """One table of every profile, concatenated under a leading ``rank`` column.

        Parameters
        ----------
        name : str
            A table's name (``"allocations"``, ``"ops"``, ...).

        Returns
        -------
        pandas.DataFrame
            Its rows of every rank, the declared dtypes kept.

        Raises
        ------
        KeyError
            No table has that name.
        """
        if name not in S.TABLES:
            raise KeyError(f"no table {name!r}; tables: {', '.join(S.TABLES)}")
        if name not in self._tables:
            frames = [p.tables[name] for p in self.profiles]
            self._tables[name] = _concat(frames, self.ranks, S.TABLES[name])
        return self._tables[name]

    def __getattr__(self, name: str):
        if name in S.TABLES:
            return self.table(name)
        raise AttributeError(f"'ProfileSet' object has no attribute {name!r}")

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table by name, as :meth:`table` gives it."""
        return {name: self.table(name) for name in S.TABLES}

    def peaks(self) -> pd.DataFrame:
        """Each rank's peak.

        Returns
        -------
        pandas.DataFrame
            One row per rank: ``rank, device, peak_bytes, peak_ns`` of the device with the
            highest peak on that rank.
        """
        rows = []
        for rank, prof in zip(self.ranks, self.profiles):
            attrs = prof.peak().attrs
            rows.append(
                {
                    "rank": rank,
                    "device": attrs.get("device"),
                    "peak_bytes": int(attrs.get("peak_bytes") or 0),
                    "peak_ns": attrs.get("peak_ns"),
                }
            )
        out = pd.DataFrame(rows, columns=["rank", "device", "peak_bytes", "peak_ns"])
        return out.astype({"rank": "int64", "peak_bytes": "int64", "peak_ns": "Int64"})

    def peak_by(self, by: str = "category", device: str | None = None) -> pd.DataFrame:
        """Bytes live at each rank's peak, grouped (as :meth:`Profile.peak_by`).

        Parameters
        ----------
        by : {"category", "module", "op", "name"}
            The grouping.
        device : str, optional
            The device; default: each rank's device with the highest peak.

        Returns
        -------
        pandas.DataFrame
            One row per rank, one column per key, largest keys first, 0 where a rank has
            none.

        Raises
        ------
        ValueError
            An unknown ``by`` or ``device``.
        """
        series = {r: p.peak_by(by, device) for r, p in zip(self.ranks, self.profiles)}
        wide = pd.DataFrame({r: s.astype("int64") for r, s in series.items()}).T
        wide = wide.fillna(0).astype("int64")
        wide = wide[wide.sum().sort_values(ascending=False, kind="stable").index]
        wide.index = pd.Index(self.ranks, name="rank", dtype="int64")
        wide.columns = pd.Index([str(c) for c in wide.columns], name=by)
        return wide

    def __repr__(self) -> str:
        peaks = self.peaks()
        lines = [f"ProfileSet of {len(self)} profiles (ranks {self.ranks})"]
        from .._units import format_bytes

        for row in peaks.itertuples():
            lines.append(f"  rank {row.rank}: peak {format_bytes(row.peak_bytes)} on {row.device}")
        return "\n".join(lines)


def load_many(
    paths_or_glob: str | os.PathLike | Iterable[str | os.PathLike], *, loader=None
) -> ProfileSet:
    """Load saved profiles (zip files or Parquet folders) as a :class:`ProfileSet`.

    ``paths_or_glob`` is a list of paths or one glob pattern (``"run/rank*"``; ``{rank}``
    counts as ``*``). Each profile's rank is ``meta["rank"]`` when every profile has a
    distinct one, else its position in the (sorted) list of paths.
    """
    paths = _expand(paths_or_glob)
    _refuse_repeats(paths)
    profiles = [(loader or load)(p) for p in paths]
    ranks = [p.meta.get("rank") for p in profiles]
    if any(not isinstance(r, int) for r in ranks) or len(set(ranks)) != len(ranks):
        ranks = list(range(len(profiles)))
    return ProfileSet(profiles, ranks, paths)
