"""``dept run``'s help, its refusal of a bad setting and its checks before a run stay quick:
reading the run config and the ``model`` value, checking the sources and sizing a preset's
run import no model code (Transformers' model classes pull in most of torch and
Transformers: 2 s of 4.6 on 2 cores) and no ``datasets`` (0.8 s). Only a model given as a
config file is built (on the meta device) to be sized."""

from __future__ import annotations

import json
import subprocess
import sys

MODEL_CODE = (
    "transformers.modeling_utils",
    "transformers.masking_utils",
    "transformers.models.llama.modeling_llama",
    "transformers.models.gpt2.modeling_gpt2",
    "datasets",
)
PROBE = f"""
import json, sys
MODEL_CODE = {MODEL_CODE!r}
import server_app.launch as launch
from dept.config import load_config
from dept.data.sources import check_source_paths, run_sources
from server_app.sizing import check_fits_here
for model in ("tiny", "gpt2:tiny"):
    cfg = load_config(launch.app_defaults(launch.project_dir()), overrides={{"model": model}})
    sources = run_sources(cfg)
    check_source_paths(sources)
    check_fits_here(cfg, sources)
print(json.dumps(sorted(m for m in MODEL_CODE if m in sys.modules)))
"""


def test_checking_and_sizing_a_run_imports_no_model_code() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
