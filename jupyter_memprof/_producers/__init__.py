"""Producers: turn a run of PyTorch code into the records the analysis consumes (see jupyter_memprof._records)."""
