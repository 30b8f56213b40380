"""``dept run``'s help, its refusal of a bad setting and its checks before a run stay quick:
reading the run config and the ``model`` value, checking the sources and sizing a preset's
run import neither Transformers (a preset is checked and sized from its own numbers: the
Llama config class alone took 1.7 s, through Transformers' integrations) nor ``datasets``
(0.8 s), and on a machine without GPU device files no torch (1 s). Only a model given as a
config file is built (on the meta device) to be sized."""

from __future__ import annotations

import json
import subprocess
import sys

from dept.train.device_kind import accelerator_possible

HEAVY = ("transformers", "datasets", *(() if accelerator_possible() else ("torch",)))
PROBE = f"""
import json, sys
HEAVY = {HEAVY!r}
import server_app.launch as launch
from dept.config import load_config
from dept.data.sources import check_source_paths, run_sources
from server_app.sizing import check_fits_here
for model in ("tiny", "gpt2:tiny"):
    cfg = load_config(launch.app_defaults(launch.project_dir()), overrides={{"model": model}})
    sources = run_sources(cfg)
    check_source_paths(sources)
    check_fits_here(cfg, sources)
print(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))
"""


def test_checking_and_sizing_a_run_imports_no_heavy_library() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
