"""CUDA's caching allocator, modelled.

Its parts: the model (:mod:`.model`, the front door), its settings
(:mod:`.config`), one device's state (:mod:`.state`) and the replay loops (:mod:`.fast`,
:mod:`.repeat`)."""
