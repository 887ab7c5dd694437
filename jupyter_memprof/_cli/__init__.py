"""Front ends outside the notebook: the command, pytest, MCP.

They are the ``jupyter-memprof`` command (:mod:`.main`), the
documents its ``--json`` prints (:mod:`.schema`, :mod:`.report`), the functions it runs by
import path (:mod:`.target`), the pytest plugin's work (:mod:`.budget`) and the MCP server
(:mod:`.mcp_server`). See docs/cli.md."""
