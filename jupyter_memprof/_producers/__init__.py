"""Producers: a run of PyTorch code (or a file) -> records."""
