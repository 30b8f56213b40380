"""What travels between the server and the nodes, known to both sides: the message contract
(:mod:`.keys`), the codecs of pseudo-gradients (:mod:`.compression`) and partial
synchronisation's fragments (:mod:`.fragments`). Imports nothing else of the core."""
