import re
import tomllib
from pathlib import Path
from typing import Any, get_args

import pytest
import torch

from dept.config import (
    CompressionName,
    ConfigError,
    config_keys,
    load_config,
    reference,
    to_run_config,
)
from dept.data.sources import check_source_paths, load_sources
from dept.model.outer_optimizers import OUTER_OPTIMIZERS, OuterName
from dept.model.variants import VARIANTS, VariantName
from dept.paths import resolve_path
from dept.train.local import lr_at
from dept.wire.compression import decode, encode
from tests.helpers import debug_run_config

ROOT = Path(__file__).resolve().parents[3]
README_ROW = re.compile(r"^\| `([a-z0-9-]+)` \| `([^`]*)` \| (.*) \|$")


def test_defaults_round_trip(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path))
    assert load_config(to_run_config(cfg)) == cfg
    assert cfg.total_steps == cfg.num_server_rounds * cfg.local_steps


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"local-stepz": 3}, "local-stepz"),
        ({"local-steps": "many"}, "local-steps"),
        ({"local-steps": 0}, "local-steps"),
        ({"variant": "fedavg"}, "variant"),
        ({"model": "7b"}, "model"),
        ({"outer-optimizer": "adam"}, "outer-optimizer"),
        ({"fraction-train": 1.5}, "fraction-train"),
        ({"outer-momentum": 1.0}, "outer-momentum"),
        ({"outer-optimizer": "nesterov", "outer-momentum": 0.0}, "outer-momentum"),
        ({"seed": -1}, "seed"),
        ({"compression": "int3"}, "^config key 'compression': Invalid value 'int3'"),
        ({"topk-density": 0.0}, r"'topk-density' must be in \(0, 1\]"),
        ({"topk-density": 1.5}, r"'topk-density' must be in \(0, 1\]"),
        ({"device": "gpu"}, r"^config key 'device' is 'gpu': use auto, cpu, cuda, cuda:N or mps$"),
        ({"device": "cuda:x"}, r"^config key 'device' is 'cuda:x': use auto"),
        ({"aggregation": "avg"}, "^config key 'aggregation': Invalid value 'avg'"),
        ({"outlier-action": "drop"}, "^config key 'outlier-action': Invalid value 'drop'"),
        ({"compression-error-feedback": "maybe"}, "compression-error-feedback"),
        ({"lr": float("inf")}, "'lr' must be finite"),
        ({"lr": "0.01"}, r"^config key 'lr' is the string '0\.01'; write it as a number"),
        ({"local-steps": "7"}, "^config key 'local-steps' is the string '7'"),
        ({"resume": "true"}, "'resume' is the string 'true'; write it as a true/false"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, override: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named) as raised:
        load_config(debug_run_config(tmp_path, **override))
    assert "\n" not in str(raised.value)


def test_yaml_layer_and_overrides(tmp_path: Path) -> None:
    layer = tmp_path / "run.yaml"
    layer.write_text("local-steps: 7\nlr: 1e-2\nweight-decay: 5.0E-2\n")  # YAML 1.2 floats
    assert load_config(debug_run_config(tmp_path), layer).weight_decay == 0.05
    cfg = load_config(debug_run_config(tmp_path), layer, {"lr": 0.02})
    assert (cfg.local_steps, cfg.lr) == (7, 0.02)
    layer.write_text("local_steps: 7\n")
    with pytest.raises(ConfigError, match="local_steps"):
        load_config(debug_run_config(tmp_path), layer)


def test_a_warmup_longer_than_the_run_is_clamped(tmp_path: Path) -> None:
    overrides = {"num-server-rounds": 1, "local-steps": 3, "warmup-steps": 10}
    cfg = load_config(debug_run_config(tmp_path, **overrides))
    assert (cfg.warmup_steps, cfg.warmup, cfg.total_steps) == (10, 2, 3)
    assert [lr_at(step, cfg) for step in range(3)] == [cfg.lr / 2, cfg.lr, cfg.lr]


def test_relative_paths_resolve_against_dept_home(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DEPT_HOME", str(tmp_path))
    assert resolve_path("runs/a") == tmp_path / "runs" / "a"
    assert resolve_path("/abs/x") == Path("/abs/x")


def test_sources_file_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    data = tmp_path / "data" / "de"
    data.mkdir(parents=True)
    (data / "train.txt").write_text("a")
    (data / "val.txt").write_text("b")
    sources = tmp_path / "cfg" / "sources.yaml"
    sources.parent.mkdir()
    sources.write_text("sources:\n  - name: de\n    path: ../data/de\n    vocab-size: 512\n")
    [spec] = load_sources(sources)
    assert Path(spec.path) == data.resolve() and spec.kind == "dir" and spec.vocab_size == 512
    check_source_paths([spec])
    (data / "val.txt").unlink()
    with pytest.raises(ConfigError, match=r"'de'.*val\.txt"):
        check_source_paths([spec])


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("- name: a\n  path: x\n- name: a\n  path: y\n", "duplicate names a"),
        ("- name: a\n  path: x\n  vocab-size: 10\n", "vocab-size"),
        ("- name: a\n  path: x\n  colour: red\n", "colour"),
        ("- name: 'bad name'\n  path: x\n", "name"),
        ("- name: a\n", "path"),
        ("{}\n", "non-empty list"),
    ],
)
def test_bad_sources_files(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=named):
        load_sources(path)


def test_missing_sources_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sources-file"):
        load_sources(tmp_path / "nope.yaml")


def test_default_sources_are_offline_builtins() -> None:
    specs = load_sources(None)
    assert len(specs) >= 4 and all(s.kind == "builtin" for s in specs)


def test_the_reference_page_lists_every_key_with_its_default_and_doc() -> None:
    page = reference.PAGE.read_text(encoding="utf-8")
    section = page.split(reference.BEGIN, 1)[1].split(reference.END, 1)[0]
    table = {m[1]: (m[2], m[3]) for line in section.splitlines() if (m := README_ROW.match(line))}
    schema = {k.key: (k.shown_default, k.doc) for k in config_keys()}
    assert table == schema
    assert reference.main(["--check"]) == 0, "regenerate: python -m dept.config.reference"


def test_pyproject_defaults_are_the_schema_defaults() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    defaults: dict[str, Any] = pyproject["tool"]["flwr"]["app"]["config"]
    assert defaults == {k.key: k.default for k in config_keys()}


def test_variant_choices_are_the_registered_variants() -> None:
    assert set(get_args(VariantName)) == set(VARIANTS)


def test_outer_optimizer_choices_are_the_registered_optimizers() -> None:
    assert set(get_args(OuterName)) == set(OUTER_OPTIMIZERS)


@pytest.mark.parametrize("kind", get_args(CompressionName))
def test_every_compression_choice_encodes_and_decodes(kind: str) -> None:
    delta = {"w": torch.linspace(-1, 1, 300).reshape(3, 100)}
    decoded = decode(encode(delta, kind), {"w": (3, 100)}, kind)["w"]
    assert decoded.dtype == torch.float32 and decoded.shape == (3, 100)
    # every codec sends the largest values as they are (error bounds: test_compression)
    assert torch.allclose(decoded[[0, -1], [0, -1]], delta["w"][[0, -1], [0, -1]])
    assert (decoded - delta["w"]).abs().max() < delta["w"].abs().max()


def test_choice_keys_show_their_choices() -> None:
    kinds = {k.key: k.kind for k in config_keys()}
    assert kinds["variant"] == "|".join(get_args(VariantName))
    assert kinds["compression"] == "none|fp16|int8|int4|int2|ternary|topk"
    assert kinds["device"] == "str"  # auto, cpu, cuda, cuda:N or mps: checked by pattern


def test_an_unknown_key_is_named_with_the_closest_known_one(tmp_path: Path) -> None:
    run_config = {**debug_run_config(tmp_path), "num-server-round": 3, "zzz": 1}
    with pytest.raises(ConfigError) as refused:
        load_config(run_config)
    assert str(refused.value) == (
        "config: unknown key(s) num-server-round (did you mean num-server-rounds?), zzz; "
        "keys are kebab-case, listed by dept run --help"
    )
