"""Plain-PyTorch Forgetting Attention: the oracle every kernel is tested against, and the CPU path.

    o_i = sum_{j <= i} softmax_j(q_i . k_j * sm_scale + c_i - c_j) v_j,   c = cumsum_t(log f_t)

The decay bias ``c_i - c_j`` is materialised one query chunk at a time, so the forward pass never holds a
``Tq x Tk`` matrix, and with autograd each chunk is recomputed in the backward pass (activation
checkpointing), so the backward pass does not either.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from . import acp as _acp

DEFAULT_CHUNK_SIZE = 1024


def check_inputs(q, k, v, log_fgate, cu_seqlens=None, seq_start=None) -> None:
    """Validate shapes and dtypes shared by the reference and the kernel; errors name the argument."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be (B, T, H, D); got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    B, Tq, H, D = q.shape
    Bk, Tk, Hkv, Dk = k.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if Bk != B:
        raise ValueError(f"batch size mismatch: q has B={B}, k has B={Bk}")
    if Dk != D:
        raise ValueError(f"head dim mismatch: q has D={D}, k/v have D={Dk}")
    if H % Hkv != 0:
        raise ValueError(f"number of kv heads ({Hkv}) must divide number of query heads ({H})")
    if Tq > Tk:
        raise ValueError(f"seqlen_q ({Tq}) must be <= seqlen_k ({Tk}); queries are aligned to the end")
    if log_fgate.shape != (B, Tk, H):
        raise ValueError(f"log_fgate must be (B, Tk, H) = {(B, Tk, H)}; got {tuple(log_fgate.shape)}")
    if log_fgate.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"log_fgate must be float32 (or float64 in tests); got {log_fgate.dtype}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"cu_seqlens needs packed input with B=1; got B={B}")
        if Tq != Tk:
            raise ValueError(f"cu_seqlens needs seqlen_q == seqlen_k; got {Tq} and {Tk}")
        if cu_seqlens.dim() != 1 or int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != Tk:
            raise ValueError(f"cu_seqlens must be 1-D, start at 0 and end at T={Tk}; got {cu_seqlens.tolist()}")
        if bool((cu_seqlens[1:] < cu_seqlens[:-1]).any()):
            raise ValueError(f"cu_seqlens must be non-decreasing; got {cu_seqlens.tolist()}")
    if seq_start is not None and seq_start.shape != (B,):
        raise ValueError(f"seq_start must be (B,) = ({B},); got {tuple(seq_start.shape)}")


def _attend_chunk(q, k, v, c_q, c_k, pos_q, pos_k, doc_q, doc_k, start, jmin, sm_scale):
    # q (B, H, tq, D); k, v (B, H, tk, D); c_q (B, H, tq) and c_k (B, H, tk): cumsums of log f relative to the
    # chunk's first query (formed in float64, then cast), so the bias below never differences two large numbers
    # where it matters: keys near the queries have small offsets, far keys have exp(bias) ~ 0 anyway.
    scores = torch.matmul(q, k.transpose(-1, -2)) * sm_scale  # (B, H, tq, tk)
    scores = scores + (c_q.unsqueeze(-1) - c_k.unsqueeze(-2))  # + decay bias c_i - c_j
    mask = pos_k[None, :] <= pos_q[:, None]  # (tq, tk) causal
    if doc_q is not None:
        mask = mask & (doc_k[None, :] == doc_q[:, None])
    if jmin is not None:  # ACP: each row's first unpruned key, (B, H, tq); the diagonal is never pruned
        mask = mask & (pos_k >= jmin[..., None])  # (B, H, tq, tk)
    if start is None:
        return torch.matmul(torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1), v)  # (B, H, tq, D)
    mask = mask & (pos_k >= start[:, None, None, None])  # (B, 1 or H, tq, tk)
    # Rows with no visible key (queries inside the left padding) give 0 rather than NaN.
    visible = mask.any(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")).masked_fill(~visible, 0.0), dim=-1)
    return torch.matmul(probs * visible, v)


def forgetting_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_fgate: torch.Tensor,
    *,
    sm_scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    seq_start: torch.Tensor | None = None,
    adaptive_threshold=None,
    return_stats: bool = False,
    acp_eps: float = _acp.DEFAULT_EPS,
    qk_norm_weights=None,
    acp_grid: tuple[int, int] = (64, 64),
    chunk_size: int = DEFAULT_CHUNK_SIZE,
):
    """Forgetting Attention in plain PyTorch (same signature as ``forgetting_attention``).

    Args:
        q: ``(B, Tq, H, D)``; k, v: ``(B, Tk, Hkv, D)`` with ``Hkv`` dividing ``H`` (GQA/MQA).
        log_fgate: ``(B, Tk, H)`` float32, ``log f_t <= 0``.
        sm_scale: score scale, default ``1 / sqrt(D)``.
        cu_seqlens: ``(N + 1,)`` int document boundaries of a packed ``B = 1`` batch; no attention across them.
        seq_start: ``(B,)`` int index of each sequence's first real key (left padding before it is masked).
        adaptive_threshold, acp_eps, qk_norm_weights: ACP as in ``forgetting_attention``; the pruned region is
            defined on the ``acp_grid`` (GM, GN) exactly as the kernel defines it on its grid (see ``acp.py``),
            and masked here, so the output and gradients are those of the pruned attention.
        return_stats: also return ``{"computed", "pruned"}`` (B, H) counts of causal ``acp_grid`` tiles.
        chunk_size: queries per materialised chunk.
    Returns:
        ``(B, Tq, H, D)`` in q's dtype (``(o, stats)`` with ``return_stats``). Queries are aligned to the end of
        the keys (``Tq <= Tk``).
        Computation is in float32 (float64 for float64 inputs); the cumulative sum is float64 and taken
        relative to each chunk, so the bias ``c_i - c_j`` does not suffer cancellation at long T.
    """
    check_inputs(q, k, v, log_fgate, cu_seqlens, seq_start)
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    GM, GN = acp_grid
    jmin = lo = None
    if adaptive_threshold is not None:
        delta = _acp.acp_threshold(q, k, sm_scale, adaptive_threshold, eps=acp_eps, qk_norm_weights=qk_norm_weights)
        lo = _acp.lo_table(log_fgate, delta, Tq, GM, GN)  # (B*H, cdiv(Tq, GM)) pruned grid blocks
        jmin = (lo.view(B, H, -1)[..., torch.arange(Tq, device=q.device) // GM] * GN).long()  # (B, H, Tq)
    compute_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32

    qh = q.transpose(1, 2).to(compute_dtype)  # (B, H, Tq, D)
    kh = k.transpose(1, 2).to(compute_dtype)  # (B, Hkv, Tk, D)
    vh = v.transpose(1, 2).to(compute_dtype)
    if Hkv != H:
        kh = kh.repeat_interleave(H // Hkv, dim=1)  # (B, H, Tk, D)
        vh = vh.repeat_interleave(H // Hkv, dim=1)
    c = torch.cumsum(log_fgate.to(torch.float64), dim=1).transpose(1, 2)  # (B, H, Tk) float64
    pos_k = torch.arange(Tk, device=q.device)
    pos_q = pos_k[Tk - Tq :]
    doc = None
    if cu_seqlens is not None:
        doc = torch.bucketize(pos_k, cu_seqlens[1:].to(q.device), right=True)  # (Tk,) document id
    start = seq_start.to(q.device) if seq_start is not None else None

    use_ckpt = torch.is_grad_enabled() and Tq > chunk_size and any(
        t.requires_grad for t in (q, k, v, log_fgate)
    )
    outs = []
    for s in range(0, Tq, chunk_size):
        e = min(s + chunk_size, Tq)
        qs, qe = Tk - Tq + s, Tk - Tq + e  # absolute positions of this chunk's queries; keys after qe are masked
        c_rel = (c[:, :, :qe] - c[:, :, qs : qs + 1]).to(compute_dtype)  # (B, H, qe) relative to the chunk
        args = (
            qh[:, :, s:e], kh[:, :, :qe], vh[:, :, :qe], c_rel[:, :, qs:], c_rel, pos_q[s:e], pos_k[:qe],
            None if doc is None else doc[qs:qe], None if doc is None else doc[:qe], start,
            None if jmin is None else jmin[:, :, s:e], sm_scale,
        )
        outs.append(checkpoint(_attend_chunk, *args, use_reentrant=False) if use_ckpt else _attend_chunk(*args))
    o = torch.cat(outs, dim=2).transpose(1, 2).to(q.dtype)  # (B, Tq, H, D)
    if return_stats:
        return o, _acp.tile_stats(log_fgate, None, Tq, GM, GN, lo=lo)
    return o


def forgetting_attention_naive(q, k, v, log_fgate, sm_scale=None):
    """The definition written out with full ``T x T`` matrices and explicit gate products (no cumsum).

    Independent of ``forgetting_attention_ref``'s cumsum/chunking; used only in tests, in float64.
    """
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    kk = k.repeat_interleave(H // Hkv, dim=2)
    vv = v.repeat_interleave(H // Hkv, dim=2)
    out = torch.zeros_like(q)
    for i in range(Tq):
        p = Tk - Tq + i  # absolute position of query i
        scores = torch.einsum("bhd,bjhd->bhj", q[:, i], kk[:, : p + 1]) * sm_scale  # (B, H, p+1)
        # log of prod_{l=j+1}^{p} f_l for every j <= p: sum of log f over (j, p].
        decay = torch.stack([log_fgate[:, j + 1 : p + 1].sum(dim=1) for j in range(p + 1)], dim=-1)  # (B, H, p+1)
        w = F.softmax(scores + decay, dim=-1)
        out[:, i] = torch.einsum("bhj,bjhd->bhd", w, vv[:, : p + 1])
    return out
