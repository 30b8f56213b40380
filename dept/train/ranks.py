"""How one process of a source's data-parallel training takes part in its round.

A source with ``nproc`` > 1 trains on ``nproc`` processes (ranks) of one process group: gloo
on the CPU, NCCL on GPUs (rank r on the r-th GPU from the node's device). Every rank walks
the single-process batch stream and takes rows ``r::nproc`` of each micro-batch, so the
ranks' rows together are the single-process batch; each rank's loss is the mean over its
rows, and averaging the ranks' gradients (DDP, or FSDP2's reduce-scatter) gives the
single-process gradient. The round's code is the single-process one
(:meth:`dept.train.source_client.SourceClient.train_round`) with the hooks of :class:`OneProcess`,
which :class:`Ranks` fills in.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn.parallel import DistributedDataParallel
from transformers import PreTrainedModel

from dept.config import DataParallelName
from dept.train.local import TrainStats

# A rank waits this long in a collective for a peer; a dead peer is seen by the launcher
# long before (it stops every rank), so this only bounds a peer that hangs.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


class OneProcess:
    """The hooks of a round trained by one process: each one leaves things as they are."""

    rank, world = 0, 1

    @property
    def writes(self) -> bool:
        """Whether this process writes the round's state and reply (rank 0)."""
        return self.rank == 0

    def wrap(self, model: PreTrainedModel) -> PreTrainedModel:
        """The module to train: ``model`` itself, or its data-parallel wrapper (which
        forwards the calls :func:`dept.train.local.train_local` makes)."""
        return model

    def shard(self, batches: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        """This process's rows of each (B, T+1) micro-batch."""
        return batches

    def load_optimizer(self, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
        optimizer.load_state_dict(saved)

    def reduce(self, stats: TrainStats) -> TrainStats:
        """The round's statistics over all processes."""
        return stats

    def agree(self, flag: bool) -> bool:
        """Rank 0's ``flag`` on every process: a decision all must take alike (another step
        of a time-budgeted round), though each measured its own time."""
        return flag

    def unshard(self, model: PreTrainedModel) -> None:
        """Make ``model``'s parameters whole again after training (FSDP)."""

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's state_dict with whole tensors, as one process would save it."""
        return optimizer.state_dict()


class Ranks(OneProcess):
    """This process as rank ``rank`` of ``world``, training with ``kind`` on ``device``."""

    def __init__(self, rank: int, world: int, device: torch.device, kind: DataParallelName):
        self.rank, self.world, self.device, self.kind = rank, world, device, kind

    @classmethod
    def join(cls, kind: DataParallelName, first_gpu: int | None) -> Ranks:
        """Join the process group the launcher set up (``RANK``, ``WORLD_SIZE``,
        ``LOCAL_RANK``, ``MASTER_*`` in the environment); ``first_gpu``: the GPU of rank 0
        (the others take the next ones), None to train on the CPU."""
        local = int(os.environ["LOCAL_RANK"])
        if first_gpu is None:
            device = torch.device("cpu")
            dist.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT)
        else:
            device = torch.device("cuda", first_gpu + local)
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", timeout=COLLECTIVE_TIMEOUT, device_id=device)
        return cls(dist.get_rank(), dist.get_world_size(), device, kind)

    def close(self) -> None:
        dist.destroy_process_group()

    def wrap(self, model: PreTrainedModel) -> PreTrainedModel:
        if self.kind == "ddp":
            ids = [self.device.index] if self.device.type == "cuda" else None
            return cast(PreTrainedModel, DistributedDataParallel(model, device_ids=ids))
        mesh = init_device_mesh(self.device.type, (self.world,))
        blocks = set(getattr(model, "_no_split_modules", None) or ())  # HF: the layer classes
        for module in model.modules():
            if type(module).__name__ in blocks:
                fully_shard(module, mesh=mesh)  # one all-gather per block, not per model
        fully_shard(model, mesh=mesh)  # in place: its parameters become this rank's shards
        return model

    def shard(self, batches: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        return (batch[self.rank :: self.world] for batch in batches)

    def load_optimizer(self, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
        """``saved`` holds whole tensors (one process's format); FSDP's parameters are
        shards, so each moment is cut like its parameter (every rank read it whole)."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        state = {
            index: {k: _like(v, params[index]) for k, v in values.items()}
            for index, values in saved["state"].items()
        }
        optimizer.load_state_dict({**saved, "state": state})

    def reduce(self, stats: TrainStats) -> TrainStats:
        """Tokens summed, losses averaged (equal rows per rank: the mean of the ranks' means
        is the single-process mean), seconds of the slowest rank."""
        sums = torch.tensor(
            [stats.tokens, stats.mean_loss, stats.final_loss], dtype=torch.float64
        ).to(self.device)
        dist.all_reduce(sums)
        seconds = torch.tensor([stats.seconds], dtype=torch.float64).to(self.device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        tokens, mean_loss, final_loss = sums.tolist()
        return dataclasses.replace(
            stats,
            tokens=round(tokens),
            mean_loss=mean_loss / self.world,
            final_loss=final_loss / self.world,
            seconds=float(seconds.item()),
        )

    def agree(self, flag: bool) -> bool:
        decision = torch.tensor([int(flag)], dtype=torch.int32, device=self.device)
        dist.broadcast(decision, src=0)
        return bool(decision.item())

    def unshard(self, model: PreTrainedModel) -> None:
        """FSDP: gather every block's weights (all ranks take part); its modules then hold
        whole parameters, which the rest of the round reads as one process would."""
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.unshard()

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        saved = optimizer.state_dict()
        state = {
            index: {k: _whole(v) for k, v in values.items()}
            for index, values in saved["state"].items()
        }
        return {**saved, "state": state}


def _like(value: Any, param: torch.Tensor) -> Any:
    """A saved moment of ``param`` cut into this rank's shard where ``param`` is one."""
    if not isinstance(param, DTensor) or not isinstance(value, torch.Tensor) or not value.dim():
        return value  # a plain parameter's, or the step count
    whole = value.to(param.device)
    return distribute_tensor(whole, param.device_mesh, param.placements, src_data_rank=None)


def _whole(value: Any) -> Any:
    """A moment as one tensor on the CPU (all ranks gather it together)."""
    return value.full_tensor().cpu() if isinstance(value, DTensor) else value
