"""The thin ClientApp stays thin: every deployment message starts a fresh process that
imports it, so whatever it imports is paid once per message (the warm worker holds the rest)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "datasets", "omegaconf", "safetensors", "tokenizers")


def test_the_client_app_imports_none_of_the_heavy_libraries() -> None:
    probe = "import sys, json, client_app.app; "
    probe += f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
