"""README.md stays true: its Python blocks run, its links lead somewhere, it stays short.

Every fenced block whose info string starts with ``python`` or ``ipython`` runs, in the
README's order, in one IPython shell (so ``%load_ext`` and ``%%memprofile`` work as in a
notebook). A block that cannot run here (it needs a GPU, a user's file, a distributed launch)
carries ``not-run`` after its language: ```` ```python not-run ````. ``text`` blocks (output)
and blocks without a language (shell commands) are not run.
"""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
RUN_LANGUAGES = ("python", "ipython")
NOT_RUN = "not-run"


def fenced_blocks(text: str) -> list[tuple[int, str, str]]:
    """Every fenced block of ``text``: (line of its opening fence, info string, code)."""
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(1).strip(), m.group(2))
        for m in FENCE.finditer(text)
    ]


def runs(info: str) -> bool:
    """Whether a block with this info string is run by the test."""
    words = info.split()
    return bool(words) and words[0] in RUN_LANGUAGES and NOT_RUN not in words[1:]


def _readme() -> str:
    with open(README, encoding="utf-8") as f:
        return f.read()


def test_fences_are_read_as_written():
    text = (
        "a\n```python\nx = 1\n```\n```python not-run\ny\n```\n```text\nout\n```\n```\nmake\n```\n"
    )
    blocks = fenced_blocks(text)
    assert [(line, info) for line, info, _ in blocks] == [
        (2, "python"),
        (5, "python not-run"),
        (8, "text"),
        (11, ""),
    ]
    assert [runs(info) for _, info, _ in blocks] == [True, False, False, False]
    assert blocks[0][2] == "x = 1\n"


def test_readme_is_short_and_shows_the_tour():
    text = _readme()
    assert len(text.splitlines()) <= 300
    blocks = fenced_blocks(text)
    ran = [code for _, info, code in blocks if runs(info)]
    assert any("%%memprofile" in code for code in ran)
    assert any("jupyter_memprof.estimate(" in code for code in ran)
    assert any("jupyter_memprof.fit(" in code for code in ran)
    assert any("load_snapshot(" in code for _, info, code in blocks)


def test_readme_links_lead_to_files():
    text = _readme()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:", t)]
    assert any(t.startswith("docs/") for t in local)
    missing = [t for t in local if t and not os.path.exists(os.path.join(ROOT, t))]
    assert missing == []


def test_readme_python_blocks_run(ipython_shell, tmp_path, monkeypatch):
    import jupyter_memprof

    monkeypatch.chdir(tmp_path)  # the files the tour writes (a snapshot) land here
    from jupyter_memprof._frontends.session import items

    ip = ipython_shell
    names_before = set(ip.user_ns)
    sessions_before = {sid for sid, _ in items()}
    try:
        for line, info, code in fenced_blocks(_readme()):
            if not runs(info):
                continue
            result = ip.run_cell(code, store_history=True)
            error = result.error_before_exec or result.error_in_exec
            assert error is None, f"README.md line {line} ({info}): {error!r}"
        prof = ip.user_ns["prof"]
        assert prof.peak_by("category")["optimizer_state"] > 0
        assert ip.user_ns["est"].meta["oom"] is None
        assert ip.user_ns["best"].batch > 8192
        # the snapshot the tour writes opens back to the capture's peak
        snap = ip.user_ns["snap"]
        assert snap.peak().attrs["peak_bytes"] == prof.peak().attrs["peak_bytes"]
    finally:
        # leave the shared shell as the README found it: no extension, names or profiles
        if "jupyter_memprof" in ip.extension_manager.loaded:
            ip.run_cell("%unload_ext jupyter_memprof")
        for sid in {sid for sid, _ in items()} - sessions_before:
            jupyter_memprof.release(sid)
        for name in set(ip.user_ns) - names_before:
            if not name.startswith("_"):
                del ip.user_ns[name]
