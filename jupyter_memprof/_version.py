"""The one version number; ``labextension/package.json`` follows."""

__version__ = "0.1.0"
