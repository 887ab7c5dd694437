"""Front ends: the public profile() context manager, the IPython magic, the JupyterLab comm and the session registry."""
