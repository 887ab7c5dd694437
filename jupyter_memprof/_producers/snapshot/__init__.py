"""The snapshot producer: a torch memory snapshot -> Capture.

Its input: a file torch's ``torch.cuda.memory._dump_snapshot`` wrote (or the
dict ``torch.cuda.memory._snapshot()`` returns) read into a
:class:`~jupyter_memprof._records.Capture`.

- :mod:`.unpickle`: the file read as plain data, never running code from it;
- :mod:`.frames`: each distinct Python stack read once (stacks are shared objects), with
  what it says: the innermost user frame and the context (forward, backward, optimizer...);
- :mod:`.blocks`: each block's size as the allocator counted it, from the recorded layout;
- :mod:`.read`: the snapshot dict checked and turned into records.
"""
