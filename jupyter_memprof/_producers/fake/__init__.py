"""Estimate mode's producer: a step run on fake tensors.

:mod:`.copy` makes the fake copies of what the step touches, :mod:`.modes` the dispatch modes,
:mod:`.recorder` the records, :mod:`.changes` the what-if changes, :mod:`.known`/:mod:`.values`
the values a fake run cannot compute, :mod:`.state` what is restored afterwards and
:mod:`.dist` the fake process group.
"""
