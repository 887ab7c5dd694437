"""Sphinx configuration of the jupyter_memprof documentation (``make docs``).

Sphinx with MyST (Markdown pages), myst-nb (the notebooks, rendered with the outputs they
were saved with: nothing is executed here, nbval runs them in ``make test``), autodoc and
napoleon (the API reference from the NumPy-style docstrings) and the furo theme. The build is
offline and treats warnings as errors (``-W`` in the Makefile).
"""

import os
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(DOCS))  # this checkout's jupyter_memprof
sys.path.insert(0, os.path.join(DOCS, "_ext"))

from jupyter_memprof import __version__  # noqa: E402

project = "jupyter_memprof"
author = "the jupyter_memprof developers"
copyright = "the jupyter_memprof developers"
release = version = __version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "memprof_docs",
]

source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "**/.ipynb_checkpoints", "Thumbs.db", ".DS_Store"]

# MyST: GitHub-style anchors for headings, so links such as tables.md#the-baseline work on
# GitHub and here alike.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]

# myst-nb: render the stored outputs, never run a notebook while building the site.
nb_execution_mode = "off"
nb_merge_streams = True
# The dashboards are Bokeh widgets whose state lives in the kernel: a saved notebook keeps
# their text/plain fallback and the summary's HTML. BokehJS's load message has no renderer
# and nothing to show, so it is dropped without a warning.
suppress_warnings = ["mystnb.unknown_mime_type"]
nb_mime_priority_overrides = [
    ("html", "application/vnd.jupyter.widget-view+json", None),
]

# autodoc + napoleon: NumPy-style docstrings; signatures as written, types from them.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"exclude-members": "__init__, __weakref__, __dict__, __module__"}
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

html_theme = "furo"
html_title = f"jupyter_memprof {version}"
html_static_path = []
html_show_sourcelink = False
