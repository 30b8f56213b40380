"""``dept eval``: a finished run's models through lm-evaluation-harness.

    dept eval outputs/dept                                   # every source's model
    dept eval outputs/dept --global --tasks my_task --include-path my-tasks/
    dept eval outputs/compare/runs/std-0.3-lr0.004          # a comparison's STD model

Exports each model the run ends with (``RUN/eval/models/``, as ``dept export`` does) and
scores it with lm-eval's ``hf`` model: on ``dept_stream_bpb`` over each source it covers
(its validation text, scored as the run scored it, beside the run's own figure) and on the
``--tasks`` given. A source's model covers that source; GLOB's and TRIM's global model
(``--global``) and a STD model cover every source. Writes ``RUN/eval/eval.json`` and prints
a table. SPEC and SPEC-OPT have no global model: each source is evaluated with its own.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from transformers import AutoTokenizer

from dept.cli_help import HelpFormatter
from dept.config import ConfigError, DeptConfig, load_config
from dept.data.corpus import load_source_text
from dept.data.sources import SourceSpec, run_sources
from dept.export import RUN_CONFIG_FILE, export_global, export_source, load_run, state_root
from dept.model.variants import variant
from dept.state.strict_json import dumps
from dept.train.devices import resolve_device, size_cpu_threads
from dept_cli.compare_resume import PLAN_FILE, RESULT_FILE
from dept_cli.harness import (
    evaluate_folder,
    stream_task,
    stream_task_name,
    validation_stream,
)

BASELINE_MODEL = "model"  # in a comparison's STD/ACT run folder: its final model, exported
EVAL_DIR = "eval"
EVAL_FILE = "eval.json"
EXAMPLES = """examples:
  dept eval outputs/dept                               # each source's model, bits per byte
  dept eval outputs/dept --source de-novels --tasks my_task --include-path my-tasks/
  dept eval outputs/dept --global                      # GLOB, TRIM: the global model too
  dept eval outputs/compare/runs/std-0.3-lr0.004       # a dept compare STD run
"""


@dataclass
class Model:
    """A model the run ends with, what it is scored on, and what the run measured of it."""

    name: str
    folder: Path
    sources: list[str]  # the validation streams it covers
    measured: dict[str, float] = field(default_factory=dict)  # the run's bits per byte


@dataclass
class FinishedModels:
    cfg: DeptConfig
    specs: list[SourceSpec]
    state_root: Path
    models: list[Model]


def federated_models(
    run_dir: Path, sources: list[str], with_global: bool, state_dir: Path | None
) -> FinishedModels:
    """Each named source's model (all by default), and the global model where asked,
    exported under ``run_dir/eval/models``."""
    run = load_run(run_dir)
    specs = run_sources(run.cfg)
    names = [s.name for s in specs]
    unknown = [s for s in sources if s not in names]
    if unknown:
        raise ConfigError(f"source {unknown[0]!r} is not in the run's sources ({', '.join(names)})")
    root = state_dir or state_root(run.cfg)
    exports = run_dir / EVAL_DIR / "models"
    scores = {n: s["val_bpb"] for n, s in run.summary.get("sources", {}).items()}
    models = []
    for name in sources or names:
        folder = export_source(run_dir, name, exports / name, state_dir=root, force=True)
        measured = {name: scores[name]} if name in scores else {}
        models.append(Model(name, folder, [name], measured))
    if with_global:
        folder = export_global(run_dir, exports / "global", state_dir=root, force=True)
        # GLOB scored every source with this very model; TRIM scored each with its own rows.
        glob_like = not variant(run.cfg.variant).keeps_state
        models.append(Model("global", folder, names, scores if glob_like else {}))
    return FinishedModels(run.cfg, specs, root, models)


def baseline_models(run_dir: Path) -> FinishedModels:
    """The final model of a ``dept compare`` STD or ACT run, which covers every source."""
    cfg = load_config(json.loads((run_dir / PLAN_FILE).read_text()))
    result = json.loads((run_dir / RESULT_FILE).read_text())
    if "error" in result:
        raise ConfigError(f"{run_dir} crashed ({result['error']}): nothing to evaluate")
    specs = run_sources(cfg)
    scores = {n: s["val_bpb"] for n, s in result["sources"].items()}
    model = Model(str(result.get("method", "std")), run_dir / BASELINE_MODEL, list(scores), scores)
    return FinishedModels(cfg, specs, state_root(cfg), [model])


def folder_models(folder: Path) -> FinishedModels:
    """A model folder an export wrote (``dept cpt``'s adapted models among them): one model,
    on the sources of the run config written beside it."""
    cfg = load_config(json.loads((folder / RUN_CONFIG_FILE).read_text()))
    specs = run_sources(cfg)
    return FinishedModels(
        cfg, specs, state_root(cfg), [Model(folder.name, folder, [s.name for s in specs])]
    )


def finished_models(args: argparse.Namespace) -> FinishedModels:
    """What ``args.run_dir`` holds: a federated run, a comparison's baseline run, or a model
    folder."""
    run_dir: Path = args.run_dir
    if (run_dir / BASELINE_MODEL / "config.json").is_file() and (run_dir / PLAN_FILE).is_file():
        if args.source or args.global_model:
            raise ConfigError(
                f"{run_dir} is a baseline run: one model covers every source "
                "(drop --source and --global)"
            )
        return baseline_models(run_dir)
    if (run_dir / PLAN_FILE).is_file() and not (run_dir / "summary.json").is_file():
        raise ConfigError(
            f"{run_dir} is a comparison run without a model to evaluate: a baseline saves "
            f"its model in {BASELINE_MODEL}/ since this version (rerun it), a federated run "
            "writes summary.json when it finishes"
        )
    if not (run_dir / "summary.json").is_file():
        if (run_dir / RUN_CONFIG_FILE).is_file() and (run_dir / "config.json").is_file():
            if args.source or args.global_model:
                raise ConfigError(f"{run_dir} is one model: drop --source and --global")
            return folder_models(run_dir)
        raise ConfigError(
            f"{run_dir} holds no finished run: give a run's output-dir (summary.json, "
            "body.safetensors), a dept compare run's folder or an exported model's folder"
        )
    return federated_models(run_dir, args.source or [], args.global_model, args.state_dir)


def stream_tasks(
    finished: FinishedModels, model: Model, folder: Path, eval_bytes: int
) -> list[dict[str, Any]]:
    """``dept_stream_bpb`` over each source ``model`` covers, joined by its tokenizer's
    end-of-document token."""
    eos = AutoTokenizer.from_pretrained(model.folder).eos_token
    cache = finished.state_root / "cache"
    tasks = []
    for name in model.sources:
        spec = next(s for s in finished.specs if s.name == name)
        text = load_source_text(spec, cache, finished.cfg.seed)
        stream = validation_stream(name, text.validation["text"], eos, eval_bytes)
        tasks.append(stream_task(stream, folder / model.name))
    return tasks


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    finished = finished_models(args)
    eval_dir = args.run_dir / EVAL_DIR
    eval_bytes = finished.cfg.eval_bytes if args.eval_bytes is None else args.eval_bytes
    resolved = resolve_device(args.device)
    threads = size_cpu_threads(resolved)  # beside busy processes, torch's default is 3x slower
    device = str(resolved)
    shown = device if threads is None else f"{device}, {threads} torch thread(s)"
    rows = []
    for model in finished.models:
        tasks: list[str | dict[str, Any]] = []
        if not args.no_bits_per_byte:
            tasks += stream_tasks(finished, model, eval_dir / "data", eval_bytes)
        tasks += args.tasks
        print(f"dept eval: {model.name} on {len(tasks)} tasks ({shown})", flush=True)
        results = evaluate_folder(
            model.folder,
            tasks,
            seq_len=finished.cfg.seq_len,
            device=device,
            batch_size=args.batch_size,
            limit=args.limit,
            include_paths=args.include_path,
        )
        for task, metrics in results.items():
            rows.append({"model": model.name, "task": task, **metrics, **_measured(model, task)})
    return {
        "run_dir": str(args.run_dir),
        "variant": finished.cfg.variant,
        "seq_len": finished.cfg.seq_len,
        "eval_bytes": eval_bytes,
        "device": device,
        "limit": args.limit,
        "results": rows,
    }


def _measured(model: Model, task: str) -> dict[str, float]:
    """The run's own bits per byte beside lm-eval's, where the task is a stream it scored."""
    for source, bpb in model.measured.items():
        if task == stream_task_name(source):
            return {"run_bits_per_byte": bpb}
    return {}


def table(report: dict[str, Any]) -> Table:
    out = Table(title=f"dept eval: {report['run_dir']} ({report['variant']}, {report['device']})")
    for heading in ("model", "task", "metric"):
        out.add_column(heading)
    for heading in ("value", "run's", "Δ"):
        out.add_column(heading, justify="right")
    for row in report["results"]:
        for metric, value in row.items():
            if metric in ("model", "task", "run_bits_per_byte") or metric.endswith("_stderr"):
                continue
            run = row.get("run_bits_per_byte") if metric == "bits_per_byte" else None
            stderr = row.get(f"{metric}_stderr")
            spread = f" ± {stderr:.4f}" if stderr and math.isfinite(stderr) else ""
            out.add_row(
                row["model"],
                row["task"],
                metric,
                f"{value:.4f}{spread}",
                f"{run:.4f}" if run is not None else "",
                f"{(value / run - 1) * 100:+.2f}%" if run else "",
            )
    return out


def models_parser(prog: str, description: str, epilog: str) -> argparse.ArgumentParser:
    """A command's parser with the arguments that choose a run's models
    (:func:`finished_models`): ``dept eval``'s and ``dept finetune``'s."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, epilog=epilog, formatter_class=HelpFormatter
    )
    parser.add_argument("run_dir", type=Path, help="a run's output-dir, or a dept compare run")
    parser.add_argument(
        "--source", action="append", help="this source's model (repeat; default: every source)"
    )
    parser.add_argument(
        "--global",
        dest="global_model",
        action="store_true",
        help="also the global model (glob, trim), on every source",
    )
    parser.add_argument("--state-dir", type=Path, help="the run's state root, if not its own")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N, mps")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = models_parser(
        "dept eval", "Evaluate a finished run's models with lm-evaluation-harness.", EXAMPLES
    )
    parser.add_argument(
        "--tasks",
        type=lambda s: [t for t in s.split(",") if t],
        default=[],
        help="lm-eval tasks, comma-separated: its own names, or those of --include-path",
    )
    parser.add_argument(
        "--include-path",
        type=Path,
        action="append",
        help="a folder of lm-eval task YAML files (local data files; repeat)",
    )
    parser.add_argument(
        "--limit", type=float, help="documents per task (a fraction below 1); not dept_stream_bpb"
    )
    parser.add_argument(
        "--eval-bytes", type=int, help="validation bytes per source (default: the run's)"
    )
    parser.add_argument(
        "--no-bits-per-byte",
        action="store_true",
        help="skip dept_stream_bpb (only --tasks)",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="lm-eval's batch size")
    args = parser.parse_args(argv)
    if args.no_bits_per_byte and not args.tasks:
        parser.error("--no-bits-per-byte leaves nothing to evaluate: give --tasks")
    if args.limit is not None and args.limit <= 0:
        parser.error("--limit must be > 0")
    return args


def report_on(
    command: str,
    args: argparse.Namespace,
    compute: Callable[[argparse.Namespace], dict[str, Any]],
    render: Callable[[dict[str, Any]], Table],
    out: Path,
) -> int:
    """Run ``compute``, a bad input ending it with one line that names the problem; write its
    report to ``out`` (JSON) and print it as a table."""
    try:
        report = compute(args)
    except (ValueError, OSError) as exc:  # ConfigError is a ValueError
        raise SystemExit(f"dept {command}: {exc}") from exc
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dumps(report, indent=2))
    Console(width=140).print(render(report))
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return report_on("eval", args, evaluate, table, args.run_dir / EVAL_DIR / EVAL_FILE)


if __name__ == "__main__":
    raise SystemExit(main())
