"""Apply activation checkpointing, torch.compile and data parallelism to a single-device model, in that order
(torchtitan's ``parallelize`` order): checkpoint wrappers must sit inside the compiled region, and FSDP must
wrap the compiled blocks so its hooks run around them.

Models stay plain single-device PyTorch; everything here is applied from the outside, block by block.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper


def apply_activation_checkpointing(model: nn.Module, mode: str, every: int) -> None:
    """``full``: recompute every block in the backward pass; ``selective``: every ``every``-th block.
    Parameter names are unchanged in checkpoints: ``get_state_dict`` strips the wrapper prefix."""
    if mode == "none":
        return
    for i, block in enumerate(model.blocks):
        if mode == "full" or i % every == 0:
            model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_compile(model: nn.Module) -> None:
    """Compile each block separately: small graphs compile fast and are reused across identical blocks."""
    for i, block in enumerate(model.blocks):
        model.blocks[i] = torch.compile(block, fullgraph=False)


def apply_fsdp(model: nn.Module, mixed_precision: bool) -> None:
    """FSDP2: shard every block, then the root (embedding, final norm, LM head). bf16 compute with fp32
    gradient reduction when mixed precision is on; parameters are stored in fp32 either way."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if mixed_precision else None,
                                  reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def parallelize(model: nn.Module, strategy_cfg, device: torch.device, mixed_precision: bool) -> nn.Module:
    """Model on ``device`` → AC → compile → FSDP2 / DDP / nothing, as ``strategy.name`` says."""
    model = model.to(device)
    apply_activation_checkpointing(model, strategy_cfg.activation_checkpointing, strategy_cfg.ac_every)
    if strategy_cfg.compile:
        apply_compile(model)
    if strategy_cfg.name == "fsdp":
        apply_fsdp(model, mixed_precision)
    elif strategy_cfg.name == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model


def autocast_needed(strategy_cfg, mixed_precision: bool) -> bool:
    """FSDP casts parameters to bf16 itself; the other strategies compute in bf16 through autocast."""
    return mixed_precision and strategy_cfg.name != "fsdp"


def set_grad_sync(model: nn.Module, enabled: bool) -> None:
    """Skip the gradient all-reduce / reduce-scatter on all but the last micro-batch of an accumulation."""
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(enabled)
    elif hasattr(model, "require_backward_grad_sync"):  # DDP
        model.require_backward_grad_sync = enabled
