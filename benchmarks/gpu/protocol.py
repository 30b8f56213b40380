"""The paper's regime, shrunk to about 8 minutes on one H100-class GPU: does DEPT beat STD there?

    python -m benchmarks.gpu.protocol            # 125m, 4 corpora, seq 2048, the authors' settings
    python -m benchmarks.gpu.protocol --smoke    # the same pipeline at debug size, on any CPU

Runs ``dept compare`` (STD τ=0, GLOB, SPEC, SPEC-OPT by default) with the inner and outer
settings of the authors' own configs, which differ from this project's defaults:

- inner decoupled AdamW, weight decay 0, lr 6e-4 (their 125m rate), clipping 1.0, cosine to
  0.1 of the peak, the inner optimizer reset every round;
- outer Nesterov, lr 0.7, momentum 0.7;
- sequences of 2048 tokens.

Shrunk to fit: 8 sequences per source per step (their global batch is 256-512), 40 local steps
a round (theirs: 500), 5 rounds, warmup 20 steps (theirs: 100 batches of a far longer run), on
four sources of ``../shared/corpora``: 4 x 8 x 2048 x 200 = 13.1M training tokens per method,
about 60-90 s each at the 150-250k tokens/s a 125m body trains at in bf16 on an H100 (the
figure ``benchmarks.gpu.training`` measures), plus evaluation. Results go to ``--out``
(``comparison.md``/``.json``/``.png``, as ``dept compare`` writes them).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.measure import CORPORA
from dept.data.sources import load_sources, write_sources
from dept_cli import compare

SOURCES = ("en-shakespeare", "de-novels", "code-python", "zh-techdoc")
AUTHORS = "weight-decay=0.0 keep-inner-optimizer=false grad-clip=1.0 min-lr-ratio=0.1"
# (model, seq-len, batch-size, local-steps, rounds, warmup, eval-bytes, lr)
SHAPES = {
    "gpu": ("125m", 2048, 8, 40, 5, 20, 65536, 6e-4),
    "smoke": ("debug", 64, 2, 3, 2, 1, 2048, 6e-3),
}


def compare_args(args: argparse.Namespace, sources_file: Path) -> list[str]:
    """The ``dept compare`` command line of this protocol."""
    model, seq_len, batch, local, rounds, warmup, eval_bytes, lr = SHAPES[
        "smoke" if args.smoke else "gpu"
    ]
    sources = len(load_sources(sources_file))
    tokens = sources * batch * seq_len * local * rounds
    # fmt: off
    return [
        "--sources-file", str(sources_file), "--model", model, "--seq-len", str(seq_len),
        "--batch-size", str(batch), "--local-steps", str(local), "--tokens", str(tokens),
        "--warmup-steps", str(warmup), "--eval-bytes", str(eval_bytes), "--lrs", f"{lr:g}",
        "--outer-optimizer", "nesterov", "--outer-lr", "0.7", "--outer-momentum", "0.7",
        "--methods", args.methods, "--jobs", "1", "--device", args.device, "--out", args.out,
        "-c", AUTHORS,
    ]
    # fmt: on


def protocol_sources(args: argparse.Namespace) -> Path:
    """The sources file the protocol reads: the four corpora, or the one given."""
    if args.sources_file:
        return Path(args.sources_file)
    chosen = [s for s in load_sources(CORPORA) if s.name in SOURCES]
    path = Path(args.out) / "protocol-sources.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_sources(path, chosen)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.protocol", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="debug size, for any CPU")
    parser.add_argument("--sources-file", help="default: four of benchmarks/corpora.yaml")
    parser.add_argument("--methods", default="std-0,glob,spec,spec-opt")
    parser.add_argument("--device", default="auto", help="auto, cuda, cuda:N, cpu")
    parser.add_argument("--out", default="outputs/gpu-protocol")
    args = parser.parse_args(argv)
    argv_compare = compare_args(args, protocol_sources(args))
    print("dept compare " + " ".join(argv_compare), flush=True)
    return compare.main(argv_compare)


if __name__ == "__main__":
    raise SystemExit(main())
