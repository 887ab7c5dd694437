"""The one version number of jupyter_memprof (``labextension/package.json`` follows it)."""

__version__ = "0.1.0"
