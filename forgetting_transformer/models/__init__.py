"""Model registry: ``model.arch`` → builder. Named sizes live in ``configs/model/size/`` (data, not code).

``decoder`` is the one decoder-only architecture behind FoX (LLaMA/Pro), the Transformer (LLaMA/Pro) and the
paper's ablations; they differ only in config switches (see ``configs/model/``). The ``fla_*`` architectures are
the paper's recurrent / local-attention baselines (``baselines.py``); they import flash-linear-attention when built.
"""

from __future__ import annotations

from typing import Callable

import torch.nn as nn

from .baselines import FLA_ARCHS, FlaLM
from .decoder import DecoderLM, resolve_heads

MODEL_REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "decoder": DecoderLM,
    **{arch: FlaLM for arch in FLA_ARCHS},
}


def build_model(cfg) -> nn.Module:
    """Build the model named by ``cfg.arch`` on the current default device."""
    if cfg.arch not in MODEL_REGISTRY:
        raise ValueError(f"unknown model.arch={cfg.arch!r}; choose one of {sorted(MODEL_REGISTRY)}")
    return MODEL_REGISTRY[cfg.arch](cfg)


__all__ = ["MODEL_REGISTRY", "build_model", "DecoderLM", "resolve_heads"]
