"""Values the views derive from a profile, kept while it lives.

A notebook shows one cell's profile after another, and each is drawn by several views (the
summary as text and as HTML, then the dashboard; later ``prof.to_html`` or ``prof.show()``
again): what they derive from it is worth keeping for the last profile, and for no other.
A :class:`LastProfile` holds such a value, never a table nor the profile: weak references
tell whether the profile and each of its tables are still the very same objects, and the
profile's death drops the value.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any


@dataclass
class Remembered:
    """A value derived from one profile: the profile (weakly), what else the value depends on
    (``key``), the profile's tables (weakly: a table replaced makes the value stale) and the
    value itself."""

    profile: weakref.ref
    key: Hashable
    tables: dict[str, weakref.ref]
    value: Any

    def holds_for(self, prof, key: Hashable) -> bool:
        """The value is still the one ``prof`` (with ``key``) would give."""
        if self.profile() is not prof or self.key != key:
            return False
        now = prof.tables
        return self.tables.keys() == now.keys() and all(self.tables[k]() is now[k] for k in now)


class LastProfile:
    """The value derived from the last profile asked about (at most one :class:`Remembered`
    in :attr:`entries`)."""

    def __init__(self) -> None:
        self.entries: list[Remembered] = []

    def get(self, prof, key: Hashable) -> Any | None:
        """The value remembered for ``prof`` and ``key``, or None."""
        if self.entries and self.entries[0].holds_for(prof, key):
            return self.entries[0].value
        return None

    def put(self, prof, key: Hashable, value: Any) -> None:
        """Remember ``value`` for ``prof`` and ``key`` (in place of any other profile's)."""
        entries = self.entries

        def dropped(ref) -> None:  # the profile died: its value goes with it
            if entries and entries[0].profile is ref:
                entries.clear()

        try:
            ref = weakref.ref(prof, dropped)
            tables = {k: weakref.ref(df) for k, df in prof.tables.items()}
        except TypeError:  # a profile-like object without weak references: nothing kept
            return
        entries[:] = [Remembered(ref, key, tables, value)]

    def forget(self, prof=None) -> None:
        """Drop the value of ``prof`` (of any profile when None, or when its profile died)."""
        if self.entries:
            held = self.entries[0].profile()
            if prof is None or held is prof or held is None:
                self.entries.clear()
