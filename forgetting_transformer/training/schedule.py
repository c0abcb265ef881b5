"""Learning-rate schedules as pure functions of tokens seen (so changing the batch size keeps the schedule)."""

from __future__ import annotations

import math


def warmup_cosine_lr(tokens: int, *, lr: float, warmup_tokens: int, total_tokens: int,
                     min_lr_ratio: float = 0.0) -> float:
    """Linear warmup from 0 to ``lr`` over ``warmup_tokens``, then cosine decay to ``min_lr_ratio * lr`` at
    ``total_tokens``; constant at the minimum after that."""
    if tokens < warmup_tokens:
        return lr * tokens / warmup_tokens
    progress = min(1.0, (tokens - warmup_tokens) / max(1, total_tokens - warmup_tokens))
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def lr_at(tokens: int, optim_cfg, schedule_cfg) -> float:
    """The configured schedule's learning rate once ``tokens`` training tokens have been consumed."""
    return warmup_cosine_lr(
        tokens, lr=optim_cfg.lr, warmup_tokens=schedule_cfg.warmup_tokens,
        total_tokens=schedule_cfg.total_tokens, min_lr_ratio=schedule_cfg.min_lr_ratio,
    )
