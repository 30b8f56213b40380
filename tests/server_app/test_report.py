from pathlib import Path

from dept.config import load_config
from server_app.report import RunReport
from tests.helpers import debug_run_config


def test_a_new_run_keeps_the_previous_runs_files(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path))
    out = tmp_path / "out"
    RunReport(out, cfg, "run1")
    (out / "summary.json").write_text('{"earlier": true}')

    RunReport(out, cfg, "run1")

    [archived] = (out / "previous").iterdir()
    assert (archived / "summary.json").read_text() == '{"earlier": true}'
    assert not (out / "summary.json").exists() and (out / "config.json").exists()
