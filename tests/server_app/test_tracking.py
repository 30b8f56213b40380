"""TensorBoard event files and W&B offline runs, read back, hold what metrics.jsonl holds."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import wandb
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import server_app.federation
from dept.config import ConfigError, load_config
from dept.train.local import lr_at
from dept_cli.in_process import federate_in_process
from server_app import tracking
from server_app.report import RunReport
from tests.command_examples import all_examples
from tests.helpers import (
    debug_run_config,
    in_own_network,
    needs_own_network,
    synthetic_sources,
    with_venv_on_path,
)

Scalars = dict[str, dict[int, float]]  # tag -> round -> value


class CheckpointCrash(RuntimeError):
    pass


def _config(tmp_path: Path, cache: Path, **overrides: Any) -> dict[str, Any]:
    sources = synthetic_sources(tmp_path, "latin", "greek")
    return debug_run_config(
        tmp_path,
        cache,
        **{"sources-file": str(sources), "local-steps": 2, "eval-bytes": 2048, **overrides},
    )


def _metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _expected(lines: list[dict[str, Any]], run_config: dict[str, Any]) -> Scalars:
    """What the trackers must hold: every number of metrics.jsonl, and the learning rates."""
    cfg = load_config(run_config)
    want: Scalars = {}
    for line in lines:
        r = line["round"]
        for key in ("avg_val_bpb", "bytes_up", "bytes_down", "sampled", "wall_s"):
            want.setdefault(f"round/{key}", {})[r] = line[key]
        for source, metrics in line["sources"].items():
            for key, value in metrics.items():
                if value is not None:  # null in metrics.jsonl: not measured this round
                    want.setdefault(f"{key}/{source}", {})[r] = value
        if r > 0:
            want.setdefault("lr/inner", {})[r] = lr_at(line["global_step"], cfg)
            want.setdefault("lr/outer", {})[r] = cfg.outer_lr
    return want


def _assert_holds(got: Scalars, want: Scalars) -> None:
    for tag in ("val_bpb/synth-latin", "train_loss/synth-greek", "tokens_per_s/synth-latin"):
        assert tag in want, tag  # the run measured what the test is about
    for tag, by_round in want.items():
        assert tag in got, f"{tag} not logged (logged: {sorted(got)})"
        assert got[tag] == pytest.approx(by_round, rel=1e-6), tag  # TensorBoard keeps float32


def _tensorboard(folder: Path) -> Scalars:
    """Each tag's values by step, as TensorBoard shows them (one value per step)."""
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    got: Scalars = {}
    for tag in events.Tags()["scalars"]:
        steps = [e.step for e in events.Scalars(tag)]
        assert len(steps) == len(set(steps)), f"{tag}: a round logged twice {steps}"
        got[tag] = {e.step: e.value for e in events.Scalars(tag)}
    return got


def _wandb_runs(wandb_dir: Path, run_id: str) -> list[dict[str, Any]]:
    """The offline runs of ``run_id``, in order: ``summary`` as ``wandb leet inspect`` gives
    it, and ``history`` (tag -> step -> value) from the run's records."""
    runs = []
    for folder in sorted((wandb_dir / "wandb").glob(f"offline-run-*-{run_id}")):
        log_file = str(folder / f"run-{run_id}.wandb")
        summary = json.loads(_inspect(log_file, "--summary", "--json"))
        history: Scalars = {}
        for text in _inspect(log_file, "--json").splitlines():
            record = json.loads(text)
            if record["type"] == "history":
                step = record["history"]["step"]["num"]
                for key, value in record["history"]["item"].items():
                    if not key.startswith("_"):  # W&B's own: _step, _runtime, _timestamp
                        history.setdefault(key, {})[step] = value
        runs.append({"summary": summary, "history": history})
    return runs


def _inspect(log_file: str, *options: str) -> str:
    command = [sys.executable, "-m", "wandb", "leet", "inspect", *options, log_file]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """W&B without network or login: offline runs under the yielded folder. W&B reads its
    environment once per process: the test starts and ends with a fresh W&B."""
    folder = tmp_path / "wandb-home"
    folder.mkdir()
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(folder),
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(folder / "config"),
        "WANDB_CACHE_DIR": str(folder / "cache"),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    wandb.teardown()
    yield folder
    wandb.teardown()  # also stops the service process W&B started


@pytest.mark.slow  # a run, then W&B's own service and reader: 9 s of the fast tier's 150
def test_tensorboard_and_wandb_hold_every_round_of_metrics_jsonl(
    tmp_path: Path, wandb_offline: Path, node_cache: Path
) -> None:
    # Prepare
    run_config = _config(tmp_path, node_cache, tensorboard=True, **{"wandb-project": "dept-test"})
    # Execute
    out = federate_in_process(run_config)
    # Assert
    lines = _metrics(out)
    assert [line["round"] for line in lines] == [0, 1, 2]
    want = _expected(lines, run_config)
    _assert_holds(_tensorboard(out / "tensorboard"), want)
    run_id = json.loads((out / "summary.json").read_text())["run_id"]
    [run] = _wandb_runs(wandb_offline, run_id)
    _assert_holds(run["history"], want)
    assert run["summary"]["state"] == "finished" and run["summary"]["exit_code"] == 0
    assert run["summary"]["name"] == run_id and run["summary"]["project"] == "dept-test"
    assert run["summary"]["config"]["variant"] == run_config["variant"], "the run config"


@pytest.mark.slow
def test_a_resumed_run_goes_on_in_the_same_folder_and_w_and_b_run(
    tmp_path: Path, wandb_offline: Path, monkeypatch: pytest.MonkeyPatch, node_cache: Path
) -> None:
    # Prepare: a one-round run that dies after logging round 1, before its checkpoint
    run_config = _config(
        tmp_path,
        node_cache,
        tensorboard=True,
        **{"wandb-project": "dept-test", "num-server-rounds": 1},
    )
    save = server_app.federation.save_checkpoint

    def save_but_round_1(out_dir: Path, server_round: int, *args: Any) -> None:
        if server_round == 1:
            raise CheckpointCrash("killed while checkpointing round 1")
        save(out_dir, server_round, *args)

    monkeypatch.setattr(server_app.federation, "save_checkpoint", save_but_round_1)
    with pytest.raises(CheckpointCrash):
        federate_in_process(run_config)
    monkeypatch.setattr(server_app.federation, "save_checkpoint", save)
    # resumed as printed (dept run --resume), without WANDB_MODE: offline still, as it began
    monkeypatch.delenv("WANDB_MODE")
    wandb.teardown()  # W&B reads its environment once per process
    # W&B names an offline run's folder by the second it started and the run id: an attempt
    # resumed within the same second (only a test is that quick) would share the first's.
    time.sleep(1.01 - time.time() % 1)
    # Execute: round 1 again, from round 0's checkpoint
    out = federate_in_process({**run_config, "resume": True})
    # Assert: one folder, each round once, the resumed attempt's round 1
    want = _expected(_metrics(out), run_config)
    assert not (out / "previous").exists(), "nothing moved aside"
    assert len(list((out / "tensorboard").iterdir())) == 2, "one event file per attempt"
    _assert_holds(_tensorboard(out / "tensorboard"), want)
    run_id = json.loads((out / "summary.json").read_text())["run_id"]
    failed, resumed = _wandb_runs(wandb_offline, run_id)
    assert failed["summary"]["exit_code"] == 1, "the failed attempt closed its run as failed"
    assert set(failed["history"]["round/avg_val_bpb"]) == {0, 1}
    assert resumed["summary"]["exit_code"] == 0
    assert set(resumed["history"]["round/avg_val_bpb"]) == {1}, "the rounds after round 0"
    assert resumed["history"]["round/avg_val_bpb"][1] == want["round/avg_val_bpb"][1]


@pytest.mark.parametrize(
    ("key", "value", "package"),
    [
        ("tensorboard", True, "tensorboard"),
        ("wandb-project", "dept", "wandb"),
    ],
)
def test_a_tracker_without_its_package_fails_the_config_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: Any, package: str
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # what an uninstalled package looks like

    with pytest.raises(ConfigError) as caught:
        load_config(debug_run_config(tmp_path, **{key: value}))

    message = str(caught.value)
    assert f"'{key}'" in message and f'pip install -e ".[{package}]"' in message
    assert "\n" not in message


def test_no_tracker_is_on_by_default(tmp_path: Path, wandb_offline: Path) -> None:
    report = RunReport(tmp_path / "out", load_config(debug_run_config(tmp_path)), "run1")

    assert report.trackers.open == []
    assert not (tmp_path / "out" / "tensorboard").exists()
    assert not (wandb_offline / "wandb").exists() and not (tmp_path / "out" / "wandb").exists()


def test_a_tracker_that_cannot_open_closes_those_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[bool] = []
    monkeypatch.setattr(tracking.TensorBoard, "close", lambda self, failed: closed.append(failed))

    def unreachable(*args: Any) -> None:
        raise ConnectionError("W&B is unreachable")

    monkeypatch.setattr(tracking, "WandbRun", unreachable)
    cfg = load_config(debug_run_config(tmp_path, tensorboard=True, **{"wandb-project": "x"}))

    with pytest.raises(ConnectionError):
        tracking.Trackers(cfg, tmp_path, "run1", resumed_after=-1)

    assert closed == [True], "TensorBoard, opened first, closed as failed"


# What the viewer serves a browser: the tags of each run it found under --logdir.
FETCH_TAGS = """python - <<'PY'
import time, urllib.request
for _ in range(300):
    try:
        url = 'http://localhost:6006/data/plugin/scalars/tags'
        print(urllib.request.urlopen(url).read().decode())
        break
    except OSError:
        time.sleep(0.2)
PY"""


@needs_own_network  # the viewer listens on its fixed port 6006
def test_the_docs_viewer_line_serves_a_runs_scalars(tmp_path: Path) -> None:
    # Prepare: event files where a run of docs/outputs.md's example writes them
    board = tracking.TensorBoard(tmp_path / "outputs" / "dept" / tracking.TENSORBOARD_DIR, -1)
    board.log({"round/avg_val_bpb": 2.0, "val_bpb/synth-latin": 2.3}, step=0)
    board.log({"round/avg_val_bpb": 1.5}, step=1)
    board.close(failed=False)
    (viewer,) = [c for c in all_examples() if c.startswith("tensorboard --logdir")]
    # Execute: the line as printed, until it serves
    done = subprocess.run(
        in_own_network(f"{viewer} &", FETCH_TAGS, "kill %1"),
        cwd=tmp_path,
        env=with_venv_on_path(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Assert
    assert done.returncode == 0, done.stderr[-3000:]
    tags = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(tags["."]) == {"round/avg_val_bpb", "val_bpb/synth-latin"}, tags
