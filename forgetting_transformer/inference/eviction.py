"""ACP eviction: drop from the KV cache, for good, the keys the forget gates have decayed below ACP's threshold.

Training-time ACP (``ops/forgetting_attention/acp.py``) skips key j for query i when ``c_i - c_j < delta`` with
``delta = -2U - log(Tk) + log(eps)`` and ``U >= max |q_i . k_j| * sm_scale``: every skipped weight is then below
``exp(2U + delta) = eps / Tk`` (the query's own key, with decay 0 and score >= -U, keeps the softmax denominator
above ``exp(-U)``), so at most ``eps`` of the attention mass of a row is skipped.

At inference the same rule is applied with ``Tk = max_len``, the most positions the cache may ever hold, and
``U`` from the QK-norm weights, which bound every query and key the model can produce (``|RMSNorm(x)| <=
sqrt(D) max|gamma|``, and RoPE keeps norms). Since ``log f <= 0``, ``c`` never increases: a key dropped for the
newest query is below the threshold for every later query too, so it is never needed again, and each row of
every later query loses at most ``eps`` of its attention mass (fewer than ``max_len`` keys, each below
``eps / max_len``).

The first kept key of each (sequence, query head) moves forward only (``advance``); a kv head's cache block is
released once it lies wholly before the first kept key of all query heads of its group (``PagedKVCache.release``).
"""

from __future__ import annotations

import math

import torch

from ..ops.forgetting_attention.acp import DEFAULT_EPS, check_qk_norm_weights


def thresholds(model, max_len: int, eps: float = DEFAULT_EPS, threshold: float | None = None) -> torch.Tensor:
    """delta per (layer, query head), (L, H) float64 on the model's device, for a ``DecoderLM`` decoding up to
    ``max_len`` positions. ``threshold``: an explicit delta (< 0) for every head instead of the ``"auto"`` rule,
    which needs QK-norm."""
    attns = [block.attn for block in model.blocks]
    device = model.embed.weight.device
    n_heads, head_dim = attns[0].n_heads, attns[0].head_dim
    if attns[0].fgate is None:
        raise ValueError("acp_eviction needs a forget gate: a model with model.fgate='none' (a Transformer) has no "
                         "decay to evict keys by")
    if threshold is not None:
        if not (isinstance(threshold, (int, float)) and threshold < 0):
            raise ValueError(f"eviction_threshold must be a float < 0 (the newest key, with decay 0, is always "
                             f"kept); got {threshold!r}")
        return torch.full((len(attns), n_heads), float(threshold), dtype=torch.float64, device=device)
    if not (0.0 < eps < 1.0):
        raise ValueError(f"acp_eps must be in (0, 1); got {eps}")
    if attns[0].q_norm is None:
        raise ValueError("acp_eviction's 'auto' threshold bounds the scores of every later query by the QK-norm "
                         "weights, and this model has no QK-norm (model.qk_norm=false): pass eviction_threshold="
                         "<a float delta < 0> (keys with c_i - c_j < delta are dropped)")
    rows = []
    for a in attns:
        check_qk_norm_weights((a.q_norm.weight, a.k_norm.weight), n_heads, a.n_kv_heads, head_dim)
        # The "auto" rule of ops.forgetting_attention.acp.acp_threshold with QK-norm weights, in float64, Tk = max_len
        qmax = a.q_norm.weight.detach().double().abs().amax(-1) * math.sqrt(head_dim)
        kmax = a.k_norm.weight.detach().double().abs().amax(-1) * math.sqrt(head_dim)
        U = qmax * kmax / math.sqrt(head_dim)
        rows.append((-2.0 * U - math.log(max_len) + math.log(eps)).expand(n_heads))
    return torch.stack(rows).to(device)


def sequence_thresholds(model, real_lengths: torch.Tensor, eps: float = DEFAULT_EPS,
                        threshold: float | None = None) -> torch.Tensor:
    """delta per (layer, sequence, query head), (L, B, H): ``thresholds`` with each sequence's own ``max_len``
    (its real tokens, ``real_lengths`` (B,), left padding not counted), so a sequence drops the keys it would
    drop decoded alone, whatever the batch it is in."""
    return torch.stack([thresholds(model, int(n), eps, threshold) for n in real_lengths.tolist()], dim=1)


def advance(cache, deltas: torch.Tensor) -> None:
    """Move ``cache.key_start`` (L, B, H) past every key with ``c_last - c_j < delta``, ``deltas`` (L, H) or per
    sequence (L, B, H), where c_last is the newest token's cumulative gate. Exact: whole blocks are tested at their
    last key, then the block holding the boundary key by key (c is non-increasing, so the dropped keys are a
    prefix). Every layer in one pass (a launch per operation, not per layer and operation: the decoding loop
    runs this between CUDA graph replays, on the host's clock). No sync."""
    L, BS, G = cache.length, cache.block_size, cache.group
    delta = (deltas if deltas.dim() == 3 else deltas[:, None])[..., None]  # (L, B | 1, H, 1)
    nb = -(-L // BS)
    c_now = cache.c_last[..., None]  # (L, B, H, 1)
    start = cache.key_start  # (L, B, H)
    table = cache.tables[..., :nb].long().repeat_interleave(G, dim=2)  # (L, B, H, nb)
    g = (torch.arange(cache.n_heads, device=start.device) % G)[:, None]  # (H, 1)
    i = torch.arange(nb, device=start.device)
    ends = torch.clamp(i * BS + BS - 1, max=L - 1)
    c_end = cache.c_pool[table.clamp(min=0), g, ends % BS]  # (L, B, H, nb)
    # blocks wholly before the first kept key (released ones, left padding) count as dropped without a look
    dropped = ((i * BS + BS - 1) < start[..., None]) | (c_now - c_end < delta)
    blk = dropped.sum(-1, keepdim=True).clamp(max=nb - 1)  # (L, B, H, 1) the block holding the boundary
    pos = blk * BS + torch.arange(BS, device=start.device)  # (L, B, H, BS)
    c_blk = cache.c_pool[table.gather(3, blk).clamp(min=0), g, pos % BS]
    dropped = (pos < start[..., None]) | ((c_now - c_blk < delta) & (pos < L))
    torch.maximum(start, blk[..., 0] * BS + dropped.sum(-1), out=start)


def evict(cache, deltas: torch.Tensor) -> None:
    """``advance`` every layer (``deltas`` (L, H) or (L, B, H)), then release the blocks no query head of a row
    can see."""
    advance(cache, deltas)
    cache.release()
