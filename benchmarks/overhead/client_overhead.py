"""Does Flower cost a client training speed? Its tokens/s against a bare PyTorch loop.

    python -m benchmarks.overhead.client_overhead

Three arms on one source, same model build, same AdamW, same batch shapes, same number of
steps, same torch thread count (``--threads``, 1 as a Ray actor with one CPU gets),
interleaved repeat after repeat:

- ``bare``: ``SourceClient.model`` + ``make_inner_optimizer`` + a plain forward/backward/
  clip/step loop over batch tensors made before the clock starts. No Flower.
- ``in-process``: a real train Message through the ClientApp (``client_app.app``) by the
  in-process grid, a new round each repeat (state saved and reloaded from disk as in a run).
- ``flwr-run``: ``flwr run`` of the app in the simulation runtime (Ray), one SuperNode,
  ``--flwr-rounds`` rounds; tokens/s read from the run's ``metrics.jsonl``.

The clients report tokens/s of their training loop only (``train_local`` times from the
first step to the last). The ``whole message`` column divides the same tokens by the
message's wall time in the ClientApp (arrays decoded, model built, state loaded, trained,
state saved, reply encoded); for ``flwr-run`` by the round's wall time at the server,
which also holds Ray's dispatch and the round's evaluation message.

Wall time on a shared machine swings with other people's load, so the bare loop and the
in-process message are also measured in this process's CPU time (``tok per CPU-s``: the
loop's, and the whole message's), which other processes do not inflate. The Ray actor's
CPU time is not visible from here, so ``flwr-run`` has wall-time columns only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from benchmarks.measure import (
    PROJECT,
    common_arguments,
    corpora_run_config,
    interleave,
    median_of,
    parse_quick,
    print_table,
    result_header,
    write_outputs,
)
from benchmarks.timed_grid import TimedGrid
from dept.config import load_config
from dept.data.sources import run_sources
from dept.data.token_stream import StreamPosition, training_batches
from dept.state.workspace import Workspace
from dept.train.local import make_inner_optimizer, next_token_loss
from dept.train.sharing import initial_tensors
from dept.train.source_client import SourceClient
from dept.wire import keys
from dept_cli.in_process import in_process_grid
from server_app.launch import build_command
from server_app.local_runtime import local_runtime
from server_app.sizing import ClientShare

TARGET = 0.95


def bare_loop(client: SourceClient, arrays: dict[str, torch.Tensor], repeat: int) -> dict:
    """The client's model and optimizer, trained by the plainest loop there is."""
    cfg = client.cfg
    model = client.model(arrays, None)
    optimizer = make_inner_optimizer(model, cfg)
    stream = training_batches(
        client.tokens.train, cfg.seq_len, cfg.batch_size, cfg.seed, StreamPosition(repeat)
    )
    batches = [torch.from_numpy(next(stream)).long() for _ in range(cfg.local_steps)]
    model.train()
    started, cpu_started = time.perf_counter(), time.process_time()
    for batch in batches:
        loss = next_token_loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    tokens = sum(b.shape[0] * (b.shape[1] - 1) for b in batches)
    return {
        "tokens": tokens,
        "train_s": seconds,
        "tokens_per_s": tokens / seconds,
        "cpu_tokens_per_s": tokens / cpu_seconds,
    }


class InProcessClient:
    """Train messages for rounds 1, 2, ... to one node of the in-process grid."""

    def __init__(self, run_config: dict[str, Any], arrays: ArrayRecord, source: str) -> None:
        grid = in_process_grid(run_config, TimedGrid)
        assert isinstance(grid, TimedGrid)
        self.grid = grid
        self.arrays, self.source = arrays, source
        self.local_steps = int(run_config["local-steps"])
        self.server_round = 0

    def send(self) -> dict[str, Any]:
        self.server_round += 1
        config = ConfigRecord(
            {
                keys.RUN_ID: "client-overhead",
                keys.SOURCE: self.source,
                keys.SERVER_ROUND: self.server_round,
                keys.GLOBAL_STEP: (self.server_round - 1) * self.local_steps,
                keys.ATTEMPT: "a",
                keys.RESUMED_AFTER: -1,
            }
        )
        content = RecordDict({keys.ARRAYS: self.arrays, keys.CONFIG: config})
        message = Message(content, dst_node_id=1, message_type=MessageType.TRAIN)
        (reply,) = self.grid.send_and_receive([message])
        if reply.has_error():
            raise RuntimeError(f"the ClientApp failed: {reply.error.reason}")
        delivery = self.grid.deliveries[-1]
        tokens = int(delivery.metrics[keys.NUM_EXAMPLES])
        return {
            "tokens": tokens,
            "train_s": float(delivery.metrics[keys.TRAIN_SECONDS]),
            "tokens_per_s": float(delivery.metrics[keys.TOKENS_PER_S]),
            "message_s": delivery.seconds,
            "message_tokens_per_s": tokens / delivery.seconds,
            "cpu_tokens_per_s": tokens / delivery.cpu_seconds,  # of the whole message
        }


def flwr_run(
    run_config: dict[str, Any], work: Path, rounds: int, threads: int, repeat: int
) -> dict:
    """One ``flwr run`` in the simulation runtime; medians over its training rounds."""
    out = work / f"flwr-{repeat}"
    overrides = {
        **run_config,
        "num-server-rounds": rounds,
        "output-dir": str(out),
        "warmup-steps": 1,
        "eval-bytes": 4096,
    }
    # the actor's CPUs are its torch threads (client_app.cpu_share), as in the other arms
    share = ClientShare(gpus=0.0, cpus=threads, at_once=1)
    command = build_command(PROJECT, overrides, num_nodes=1, share=share, stream=True)
    # --stream: flwr run returns only when the run ends (without it, once it is submitted)
    started = time.perf_counter()
    with local_runtime(work / "flwr-home") as runtime:  # its own ports, stopped after
        env = runtime.env(dict(os.environ))
        done = subprocess.run(command, cwd=PROJECT, env=env, capture_output=True, text=True)
    if not (out / "summary.json").is_file():
        raise RuntimeError(f"flwr run wrote no summary:\n{(done.stdout + done.stderr)[-2000:]}")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    trained = [(r, next(iter(r["sources"].values()))) for r in rows if r["round"] > 0]
    walls = {r["round"]: r["wall_s"] for r in rows}
    speeds = sorted(s["tokens_per_s"] for _, s in trained)
    whole = sorted(s["tokens"] / (walls[r["round"]] - walls[r["round"] - 1]) for r, s in trained)
    return {
        "tokens": int(sum(s["tokens"] for _, s in trained) / len(trained)),
        "tokens_per_s": speeds[len(speeds) // 2],
        "message_tokens_per_s": whole[len(whole) // 2],
        "flwr_run_s": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    work = args.work.resolve()  # the flwr run arm runs in the checkout, not here
    run_config = corpora_run_config(
        [args.source],
        work,
        model=args.model,
        local_steps=args.local_steps,
        variant="spec-opt",
        num_server_rounds=args.repeats + 1,
        warmup_steps=1,
    )
    cfg = load_config(run_config)
    (spec,) = run_sources(cfg)
    body, _ = initial_tensors(cfg)
    bare_client = SourceClient(cfg, spec, Workspace(work / "state", "bare", spec.name))
    in_process = InProcessClient(run_config, ArrayRecord(body), spec.name)
    first = in_process.send()  # one-time setup (tokenizer, tokens) and the first state
    arms = {
        "bare": lambda r: bare_loop(bare_client, body, r),
        "in-process": lambda r: in_process.send(),
    }
    if args.flwr:
        arms["flwr-run"] = lambda r: flwr_run(run_config, work, args.flwr_rounds, args.threads, r)
    rows = interleave(arms, args.repeats)
    result = summarise(args, rows, first)
    write_outputs(args.out, "client_overhead", result, rows)
    return 0


def summarise(args: argparse.Namespace, rows: list[dict], first: dict) -> dict[str, Any]:
    bare = median_of(rows, "bare", "tokens_per_s")
    bare_cpu = median_of(rows, "bare", "cpu_tokens_per_s")
    cells, arms = [], {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        speed = median_of(rows, arm, "tokens_per_s")
        whole = median_of(rows, arm, "message_tokens_per_s")
        cpu = median_of(rows, arm, "cpu_tokens_per_s")
        arms[arm] = {
            "tokens_per_s": speed,
            "ratio_vs_bare": speed / bare,
            "message_tokens_per_s": whole,
            "message_ratio_vs_bare": whole / bare,
            "cpu_tokens_per_s": cpu,
            "cpu_ratio_vs_bare": cpu / bare_cpu,
        }
        cells.append((arm, speed, speed / bare, whole, whole / bare, cpu, cpu / bare_cpu))
    text = print_table(
        f"client overhead: {args.model}, {args.source}, {args.local_steps} local steps, "
        f"{args.threads} thread(s), medians of {args.repeats} interleaved repeats "
        f"(target: training ratio >= {TARGET})",
        [
            "arm",
            "train tok/s",
            "ratio",
            "whole-message tok/s",
            "ratio",
            "tok per CPU-s",
            "ratio",
        ],
        cells,
    )
    flwr_ratio = arms.get("flwr-run", {}).get("ratio_vs_bare")
    return {
        **result_header("client_overhead", args, args.threads),
        "table": text,
        "target_ratio": TARGET,
        "arms": arms,
        "first_message": first,
        "met": {
            "in-process": arms["in-process"]["ratio_vs_bare"] >= TARGET,
            "in-process-cpu-whole-message": arms["in-process"]["cpu_ratio_vs_bare"] >= TARGET,
            "flwr-run": None if flwr_ratio is None else flwr_ratio >= TARGET,
        },
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="en-shakespeare", help="a source of corpora.yaml")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--local-steps", type=int, default=25, help="the app's default")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--flwr-rounds", type=int, default=3)
    parser.add_argument("--no-flwr", dest="flwr", action="store_false", help="skip flwr run")
    common_arguments(parser, "client-overhead", "debug model, 5 steps, 2 repeats")
    return parse_quick(parser, argv, model="debug", local_steps=5, repeats=2, flwr_rounds=2)


if __name__ == "__main__":
    raise SystemExit(main())
