"""lm-evaluation-harness on an exported model folder: the tasks this project ships, and the call.

The shipped task ``dept_stream_bpb`` (``tasks/dept_stream_bpb.yaml``) scores a source's
validation text the way a run does (:func:`dept.train.evaluate.evaluate_stream`): the
documents joined by the tokenizer's end-of-document token (the tokenizer turns that token's
text back into its id, so the ids are the run's stream), non-overlapping windows of the
run's context, and bits per byte with each boundary counted as one byte. Through it,
lm-eval's figure checks that an export is the model that trained. Other tasks are lm-eval's
own (by name) or a user's YAML files (``include_path``), read from local files.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager

TASKS_DIR = Path(__file__).with_name("tasks")
STREAM_TASK = "dept_stream_bpb"
INSTALL_HINT = 'dept eval needs lm-evaluation-harness: pip install "dept-flower[eval]"'


@dataclass(frozen=True)
class Stream:
    """A source's validation text as the run scores it."""

    source: str
    text: str  # the documents, each followed by the end-of-document token's text
    bytes: int  # UTF-8 bytes of the documents, each boundary counted as one byte


def validation_stream(source: str, documents: Iterable[str], eos: str, max_bytes: int) -> Stream:
    """The first ``max_bytes`` of ``documents`` (0: all), joined as the run's token stream
    joins them: each document, then ``eos``."""
    parts: list[str] = []
    used = 0
    for document in documents:
        if max_bytes and used >= max_bytes:
            break
        encoded = document.encode()
        if max_bytes and used + len(encoded) + 1 > max_bytes:
            cut = encoded[: max_bytes - used].decode(errors="ignore")  # a whole character
            parts.append(cut)
            used += len(cut.encode())
            break
        parts.append(document + eos)
        used += len(encoded) + 1
    if not parts:
        raise ValueError(f"source {source!r} has no validation text to score")
    return Stream(source, "".join(parts), used)


def stream_task(stream: Stream, folder: Path) -> dict[str, Any]:
    """lm-eval's config of ``dept_stream_bpb`` on ``stream``, its data written to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{stream.source}.jsonl"
    data.write_text(json.dumps({"text": stream.text, "bytes": stream.bytes}) + "\n")
    config = yaml.safe_load((TASKS_DIR / f"{STREAM_TASK}.yaml").read_text())
    config["task"] = stream_task_name(stream.source)
    config["dataset_kwargs"] = {"data_files": {"test": str(data)}}
    config["process_results"] = _stream_results
    return config


def stream_task_name(source: str) -> str:
    return f"{STREAM_TASK}_{source}"


def _stream_results(doc: dict[str, Any], results: list[float]) -> dict[str, tuple[float, int]]:
    """The row's log-likelihood over its bytes as the run counts them (not lm-eval's count
    of the text, which would count each end-of-document token's text in full)."""
    (loglikelihood,) = results
    return {"bits_per_byte": (loglikelihood, int(doc["bytes"]))}


def evaluate_folder(
    folder: Path,
    tasks: list[str | dict[str, Any]],
    *,
    seq_len: int,
    device: str,
    batch_size: int,
    limit: float | None = None,
    include_paths: list[Path] | None = None,
) -> dict[str, dict[str, float]]:
    """Each task's metrics for the model in ``folder`` (an export): ``{task: {metric:
    value}}``, a metric's standard error as ``<metric>_stderr`` where lm-eval gives one.
    ``seq_len``: the context the model trained with, which lm-eval's windows keep to."""
    try:
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as exc:
        raise SystemExit(INSTALL_HINT) from exc
    model = HFLM(
        pretrained=str(folder),
        backend="causal",
        device=device,
        dtype="float32",
        max_length=seq_len,
        batch_size=batch_size,
    )
    manager = _task_manager(TaskManager, tasks, include_paths or [])
    output = simple_evaluate(
        model=model,
        tasks=tasks,
        limit=limit,
        task_manager=manager,
        bootstrap_iters=1000,
        log_samples=False,
    )
    if output is None:  # lm-eval answers None on ranks other than the first
        return {}
    return {task: _metrics(values) for task, values in output["results"].items()}


def _task_manager(
    manager_type: type[TaskManager], tasks: list[str | dict[str, Any]], include_paths: list[Path]
) -> TaskManager:
    """lm-eval's index of ``include_paths``, and of its own tasks only where a task named is
    not among those: indexing its thousands of YAML files takes seconds."""
    paths = [str(p) for p in include_paths] or None
    local = manager_type(include_path=paths, include_defaults=False)
    named = {t for t in tasks if isinstance(t, str)}
    if named <= set(local.all_tasks):
        return local
    return manager_type(include_path=paths)


def _metrics(values: dict[str, Any]) -> dict[str, float]:
    """lm-eval's ``"<metric>,<filter>"`` keys as ``<metric>`` (``none`` filter) or
    ``<metric>,<filter>``; numbers only ("N/A" errors dropped)."""
    out = {}
    for key, value in values.items():
        if "," not in key or not isinstance(value, int | float):
            continue
        metric, filtered = key.split(",", 1)
        out[metric if filtered == "none" else key] = float(value)
    return out
