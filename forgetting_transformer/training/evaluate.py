"""Evaluation passes shared by train.py and eval/: held-out loss and per-token loss L(i)."""

from __future__ import annotations

import contextlib
from typing import Callable

import numpy as np
import torch

from .progress import Progress


def autocast_context(device: torch.device, mixed_precision: bool):
    if mixed_precision:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def per_token_loss(model, inputs: torch.Tensor, labels: torch.Tensor, *, batch_size: int, device: torch.device,
                   mixed_precision: bool = False, progress: bool = True,
                   after_batch: Callable[[], None] | None = None) -> np.ndarray:
    """Mean loss at every position over the given rows: inputs/labels (N, T) → L (T,) float64. ``after_batch``
    runs after each batch (train.py's stops the evaluation on a preemption signal by raising)."""
    was_training = model.training
    model.eval()
    total = torch.zeros(inputs.shape[1], dtype=torch.float64)
    with Progress(-(-inputs.shape[0] // batch_size), "per-token loss", "batch", enabled=progress) as bar:
        for s in range(0, inputs.shape[0], batch_size):
            x, y = inputs[s : s + batch_size].to(device), labels[s : s + batch_size].to(device)
            with autocast_context(device, mixed_precision):
                loss = model(x, y)  # (b, T)
            total += loss.double().sum(0).cpu()
            bar.update()
            if after_batch is not None:
                after_batch()
    model.train(was_training)
    return (total / inputs.shape[0]).numpy()


def spread_rows(num_rows: int, n: int) -> list[int]:
    """``n`` row indices spread evenly over ``range(num_rows)``, first and last included (all rows when there are
    fewer): a per-token-loss curve then averages over many documents, not the first few of a split."""
    if n >= num_rows:
        return list(range(num_rows))
    return [int(i) for i in np.linspace(0, num_rows - 1, n).round()]


@torch.no_grad()
def heldout_loss(model, dataset, num_batches: int | None, *, device: torch.device, mixed_precision: bool = False,
                 progress: bool = True, after_batch: Callable[[], None] | None = None) -> float:
    """Mean token loss over the first ``num_batches`` batches of an (unshuffled) dataset; None: all of them.
    ``after_batch`` as in ``per_token_loss``."""
    num_batches = dataset.steps_per_epoch if num_batches is None else num_batches
    if num_batches > dataset.steps_per_epoch:
        raise ValueError(f"eval.heldout_batches={num_batches} exceeds the {dataset.steps_per_epoch} batches the "
                         "held-out split holds at this batch size and seq_len")
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    it = iter(dataset)
    with Progress(num_batches, "held-out loss", "batch", enabled=progress) as bar:
        for _ in range(num_batches):
            x, y = next(it)
            with autocast_context(device, mixed_precision):
                loss = model(x.to(device), y.to(device))
            total += loss.double().sum().item()
            count += loss.numel()
            bar.update()
            if after_batch is not None:
                after_batch()
    model.train(was_training)
    return total / count
