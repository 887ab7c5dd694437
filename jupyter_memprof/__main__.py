"""``python -m jupyter_memprof``, the same as ``jupyter-memprof``."""

from ._cli.main import run

if __name__ == "__main__":
    run()
