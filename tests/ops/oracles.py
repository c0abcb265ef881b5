"""Independent float64 oracles shared by the kernel and reference tests."""

import math

import torch


def acp_masked_ref(q, k, v, lf, delta, GM, GN, seq_start=None):
    """Float64 attention with exactly the (GM x GN) grid tiles pruned that ACP prunes (delta: (B, H)): tiles whose
    largest decay is below delta, except the key block holding the query block's first row."""
    B, Tq, H, D = q.shape
    Tk = k.shape[1]
    off = Tk - Tq
    kk = k.repeat_interleave(H // k.shape[2], dim=2)
    vv = v.repeat_interleave(H // k.shape[2], dim=2)
    c = torch.cumsum(lf, 1).transpose(1, 2)  # (B, H, Tk)
    r = torch.arange(Tq, device=q.device)
    j = torch.arange(Tk, device=q.device)
    m0 = off + (r // GM) * GM
    e = torch.clamp((j // GN) * GN + GN - 1, max=Tk - 1)
    pruned = (c[..., m0][..., :, None] - c[..., e][..., None, :]) < delta[..., None, None]  # (B, H, Tq, Tk)
    pruned &= (j // GN)[None, :] < (m0 // GN)[:, None]
    visible = (j[None, :] <= (off + r)[:, None]) & ~pruned
    if seq_start is not None:  # left padding: keys before seq_start[b] are invisible
        visible = visible & (j >= seq_start[:, None, None, None])
    s = torch.einsum("bihd,bjhd->bhij", q, kk) / math.sqrt(D) + c[..., off:, None] - c[..., None, :]
    p = torch.softmax(s.masked_fill(~visible, float("-inf")), -1).nan_to_num(0.0)  # rows with no key: 0
    p = p.to(vv.dtype)  # 16-bit v (with fp32 log f): P V in v's dtype, as in the kernels
    return torch.einsum("bhij,bjhd->bihd", p, vv)
