"""Forgetting Attention for a few new query tokens per sequence over a paged KV cache (decoding).

    o_i = sum_{j in [start, i]} softmax_j(q_i . k_j * sm_scale + c_i - c_j) v_j,   c = cumsum_t(log f_t)

The keys of one (sequence, kv head) live in fixed-size blocks of a shared pool, found through a block table; the
queries are the last ``Tq`` positions of each sequence, whose lengths may differ. ``start`` (per sequence and query
head) hides left padding and keys dropped by ACP eviction (``forgetting_transformer.inference``).

Layers, top to bottom:
    ``_decode_split_kernel`` / ``_decode_reduce_kernel``   the Triton kernels (split over keys, then combined);
    ``decode_launch``                                       launches both on tensors;
    ``forgetting_attention_decode``                         the public op (validates, picks kernel or reference);
    ``forgetting_attention_decode_ref``                     the float64 PyTorch reference (the CPU path).

A program of the split kernel takes one (sequence, kv head), a tile of ``BLOCK_M`` query rows (the ``Tq`` tokens
times the ``G = H / Hkv`` query heads that share the kv head, so a GQA group reads its keys once) and one of
``num_splits`` equal parts of the live key blocks, and writes an unnormalised partial output with its row max and
sum; the reduce kernel combines the parts. The live range is read from ``lengths`` and ``start`` on the device, so
a launch has fixed arguments for every step and can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from .. import launch_cache

MIN_TILE = 16  # tl.dot needs at least 16 rows, keys and head-dim lanes


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _decode_split_kernel(
    Q, K, V, C, CQ, TABLE, LENGTHS, KSTART, O_PART, M_PART, L_PART,
    sqb, sqt, sqh, skn, skt, svn, svt, scn, scg, scqb, scqt, stb, sth, sks,
    Hkv, Tq, n_splits, M_PAD, sm_scale,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, HAS_GATE: tl.constexpr, IEEE: tl.constexpr,
):
    # grid (B * Hkv, cdiv(Tq * G, BLOCK_M), n_splits); row r of a tile is query token r // G of query head
    # hkv * G + r % G
    pid_row = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    b = pid_row // Hkv
    hkv = pid_row % Hkv
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < Tq * G
    t = rows // G
    h = hkv * G + rows % G
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM

    length = tl.load(LENGTHS + b).to(tl.int32)
    pos_q = length - Tq + t  # (BLOCK_M,) each row's query position
    kstart = tl.load(KSTART + b.to(tl.int64) * sks + h, mask=row_ok, other=2**30).to(tl.int32)
    # This program's share of the live key blocks [min start, last query]
    lo = tl.min(tl.where(row_ok, kstart, 2**30), 0)
    lo_blk = lo // BLOCK_N
    hi = tl.minimum(tl.max(tl.where(row_ok, pos_q + 1, 0), 0), length)
    hi_blk = (hi + BLOCK_N - 1) // BLOCK_N
    per_split = (tl.maximum(hi_blk - lo_blk, 0) + n_splits - 1) // n_splits
    blk_lo = lo_blk + pid_s * per_split
    blk_hi = tl.minimum(blk_lo + per_split, hi_blk)

    q_ptr = Q + b.to(tl.int64) * sqb + t[:, None].to(tl.int64) * sqt + h[:, None] * sqh + offs_d[None, :]
    q = tl.load(q_ptr, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if HAS_GATE:
        cq = tl.load(CQ + b.to(tl.int64) * scqb + t.to(tl.int64) * scqt + h, mask=row_ok, other=0.0)  # fp64
    table = TABLE + b.to(tl.int64) * stb + hkv.to(tl.int64) * sth
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for blk in range(blk_lo, blk_hi):
        phys = tl.load(table + blk).to(tl.int64)
        pos_k = blk * BLOCK_N + offs_n
        # slots before the tile's first visible key may be released, those past the end never written
        kv_ok = (pos_k >= lo) & (pos_k < length)
        kv_mask = kv_ok[:, None] & d_ok[None, :]
        k = tl.load(K + phys * skn + offs_n[:, None] * skt + offs_d[None, :], mask=kv_mask, other=0.0)
        s = _dot(q, tl.trans(k), IEEE) * sm_scale  # (BLOCK_M, BLOCK_N)
        if HAS_GATE:
            # c_i - c_j in float64: the cumulative sums grow without bound, their differences stay small
            ck = tl.load(C + phys * scn + (rows % G)[:, None] * scg + offs_n[None, :],
                         mask=row_ok[:, None] & kv_ok[None, :], other=0.0)
            s += (cq[:, None] - ck).to(tl.float32)
        vis = (pos_k[None, :] >= kstart[:, None]) & (pos_k[None, :] <= pos_q[:, None]) & row_ok[:, None]
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet stay at 0
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + phys * svn + offs_n[:, None] * svt + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
        m_i = m_new
    part = (pid_row * n_splits + pid_s).to(tl.int64) * M_PAD + rows
    tl.store(O_PART + part[:, None] * BLOCK_D + offs_d[None, :], acc)
    tl.store(M_PART + part, m_i)
    tl.store(L_PART + part, l_i)


@triton.jit
def _decode_reduce_kernel(
    O_PART, M_PART, L_PART, O, sob, sot, soh, Hkv, Tq, n_splits, M_PAD,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    # grid (B * Hkv, cdiv(Tq * G, BLOCK_M)): the parts of one tile, weighted by exp(part max - global max)
    pid_row = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = pid_row // Hkv
    hkv = pid_row % Hkv
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < Tq * G
    offs_d = tl.arange(0, BLOCK_D)
    base = pid_row.to(tl.int64) * n_splits * M_PAD + rows
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    for s in range(0, n_splits):
        m = tl.maximum(m, tl.load(M_PART + base + s * M_PAD))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    l_sum = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for s in range(0, n_splits):
        w = tl.exp(tl.load(M_PART + base + s * M_PAD) - m_safe)
        l_sum += w * tl.load(L_PART + base + s * M_PAD)
        acc += w[:, None] * tl.load(O_PART + (base + s * M_PAD)[:, None] * BLOCK_D + offs_d[None, :])
    # a row with no visible key gives 0, as the prefill op does
    o = tl.where(l_sum[:, None] > 0, acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None], 0.0)
    t = rows // G
    h = hkv * G + rows % G
    o_ptr = O + b.to(tl.int64) * sob + t[:, None].to(tl.int64) * sot + h[:, None] * soh + offs_d[None, :]
    tl.store(o_ptr, o.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


def _next_pow2(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


def default_num_splits(q: torch.Tensor, max_blocks: int, n_kv_heads: int) -> int:
    """Key splits per (sequence, kv head, query tile): enough programs for two waves of the GPU's SMs, at most
    one per key block. A function of shapes only, so every step of a decode launches the same grid."""
    B, Tq, H, _ = q.shape
    if not q.is_cuda:
        return 1
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    tiles = B * n_kv_heads * max(1, -(-Tq * (H // n_kv_heads) // 64))
    return max(1, min(max_blocks, -(-2 * sms // tiles)))


def decode_launch(q, k_pool, v_pool, block_table, lengths, key_start, c_q, c_pool, sm_scale, num_splits):
    """Launch the split and reduce kernels (arguments as ``forgetting_attention_decode``, already validated and
    contiguous in the last dim); returns o (B, Tq, H, D) in q's dtype."""
    B, Tq, H, D = q.shape
    Hkv = block_table.shape[1]
    G = H // Hkv
    BS = k_pool.shape[1]
    block_d = max(MIN_TILE, _next_pow2(D))
    block_m = max(MIN_TILE, min(64, _next_pow2(Tq * G)))
    n_mtiles = -(-Tq * G // block_m)
    m_pad = n_mtiles * block_m
    o_part = torch.empty((B * Hkv * num_splits * m_pad, block_d), device=q.device, dtype=torch.float32)
    m_part = torch.empty((B * Hkv * num_splits * m_pad,), device=q.device, dtype=torch.float32)
    l_part = torch.empty_like(m_part)
    o = torch.empty_like(q)
    gated = c_pool is not None
    cq = c_q if gated else m_part  # (a dummy pointer when there is no gate)
    cp = c_pool if gated else m_part
    launch_cache.launch(_decode_split_kernel, (B * Hkv, n_mtiles, num_splits),
        q, k_pool, v_pool, cp, cq, block_table, lengths, key_start, o_part, m_part, l_part,
        q.stride(0), q.stride(1), q.stride(2), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0),
        v_pool.stride(1), cp.stride(0) if gated else 0, cp.stride(1) if gated else 0,
        cq.stride(0) if gated else 0, cq.stride(1) if gated else 0, block_table.stride(0),
        block_table.stride(1), key_start.stride(0), Hkv, Tq, num_splits, m_pad, sm_scale,
        G=G, HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=BS, HAS_GATE=gated,
        IEEE=q.dtype == torch.float32, num_warps=4, num_stages=2,
    )
    launch_cache.launch(_decode_reduce_kernel, (B * Hkv, n_mtiles),
        o_part, m_part, l_part, o, o.stride(0), o.stride(1), o.stride(2), Hkv, Tq, num_splits, m_pad,
        G=G, HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=block_m, num_warps=4,
    )
    return o


def check_decode_inputs(q, k_pool, v_pool, block_table, lengths, key_start, c_q, c_pool) -> None:
    """Shapes and dtypes only (no values: a check must not wait for the GPU inside a captured step)."""
    if q.dim() != 4:
        raise ValueError(f"q must be (B, Tq, H, D); got shape {tuple(q.shape)}")
    B, Tq, H, D = q.shape
    if k_pool.dim() != 3 or k_pool.shape != v_pool.shape or k_pool.shape[2] != D:
        raise ValueError(f"k_pool and v_pool must both be (n_blocks, block_size, D={D}); got "
                         f"{tuple(k_pool.shape)} and {tuple(v_pool.shape)}")
    BS = k_pool.shape[1]
    if BS < MIN_TILE or BS & (BS - 1):
        raise ValueError(f"block_size (k_pool.shape[1]) must be a power of two >= {MIN_TILE}; got {BS}")
    if q.dtype != k_pool.dtype or q.dtype != v_pool.dtype:
        raise ValueError(f"q, k_pool, v_pool must share a dtype; got {q.dtype}, {k_pool.dtype}, {v_pool.dtype}")
    if block_table.dim() != 3 or block_table.shape[0] != B or H % block_table.shape[1]:
        raise ValueError(f"block_table must be (B={B}, Hkv, max_blocks) with Hkv dividing H={H}; got "
                         f"{tuple(block_table.shape)}")
    if block_table.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"block_table must be int32 or int64; got {block_table.dtype}")
    if lengths.shape != (B,):
        raise ValueError(f"lengths must be (B,) = ({B},); got {tuple(lengths.shape)}")
    if key_start.shape != (B, H):
        raise ValueError(f"key_start must be (B, H) = {(B, H)}; got {tuple(key_start.shape)}")
    if (c_q is None) != (c_pool is None):
        raise ValueError("pass both c_q and c_pool (Forgetting Attention) or neither (softmax attention)")
    if c_q is not None:
        G = H // block_table.shape[1]
        if c_q.shape != (B, Tq, H):
            raise ValueError(f"c_q must be (B, Tq, H) = {(B, Tq, H)}; got {tuple(c_q.shape)}")
        if c_pool.shape != (k_pool.shape[0], G, BS):
            raise ValueError(f"c_pool must be (n_blocks, H / Hkv, block_size) = {(k_pool.shape[0], G, BS)}; "
                             f"got {tuple(c_pool.shape)}")
        if c_q.dtype != torch.float64 or c_pool.dtype != torch.float64:
            raise ValueError(f"c_q and c_pool must be float64 (cumulative sums over the whole sequence); got "
                             f"{c_q.dtype} and {c_pool.dtype}")


def forgetting_attention_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor,
    lengths: torch.Tensor,
    key_start: torch.Tensor,
    *,
    c_q: torch.Tensor | None = None,
    c_pool: torch.Tensor | None = None,
    sm_scale: float | None = None,
    num_splits: int | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Attention of the last ``Tq`` tokens of each sequence over its cached keys, with forget-gate decay.

    Args:
        q: ``(B, Tq, H, D)``: query token t of sequence b sits at position ``lengths[b] - Tq + t``.
        k_pool, v_pool: ``(n_blocks, block_size, D)``: blocks of ``block_size`` (a power of two >= 16)
            consecutive positions of one (sequence, kv head), in q's dtype.
        block_table: ``(B, Hkv, max_blocks)`` int: the pool block holding positions ``[i * block_size,
            (i + 1) * block_size)`` of (b, kv head); only entries of live blocks (from ``min key_start`` of the
            kv head's query heads to the last query) are read. ``Hkv`` divides ``H`` (GQA/MQA).
        lengths: ``(B,)`` int: positions per sequence, the ``Tq`` new ones included (may differ per sequence).
        key_start: ``(B, H)`` int: each (sequence, query head)'s first visible key (left padding, eviction).
        c_q: ``(B, Tq, H)`` float64: cumulative log forget gate at the queries; c_pool: ``(n_blocks, H / Hkv,
            block_size)`` float64: at every cached key, for each query head of its kv head. Both None: plain
            softmax attention (a Transformer).
        sm_scale: default ``1 / sqrt(D)``.
        num_splits: parts the live keys are split into (``default_num_splits``); fixed per shape, so a CUDA
            graph of the launch serves every step.
        backend: None (the Triton kernels on CUDA, the float64 reference on the CPU), ``"triton"`` (also on
            the CPU under ``TRITON_INTERPRET=1``) or ``"reference"``.
    Returns:
        ``(B, Tq, H, D)`` in q's dtype; a row with no visible key gives 0.
    """
    check_decode_inputs(q, k_pool, v_pool, block_table, lengths, key_start, c_q, c_pool)
    if backend not in (None, "triton", "reference"):
        raise ValueError(f"backend must be None, 'triton' or 'reference'; got {backend!r}")
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    if backend == "reference" or (backend is None and not q.is_cuda):
        return forgetting_attention_decode_ref(q, k_pool, v_pool, block_table, lengths, key_start, c_q=c_q,
                                               c_pool=c_pool, sm_scale=sm_scale)
    if num_splits is None:
        num_splits = default_num_splits(q, block_table.shape[2], block_table.shape[1])
    if not (isinstance(num_splits, int) and num_splits >= 1):
        raise ValueError(f"num_splits must be an int >= 1; got {num_splits!r}")
    # Under torch.compile the launch is one opaque op (Inductor would re-specialise the kernels' arguments);
    # eager calls skip the op's dispatch.
    launch = decode_op if torch.compiler.is_compiling() else decode_launch
    return launch(q.contiguous(), k_pool.contiguous(), v_pool.contiguous(), block_table.contiguous(),
                  lengths.contiguous(), key_start.contiguous(), None if c_q is None else c_q.contiguous(),
                  None if c_pool is None else c_pool.contiguous(), sm_scale, num_splits)


@torch.library.custom_op("forgetting_transformer::fox_decode", mutates_args=())
def decode_op(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_table: torch.Tensor, lengths: torch.Tensor,
    key_start: torch.Tensor, c_q: Optional[torch.Tensor], c_pool: Optional[torch.Tensor], sm_scale: float,
    num_splits: int,
) -> torch.Tensor:
    """``decode_launch`` as a custom op, for traced calls."""
    return decode_launch(q, k_pool, v_pool, block_table, lengths, key_start, c_q, c_pool, sm_scale, num_splits)


@decode_op.register_fake
def _(q, k_pool, v_pool, block_table, lengths, key_start, c_q, c_pool, sm_scale, num_splits):
    return torch.empty_like(q)


def forgetting_attention_decode_ref(q, k_pool, v_pool, block_table, lengths, key_start, *, c_q=None, c_pool=None,
                                    sm_scale=None):
    """``forgetting_attention_decode`` in float64 PyTorch: the blocks gathered into dense (B, H, S, D) keys and
    values (S = max_blocks * block_size), every hidden position masked. Same arguments; returns q's dtype."""
    check_decode_inputs(q, k_pool, v_pool, block_table, lengths, key_start, c_q, c_pool)
    B, Tq, H, D = q.shape
    Hkv, MB = block_table.shape[1:]
    G, BS = H // Hkv, k_pool.shape[1]
    S = MB * BS
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    idx = block_table.long().clamp(min=0)  # (B, Hkv, MB); entries outside the live range are masked below

    def dense(pool):  # (n_blocks, BS, D) -> (B, H, S, D)
        return pool[idx].double().reshape(B, Hkv, S, D).repeat_interleave(G, dim=1)

    pos = torch.arange(S, device=q.device)
    pos_q = lengths.to(q.device)[:, None] - Tq + torch.arange(Tq, device=q.device)  # (B, Tq)
    start = key_start.to(q.device)
    visible = (pos >= start[:, :, None, None]) & (pos <= pos_q[:, None, :, None])  # (B, H, Tq, S)
    live = (pos >= start[:, :, None]) & (pos < lengths.to(q.device)[:, None, None])  # (B, H, S)
    k = torch.where(live[..., None], dense(k_pool), 0.0)
    v = torch.where(live[..., None], dense(v_pool), 0.0)
    scores = torch.einsum("bthd,bhsd->bhts", q.double(), k) * sm_scale  # (B, H, Tq, S)
    if c_q is not None:
        ck = c_pool[idx].permute(0, 1, 3, 2, 4).reshape(B, H, S)  # (B, H, S): per query head of each kv head
        ck = torch.where(live, ck, 0.0)
        scores = scores + (c_q.permute(0, 2, 1)[..., None] - ck[:, :, None, :])
    any_visible = visible.any(-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")).masked_fill(~any_visible, 0.0), dim=-1)
    o = torch.einsum("bhts,bhsd->bthd", probs * any_visible, v)  # (B, Tq, H, D)
    return o.to(q.dtype)
