"""The words the run configuration is written in: its error, its key spelling, the choices
of keys whose code lives elsewhere, and ``doc()``, which gives every field its one-line doc.
Light (no omegaconf, no torch): the rest of the config builds on it."""

from __future__ import annotations

import re
from dataclasses import field
from typing import Literal, TypeVar, get_args

# Choices whose code imports this module (dept.train.local, dept.wire.compression), or is not the
# core's (dept_strategy); named here so the config (and --help) loads without torch.
CompressionName = Literal["none", "fp16", "int8", "int4", "int2", "ternary", "topk"]  # Δ's trip up
DownloadName = Literal["none", "fp16", "int8", "int4", "int2", "ternary"]  # θ's change going down
AggregationName = Literal["mean", "trimmed-mean", "median"]  # how a round's updates combine
OutlierAction = Literal["clip", "reject"]  # what becomes of an update too large to be honest
ServerMemory = Literal["fast", "lean"]  # whether a round's mean is folded as replies arrive
DataParallelName = Literal["ddp", "fsdp"]  # how a source with nproc > 1 splits its training
InnerName = Literal["adamw", "sgd"]  # a source's local optimizer (dept.train.local builds it)
# Tuples for the code that checks a value outside the schema.
COMPRESSIONS: tuple[CompressionName, ...] = get_args(CompressionName)
DOWNLOADS: tuple[DownloadName, ...] = get_args(DownloadName)
AGGREGATIONS: tuple[AggregationName, ...] = get_args(AggregationName)
OUTLIER_ACTIONS: tuple[OutlierAction, ...] = get_args(OutlierAction)
SERVER_MEMORIES: tuple[ServerMemory, ...] = get_args(ServerMemory)
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:[0-9]+)?")  # dept.train.devices resolves it
MAX_VOCAB_SIZE = 1 << 20  # larger vocabularies are not trained here (a typo, not a plan)
# The smallest byte-level BPE vocabulary (dept.data.vocab): 256 bytes, end-of-text, one merge
MIN_VOCAB_SIZE = 256 + 1 + 1
T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or invalid; the message names the key."""


def kebab(name: str) -> str:
    """Schema field name -> run config key (``local_steps`` -> ``local-steps``)."""
    return name.replace("_", "-")


def snake(key: str) -> str:
    """Run config key -> schema field name."""
    return key.replace("-", "_")


def doc(default: T, text: str) -> T:
    """A schema field with its one-line doc, shown by ``dept run --help`` and the reference page."""
    return field(default=default, metadata={"doc": text})
