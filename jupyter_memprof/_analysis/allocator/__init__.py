"""CUDA's caching allocator, modelled (:mod:`.model` is the front).

The CUDA caching allocator's model (:mod:`.model` is the front door): its settings
(:mod:`.config`), one device's state (:mod:`.state`) and the replay loops (:mod:`.fast`,
:mod:`.repeat`)."""
