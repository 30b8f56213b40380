from pathlib import Path

import pytest

from client_app.node import node_setup, served_sources
from dept.config import ConfigError, load_config
from dept.data.sources import load_sources
from tests.helpers import debug_run_config


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    (folder / "train.txt").write_text("text")
    (folder / "val.txt").write_text("text")
    return folder


@pytest.mark.parametrize(
    ("partition", "partitions", "expected"),
    [(2, 4, [2]), (0, 2, [0, 2]), (1, 2, [1, 3]), (5, 6, [])],
)
def test_simulation_nodes_share_the_sources_round_robin(
    tmp_path: Path, partition: int, partitions: int, expected: list[int]
) -> None:
    cfg = load_config(debug_run_config(tmp_path))
    names = [s.name for s in load_sources(None)]
    node = {"partition-id": partition, "num-partitions": partitions}
    served, known = served_sources(cfg, node)
    assert [s.name for s in served] == [names[i] for i in expected]
    assert [s.name for s in known] == names
    if expected:
        setup = node_setup(cfg, node, names[expected[-1]])
        assert setup.spec.name == names[expected[-1]] and setup.state_root == tmp_path / "state"
    with pytest.raises(ConfigError, match="does not serve source 'nope'"):
        node_setup(cfg, node, "nope")


def test_deployment_node_config_defines_the_source(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path))
    folder = _folder(tmp_path)
    node = {
        "source": "de",
        "path": str(folder),
        "vocab-size": 512,
        "state-dir": str(tmp_path / "n"),
    }
    setup = node_setup(cfg, node, "de")
    assert (setup.spec.name, setup.spec.vocab_size) == ("de", 512)
    assert setup.state_root == tmp_path / "n"


@pytest.mark.parametrize(
    ("node_config", "named"),
    [
        ({"source": "de", "path": "/no/such/dir"}, "no file matches /no/such/dir"),
        ({"source": "de", "path": "{folder}", "colour": "red"}, "colour"),
        ({}, "neither 'source'"),
    ],
)
def test_bad_node_configs_name_the_problem(tmp_path: Path, node_config: dict, named: str) -> None:
    cfg = load_config(debug_run_config(tmp_path))
    config = {
        k: v.format(folder=_folder(tmp_path)) if isinstance(v, str) else v
        for k, v in node_config.items()
    }
    with pytest.raises(ConfigError, match=named):
        served_sources(cfg, config)


def test_spec_deployment_needs_the_shared_global_tokenizer(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path, variant="spec"))
    with pytest.raises(ConfigError, match="global-tokenizer"):
        served_sources(cfg, {"source": "de", "path": str(_folder(tmp_path))})


def test_a_nodes_own_budget_and_delay_win_over_the_runs(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path, **{"round-time-s": 30.0}))
    node = {"partition-id": 0, "num-partitions": 1, "round-time-s": 5, "step-delay-s": "0.25"}

    own = node_setup(cfg, node, "python-stdlib").own_config(cfg)
    plain = node_setup(cfg, {"partition-id": 0}, "python-stdlib").own_config(cfg)

    assert (own.round_time_s, own.step_delay_s) == (5.0, 0.25)
    assert plain == cfg


@pytest.mark.parametrize(("key", "value"), [("round-time-s", -1), ("step-delay-s", "slow")])
def test_bad_node_seconds_name_their_key_before_any_training(
    tmp_path: Path, key: str, value: object
) -> None:
    cfg = load_config(debug_run_config(tmp_path))
    node = {"source": "de", "path": str(_folder(tmp_path)), key: value}

    with pytest.raises(ConfigError, match=f"node config key '{key}' is {value!r}"):
        served_sources(cfg, node)  # the discovery query's check, before the first round
