"""Evaluation passes shared by train.py and eval/: held-out loss and per-token loss L(i). Both print a progress
line at least every ~10 s, also inside one long batch (``progress.heartbeat``), naming the batch that runs."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .progress import Progress, heartbeat


def autocast_context(device: torch.device, mixed_precision: bool):
    if mixed_precision:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


ROW_BAND = 1024  # positions per band of the per-row losses train.py keeps beside L(i)


@torch.no_grad()
def per_token_loss(model, inputs: torch.Tensor, labels: torch.Tensor, *, batch_size: int, device: torch.device,
                   mixed_precision: bool = False, progress: bool = True,
                   after_batch: Callable[[], None] | None = None, band: int | None = None):
    """Mean loss at every position over the given rows: inputs/labels (N, T) → L (T,) float64. With ``band``, also
    each row's mean loss over consecutive bands of ``band`` positions, (N, ceil(T / band)) float64: the spread
    between rows that an interval on L(i) needs. ``after_batch`` runs after each batch (train.py's stops the
    evaluation on a preemption signal by raising)."""
    was_training = model.training
    model.eval()
    total = torch.zeros(inputs.shape[1], dtype=torch.float64)
    bands = []
    batches = -(-inputs.shape[0] // batch_size)
    with Progress(batches, "per-token loss", "batch", enabled=progress) as bar, heartbeat(bar):
        for s in range(0, inputs.shape[0], batch_size):
            x, y = inputs[s : s + batch_size].to(device), labels[s : s + batch_size].to(device)
            bar.working_on(f"batch {s // batch_size + 1} of {batches} ({x.shape[0]} rows × {x.shape[1]:,} tokens)")
            with autocast_context(device, mixed_precision):
                loss = model(x, y).double().cpu()  # (b, T)
            total += loss.sum(0)
            if band is not None:
                bands.append(band_means(loss, band))
            bar.update()
            if after_batch is not None:
                after_batch()
    model.train(was_training)
    curve = (total / inputs.shape[0]).numpy()
    return curve if band is None else (curve, torch.cat(bands).numpy())


def band_means(loss: torch.Tensor, band: int) -> torch.Tensor:
    """(N, T) → (N, ceil(T / band)): each row's mean over positions [k·band, (k+1)·band) (the last band may be
    shorter)."""
    if band < 1:
        raise ValueError(f"band must be >= 1, got {band}")
    return torch.stack([chunk.mean(1) for chunk in loss.split(band, dim=1)], dim=1)


def spread_rows(num_rows: int, n: int) -> list[int]:
    """``n`` row indices spread evenly over ``range(num_rows)``, first and last included (all rows when there are
    fewer): a per-token-loss curve then averages over many documents, not the first few of a split."""
    if n >= num_rows:
        return list(range(num_rows))
    return [int(i) for i in np.linspace(0, num_rows - 1, n).round()]


@dataclass(frozen=True)
class HeldoutLoss:
    """The mean token loss over the first ``sequences`` chunks of ``seq_len`` tokens of a split (row by row), and
    what that covers of the split's ``rows`` rows of ``doc_len`` tokens: the figure alone would not say whether it
    is the whole split or its first rows (one book of two, say)."""

    loss: float
    sequences: int
    seq_len: int
    rows: int
    doc_len: int
    split: str  # the array's name, e.g. heldout.zarr

    @property
    def tokens(self) -> int:
        return self.sequences * self.seq_len

    def rows_covered(self) -> int | float:
        rows = self.tokens / self.doc_len
        return int(rows) if rows.is_integer() else rows

    def covers(self) -> str:
        """E.g. ``all 57 rows × 2,048 tokens of heldout.zarr (116,736 tokens)``."""
        shape, total = f"{self.rows} rows × {self.doc_len:,} tokens", self.rows * self.doc_len
        if self.tokens == total:
            return f"all {shape} of {self.split} ({total:,} tokens)"
        return (f"the first {self.rows_covered():.4g} of {shape} of {self.split} "
                f"({self.tokens:,} of {total:,} tokens)")

    def text(self) -> str:
        return f"held-out loss {self.loss:.4f} over {self.covers()}"

    def record(self) -> dict:
        """The metrics.jsonl fields: ``heldout_loss`` and what it covers (rows, of the split's rows, tokens)."""
        return {"heldout_loss": self.loss, "heldout_rows": self.rows_covered(), "heldout_split_rows": self.rows,
                "heldout_tokens": self.tokens}


@torch.no_grad()
def heldout_loss(model, dataset, num_batches: int | None, *, device: torch.device, mixed_precision: bool = False,
                 progress: bool = True, after_batch: Callable[[], None] | None = None) -> HeldoutLoss:
    """Mean token loss over the first ``num_batches`` batches of ``dataset.batch_size`` chunks of a
    ``LongCrawl64Dataset``, read in order (row by row); None: every chunk of the split (the last batch may be
    smaller). ``after_batch`` as in ``per_token_loss``."""
    size = dataset.batch_size
    batches = -(-dataset.num_sequences // size)
    num_batches = batches if num_batches is None else num_batches
    if num_batches > batches:
        raise ValueError(f"eval.heldout_batches={num_batches} exceeds the {batches} batches of {size} sequences of "
                         f"{dataset.seq_len} tokens that {dataset.path} holds (null: all of them)")
    n = min(num_batches * size, dataset.num_sequences)
    was_training = model.training
    model.eval()
    total = 0.0
    with Progress(num_batches, "held-out loss", "batch", enabled=progress) as bar, heartbeat(bar):
        for s in range(0, n, size):
            x, y = dataset.read_sequences(np.arange(s, min(s + size, n)))
            bar.working_on(f"batch {s // size + 1} of {num_batches} ({x.shape[0]} × {x.shape[1]:,} tokens)")
            with autocast_context(device, mixed_precision):
                loss = model(x.to(device), y.to(device))
            total += loss.double().sum().item()
            bar.update()
            if after_batch is not None:
                after_batch()
    model.train(was_training)
    return HeldoutLoss(total / (n * dataset.seq_len), n, dataset.seq_len, dataset.num_rows, dataset.doc_len,
                       dataset.path.name)
