"""The ``dept`` command and the experiments it runs (compare, continued pre-training) that
drive the federation in process."""
