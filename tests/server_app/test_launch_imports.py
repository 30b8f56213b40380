"""``dept run``'s help and its refusal of a bad setting stay quick: reading the run config
and the ``model`` value imports no model code. Transformers' model classes pull in most of
torch and Transformers (2 s of 4.6 on 2 cores); only sizing the run, once every setting
is known good, builds a model (on the meta device) and needs them."""

from __future__ import annotations

import json
import subprocess
import sys

MODEL_CODE = (
    "transformers.modeling_utils",
    "transformers.masking_utils",
    "transformers.models.llama.modeling_llama",
    "transformers.models.gpt2.modeling_gpt2",
)
PROBE = f"""
import json, sys
MODEL_CODE = {MODEL_CODE!r}
import server_app.launch as launch
from dept.config import load_config
from dept.data.sources import check_source_paths, run_sources
for model in ("tiny", "gpt2:tiny"):
    cfg = load_config(launch.app_defaults(launch.project_dir()), overrides={{"model": model}})
    check_source_paths(run_sources(cfg))
print(json.dumps(sorted(m for m in MODEL_CODE if m in sys.modules)))
"""


def test_checking_the_settings_imports_no_model_code() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
