"""``dept finetune``: the paper's downstream protocol, a pre-trained body tuned with a task head.

    dept finetune outputs/dept --task tasks/sst2 --seeds 3
    dept finetune outputs/compare/runs/std-0.3-lr0.004 --task tasks/sst2 --task tasks/stsb

A task is a folder in the GLUE formats: ``train.jsonl`` and ``test.jsonl`` (or
``validation.jsonl``), one example a line, with ``sentence`` (or ``sentence1`` and
``sentence2``, joined by ``--pair-separator``) and ``label``: whole numbers
make a classification scored by accuracy, other numbers a regression scored by Pearson's r.
Each model ``dept eval`` would score (a source's, the global one, a baseline's) gets a fresh
head and trains with its body on the train split for ``--epochs``, then scores the test
split, once per seed (the head, the batches and dropout follow the seed). Writes
``RUN/finetune/finetune.json`` and prints mean ± standard deviation over the seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.table import Table
from tqdm import tqdm
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from dept.config import ConfigError
from dept.train.devices import resolve_device, size_cpu_threads
from dept_cli.evaluate import finished_models, models_parser, report_on

TEST_SPLITS = ("test.jsonl", "validation.jsonl")
TEXT_FIELDS = (("sentence1", "sentence2"), ("sentence",))
EXAMPLES = """examples:
  dept finetune outputs/dept --task tasks/sst2                 # each source's model, 3 seeds
  dept finetune outputs/glob --global --task tasks/stsb --epochs 5
  dept finetune outputs/compare/runs/std-0.3-lr0.004 --task tasks/sst2
"""


@dataclass(frozen=True)
class Task:
    """A downstream task: its examples' texts and labels, per split."""

    name: str
    regression: bool
    num_labels: int  # 1 for a regression
    train: list[tuple[tuple[str, ...], float]]
    test: list[tuple[tuple[str, ...], float]]

    @property
    def metric(self) -> str:
        return "pearson" if self.regression else "accuracy"


def load_task(folder: Path) -> Task:
    """The task in ``folder``; a clear error naming the file and line of anything amiss."""
    train = _read_split(folder / "train.jsonl")
    test_file = next((folder / n for n in TEST_SPLITS if (folder / n).is_file()), None)
    if test_file is None:
        raise ConfigError(f"task {folder} has no {' or '.join(TEST_SPLITS)}")
    test = _read_split(test_file)
    labels = [label for _, label in train + test]
    regression = any(not float(label).is_integer() for label in labels)
    if not regression and min(labels) < 0:
        raise ConfigError(f"task {folder}: class labels must be 0, 1, 2...; found {min(labels)}")
    num_labels = 1 if regression else int(max(labels)) + 1
    if len(set(labels)) < 2:
        raise ConfigError(f"task {folder}: every label is {int(labels[0])}: nothing to learn")
    return Task(folder.name, regression, num_labels, train, test)


def _read_split(path: Path) -> list[tuple[tuple[str, ...], float]]:
    if not path.is_file():
        raise ConfigError(f"task file {path} is missing")
    examples = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            fields = next(f for f in TEXT_FIELDS if all(k in row for k in f))
            examples.append((tuple(str(row[k]) for k in fields), float(row["label"])))
        except (ValueError, KeyError, StopIteration, TypeError) as exc:
            raise ConfigError(
                f"{path}:{number}: expected a JSON object with 'sentence' (or 'sentence1' and "
                f"'sentence2') and a numeric 'label' ({type(exc).__name__})"
            ) from exc
    if not examples:
        raise ConfigError(f"task file {path} holds no examples")
    return examples


@dataclass(frozen=True)
class Tuning:
    """How every model is fine-tuned."""

    epochs: int
    lr: float
    batch_size: int
    max_length: int  # tokens per example
    separator: str  # between a pair's two sentences
    device: torch.device


def _batches(
    examples: list[tuple[tuple[str, ...], float]],
    tokenizer: PreTrainedTokenizerBase,
    order: np.ndarray,
    tuning: Tuning,
) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """Padded batches in ``order``, a pair's sentences joined by the separator, on the
    device one at a time."""
    for start in range(0, len(order), tuning.batch_size):
        chosen = [examples[i] for i in order[start : start + tuning.batch_size]]
        encoded = tokenizer(
            [tuning.separator.join(texts) for texts, _ in chosen],
            padding=True,
            truncation=True,
            max_length=tuning.max_length,
            return_tensors="pt",
        )
        inputs = {k: v.to(tuning.device) for k, v in encoded.items()}
        yield inputs, torch.tensor([label for _, label in chosen])


def finetune(
    folder: Path, task: Task, seed: int, tuning: Tuning, name: str = ""
) -> dict[str, float]:
    """Fine-tune the model in ``folder`` (its progress bar says ``name``, default the
    folder's) with a fresh head on ``task``'s train split; its test score and last epoch's
    mean training loss."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # not the table of the new head's and unused lm_head's names
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            folder,
            num_labels=task.num_labels,
            problem_type="regression" if task.regression else "single_label_classification",
        ).to(tuning.device)
    finally:
        hf_logging.set_verbosity(verbosity)
    model.config.pad_token_id = tokenizer.pad_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=tuning.lr, weight_decay=0.0)
    losses: list[float] = []
    steps = tuning.epochs * math.ceil(len(task.train) / tuning.batch_size)
    label = f"{name or folder.name} on {task.name}, seed {seed}"
    with tqdm(total=steps, desc=label, unit="step", leave=False, mininterval=0.5) as bar:
        for epoch in range(tuning.epochs):
            model.train()
            losses = []
            order = rng.permutation(len(task.train))
            for inputs, labels in _batches(task.train, tokenizer, order, tuning):
                target = labels.float() if task.regression else labels.long()
                loss = model(**inputs, labels=target.to(tuning.device)).loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                losses.append(loss.item())
                bar.set_postfix(epoch=epoch + 1, loss=f"{losses[-1]:.4f}", refresh=False)
                bar.update()
    return {
        task.metric: _score(model, tokenizer, task, tuning),
        "train_loss": float(np.mean(losses)) if losses else math.nan,
    }


@torch.no_grad()
def _score(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, task: Task, tuning: Tuning
) -> float:
    model.eval()
    predicted, wanted = [], []
    for inputs, labels in _batches(task.test, tokenizer, np.arange(len(task.test)), tuning):
        logits = model(**inputs).logits.float().cpu()
        predicted.append(logits[:, 0] if task.regression else logits.argmax(-1).float())
        wanted.append(labels)
    got, want = torch.cat(predicted).numpy(), torch.cat(wanted).numpy()
    if task.regression:
        return float(np.corrcoef(got, want)[0, 1]) if got.std() > 0 and want.std() > 0 else 0.0
    return float((got == want).mean())


def run(args: argparse.Namespace) -> dict[str, Any]:
    tasks = [load_task(folder) for folder in args.task]  # every task checked before training
    finished = finished_models(args)
    device = resolve_device(args.device)
    threads = size_cpu_threads(device, args.threads)
    if threads is not None:
        print(f"fine-tuning on the CPU with {threads} torch thread(s)", flush=True)
    tuning = Tuning(
        args.epochs,
        args.lr,
        args.batch_size,
        args.max_length or finished.cfg.seq_len,
        args.pair_separator.replace("\\n", "\n").replace("\\t", "\t"),
        device,
    )
    rows = []
    seeds = range(args.seed, args.seed + args.seeds)
    total, done, started = len(finished.models) * len(tasks) * len(seeds), 0, time.perf_counter()
    for model in finished.models:
        for task in tasks:
            scores = []
            for seed in seeds:
                scores.append(finetune(model.folder, task, seed, tuning, model.name))
                done += 1
                elapsed = time.perf_counter() - started
                print(
                    f"[{done}/{total}] {model.name} on {task.name}, seed {seed}: "
                    f"{task.metric} {scores[-1][task.metric]:.4f} ({elapsed / 60:.1f} min "
                    f"elapsed, ETA {elapsed / done * (total - done) / 60:.1f} min)",
                    flush=True,
                )
            values = [s[task.metric] for s in scores]
            rows.append(
                {
                    "model": model.name,
                    "task": task.name,
                    "metric": task.metric,
                    "mean": float(np.mean(values)),
                    "sd": float(np.std(values, ddof=1)) if len(values) > 1 else None,
                    "seeds": {str(seed): s for seed, s in zip(seeds, scores, strict=True)},
                }
            )
    settings = {k: getattr(args, k) for k in ("epochs", "lr", "batch_size", "seeds", "seed")}
    settings["threads"] = threads
    return {
        "run_dir": str(args.run_dir),
        "variant": finished.cfg.variant,
        "max_length": tuning.max_length,
        "pair_separator": tuning.separator,
        "device": str(device),
        **settings,
        "results": rows,
    }


def table(report: dict[str, Any]) -> Table:
    out = Table(
        title=f"dept finetune: {report['run_dir']} ({_count(report['seeds'], 'seed')}, "
        f"{report['device']})"
    )
    for heading in ("model", "task", "metric"):
        out.add_column(heading)
    out.add_column("mean ± sd", justify="right")
    for row in report["results"]:
        # one seed measures no spread: none is shown
        spread = f" ± {row['sd']:.4f}" if len(row["seeds"]) > 1 else " (1 seed)"
        out.add_row(row["model"], row["task"], row["metric"], f"{row['mean']:.4f}{spread}")
    return out


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = models_parser(
        "dept finetune",
        "Fine-tune a finished run's models with a task head; test scores per seed.",
        EXAMPLES,
    )
    parser.add_argument(
        "--task", type=Path, action="append", required=True, help="a task folder (repeat)"
    )
    parser.add_argument("--seeds", type=int, default=3, help="runs per model and task")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--epochs", type=int, default=3, help="passes over the train split")
    parser.add_argument("--lr", type=float, default=1e-4, help="AdamW's learning rate, constant")
    parser.add_argument("--batch-size", type=int, default=16, help="examples a step")
    parser.add_argument("--max-length", type=int, help="tokens per example (default: seq-len)")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads on a CPU (default: %(default)s: the cores not already busy)",
    )
    parser.add_argument(
        "--pair-separator",
        default="\\n",
        help="between a pair's sentences (\\n and \\t read as newline and tab)",
    )
    args = parser.parse_args(argv)
    if args.threads < 0:
        parser.error("--threads must be >= 0 (0: the cores not already busy)")
    for name in ("seeds", "epochs", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.lr <= 0:
        parser.error("--lr must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return report_on("finetune", args, run, table, args.run_dir / "finetune" / "finetune.json")


if __name__ == "__main__":
    raise SystemExit(main())
