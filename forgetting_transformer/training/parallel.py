"""Make a model built on the meta device ready to train, in torchtitan's ``parallelize`` order:
activation checkpointing → torch.compile per block → FSDP2 per block and at the root → allocate
(``to_empty``) and initialise (``reset_parameters``) → DDP. Checkpoint wrappers must sit inside the compiled
region, FSDP must wrap the compiled blocks so its hooks run around them, and allocating after sharding means
each rank only ever holds its shard. DDP comes last because it broadcasts real weights when it is built.

Initialisation is exact: the weights are bit for bit those of an eager build, ``torch.manual_seed(seed);
build_model(cfg)`` on the CPU, whatever the device, the strategy and the number of ranks (``init_weights``).

Models stay plain single-device PyTorch; everything here is applied from the outside, block by block.
"""

from __future__ import annotations

from itertools import chain

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
# In-place random fills: what nn.init and Tensor.normal_/uniform_/... reach at the ATen level.
_RANDOM_FILLS = {_aten.normal_, _aten.uniform_, _aten.bernoulli_, _aten.exponential_, _aten.random_,
                 _aten.log_normal_, _aten.cauchy_, _aten.geometric_}


def apply_activation_checkpointing(model: nn.Module, mode: str, every: int) -> None:
    """``full``: recompute every block in the backward pass; ``selective``: every ``every``-th block.
    Parameter names are unchanged in checkpoints: ``get_state_dict`` strips the wrapper prefix."""
    if mode == "none":
        return
    for i, block in enumerate(model.blocks):
        if mode == "full" or i % every == 0:
            model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_compile(model: nn.Module) -> None:
    """Compile each block separately: small graphs compile fast and are reused across identical blocks. A model's
    ``chunk_loss`` (LM head + cross-entropy of one chunk), when it has one, is compiled too: Inductor fuses the
    fp32 upcast, softmax and loss gradient that eager runs as separate passes over the (tokens x vocab) logits."""
    for i, block in enumerate(model.blocks):
        model.blocks[i] = torch.compile(block, fullgraph=False)
    if callable(getattr(model, "chunk_loss", None)):
        model.chunk_loss = torch.compile(model.chunk_loss, fullgraph=True)


def apply_fsdp(model: nn.Module, bf16_params: bool, reshard_after_forward: bool = True,
               prefetch: int = 0) -> None:
    """FSDP2: shard every block, then the root (embedding, final norm, LM head). Parameters are stored in fp32
    and gradients reduced in fp32 either way. ``bf16_params``: FSDP2 all-gathers the parameters in bf16 and the
    forward computes with them; otherwise they are gathered in fp32 (bf16 then comes from autocast, if on).

    ``reshard_after_forward=False`` keeps every block's gathered parameters until its backward (ZeRO-2 style).
    The last block is never resharded after its forward: its backward comes next (torchtitan does the same).
    ``prefetch`` > 0: each block's forward starts the all-gathers of the next ``prefetch`` blocks, and its
    backward those of the ``prefetch`` blocks before it (FSDP2's default prefetches one block, implicitly)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16_params else None,
                                  reduce_dtype=torch.float32)
    blocks = list(model.blocks)
    for i, block in enumerate(blocks):
        fully_shard(block, mp_policy=policy, reshard_after_forward=reshard_after_forward and i < len(blocks) - 1)
    fully_shard(model, mp_policy=policy)
    if prefetch:
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + prefetch])
            block.set_modules_to_backward_prefetch(blocks[max(i - prefetch, 0):i][::-1])


class _FullTensorInit(TorchDispatchMode):
    """Draw every random fill of a non-CPU tensor or a DTensor shard on the CPU generator over the full
    tensor, and keep the device copy or this rank's shard. An eager CPU build draws exactly these numbers,
    so the weights do not depend on the device or on how (or over how many ranks) they are sharded; DTensor's
    own random ops would give sharding-dependent values (pytorch/torchtitan#514). Each rank draws every full
    tensor, one at a time: the cost of an eager build, without holding the full model."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dst = args[0] if args else None
        if func.overloadpacket in _RANDOM_FILLS and (isinstance(dst, DTensor) or dst.device.type != "cpu"):
            full = torch.empty(dst.shape, dtype=dst.dtype)
            func(full, *args[1:], **kwargs)
            return _copy_full(dst, full)
        if func.overloadpacket is _aten.copy_ and isinstance(dst, DTensor) and not isinstance(args[1], DTensor):
            return _copy_full(dst, args[1])  # e.g. a bias copied from a plain tensor computed for the full shape
        return func(*args, **kwargs)


def _copy_full(dst: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """Write the full-shape ``full`` into ``dst``: all of it, or only this rank's shard of a DTensor."""
    if isinstance(dst, DTensor):
        # src_data_rank=None: every rank holds the same full tensor, so each takes its shard without communication.
        shard = distribute_tensor(full.to(dst.dtype), dst.device_mesh, dst.placements, src_data_rank=None)
        dst.to_local().copy_(shard.to_local())
    else:
        dst.copy_(full)
    return dst


def _initialised_at_construction(module: nn.Module) -> bool:
    """torch.nn layers (Linear, Embedding, ...) draw their default initialisation in their constructors."""
    for cls in type(module).__mro__:  # class attributes only: wrappers forward attribute lookups to what they wrap
        if "reset_parameters" in vars(cls):
            return cls.__module__.startswith("torch.nn.")
    return False


def init_weights(model: nn.Module, device: torch.device, seed: int) -> None:
    """Allocate a meta-device model (possibly wrapped and FSDP-sharded) on ``device`` and initialise it to the
    weights of an eager build, ``torch.manual_seed(seed); build_model(cfg)`` on the CPU, bit for bit; the
    generator is left where that build leaves it.

    An eager build draws twice: each torch.nn layer's default initialisation in its constructor, then the
    model's ``reset_parameters()``; both are replayed in construction (= registration) order. Parameters and
    float buffers are NaN-filled first, so one that neither touches is reported instead of training from
    whatever ``to_empty`` left in memory (non-persistent buffers such as rotary caches must be recomputed by
    ``reset_parameters()`` too)."""
    if not callable(getattr(type(model), "reset_parameters", None)):
        raise TypeError(f"{type(model).__name__} has no reset_parameters(): models are built on the meta device "
                        "and initialised by it once allocated; every model in MODEL_REGISTRY must define it")
    model.to_empty(device=device)
    tensors = [(n, t) for n, t in chain(model.named_parameters(), model.named_buffers()) if t.is_floating_point()]
    torch.manual_seed(seed)
    with torch.no_grad(), _FullTensorInit():
        for _, t in tensors:
            t.fill_(float("nan"))
        for module in model.modules():
            if _initialised_at_construction(module):
                module.reset_parameters()
        model.reset_parameters()
    for name, t in tensors:
        if torch.isnan(t.to_local() if isinstance(t, DTensor) else t).any():
            raise RuntimeError(f"{type(model).__name__}.reset_parameters() does not initialise {name} "
                               "(it holds NaN after initialisation)")


def parallelize(model: nn.Module, strategy_cfg, device: torch.device, mixed_precision: bool, seed: int) -> nn.Module:
    """A model built under ``torch.device("meta")`` → AC → compile → FSDP2 → allocated on ``device`` and
    initialised from ``seed`` → DDP / nothing, as ``strategy.name`` says."""
    real = next((f"{n} is on {t.device}" for n, t in chain(model.named_parameters(), model.named_buffers())
                 if not t.is_meta), None)
    if real is not None:
        raise ValueError(f"parallelize() takes a model built under torch.device('meta'), but {real}; it allocates "
                         "and initialises the weights itself")
    apply_activation_checkpointing(model, strategy_cfg.activation_checkpointing, strategy_cfg.ac_every)
    if strategy_cfg.compile:
        apply_compile(model)
    if strategy_cfg.name == "fsdp":
        apply_fsdp(model, mixed_precision and strategy_cfg.fsdp_precision == "bf16_params",
                   strategy_cfg.reshard_after_forward, strategy_cfg.fsdp_prefetch)
    init_weights(model, device, seed)
    if strategy_cfg.name == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model


def autocast_needed(strategy_cfg, mixed_precision: bool) -> bool:
    """Whether the forward passes (training and evaluation) run under bf16 autocast: always with mixed precision,
    except for FSDP with ``strategy.fsdp_precision=bf16_params``, whose parameters FSDP2 casts to bf16 itself."""
    return mixed_precision and (strategy_cfg.name != "fsdp" or strategy_cfg.fsdp_precision == "autocast")


def set_grad_sync(model: nn.Module, enabled: bool) -> None:
    """Skip the gradient all-reduce / reduce-scatter on all but the last micro-batch of an accumulation."""
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(enabled)
    elif hasattr(model, "require_backward_grad_sync"):  # DDP
        model.require_backward_grad_sync = enabled
