"""What a node keeps on disk between messages: its workspace of caches and per-round state
(:mod:`.workspace`), files written whole or not at all and checked by digest
(:mod:`.files`), and the lock that keeps two runs out of one folder (:mod:`.lock`). May
import :mod:`dept.paths`, :mod:`dept.model`, :mod:`dept.config` and :mod:`dept.data`."""
