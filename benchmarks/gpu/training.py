"""How well does a client's training use a GPU? Tokens/s and model FLOPs utilisation (MFU).

    python -m benchmarks.gpu.training                # 125m, bf16, fused AdamW, flash SDPA
    python -m benchmarks.gpu.training --compile      # the same under torch.compile

Trains the project's model (``dept.model.build.build_model``) with the client's own pieces:
``make_inner_optimizer`` (fused AdamW on CUDA), ``autocast`` (bf16 on CUDA) and
``next_token_loss``, on random tokens (speed does not depend on the text), with attention
forced to the flash kernel of SDPA on CUDA (it fails loudly where flash cannot run).

With ``--compile``, flash-only attention runs only where the compiled model calls SDPA
without a mask (flash takes none), which some torch/transformers pairs do and others do not:
a compiled forward tries it first, and where it fails SDPA's default backends are used, as a
log line, the table's title and the JSON's ``attention`` say.

MFU = tokens/s x FLOPs per token / peak FLOPs, with FLOPs per token = 6 N (N: parameters,
the tied embedding counted once as the LM head's matmul) + 12 L h T (attention scores and
values over a T-token context, forward and backward; PaLM, appendix B). Peak: dense bf16 of
the device (:data:`PEAK_BF16_TFLOPS`) or ``--peak-tflops``. On a machine without a GPU it
runs (``--device cpu`` with a small preset, for tests) and says so; MFU is then only given
against a ``--peak-tflops`` you supply.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

from benchmarks.measure import print_table, result_header, write_outputs
from dept.config import load_config
from dept.model.build import build_model
from dept.model.families import build_config
from dept.train.devices import resolve_device
from dept.train.local import autocast, make_inner_optimizer, next_token_loss

log = logging.getLogger(__name__)
# Dense bf16 peaks (TFLOP/s, NVIDIA's datasheets) by the words of a device's name, e.g.
# "NVIDIA H100 80GB HBM3" (the SXM part), "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB".
PEAK_BF16_TFLOPS: dict[tuple[str, ...], float] = {
    ("H100",): 989.0,
    ("H100", "PCIE"): 756.0,
    ("H100", "NVL"): 835.0,
    ("H200",): 989.0,
    ("H200", "NVL"): 835.0,
    ("GH200",): 989.0,
    ("A100",): 312.0,  # SXM and PCIe alike
}


def peak_tflops(device: torch.device, given: float | None) -> float | None:
    """``given``, else the dense bf16 peak of a known CUDA device, else None."""
    if given is not None or device.type != "cuda":
        return given
    return peak_of(torch.cuda.get_device_name(device))


def peak_of(name: str) -> float | None:
    """The peak of the most specific entry whose words are all words of ``name`` (so an H100
    PCIe is not taken for the SXM part, nor a GH200 for an H200); None for an unknown device
    or a MIG slice (a fraction of the GPU, so of its peak)."""
    words = set(re.split(r"[^A-Z0-9]+", name.upper()))
    known = [key for key in PEAK_BF16_TFLOPS if set(key) <= words]
    if "MIG" in words or not known:
        return None
    return PEAK_BF16_TFLOPS[max(known, key=len)]


def flops_per_token(params: int, preset: str, seq_len: int) -> float:
    config = build_config(preset, 512, seq_len, True)
    return 6.0 * params + 12.0 * config.num_hidden_layers * config.hidden_size * seq_len


def attention_kernel(device: torch.device, flash: bool = True) -> contextlib.AbstractContextManager:
    """Flash attention only, on CUDA with ``flash``; whatever SDPA picks otherwise."""
    if device.type != "cuda" or not flash:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def compiled(
    model: nn.Module, device: torch.device, sample: torch.Tensor, backend: str = "inductor"
) -> tuple[Callable[..., Any], bool]:
    """``model`` under torch.compile (``backend``), and whether flash-only attention runs in
    it: a compiled forward of ``sample`` (a whole batch, so training compiles for the same
    shapes) tries it; where it raises, SDPA's default backends are used and a log line says
    why."""
    step_model = torch.compile(model, backend=backend)
    try:
        with torch.no_grad(), autocast(device), attention_kernel(device):
            step_model(input_ids=sample)
    except RuntimeError as exc:  # "No available kernel", raised while tracing
        # Dynamo's first two lines: what failed, and the kernel error it met while tracing.
        reason = " ".join(line.strip() for line in str(exc).splitlines()[:2]) or repr(exc)
        log.warning(
            "flash-only SDPA fails under torch.compile with torch %s and transformers %s "
            "(%s): the compiled model runs on SDPA's default backends",
            torch.__version__,
            transformers.__version__,
            reason,
        )
        return step_model, False
    return step_model, True


def train(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Warm-up steps (compilation, allocator), then timed steps; tokens/s of the latter."""
    cfg = load_config({"model": args.model, "seq-len": args.seq_len, "batch-size": args.batch_size})
    model = build_model(args.model, args.vocab_size, args.seq_len, seed=0, device=device)
    params = sum(p.numel() for p in model.parameters())
    optimizer = make_inner_optimizer(model, cfg)
    generator = torch.Generator().manual_seed(0)
    batches = [
        torch.randint(args.vocab_size, (args.batch_size, args.seq_len + 1), generator=generator).to(
            device
        )
        for _ in range(4)
    ]
    step_model, flash = (
        compiled(model, device, batches[0][:, :-1], args.compile_backend)
        if args.compile
        else (model, True)
    )

    def step(batch: torch.Tensor) -> None:
        with autocast(device), attention_kernel(device, flash):
            loss = next_token_loss(step_model, batch)  # type: ignore[arg-type]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    model.train()
    started = time.perf_counter()
    for i in range(args.warmup):
        step(batches[i % len(batches)])
    synchronize(device)
    warmup_s = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(args.steps):
        step(batches[i % len(batches)])
    synchronize(device)
    seconds = time.perf_counter() - started
    tokens = args.steps * args.batch_size * args.seq_len
    memory = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {
        "params": params,
        "tokens": tokens,
        "seconds": seconds,
        "warmup_s": warmup_s,
        "tokens_per_s": tokens / seconds,
        "max_memory_allocated": memory,
        "attention": "flash" if flash and device.type == "cuda" else "sdpa-default",
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type != "cuda":
        print(f"NO GPU USED: this run trains on {device.type}; its numbers say nothing about a GPU")
    run = train(args, device)
    flops = flops_per_token(run["params"], args.model, args.seq_len)
    peak = peak_tflops(device, args.peak_tflops)
    achieved = run["tokens_per_s"] * flops / 1e12
    mfu = achieved / peak if peak else None
    table = print_table(
        f"{'' if device.type == 'cuda' else 'NO GPU USED - '}"
        f"training throughput: {args.model} on {device.type}"
        f"{' (' + torch.cuda.get_device_name(device) + ')' if device.type == 'cuda' else ''}, "
        f"batch {args.batch_size} x {args.seq_len}, {args.steps} timed steps, "
        f"{'compiled' if args.compile else 'eager'}, "
        f"{'bf16 autocast, fused AdamW, ' if device.type == 'cuda' else 'float32, '}"
        f"{run['attention']} SDPA",
        ["params", "tokens/s", "TFLOPs/s achieved", "peak TFLOPs", "MFU"],
        [
            (
                f"{run['params'] / 1e6:.1f}M",
                run["tokens_per_s"],
                achieved,
                peak if peak else "unknown",
                f"{mfu:.1%}" if mfu is not None else "—",
            )
        ],
    )
    result = {
        **result_header("gpu_training", args, None),
        "table": table,
        "device": str(device),
        "gpu_used": device.type == "cuda",
        "flops_per_token": flops,
        "achieved_tflops": achieved,
        "peak_tflops": peak,
        "mfu": mfu,
        **run,
    }
    write_outputs(args.out, "gpu_training", result, [run])
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="125m", help="<family>:<size> (dept models)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=50, help="timed steps")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile's backend ('eager' traces without code generation: a quick check)",
    )
    parser.add_argument("--device", default="auto", help="auto, cuda, cpu, mps")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu-training"))
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
