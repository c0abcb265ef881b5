"""Adaptive Computation Pruning (ACP, Lin et al. 2025) for the Forgetting Attention kernel: thresholds and
block-level pruning boundaries.

A tile (query block m, key block n) is pruned iff every decay in it is below the threshold ``delta``:
``max_{i in m, j in n} D_ij = c_{first query of m} - c_{last key of n} < delta`` (``D`` is monotone: it decreases
away from the diagonal, so the pruned key blocks of a query block form a prefix, and the pruned query blocks of a
key block a suffix). ``delta = -2U - log(Tk) + log(eps)`` with ``U >= max |s_ij|`` bounds the total softmax
weight pruned from any row by ``eps``.

The pruned region is defined once, on a fine grid (GM x GN, ``grid``: the smallest BLOCK_M / BLOCK_N of the three
kernels' configs for the head dim), as a per-query-block count ``lo[m]`` of pruned key blocks; equivalently every query
row ``i`` sees keys ``j >= lo[i // GM] * GN`` only. Each kernel skips its own tiles that lie wholly in the region and
masks the elements of the tiles that straddle its boundary, so the forward and both backward kernels prune exactly the
same (i, j) set whatever their tile sizes, and the gradients are exactly those of the pruned forward. The kernel path
computes ``lo`` and ``hi`` in two Triton launches (``triton.kernels._acp_cumsum_kernel``: chunk-local float64 cumsums;
``_acp_tables_kernel``: per window of blocks a 32-ary search, then the paper's two-pointer walk, vectorised, over
key blocks for ``lo`` and over query blocks for ``hi``), each parallel over positions; ``lo_table`` / ``hi_table``
here are the PyTorch (``torch.searchsorted``) equivalents used to test it and for ``tile_stats``. Requires
``log f <= 0`` (then ``c`` is non-increasing and the boundary is monotone).
"""

from __future__ import annotations

import math

import torch

from ..options import interpreting

DEFAULT_EPS = math.exp(-10.0)


def grid(head_dim: int, override=None) -> tuple[int, int]:
    """ACP's grid (GM, GN) at ``head_dim``: 64 x 64 up to 128 and 32 x 32 above on GPUs (the smallest tiles of
    the Triton kernels' head-dim configs), 16 x 16 under triton's interpreter (its tiles). The reference prunes
    on the same grid, so CPU and GPU runs prune the same region. ``override`` (``AttentionOptions.acp_grid``)
    replaces it."""
    if override is not None:
        return override
    if interpreting():
        return 16, 16
    return (64, 64) if head_dim <= 128 else (32, 32)


def threshold_kind(adaptive_threshold, B, H, eps=DEFAULT_EPS):
    """Validate ``adaptive_threshold`` (and ``eps`` for ``"auto"``); returns ``"auto"``, ``"float"`` or
    ``"tensor"``. Errors name the argument and the value."""
    if isinstance(adaptive_threshold, str):
        if adaptive_threshold != "auto":
            raise ValueError(f"adaptive_threshold must be None, 'auto', a float or a (B, H) tensor; "
                             f"got {adaptive_threshold!r}")
        if not (0.0 < eps < 1.0):
            raise ValueError(f"acp eps must be in (0, 1); got {eps}")
        return "auto"
    if isinstance(adaptive_threshold, (int, float)):
        return "float"
    if isinstance(adaptive_threshold, torch.Tensor):
        if adaptive_threshold.shape != (B, H):
            raise ValueError(f"adaptive_threshold tensor must be (B, H) = {(B, H)}; "
                             f"got {tuple(adaptive_threshold.shape)}")
        return "tensor"
    raise ValueError(f"adaptive_threshold must be None, 'auto', a float or a (B, H) tensor; "
                     f"got {type(adaptive_threshold).__name__}")


def check_qk_norm_weights(qk_norm_weights, H, Hkv, D):
    """``(gamma_q, gamma_k)``: gamma_q (D,) or (H, D); gamma_k (D,), (H, D) or (Hkv, D)."""
    gq, gk = qk_norm_weights
    if tuple(gq.shape) not in ((D,), (H, D)):
        raise ValueError(f"qk_norm_weights[0] (gamma_q) must be (D,) or (H, D) = {(H, D)}; got {tuple(gq.shape)}")
    if tuple(gk.shape) not in ((D,), (H, D), (Hkv, D)):
        raise ValueError(f"qk_norm_weights[1] (gamma_k) must be (D,), (H, D) or (Hkv, D) = {(Hkv, D)}; "
                         f"got {tuple(gk.shape)}")


def acp_threshold(q, k, sm_scale, adaptive_threshold, *, eps=DEFAULT_EPS, qk_norm_weights=None):
    """Per-(batch, head) pruning threshold ``delta`` as a (B, H) float32 tensor (the PyTorch reference of what
    the kernel path's boundary kernel computes in-kernel).

    adaptive_threshold: ``"auto"`` (``delta = -2U - log Tk + log eps``), a float, or a (B, H) tensor.
    For ``"auto"``, ``U = sm_scale * max|q| * max|k|``: with ``qk_norm_weights = (gamma_q, gamma_k)`` (RMSNorm
    weights, shape (D,) or (H, D)) ``max|q| <= max|gamma_q| sqrt(D)``; otherwise the max L2 norms of the
    actual q and k per (batch, head) are used.
    """
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    kind = threshold_kind(adaptive_threshold, B, H, eps)
    if kind == "auto":
        if qk_norm_weights is not None:
            check_qk_norm_weights(qk_norm_weights, H, Hkv, D)
            gq, gk = qk_norm_weights
            qmax = gq.detach().float().abs().amax(-1) * math.sqrt(D)  # () or (H,)
            kmax = gk.detach().float().abs().amax(-1) * math.sqrt(D)
            if kmax.dim() == 1 and kmax.numel() == Hkv and Hkv != H:
                kmax = kmax.repeat_interleave(H // Hkv)
            U = (sm_scale * qmax * kmax).to(q.device).expand(B, H)
        else:
            qmax = q.detach().float().norm(dim=-1).amax(dim=1)  # (B, H)
            kmax = k.detach().float().norm(dim=-1).amax(dim=1).repeat_interleave(H // Hkv, dim=1)  # (B, H)
            U = sm_scale * qmax * kmax
        return (-2.0 * U - math.log(max(Tk, 1)) + math.log(eps)).float().contiguous()
    if kind == "float":
        return torch.full((B, H), float(adaptive_threshold), device=q.device, dtype=torch.float32)
    return adaptive_threshold.detach().to(device=q.device, dtype=torch.float32).contiguous()


def cumsum(lf):
    """c = cumsum(log f) in float64, (B, H, Tk) contiguous."""
    return torch.cumsum(lf.detach().transpose(1, 2).contiguous().double(), dim=-1)


def _query_block_starts(Tq, Tk, BM, device):
    return (Tk - Tq) + torch.arange(0, Tq, BM, device=device)  # absolute position of each block's first row


def _key_block_ends(Tk, BN, device):
    return torch.clamp(torch.arange(BN - 1, Tk + BN - 1, BN, device=device), max=Tk - 1)


def lo_table(lf, delta, Tq, BM, BN, c=None):
    """(B*H, cdiv(Tq, BM)) int32: per query block, the number of leading key blocks (of size BN) pruned, capped
    so that the key block holding the query block's first row is kept (every row keeps its diagonal)."""
    B, Tk, H = lf.shape
    c = cumsum(lf) if c is None else c
    starts = _query_block_starts(Tq, Tk, BM, lf.device)
    cm = c[..., starts]  # (B, H, nq)
    ce = c[..., _key_block_ends(Tk, BN, lf.device)].contiguous()  # (B, H, nk), non-increasing
    lo = torch.searchsorted(-ce, (delta.double()[..., None] - cm).contiguous(), side="left")
    lo = torch.minimum(lo, starts // BN)
    return lo.to(torch.int32).reshape(B * H, -1).contiguous()


def hi_table(lo, Tk, BN):
    """(B*H, cdiv(Tk, BN)) int32 from ``lo_table``: per key block n, the last query block m with
    ``lo[m] <= n`` (-1 if none), i.e. the same pruned region seen from the keys."""
    n = torch.arange(0, -(-Tk // BN), device=lo.device, dtype=lo.dtype)
    cnt = torch.searchsorted(lo.contiguous(), n.expand(lo.shape[0], -1).contiguous(), side="right")
    return (cnt - 1).to(torch.int32).contiguous()


def _tables_torch(lf, delta, Tq, GM, GN):
    """PyTorch equivalent of the Triton tables (``_acp_tables_kernel``): (lo, hi) on the (GM x GN) grid."""
    lo = lo_table(lf, delta, Tq, GM, GN)
    return lo, hi_table(lo, lf.shape[1], GN)


def lo_for_tiling(lo_g, Tq, GM, GN, BM, BN):
    """Fully pruned key blocks per query block of a kernel tiling (BM x BN, powers of two) given the region's
    ``lo_table`` on the (GM x GN) grid: a tile is skipped iff every element is pruned for its first row."""
    idx = torch.arange(0, Tq, BM, device=lo_g.device) // GM
    return ((lo_g[:, idx].long() * GN) // BN).to(torch.int32).contiguous()


def tile_stats(lf, delta, Tq, BM, BN, lo=None):
    """Forward-pass tile counts per (batch, head): ``{"computed": (B, H), "pruned": (B, H)}`` int64 (causal tiles
    only; left padding / document masks are not subtracted). ``delta=None`` gives the dense counts."""
    B, Tk, H = lf.shape
    m0 = _query_block_starts(Tq, Tk, BM, lf.device)
    n_top = (torch.clamp(m0 + BM, max=Tk) - 1) // BN  # index of the diagonal key block
    dense = (n_top + 1).expand(B, H, -1)
    if delta is None and lo is None:
        pruned = torch.zeros_like(dense)
    else:
        lo = lo_table(lf, delta, Tq, BM, BN) if lo is None else lo
        pruned = torch.minimum(lo.reshape(B, H, -1).long(), dense)
    return {"computed": (dense - pruned).sum(-1), "pruned": pruned.sum(-1)}
