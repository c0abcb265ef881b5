"""Teacher-forced per-token loss through the paged cache, with or without ACP eviction.

``cached_loss`` runs rows of tokens through a ``PagedKVCache`` ``chunk`` tokens at a time, the way a long prompt
is prefilled, and scores every position. Without eviction it equals the model's full forward (up to rounding);
with eviction each chunk's queries see only the keys that survived the previous evictions, so the difference
measures what eviction changes in the model's predictions (at most ``eps`` of any attention row's mass is
dropped; the loss is not bounded by ``eps``, so it is measured).
"""

from __future__ import annotations

import torch

from ..models.decoder import chunked_cross_entropy
from .cache import PagedKVCache
from .eviction import evict, thresholds
from .generate import decoder_of


@torch.no_grad()
def cached_loss(model, input_ids: torch.Tensor, labels: torch.Tensor, *, chunk: int, acp_eviction: bool = False,
                acp_eps: float | None = None, eviction_threshold: float | None = None, block_size: int = 64,
                dtype: torch.dtype | None = None) -> tuple[torch.Tensor, dict]:
    """Per-token loss (B, T) fp32 of ``labels`` (B, T) after ``input_ids`` (B, T), each chunk of ``chunk``
    tokens attending to the cache of the chunks before it; with ``acp_eviction`` the cache is evicted after
    every chunk (the threshold taken at ``max_len = T``). Returns (loss, the cache's ``stats()`` at the end).
    ``acp_eps``, ``eviction_threshold``, ``block_size``, ``dtype``: as ``generate``."""
    lm = decoder_of(model)
    if input_ids.dim() != 2 or labels.shape != input_ids.shape:
        raise ValueError(f"input_ids and labels must both be (B, T); got {tuple(input_ids.shape)} and "
                         f"{tuple(labels.shape)}")
    if not (isinstance(chunk, int) and chunk >= 1):
        raise ValueError(f"chunk must be an int >= 1; got {chunk!r}")
    lm.check_token_ids(input_ids)
    B, T = input_ids.shape
    eps = getattr(lm.cfg, "acp_eps", None) if acp_eps is None else acp_eps
    deltas = thresholds(lm, T, eps, eviction_threshold) if acp_eviction else None
    cache = PagedKVCache.for_model(lm, B, T, block_size=block_size,
                                   dtype=lm.embed.weight.dtype if dtype is None else dtype)
    cache.begin(torch.zeros(B, dtype=torch.int64, device=input_ids.device))
    losses = []
    for s in range(0, T, chunk):
        part = input_ids[:, s:s + chunk]
        cache.reserve(part.shape[1])
        # the first chunk: the layers' own attention over it (an empty cache); later ones: the decode kernel
        h = lm.hidden_states(part, cache=cache.layers(decode=s > 0))  # (B, t, d_model)
        cache.advance(part.shape[1])
        losses.append(chunked_cross_entropy(h, lm.lm_head.weight, labels[:, s:s + chunk], lm.cfg.loss_chunk))
        if deltas is not None:
            evict(cache, deltas)
    return torch.cat(losses, dim=1).float(), cache.stats()
