"""``Fit``: what ``fit()`` returns, the batch and every estimate.

What :func:`jupyter_memprof.fit` returns: the largest batch that fits, and every estimate
it took to find it."""

from __future__ import annotations

import html
from dataclasses import dataclass

import pandas as pd

from .._units import format_bytes
from .profile import Profile

__all__ = ["Fit"]


@dataclass
class Fit:
    """The result of :func:`fit`: ``batch`` (the largest size that fits, None when even
    ``low`` does not), ``tried`` (one row per estimate, in the order run: ``batch``,
    ``peak_bytes``, ``fits``), ``limit`` and ``device``, and ``profile``: the estimate at
    ``batch`` (None when nothing fits)."""

    batch: int | None
    tried: pd.DataFrame
    limit: int
    device: str | None
    profile: Profile | None

    def text(self) -> str:
        """The answer, then the sizes tried, largest first."""
        lines = [self.headline()]
        for r in self.tried.sort_values("batch").itertuples():
            mark = "fits" if r.fits else "over"
            lines.append(f"  batch {r.batch:>8}: {format_bytes(int(r.peak_bytes)):>11}  {mark}")
        return "\n".join(lines)

    def headline(self) -> str:
        where = self.device or "its devices"
        limit = format_bytes(self.limit)
        n = len(self.tried)
        if self.batch is None:
            return f"no batch fits {limit} on {where} ({n} estimate{'s' if n != 1 else ''})"
        peak = format_bytes(int(self.tried.set_index("batch").loc[self.batch, "peak_bytes"]))
        return f"batch {self.batch} fits {limit} on {where}: peak {peak} ({n} estimates)"

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.text())}</pre>"
