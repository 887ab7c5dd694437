"""``diff()``: two profiles' peaks side by side, as a ``Diff``."""

from __future__ import annotations

import os

import pandas as pd

from .profile import Profile, as_profile


def diff(
    a: Profile | str | os.PathLike,
    b: Profile | str | os.PathLike,
    by: str = "category",
    *,
    device: str | None = None,
    untouched: bool = False,
):
    """Bytes live at the peak of ``a`` and of ``b``, side by side, per group.

    Parameters
    ----------
    a, b : Profile or str or os.PathLike
        Two profiles (from any producer) or the paths of saved ones.
    by : {"category", "module", "op", "name"}
        The grouping. Module paths start with the model's variable name: give both models
        the same name for their modules to line up.
    device : str, optional
        The device whose peak is compared; default: each profile's highest.
    untouched : bool, default False
        Include memory neither step touched (blocks from before the capture that no op
        read or wrote, alive at its end); left out by default, so the headline is the
        step's own change (``.attrs["untouched_a"]``, ``["untouched_b"]``: the bytes left
        out).

    Returns
    -------
    Diff
        A DataFrame indexed by the key with ``a``, ``b`` (bytes), ``delta`` (b - a) and
        ``ratio`` (b / a; ``inf`` for keys only ``b`` has), largest change first;
        ``.attrs`` holds both peaks, devices, labels and the one-line ``summary``.

    Raises
    ------
    ValueError
        An unknown ``by``.
    TypeError
        ``a`` or ``b`` is neither a Profile nor a path.
    ProfileFileError
        A saved file that does not load.

    Examples
    --------
    >>> d = jupyter_memprof.diff(plain, checkpointed, by="module")  # doctest: +SKIP
    >>> d.attrs["summary"]  # doctest: +SKIP
    'peak -5.5 MiB (-17%): activation -5.5 MiB, mostly model.blocks.layers.*'
    """
    from .._analysis.diff import diff as _diff

    pa, pb = as_profile(a, "a"), as_profile(b, "b")
    labels = (pa.label, pb.label)
    return Diff.of(
        _diff(pa.tables, pb.tables, by, device=device, labels=labels, untouched=untouched)
    )


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
