"""Model registry: ``model.arch`` → builder. Named sizes live in ``configs/model/size/`` (data, not code)."""

from __future__ import annotations

from typing import Callable

import torch.nn as nn

from .fox import FoXModel

MODEL_REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "fox": FoXModel,
}


def build_model(cfg) -> nn.Module:
    """Build the model named by ``cfg.arch`` on the current default device."""
    if cfg.arch not in MODEL_REGISTRY:
        raise ValueError(f"unknown model.arch={cfg.arch!r}; choose one of {sorted(MODEL_REGISTRY)}")
    return MODEL_REGISTRY[cfg.arch](cfg)


__all__ = ["MODEL_REGISTRY", "build_model", "FoXModel"]
