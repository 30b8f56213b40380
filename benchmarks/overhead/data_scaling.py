"""Does preparing a source need memory that grows with it? Peak RSS and MB/s at 0.1–2 GB.

    python -m benchmarks.overhead.data_scaling [--sizes 0.1,0.5,2] [--work DIR]

For each size a source folder of that much text is generated (documents of the synthetic
``latin`` language, :mod:`dept.data.synthetic`: a pool generated once, then drawn from at random,
seeded) and prepared in a fresh process, as ``dept prepare`` does for SPEC-OPT: read
through ``datasets``, a tokenizer trained on its ``tokenizer-sample-bytes`` sample, every
document tokenized into the memory-mapped shards. Measured per size:

- peak RSS of the preparing process and its children (the kernel's high-water mark,
  ``wait4``; the tokenizer's encoder runs as threads in that process, so it holds every
  worker), and its peak anonymous RSS (sampled from ``/proc``): the memory it allocated,
  without the pages of mapped files. The text is read by plain reads
  (:mod:`dept.data.arrow_text`), so the two differ by the libraries' code, not by the source;
- tokenization MB/s (text bytes of both splits / wall seconds), the cores it kept busy
  (CPU seconds / wall seconds), MB/s per available core, and the machine's load average
  over that minute (on a shared machine, other work takes cores from the encoder's threads).

Flat memory means the largest size's peak at most 1.2x the smallest's (``flat`` for RSS,
``flat_anon`` for anonymous RSS in the JSON). Generated data,
``datasets``' Arrow cache and the tokens go under ``--work`` and are deleted afterwards
(``--keep`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.measure import print_table, result_header, write_outputs

NAME = "data_scaling"
POOL_BYTES = 4_000_000
VAL_FRACTION = 0.01  # val.txt, beside train.txt
FLAT = 1.2  # largest size's peak RSS / smallest's
CHILD = "--child"


def write_source(folder: Path, size: int, seed: int = 0) -> Path:
    """``folder/train.txt`` of about ``size`` bytes and ``val.txt`` of 1% of it."""
    from dept.data.synthetic import generate_documents, make_grammar, make_lexicon

    grammar, lexicon = make_grammar(seed), make_lexicon("latin", seed)
    pool, _ = generate_documents(grammar, lexicon, np.random.default_rng([seed, 1]), POOL_BYTES)
    rng = np.random.default_rng([seed, 2])
    folder.mkdir(parents=True, exist_ok=True)
    for name, target in (("train.txt", size), ("val.txt", max(1, int(size * VAL_FRACTION)))):
        with (folder / name).open("w", encoding="utf-8") as out:
            while out.tell() < target:
                picks = rng.integers(len(pool), size=min(20_000, 1 + target // 5_000))
                out.write("\n\n".join(pool[i] for i in picks) + "\n\n")
    return folder


def prepare_here(folder: Path, state: Path, vocab_size: int) -> dict[str, Any]:
    """The child's work: prepare the source in ``folder``, timing each phase."""
    from dept.data.corpus import load_source_text
    from dept.data.sources import SourceSpec
    from dept.data.token_stream import tokenize_source
    from dept.data.vocab import load_tokenizer, tokenizer_digest
    from dept.state.workspace import cache_dir, own_tokenizer

    spec = SourceSpec(name="bench", path=str(folder), vocab_size=vocab_size)
    cache = cache_dir(state)
    started = time.perf_counter()
    text = load_source_text(spec, cache, seed=0)
    loaded = time.perf_counter()
    path = own_tokenizer(spec, text, cache, seed=0)
    trained = time.perf_counter()
    cpu = _cpu_seconds()
    tokens = tokenize_source(text, load_tokenizer(path), tokenizer_digest(path), cache / "tokens")
    done = time.perf_counter()
    return {
        "load_s": loaded - started,
        "tokenizer_s": trained - loaded,
        "tokenize_s": done - trained,
        "tokenize_cpu_s": _cpu_seconds() - cpu,
        "load_avg": os.getloadavg()[0],
        "train_tokens": len(tokens.train),
        "validation_tokens": len(tokens.validation),
        "dtype": str(tokens.train.dtype),
    }


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(folder: Path, work: Path, vocab_size: int) -> dict[str, Any]:
    """Prepare ``folder`` in a fresh process; its phases, peak RSS and peak anonymous RSS."""
    state = work / "state"
    shutil.rmtree(state, ignore_errors=True)
    env = {**os.environ, "HF_HOME": str(work / "hf"), "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    command = [
        sys.executable,
        "-m",
        "benchmarks.overhead.data_scaling",
        CHILD,
        str(folder),
        str(state),
    ]
    child = subprocess.Popen(
        [*command, str(vocab_size)], env=env, stdout=subprocess.PIPE, text=True
    )
    sampler = AnonSampler(child.pid)
    sampler.start()
    out = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    sampler.join()
    if child.returncode:
        raise RuntimeError(f"preparing {folder} failed (exit {child.returncode})")
    text_bytes = sum((folder / n).stat().st_size for n in ("train.txt", "val.txt"))
    phases = json.loads(out.splitlines()[-1])
    cores = len(os.sched_getaffinity(0))
    speed = text_bytes / 1e6 / phases["tokenize_s"]
    return {
        **phases,
        "text_mb": text_bytes / 1e6,
        "peak_rss_mb": usage.ru_maxrss / 1024,  # KiB on Linux
        "peak_anon_mb": sampler.peak_kib / 1024,
        "mb_per_s": speed,
        "cores_busy": phases["tokenize_cpu_s"] / phases["tokenize_s"],
        "cores": cores,
        "mb_per_s_per_core": speed / cores,
    }


class AnonSampler(threading.Thread):
    """The peak of a process's ``RssAnon``, read from ``/proc`` every 20 ms until it ends."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.status, self.peak_kib = Path(f"/proc/{pid}/status"), 0

    def run(self) -> None:
        while True:
            try:
                lines = self.status.read_text().splitlines()
            except OSError:
                return
            anon = [int(line.split()[1]) for line in lines if line.startswith("RssAnon:")]
            if not anon:  # a zombie: it has exited
                return
            self.peak_kib = max(self.peak_kib, anon[0])
            time.sleep(0.02)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.overhead.data_scaling", description=__doc__
    )
    parser.add_argument("--sizes", default="0.1,0.5,2", help="source sizes in GB")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--quick", action="store_true", help="sizes of 2 and 6 MB (a test)")
    parser.add_argument("--keep", action="store_true", help="keep the generated data")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/data-scaling"))
    parser.add_argument("--work", type=Path, default=Path("outputs/bench/data-scaling"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [CHILD]:
        print(json.dumps(prepare_here(Path(argv[1]), Path(argv[2]), int(argv[3]))))
        return 0
    args = parse_args(argv)
    sizes = [0.002, 0.006] if args.quick else [float(s) for s in args.sizes.split(",")]
    rows = []
    try:
        for done, size in enumerate(sizes):
            started = time.perf_counter()
            print(f"{size:g} GB ({done + 1}/{len(sizes)}): writing the source", flush=True)
            folder = write_source(args.work / f"source-{size}gb", int(size * 1e9))
            print(
                f"{size:g} GB: written in {time.perf_counter() - started:.0f} s; "
                "preparing it in a fresh process",
                flush=True,
            )
            rows.append({"size_gb": size, **measure(folder, args.work, args.vocab_size)})
            print(
                f"{size:g} GB: tokenized at {rows[-1]['mb_per_s']:.1f} MB/s, "
                f"peak RSS {rows[-1]['peak_rss_mb']:.0f} MB",
                flush=True,
            )
            if not args.keep:
                shutil.rmtree(folder)
    finally:
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)
    ratio = rows[-1]["peak_rss_mb"] / rows[0]["peak_rss_mb"]
    anon_ratio = rows[-1]["peak_anon_mb"] / rows[0]["peak_anon_mb"]
    table = print_table(
        f"Preparing a source (SPEC-OPT tokenizer, vocab {args.vocab_size}): peak RSS "
        f"{ratio:.2f}x from smallest to largest (anonymous {anon_ratio:.2f}x; flat: <= {FLAT}x)",
        ["size GB", "peak RSS MB", "peak anon MB", "tokenize MB/s", "cores busy",
         "MB/s per core", "load avg", "load s", "tokenizer s", "tokens"],
        [
            [r["size_gb"], r["peak_rss_mb"], r["peak_anon_mb"], r["mb_per_s"], r["cores_busy"],
             r["mb_per_s_per_core"], r["load_avg"], r["load_s"], r["tokenizer_s"],
             r["train_tokens"]]
            for r in rows
        ],
    )  # fmt: skip
    result = {
        **result_header(NAME, args, None),
        "peak_rss_ratio": ratio,
        "peak_anon_ratio": anon_ratio,
        "flat": ratio <= FLAT,
        "flat_anon": anon_ratio <= FLAT,
        "table": table,
    }
    write_outputs(args.out, NAME, result, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
