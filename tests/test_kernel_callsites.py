"""The callsite of every op on a ``%%memprofile`` cell's own top level, in a real ipykernel
(whose cells compile under /tmp/ipykernel_<pid>/<hash>.py, not IPython's <ipython-input-N>)
as in IPython."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(kc, code: str) -> str:
    out = []
    kc.execute(code)
    while True:
        msg = kc.get_iopub_msg(timeout=120)
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            out.append(content["text"])
        elif kind == "error":
            raise AssertionError("\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(out)


def test_top_level_ops_of_a_cell_have_their_line_in_a_real_kernel(tmp_path):
    from jupyter_client.manager import start_new_kernel

    env = {**os.environ, "PYTHONPATH": ROOT}
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path), env=env)
    try:
        _run(kc, "import torch\n%load_ext jupyter_memprof")
        _run(kc, "%%memprofile -o p\na = torch.ones(64, 64)\nb = a @ a\nc = b * 2\n")
        got = _run(
            kc,
            "import IPython\n"
            "print(type(IPython.get_ipython().compile).__module__)\n"
            "top = p.ops[p.ops['depth'] == 0]\n"
            "for n, c in zip(top['name'], top['callsite']): print(n, '|', c)\n",
        )
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    lines = got.splitlines()
    assert lines[0] == "ipykernel.compiler"  # the kernel's own compiler, its own file names
    calls = dict(line.split(" | ") for line in lines[1:])
    # line 1 is the magic's: the cell's lines as the user sees them
    assert calls == {
        "aten::ones": "In[2]:2 in <module>",
        "aten::matmul": "In[2]:3 in <module>",
        "aten::mul": "In[2]:4 in <module>",
    }
