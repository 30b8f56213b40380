"""DEPT's core: everything a run computes, and nothing of Flower.

Its rooms, each importing only those listed before it (``tests/test_rooms.py`` holds them to
it): :mod:`dept.paths` (where a node's state lives, light enough for every message),
:mod:`dept.wire` (what travels between server and nodes), :mod:`dept.model` (the families,
variants and outer optimizers: the tables), :mod:`dept.config` (the run's schema),
:mod:`dept.data` (a source's text to token streams), :mod:`dept.state` (what a node keeps on
disk) and :mod:`dept.train` (a source's local work); then the helpers of the commands,
:mod:`dept.cli_help` and :mod:`dept.logs`, and the tools, each of its own: :mod:`dept.export`
and :mod:`dept.certificates`.
"""
