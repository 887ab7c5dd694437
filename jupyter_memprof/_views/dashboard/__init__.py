"""The dashboard: linked Bokeh views of one profile.

Importing the package imports nothing else: the modules are imported by name, so that what
needs only the column helpers (the command line, the summary) does not pull in Bokeh.
"""
