"""A real JupyterLab server for browser tests: on a free 127.0.0.1 port, behind a random token
(so nobody else on the machine can run code while the tests run), with fresh settings and
workspaces, no news prompt, and every kernel shut down afterwards."""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager

BIN = pathlib.Path(sys.executable).parent
#: this checkout: its kernels import this copy of jupyter_memprof, not the one installed
CHECKOUT = str(pathlib.Path(__file__).resolve().parent.parent)
#: this checkout's build of the JupyterLab extension (`npm run build:prod` in labextension/, or
#: the install, writes it here): the server loads it before any installed copy of the same name
BUILD = pathlib.Path(CHECKOUT) / "jupyter_memprof" / "labextension"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab(str):
    """The server's base URL (``http://127.0.0.1:PORT``) with its token: open pages with
    ``lab.url("/lab/tree/x.ipynb?reset")``, which logs the browser in."""

    token: str

    def __new__(cls, base: str, token: str):
        self = super().__new__(cls, base)
        self.token = token
        return self

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self}{path}{sep}token={self.token}"


def api(base: str, path: str, method: str = "GET"):
    """Call the server's REST API; returns the decoded JSON (None for an empty body)."""
    req = urllib.request.Request(f"{base}{path}", method=method)
    token = getattr(base, "token", None)
    if token:
        req.add_header("Authorization", f"token {token}")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"null")


def write_notebook(path: pathlib.Path, cells: list[str]) -> None:
    """A notebook of code cells, with the project's Python kernel."""
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "source": src,
                "outputs": [],
                "execution_count": None,
            }
            for src in cells
        ],
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


@contextmanager
def jupyterlab(root: pathlib.Path):
    """Serve ``root``; yields its :class:`Lab` (the base URL and token). The server log is
    ``root/server.log``."""
    port = free_port()
    base = Lab(f"http://127.0.0.1:{port}", secrets.token_urlsafe(32))
    # The token goes in the environment, not the command line, which anyone can read in ps.
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        IPYTHONDIR=str(root / ".ipython"),
        JUPYTER_TOKEN=base.token,
        PYTHONPATH=os.pathsep.join(p for p in (CHECKOUT, os.environ.get("PYTHONPATH")) if p),
    )
    cmd = [
        str(BIN / "jupyter"),
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.password=",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={root / '.settings'}",
        f"--LabApp.workspaces_dir={root / '.workspaces'}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=None",
    ]
    if os.getuid() == 0:
        cmd.append("--allow-root")
    if (BUILD / "package.json").is_file():
        # JupyterLab takes the first extension of a name on its paths, extra paths first; the
        # folder must be named as the package (its files are served under that name).
        extra = root / ".labextensions"
        extra.mkdir()
        (extra / "jupyter-memprof").symlink_to(BUILD.resolve(), target_is_directory=True)
        cmd.append(f"--LabApp.extra_labextensions_path={extra}")
    # No "get notified about Jupyter news?" toast over the page.
    notification = root / ".settings" / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True)
    (notification / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    with open(root / "server.log", "w") as log:
        server = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    api(base, "/api/status")
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            "JupyterLab did not start:\n" + (root / "server.log").read_text()
                        ) from None
                    time.sleep(0.25)
            yield base
        finally:
            try:
                for kernel in api(base, "/api/kernels") or []:
                    api(base, f"/api/kernels/{kernel['id']}", method="DELETE")
            except OSError:
                pass
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


#: JupyterLab's application object in the page (``--LabApp.expose_app_in_browser``)
APP = "window.jupyterapp"


def notebook_js(path: str) -> str:
    """A JavaScript expression for the open notebook panel of ``path`` (falsy until open)."""
    return (
        f"({APP} && Array.from({APP}.shell.widgets('main'))"
        f".find(w => w.context && w.context.path === '{path}'))"
    )


def kernel_idle(page, notebook: str, timeout: int = 90_000) -> None:
    """Wait until the kernel of ``notebook`` (a :func:`notebook_js` expression) is idle."""
    page.wait_for_function(
        f"() => {{ const w = {notebook}; const s = w && w.sessionContext &&"
        " w.sessionContext.session; return !!(s && s.kernel && s.kernel.status === 'idle'); }",
        timeout=timeout,
    )
