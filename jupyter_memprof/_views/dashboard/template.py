"""A Bokeh document serialized once, filled in for every page.

Building and serializing Bokeh's models costs about half a millisecond each in Python, while
two dashboards of one layout differ only in texts, numbers and data. A :class:`DocTemplate`
is a document serialized once with stand-ins (:class:`Slots`) where those values go;
:meth:`DocTemplate.render` gives the JSON Bokeh would give for the same models holding other
values.
"""

from __future__ import annotations

import itertools
from typing import Any

from bokeh.core.serialization import Serializer
from bokeh.document import Document


class Slots:
    """Stand-ins for the values a :class:`DocTemplate` leaves open.

    Each stand-in is a value that nothing else in a document takes (a marked string, a number
    far beyond any pixel or byte count), of the type the real value has, so that Bokeh's
    property checks accept it and its places in the serialized document can be found. Whole
    data sources are left open with a one-column stand-in whose name is marked. Numbers stand
    in growing in the order they are asked for: a range's start asked before its end keeps
    the two in order, as Bokeh requires of bounds."""

    _INT = 10**15  # integers from here: one per slot
    _FLOAT = 2.0**600  # floats from here (exactly representable steps)

    def __init__(self) -> None:
        self.keys: dict[Any, str] = {}

    def stand_in(self, key: str, value):
        n = len(self.keys)
        if isinstance(value, bool):
            raise TypeError(f"{key}: a flag changes what is built, it is not a value")
        if isinstance(value, int):
            mark = self._INT + n
        elif isinstance(value, float):
            mark = self._FLOAT * (1 + n / 2**20)
        else:
            mark = f"\x00memprof-slot:{key}\x00"
        self.keys[(type(mark), mark)] = key
        return {mark: []} if isinstance(value, dict) else mark

    def key(self, value) -> str | None:
        """The slot ``value`` stands in for, or None."""
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return self.keys.get((type(value), value))
        if isinstance(value, dict) and value.get("type") == "map":  # a data source's data
            entries = value.get("entries") or ()
            if len(entries) == 1:
                return self.keys.get((str, entries[0][0]))
        return None


class _Slot:
    """The place of a value in a template."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key


class _Id:
    """A model id in a template (each document made from it gets its own)."""

    __slots__ = ("id",)

    def __init__(self, id: str) -> None:
        self.id = id


class _Dict(dict):
    """A part of a template holding a slot or a model id (what :meth:`DocTemplate.render`
    fills in); everything else in a template is shared by every document made from it."""


class _List(list):
    """A list of a template holding a slot or a model id (see :class:`_Dict`)."""


_serial = itertools.count(1)


class DocTemplate:
    """A Bokeh document serialized once, with some values left open (:class:`Slots`).

    :meth:`render` makes the JSON of a document from it, as Bokeh would serialize the same
    models holding other values: the slots filled with the values given, encoded by Bokeh's
    serializer, and every model under a fresh id (or the id of a live model standing for
    it), so documents made from one template can share a page."""

    def __init__(self, root, slots: Slots) -> None:
        doc = Document()
        doc.add_root(root)
        self.root_id = root.id
        self._slots = slots
        self._tree = self._compile(doc.to_json(deferred=False))
        self.name = root.name

    def _compile(self, node):
        key = self._slots.key(node)
        if key is not None:
            return _Slot(key)
        if isinstance(node, dict):
            out = {k: self._compile(v) for k, v in node.items()}
            if "id" in node and isinstance(node["id"], str):
                out["id"] = _Id(node["id"])
            dynamic = "id" in node or any(
                isinstance(v, (_Slot, _Dict, _List)) for v in out.values()
            )
            return _Dict(out) if dynamic else node
        if isinstance(node, (list, tuple)):
            out = [self._compile(v) for v in node]
            if any(isinstance(v, (_Slot, _Dict, _List)) for v in out):
                return _List(out)
            return node
        return node

    def render(
        self, values: dict, ids: dict[str, str] | None = None, encoded: dict | None = None
    ) -> dict:
        """The document's JSON (what ``Document.to_json(deferred=False)`` gives) with
        ``values`` in its slots; ``ids`` maps template ids to the ids of live models;
        ``encoded``: some of the values as Bokeh's serializer encodes them, by slot."""
        encode = Serializer(deferred=False).encode
        encoded = encoded or {}
        filled = {k: encoded[k] if k in encoded else encode(v) for k, v in values.items()}
        suffix = f"-{next(_serial)}"
        ids = ids or {}

        def fill(node):
            t = type(node)
            if t is _Dict:
                return {k: fill(v) for k, v in node.items()}
            if t is _List:
                return [fill(v) for v in node]
            if t is _Slot:
                return filled[node.key]
            if t is _Id:
                return ids.get(node.id) or node.id + suffix
            return node

        return fill(self._tree)
