from pathlib import Path

import pytest

from client_app.node import node_setup
from dept.config import ConfigError, load_config
from tests.helpers import debug_run_config


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    (folder / "train.txt").write_text("text")
    (folder / "val.txt").write_text("text")
    return folder


def test_simulation_node_takes_its_source_by_partition(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path))
    setup = node_setup(cfg, {"partition-id": 2, "num-partitions": 4})
    assert setup.spec.name == setup.all_sources[2].name
    assert setup.state_root == tmp_path / "state"
    with pytest.raises(ConfigError, match="partition-id 7"):
        node_setup(cfg, {"partition-id": 7, "num-partitions": 8})


def test_deployment_node_config_defines_the_source(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path))
    folder = _folder(tmp_path)
    setup = node_setup(
        cfg,
        {
            "source": "de",
            "path": str(folder),
            "vocab-size": 512,
            "state-dir": str(tmp_path / "node"),
        },
    )
    assert (setup.spec.name, setup.spec.vocab_size) == ("de", 512)
    assert setup.state_root == tmp_path / "node"


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
        node_setup(cfg, config)


def test_spec_deployment_needs_the_shared_global_tokenizer(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path, variant="spec"))
    with pytest.raises(ConfigError, match="global-tokenizer"):
        node_setup(cfg, {"source": "de", "path": str(_folder(tmp_path))})
