"""Plain-PyTorch PaTH attention (and PaTH-FoX): the oracle fla's PaTH kernel is tested against, and the CPU path.

PaTH (Yang et al. 2025) replaces RoPE's fixed rotations by data-dependent Householder-like transforms
``H_s = I - beta_s w_s w_s^T`` (``w_s`` unit-norm, ``beta_s in (0, 2)``), accumulated between key and query:

    s_ij = sm_scale * q_i^T (H_i H_{i-1} ... H_{j+1}) k_j  [+ c_i - c_j]   for j <= i (empty product for j = i)
    o_i  = sum_{j <= i} softmax_j(s_ij) v_j,                                c = cumsum_t(log f_t)

The bracketed term is PaTH-FoX: FoX's decay bias from the forget gate, added unscaled as in
``forgetting_attention``. Unrolled, the product is DeltaNet's state transition ``S_t = S_{t-1} H_t + v_t k_t^T``,
so key ``j`` is transformed first by ``H_{j+1}`` and last by ``H_i``.

``path_attention_ref`` propagates each query backwards through the transforms (``H_{j+1} ... H_i q_i``), one key
offset at a time: O(T^2 D) time, and with autograd O(T^2 D) memory, so it is meant for short sequences (tests, the
CPU). ``path_transform_keys`` gives every key transformed by all the later tokens' transforms, the decoding cache.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def check_path_inputs(q, k, v, w, beta, log_fgate=None, seq_start=None) -> None:
    """Validate shapes and dtypes; errors name the argument."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or w.dim() != 4:
        raise ValueError(f"q, k, v, w must be (B, T, H, D); got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}, w {tuple(w.shape)}")
    B, T, H, D = q.shape
    if k.shape != v.shape or k.shape != w.shape:
        raise ValueError(f"k, v, w must share a shape; got k {tuple(k.shape)}, v {tuple(v.shape)}, w {tuple(w.shape)}")
    if k.shape[:2] != (B, T) or k.shape[3] != D:
        raise ValueError(f"k must be (B, T, Hkv, D) with (B, T, D) = {(B, T, D)} of q; got {tuple(k.shape)}")
    Hkv = k.shape[2]
    if H % Hkv != 0:
        raise ValueError(f"number of kv heads ({Hkv}) must divide number of query heads ({H})")
    if beta.shape != (B, T, Hkv):
        raise ValueError(f"beta must be (B, T, Hkv) = {(B, T, Hkv)}; got {tuple(beta.shape)}")
    if log_fgate is not None and log_fgate.shape != (B, T, H):
        raise ValueError(f"log_fgate must be (B, T, H) = {(B, T, H)}; got {tuple(log_fgate.shape)}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if seq_start is not None and seq_start.shape != (B,):
        raise ValueError(f"seq_start must be (B,) = ({B},); got {tuple(seq_start.shape)}")


def _path_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """q, k, w (B, H, T, D), beta (B, H, T) (kv heads already repeated) → raw scores (B, H, T, T):
    ``q_i^T H_i ... H_{j+1} k_j`` for ``j <= i``, 0 above the diagonal."""
    B, H, T, _ = q.shape
    by_offset = []
    qt = q  # at offset d: rows i = d .. T-1 hold H_{i-d+1} ... H_i q_i (d = 0: q_i itself)
    for d in range(T):
        s = (qt * k[:, :, : T - d]).sum(-1)  # (B, H, T - d): score of query i with key i - d
        by_offset.append(F.pad(s, (d, 0)))  # (B, H, T) indexed by the query
        wd, bd, qn = w[:, :, 1 : T - d], beta[:, :, 1 : T - d, None], qt[:, :, 1:]  # H_{i-d} for rows i > d
        qt = qn - bd * (qn * wd).sum(-1, keepdim=True) * wd
    by_offset = torch.stack(by_offset, dim=-1)  # (B, H, T, T): [i, d] = score(i, i - d)
    pos = torch.arange(T, device=q.device)
    offset = (pos[:, None] - pos[None, :]).clamp(min=0)  # (T, T): i - j below the diagonal
    scores = by_offset.gather(-1, offset.expand(B, H, T, T))  # (B, H, T, T): [i, j] = score(i, j)
    return scores.masked_fill(pos[None, :] > pos[:, None], 0.0)


def path_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    log_fgate: torch.Tensor | None = None,
    *,
    sm_scale: float | None = None,
    seq_start: torch.Tensor | None = None,
) -> torch.Tensor:
    """PaTH attention (PaTH-FoX with ``log_fgate``) in plain PyTorch.

    Args:
        q: ``(B, T, H, D)`` queries.
        k, v: ``(B, T, Hkv, D)`` keys and values, ``Hkv`` dividing ``H`` (GQA/MQA).
        w: ``(B, T, Hkv, D)`` Householder vectors (unit norm for ``H_s`` to be a reflection-like transform; the
            formula is computed as given for any ``w``).
        beta: ``(B, T, Hkv)`` Householder strengths (``(0, 2)`` in the layer).
        log_fgate: ``(B, T, H)`` log forget gates, or None (PaTH without a forget gate).
        sm_scale: score scale, default ``1 / sqrt(D)``; the decay bias is not scaled.
        seq_start: ``(B,)`` index of each sequence's first real key (left padding before it is masked); query
            rows with no visible key return 0.
    Returns:
        ``(B, T, H, D)`` in q's dtype. Computed in float32 (float64 for float64 q); differentiable with respect
        to every tensor argument.
    """
    check_path_inputs(q, k, v, w, beta, log_fgate, seq_start)
    B, T, H, D = q.shape
    G = H // k.shape[2]
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32

    def heads(x):  # (B, T, Hkv, ...) → (B, H, T, ...) in the compute dtype
        return x.to(dt).repeat_interleave(G, dim=2).transpose(1, 2)

    scores = _path_scores(q.to(dt).transpose(1, 2), heads(k), heads(w), heads(beta)) * sm_scale  # (B, H, T, T)
    if log_fgate is not None:
        c = torch.cumsum(log_fgate.to(torch.float64), dim=1).transpose(1, 2)  # (B, H, T) float64
        scores = scores + (c[..., :, None] - c[..., None, :]).to(dt)  # decay bias c_i - c_j
    pos = torch.arange(T, device=q.device)
    mask = (pos[None, :] <= pos[:, None])[None, None]  # (1, 1, T, T) causal
    if seq_start is not None:
        mask = mask & (pos >= seq_start.to(q.device)[:, None, None, None])  # (B, 1, T, T)
    visible = mask.any(dim=-1, keepdim=True)  # rows inside the left padding see no key: output 0, not NaN
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")).masked_fill(~visible, 0.0), dim=-1)
    o = torch.matmul(probs * visible, heads(v))  # (B, H, T, D)
    return o.transpose(1, 2).to(q.dtype)


def path_transform_keys(k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """Every key transformed by the transforms of all the tokens after it: ``H_{T-1} ... H_{j+1} k_j``
    (0-indexed; the last key is unchanged). These are the keys a decoding cache holds after a prefill of T tokens:
    the next query attends to them with plain (gated) softmax attention.

    Args: k, w ``(B, T, Hkv, D)``; beta ``(B, T, Hkv)``. Returns ``(B, T, Hkv, D)`` in float32 (float64 for
    float64 k). Accumulates ``M_j = H_{T-1} ... H_{j+1}`` from the end as D x D matrices: O(T D^2).
    """
    dt = torch.float64 if k.dtype == torch.float64 else torch.float32
    k, w, beta = k.to(dt), w.to(dt), beta.to(dt)
    B, T, Hkv, D = k.shape
    M = torch.eye(D, dtype=dt, device=k.device).expand(B, Hkv, D, D)  # (B, Hkv, D, D) product of later transforms
    out = [None] * T
    for j in range(T - 1, -1, -1):
        out[j] = torch.einsum("bhde,bhe->bhd", M, k[:, j])  # (B, Hkv, D)
        Mw = torch.einsum("bhde,bhe->bhd", M, w[:, j])  # M_{j-1} = M_j H_j = M_j - beta_j (M_j w_j) w_j^T
        M = M - beta[:, j, :, None, None] * Mw[..., :, None] * w[:, j, :, None, :]
    return torch.stack(out, dim=1)  # (B, T, Hkv, D)
