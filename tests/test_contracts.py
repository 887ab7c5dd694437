"""Lists written in more than one place are tied together here, so that none can drift.

- the tables: ``schema.TABLES`` (declared once), ``Profile``'s fields and the views'
  ``ProfileLike`` protocol (``leaks`` is the field ``leaks_table``: ``leaks()`` reads it);
- the panel's requests: ``comm.REQUESTS`` (the kernel's check) and the ``PanelRequest`` union
  that the JupyterLab extension sends (``labextension/src/link.ts``).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

from jupyter_memprof._analysis import schema
from jupyter_memprof._frontends import comm
from jupyter_memprof._results.profile import TABLE_FIELDS, Profile
from jupyter_memprof._views.protocols import ProfileLike

ROOT = Path(__file__).resolve().parents[1]
#: Profile's fields that are not tables: what a profile holds beside them.
PROFILE_EXTRAS = {"meta", "kept", "session_id", "snapshot"}


def test_profile_has_a_field_for_every_declared_table_and_no_other():
    fields = [f.name for f in dataclasses.fields(Profile)]
    tables = [name for name in fields if name not in PROFILE_EXTRAS]
    assert tables == [TABLE_FIELDS.get(name, name) for name in schema.TABLES]
    for name in tables:
        assert typing.get_type_hints(Profile)[name].__name__ == "DataFrame", name


def test_the_views_protocol_reads_every_declared_table():
    hints = typing.get_type_hints(ProfileLike)
    tables = [name for name, hint in hints.items() if getattr(hint, "__name__", "") == "DataFrame"]
    assert tables == [TABLE_FIELDS.get(name, name) for name in schema.TABLES]
    assert "meta" in hints


def test_an_empty_profile_holds_every_table_typed():
    prof = Profile.empty()
    assert list(prof.tables) == list(schema.TABLES)
    for name, columns in schema.TABLES.items():
        assert list(prof.tables[name].columns) == list(columns), name


def _panel_requests(source: str) -> dict[str, set[str]]:
    """``PanelRequest``'s members as ``{type: {field, ...}}``, read from link.ts."""
    union = re.search(r"export type PanelRequest =(.*?);\s*\n\s*\n", source, re.S)
    assert union, "PanelRequest is no longer declared in link.ts"
    requests: dict[str, set[str]] = {}
    for member in re.findall(r"\{([^{}]*)\}", union.group(1)):
        fields = dict(
            (name.strip(), value.strip())
            for name, value in (part.split(":", 1) for part in member.split(";") if ":" in part)
        )
        kind = fields.pop("type").strip("'\"")
        requests[kind] = set(fields)
    return requests


def test_the_panel_sends_exactly_the_requests_the_kernel_checks():
    source = (ROOT / "labextension" / "src" / "link.ts").read_text(encoding="utf-8")
    sent = _panel_requests(source)
    checked = {kind: set(fields) for kind, fields in comm.REQUESTS.items()}
    assert sent == checked
