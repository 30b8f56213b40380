"""A source's local work: the inner loop, its schedule and bounds (:mod:`.local`),
evaluation in bits per byte (:mod:`.evaluate`), what a variant shares (:mod:`.sharing`), the
whole client side of a round (:mod:`.source_client`) and a source made ready for it
(:mod:`.prepare`), training on several processes
(:mod:`.distributed`, :mod:`.ranks`, :mod:`.rank_worker`), the devices (:mod:`.devices`), what
fits (:mod:`.budget`) and the STD and ACT baselines (:mod:`.baselines`). May import every room
before it."""
