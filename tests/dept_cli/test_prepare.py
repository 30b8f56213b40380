"""``dept prepare``: a node's sources tokenized ahead of a run, found again by its client."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest

from dept.config import load_config
from dept.data.sources import load_sources
from dept.data.synthetic import ensure_synthetic_corpus
from dept.state.workspace import Workspace
from dept.train.source_client import SourceClient
from dept_cli import main as dept
from dept_cli import prepare
from dept_cli.main import main
from dept_cli.prepare import prepare_node
from tests.helpers import debug_run_config, synthetic_sources


def test_the_client_finds_what_prepare_made(tmp_path: Path) -> None:
    sources = synthetic_sources(tmp_path, "latin", "greek")
    cfg = load_config(debug_run_config(tmp_path, variant="spec", **{"sources-file": str(sources)}))
    prepared = prepare_node(cfg, {"partition-id": 0, "num-partitions": 1})
    assert [p.spec.name for p in prepared] == ["synth-latin", "synth-greek"]
    cache = Path(cfg.state_dir) / "cache" / "tokens"
    folders = sorted(cache.glob("*/tokens-*/meta.json"))
    assert len(folders) == 2 and len({p.source.tokenizer_file for p in prepared}) == 1, "global"
    specs = load_sources(sources)
    client = SourceClient(
        cfg, specs[1], Workspace(Path(cfg.state_dir), "run1", "synth-greek"), specs
    )
    assert sorted(cache.glob("*/tokens-*/meta.json")) == folders, "nothing tokenized again"
    assert np.array_equal(client.tokens.train, prepared[1].source.tokens.train)


def test_a_deployment_node_config_prepares_its_one_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = ensure_synthetic_corpus("cyrillic", 0, tmp_path / "data", train_bytes=30_000)
    state = tmp_path / "node-state"
    node = f'source="cyr" path="{folder}" vocab-size=400 state-dir="{state}"'
    code = main(["prepare", "-c", "variant='spec-opt' model='debug'", "--node-config", node])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("cyr: ") and "(uint16)" in out
    assert list((state / "cache" / "tokens" / "cyr").glob("tokens-*/train.bin"))


def test_an_unknown_source_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sources = synthetic_sources(tmp_path, "latin")
    overrides = f"sources-file='{sources}' state-dir='{tmp_path / 'state'}'"
    assert main(["prepare", "-c", overrides, "--source", "nope"]) == 2
    assert "--source nope: the node serves synth-latin" in capsys.readouterr().err
    assert main(["prepare", "--node-config", "source=a path"]) == 2
    refused = capsys.readouterr().err
    assert refused.startswith("dept prepare: error: --node-config: source=a: a string needs quotes")
    assert "path: not a key=value pair" in refused


@pytest.mark.slow  # the default run's four sources, tokenized from nothing
def test_the_help_examples_run_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prepare: a user's folder with the my-sources.yaml the example names; no /data/de
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))  # the default state-dir
    corpus = ensure_synthetic_corpus("latin", 0, tmp_path / "data", train_bytes=30_000)
    (tmp_path / "my-sources.yaml").write_text(
        f"- {{name: de-novels, path: '{corpus}', vocab-size: 400}}\n"
    )
    printed = (prepare.EXAMPLES + dept.EXAMPLES).splitlines()
    examples = [line.split("#")[0].strip() for line in printed if "dept prepare" in line]
    # Execute
    ran = []
    for example in examples:
        code = main(shlex.split(example)[1:])
        ran.append((code, *capsys.readouterr()))
    # Assert
    (every, one, node, node_short) = ran
    assert every[0] == 0 and [line.split(":")[0] for line in every[1].splitlines()] == [
        "python-stdlib",
        "synth-latin",
        "synth-cyrillic",
        "synth-greek",
    ]
    assert list((tmp_path / "home-cache" / "dept" / "cache" / "tokens").iterdir())
    assert one[0] == 0 and one[1].startswith("de-novels: ") and one[1].count("\n") == 1
    for code, out, err in (node, node_short):  # the data is where the user will put it
        assert (code, out) == (2, "")
        assert err == "dept prepare: error: source 'de': no file matches /data/de\n"
