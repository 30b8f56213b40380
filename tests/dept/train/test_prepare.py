"""What a source needs before it trains: a global tokenizer of the wrong size is refused by
name for every variant that uses one."""

from pathlib import Path

import pytest

from dept.config import load_config
from dept.data.sources import load_sources
from dept.data.vocab import train_tokenizer
from dept.train.prepare import prepare_source
from tests.helpers import debug_run_config


@pytest.mark.parametrize("variant", ["spec", "glob"])
def test_a_global_tokenizer_larger_than_global_vocab_size_is_refused(
    tmp_path: Path, variant: str
) -> None:
    text = ["the quick brown fox jumps over the lazy dog " * 20, "λόγος καὶ ἔργον " * 30] * 40
    big = train_tokenizer(text, 700, tmp_path / "tok")
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "train.txt").write_text("\n".join(text[:60]))
    (folder / "val.txt").write_text("\n".join(text[60:]))
    sources = tmp_path / "sources.yaml"
    sources.write_text(f"- {{name: tiny, path: '{folder}'}}\n")
    run_config = {"global-vocab-size": 300, "sources-file": str(sources)}
    cfg = load_config(debug_run_config(tmp_path, variant=variant, **run_config))
    [spec] = load_sources(sources)
    with pytest.raises(ValueError, match=rf"{big} has \d+ tokens, more than config key "):
        prepare_source(cfg, spec, tmp_path / "cache", [spec], global_tokenizer_file=big)
