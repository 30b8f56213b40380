"""A source's text, from where it is declared to the token stream it trains on: sources and
their checks (:mod:`.sources`, :mod:`.text_checks`), the built-in synthetic languages
(:mod:`.synthetic`), loading and packing (:mod:`.corpus`, :mod:`.arrow_text`,
:mod:`.shards`), tokenizers and vocabularies (:mod:`.vocab`), content fingerprints
(:mod:`.fingerprint`). May import :mod:`dept.paths`, :mod:`dept.model` and
:mod:`dept.config`."""
