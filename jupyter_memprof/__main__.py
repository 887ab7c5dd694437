"""``python -m jupyter_memprof``: the ``jupyter-memprof`` command (docs/cli.md)."""

from ._cli.main import run

if __name__ == "__main__":
    run()
