import numpy as np
import pytest

import dept.train.evaluate
from dept.train.evaluate import byte_prefix


def test_the_byte_prefix_is_found_across_scan_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scanning a chunk at a time cuts where one cumulative sum over the stream would."""
    token_bytes = np.arange(1, 9, dtype=np.int64)
    tokens = np.random.default_rng(0).integers(0, 8, size=500).astype(np.uint16)
    covered = np.cumsum(token_bytes[tokens[1:]])
    monkeypatch.setattr(dept.train.evaluate, "SCAN_CHUNK", 16)
    for max_bytes in (1, 15, 16, 17, 800, int(covered[-1]), int(covered[-1]) + 1):
        targets = int(np.searchsorted(covered, max_bytes)) + 1
        assert np.array_equal(byte_prefix(tokens, token_bytes, max_bytes), tokens[: targets + 1])
