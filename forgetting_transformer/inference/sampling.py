"""Choosing the next token from logits: greedy, or sampling with temperature, top-k and top-p.

Every operation has shapes fixed by the batch and vocabulary and none waits for the device, so the choice can be
part of a captured decoding step. Sampling draws with the Gumbel-max trick: ``argmax(logits / T + G)`` with
i.i.d. standard Gumbel noise ``G`` is a sample of ``softmax(logits / T)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampler:
    """``do_sample=False``: greedy (the other fields are ignored). Else ``temperature`` > 0 scales the logits,
    ``top_k`` (None or 0: off) keeps the k most likely tokens, ``top_p`` (None or 1: off) the smallest set of most
    likely tokens whose probability reaches p (at least one); then one token is drawn."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if not self.do_sample:
            return
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise ValueError(f"temperature must be > 0 when sampling; got {self.temperature!r}")
        if self.top_k is not None and not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k must be None or an int >= 0; got {self.top_k!r}")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be None or in (0, 1]; got {self.top_p!r}")

    def filter(self, logits: torch.Tensor) -> torch.Tensor:
        """(B, V) → float32 logits scaled by the temperature, -inf outside the top-k / top-p sets."""
        x = logits.float() / self.temperature
        if self.top_k and self.top_k < x.shape[-1]:
            kth = torch.topk(x, self.top_k, dim=-1).values[..., -1:]  # (B, 1)
            x = x.masked_fill(x < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1:
            sorted_x, order = torch.sort(x, dim=-1, descending=True)
            probs = torch.softmax(sorted_x, dim=-1)
            # drop a token when the more likely ones already reach p (the most likely one always stays)
            drop_sorted = torch.cumsum(probs, dim=-1) - probs >= self.top_p
            x = x.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
        return x

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """(B, V) logits → (B,) int64 token ids."""
        if not self.do_sample:
            return logits.argmax(dim=-1)
        x = self.filter(logits)
        u = torch.rand_like(x).clamp_(min=torch.finfo(torch.float32).tiny)
        return (x - torch.log(-torch.log(u))).argmax(dim=-1)
