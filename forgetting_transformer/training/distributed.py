"""Process-group setup for torchrun launches (one process per GPU, or gloo ranks on CPU) and small collectives."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(strategy_cfg) -> DistInfo:
    """Read torchrun's environment, pick the device and (for several ranks) start the process group.

    ``strategy.device=auto`` means this rank's GPU when CUDA is available, else the CPU (gloo backend).
    ``strategy.deterministic``: ``torch.use_deterministic_algorithms(True, warn_only=True)`` for the process, with
    cuBLAS's fixed workspace (set before the first matmul creates its handle)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if strategy_cfg.name == "single" and world_size > 1:
        raise RuntimeError(f"strategy.name=single trains in one process, but WORLD_SIZE={world_size}; "
                           "use strategy=fsdp or strategy=ddp under torchrun")
    kind = strategy_cfg.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("strategy.device=cuda but no CUDA device is available")
    if strategy_cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition for repeatable matmuls
        torch.use_deterministic_algorithms(True, warn_only=True)
    device = torch.device("cuda", local_rank) if kind == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", device_id=device
                                if device.type == "cuda" else None)
    return DistInfo(rank, world_size, local_rank, device)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def mean_across_ranks(x: torch.Tensor) -> torch.Tensor:
    """Average a tensor over all ranks (identity in one process)."""
    if dist.is_initialized():
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        x /= dist.get_world_size()
    return x


def broadcast_from_main(obj):
    """Rank 0's value of a picklable object on every rank (e.g. a time-stamped output dir each rank resolved
    at a slightly different moment)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shutdown() -> None:
    """Destroy the process group, after the caller has dropped its models. DDP's reducer holds the group; were it
    the last holder, the group would die in the reducer's destructor, which keeps the GIL while it joins gloo's
    worker threads, and a worker that frees a collective's tensor needs the GIL: a hang at exit. Collected first,
    the reducer leaves the group to ``destroy_process_group``, whose destructor releases the GIL."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
