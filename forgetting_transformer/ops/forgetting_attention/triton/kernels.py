"""Triton kernels for Forgetting Attention (FlashAttention-2 style). ``@triton.jit`` code only.

Layouts (strides are passed, the last dim must be contiguous):
    Q, DO, O, DQ: (B, Tq, H, D)        K, V, DK, DV: (B, Tk, Hkv, D)      LF (log f), DROW, DCOL: (B, Tk|Tq, H)
    LSE, DELTA: (B, H, Tq) float32 (LSE in log2 units)
    KSTART: (B, Tq) int32, first visible key position of each query row (left padding / documents)
    KEND:   (B, Tk) int32, last query position that may see each key (documents)
    PK, PQ: (4, B*H, TPAD) float32 (strides spp, spr, 1), log f prefix sums within aligned blocks of 16 / 32 /
            64 / 128 positions (``_block_prefix_kernel``): PK over key positions (blocks at multiples of the
            size), PQ over query rows (blocks at multiples of the size from row 0, i.e. key position ``off``)
Queries are aligned to the end of the keys: query row r sits at absolute key position ``off + r``,
``off = Tk - Tq``.

Numerics of the decay ``D_ij = sum_{t=j+1..i} log f_t``: it is never formed as a difference of one global
cumulative sum. Each tile uses the local cumulative sums of its own ``log f`` block, read from PK / PQ (formed
once per call by ``_block_prefix_kernel``; a ``tl.cumsum`` per tile inside the loops cost 8-15% of fwd+bwd on
an H200), and a running sum of whole-block totals carries the distance between
the query block and the key block; the only subtraction is between two sums of at most one block each plus the
(non-cancelling) running total, so the rounding error is that of a ``BLOCK``-long sum, independent of the
sequence length.
"""

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _block_prefixes(x, P, row, spp, CHUNK: tl.constexpr):
    """Store the inclusive prefix sums of ``x`` (CHUNK,) within aligned blocks of 16, 32, 64 and 128 in planes
    0..3 of P (plane stride ``spp``) at ``row``."""
    for s in tl.static_range(4):  # block size 16 << s
        tl.store(P + s * spp + row,
                 tl.reshape(tl.cumsum(tl.reshape(x, [CHUNK // (16 << s), 16 << s]), 1), [CHUNK]))


@triton.jit
def _block_prefix_kernel(LF, PK, PQ, H, Tk, off, spp, spr, slb, slt, slh, CHUNK: tl.constexpr,
                         QUERY_SIDE: tl.constexpr, KEY_SIDE: tl.constexpr):
    """Program (b*h, c) of the grid (B*H, TPAD / CHUNK), CHUNK = 128: for the positions of chunk c, the inclusive
    prefix sums of log f within aligned blocks of 16, 32, 64 and 128, with KEY_SIDE over key positions
    (PK[s, b*h, t]) and with QUERY_SIDE over query rows (PQ[s, b*h, r], position off + r). Positions past Tk
    count as log f = 0 (so a block's last entry is its total). ``spp`` / ``spr``: the plane / row strides of PK
    and PQ."""
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    base = LF + b.to(tl.int64) * slb + h.to(tl.int64) * slh
    i = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    row = pid.to(tl.int64) * spr + i
    if KEY_SIDE:
        _block_prefixes(tl.load(base + i * slt, mask=i < Tk, other=0.0), PK, row, spp, CHUNK)
    if QUERY_SIDE:
        _block_prefixes(tl.load(base + (off + i) * slt, mask=off + i < Tk, other=0.0), PQ, row, spp, CHUNK)


@triton.jit
def _prefix_plane(P, pid_bh, spp, spr, BLOCK: tl.constexpr):
    """The row of PK / PQ (``_block_prefix_kernel``; plane / row strides spp / spr) for blocks of BLOCK
    positions, for one (b, h)."""
    tl.static_assert(BLOCK == 16 or BLOCK == 32 or BLOCK == 64 or BLOCK == 128)
    if BLOCK == 16:
        plane = 0
    elif BLOCK == 32:
        plane = 1
    elif BLOCK == 64:
        plane = 2
    else:
        plane = 3
    return P + plane * spp.to(tl.int64) + pid_bh.to(tl.int64) * spr


@triton.jit
def _row_bounds(KSTART, LO_BLK, b, pid_bh, ssb, sst, offs_m, row_ok, m0, E, ACP_NQ, ACP_GM, ACP_GN,
                BLOCK_N: tl.constexpr, HAS_START: tl.constexpr, HAS_LO: tl.constexpr):
    """Key-block schedule of a query block (fwd and dq kernels), walked downwards from the diagonal.

    ``kstart`` (BLOCK_M,): each row's first visible key, the larger of its left-padding / document start and its
    ACP bound ``LO_BLK[row // ACP_GM] * ACP_GN``. Returns kstart, the lowest block visited ``lo_blk``, the
    top block ``n_top``, and the numbers of causal-diagonal blocks, clean blocks (no mask) and blocks that
    straddle some row's kstart (kstart mask only), in that order.
    """
    kstart = tl.zeros_like(offs_m)
    if HAS_START:
        kstart = tl.load(KSTART + b.to(tl.int64) * ssb + offs_m * sst, mask=row_ok, other=0)
    if HAS_LO:
        kstart = tl.maximum(kstart, tl.load(LO_BLK + pid_bh * ACP_NQ + offs_m // ACP_GM, mask=row_ok,
                                            other=0) * ACP_GN)
    lo_blk = 0
    n_clean_lo = 0  # blocks at or above this need no kstart mask
    if HAS_START or HAS_LO:
        lo_blk = (tl.min(tl.where(row_ok, kstart, 2147483647), 0) // BLOCK_N) * BLOCK_N
        n_clean_lo = ((tl.max(kstart, 0) + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    n_top = ((E - 1) // BLOCK_N) * BLOCK_N
    n_um = ((m0 + 1) // BLOCK_N) * BLOCK_N - BLOCK_N  # highest block fully at/below the first query
    n_masked = (n_top - tl.maximum(n_um, lo_blk - BLOCK_N)) // BLOCK_N
    n_clean = tl.maximum((n_um - tl.maximum(n_clean_lo, lo_blk)) // BLOCK_N + 1, 0)
    n_smasked = tl.maximum((n_top - (n_masked + n_clean) * BLOCK_N - lo_blk) // BLOCK_N + 1, 0)
    return kstart, lo_blk, n_top, n_masked, n_clean, n_smasked


@triton.jit
def _load_kv(K_base, V_base, pos_k, kv_ok, skt, svt, offs_d,
             BOUNDS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """K and V tiles (BLOCK_N, BLOCK_D) of the fwd / dq inner loops. Only the diagonal key blocks can reach past
    the last key (``BOUNDS``); blocks below the diagonal are full, so their loads carry no row mask."""
    if BOUNDS:
        if BLOCK_D == HEAD_DIM:
            k = tl.load(K_base + pos_k[:, None] * skt + offs_d[None, :], mask=kv_ok[:, None], other=0.0)
            v = tl.load(V_base + pos_k[:, None] * svt + offs_d[None, :], mask=kv_ok[:, None], other=0.0)
        else:
            dm = kv_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
            k = tl.load(K_base + pos_k[:, None] * skt + offs_d[None, :], mask=dm, other=0.0)
            v = tl.load(V_base + pos_k[:, None] * svt + offs_d[None, :], mask=dm, other=0.0)
    else:
        if BLOCK_D == HEAD_DIM:
            k = tl.load(K_base + pos_k[:, None] * skt + offs_d[None, :])
            v = tl.load(V_base + pos_k[:, None] * svt + offs_d[None, :])
        else:
            dm = offs_d[None, :] < HEAD_DIM
            k = tl.load(K_base + pos_k[:, None] * skt + offs_d[None, :], mask=dm, other=0.0)
            v = tl.load(V_base + pos_k[:, None] * svt + offs_d[None, :], mask=dm, other=0.0)
    return k, v


@triton.jit
def _score_tile(q, rq2, g, pos_q, kstart, K_base, V_base, PK_base, skt, svt, n0, E, qk_scale, offs_n, offs_d,
                CAUSAL_MASK: tl.constexpr, START_MASK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    """One key block of the fwd / dq loops: scores ``s`` (BLOCK_M, BLOCK_N) in log2 units with the decay and
    masks applied, the K and V tiles, and the running sum ``g`` of log f over the key blocks visited so far.
    ``PK_base``: the key-side block prefix sums for blocks of BLOCK_N (the key blocks are aligned)."""
    pos_k = n0 + offs_n
    kv_ok = pos_k < E
    ck = tl.load(PK_base + pos_k)  # block-local cumsum of log f (padded past Tk)
    tot_k = tl.load(PK_base + tl.minimum(n0 + BLOCK_N, E) - 1)  # sum over the block's keys before E
    k, v = _load_kv(K_base, V_base, pos_k, kv_ok, skt, svt, offs_d, CAUSAL_MASK, HEAD_DIM, BLOCK_D)
    # key part of the decay: sum_{t=j+1}^{E-1} log f_t = (block-local suffix) + (running total g)
    dk2 = ((tot_k - ck) + g) * 1.4426950408889634
    s = _dot(q, tl.trans(k), IEEE) * qk_scale + (dk2[None, :] - rq2[:, None])
    if CAUSAL_MASK:
        s = tl.where(pos_k[None, :] <= pos_q[:, None], s, float("-inf"))
    if START_MASK:
        s = tl.where(pos_k[None, :] >= kstart[:, None], s, float("-inf"))
    return s, k, v, g + tot_k


@triton.jit
def _attn_fwd_inner(
    acc, l_i, m_i, g, q, rq2, pos_q, kstart, K_base, V_base, PK_base, skt, svt,
    n0, E, qk_scale, offs_n, offs_d,
    CAUSAL_MASK: tl.constexpr, START_MASK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
):
    s, k, v, g = _score_tile(q, rq2, g, pos_q, kstart, K_base, V_base, PK_base, skt, svt, n0, E, qk_scale,
                             offs_n, offs_d, CAUSAL_MASK, START_MASK, HEAD_DIM, BLOCK_D, BLOCK_N, IEEE)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
    return acc, l_i, m_new, g


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, LF, PK, O, LSE, KSTART, LO_BLK,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, slb, slt, slh, sob, sot, soh, ssb, sst,
    H, GROUP, Tq, Tk, sm_scale, T_BUCKET, ACP_NQ, ACP_GM, ACP_GN, spp, spr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_START: tl.constexpr, HAS_LO: tl.constexpr, IEEE: tl.constexpr,
):
    # grid (B*H, cdiv(Tq, BLOCK_M)); the last (heaviest, causal) query blocks are scheduled first
    pid_bh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    off = Tk - Tq
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < Tq
    pos_q = off + offs_m
    m0 = off + pid_m * BLOCK_M
    E = tl.minimum(m0 + BLOCK_M, Tk)

    Q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
    K_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
    V_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
    LF_base = LF + b.to(tl.int64) * slb + h.to(tl.int64) * slh
    if BLOCK_D == HEAD_DIM:
        q = tl.load(Q_base + offs_m[:, None] * sqt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    else:
        q = tl.load(Q_base + offs_m[:, None] * sqt + offs_d[None, :],
                    mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    lf_q = tl.load(LF_base + pos_q * slt, mask=row_ok, other=0.0)
    cq = tl.cumsum(lf_q, 0)
    rq2 = (tl.sum(lf_q, 0) - cq) * 1.4426950408889634  # sum_{t=i+1}^{E-1} log f_t, log2 units
    qk_scale = sm_scale * 1.4426950408889634
    PK_base = _prefix_plane(PK, pid_bh, spp, spr, BLOCK_N)

    kstart, lo_blk, n_top, n_masked, n_clean, n_smasked = _row_bounds(
        KSTART, LO_BLK, b, pid_bh, ssb, sst, offs_m, row_ok, m0, E, ACP_NQ, ACP_GM, ACP_GN,
        BLOCK_N, HAS_START, HAS_LO)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    g = tl.sum(tl.zeros([BLOCK_N], dtype=tl.float32), 0)
    # key blocks in descending order: causal diagonal blocks, clean blocks, then the blocks that straddle the
    # rows' first visible keys (left padding, documents, ACP boundary)
    for it in range(0, n_masked):
        n0 = n_top - it * BLOCK_N
        acc, l_i, m_i, g = _attn_fwd_inner(
            acc, l_i, m_i, g, q, rq2, pos_q, kstart, K_base, V_base, PK_base, skt, svt,
            n0, E, qk_scale, offs_n, offs_d, True, HAS_START or HAS_LO, HEAD_DIM, BLOCK_D, BLOCK_N, IEEE)
    for it in range(0, n_clean):
        n0 = n_top - (n_masked + it) * BLOCK_N
        acc, l_i, m_i, g = _attn_fwd_inner(
            acc, l_i, m_i, g, q, rq2, pos_q, kstart, K_base, V_base, PK_base, skt, svt,
            n0, E, qk_scale, offs_n, offs_d, False, False, HEAD_DIM, BLOCK_D, BLOCK_N, IEEE)
    if HAS_START or HAS_LO:  # (compiled out of the dense kernel)
        for it in range(0, n_smasked):
            n0 = n_top - (n_masked + n_clean + it) * BLOCK_N
            acc, l_i, m_i, g = _attn_fwd_inner(
                acc, l_i, m_i, g, q, rq2, pos_q, kstart, K_base, V_base, PK_base, skt, svt,
                n0, E, qk_scale, offs_n, offs_d, False, True, HEAD_DIM, BLOCK_D, BLOCK_N, IEEE)

    l_ok = l_i > 0.0
    o = acc / tl.where(l_ok, l_i, 1.0)[:, None]
    lse2 = tl.where(l_ok, m_i + tl.math.log2(tl.where(l_ok, l_i, 1.0)), 0.0)
    O_base = O + b.to(tl.int64) * sob + h.to(tl.int64) * soh
    if BLOCK_D == HEAD_DIM:
        tl.store(O_base + offs_m[:, None] * sot + offs_d[None, :], o.to(O.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(O_base + offs_m[:, None] * sot + offs_d[None, :], o.to(O.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    tl.store(LSE + pid_bh.to(tl.int64) * Tq + offs_m, lse2, mask=row_ok)


@triton.jit
def _attn_bwd_dq_inner(
    dq, rowsum, g, q, do, lse2, delta, rq2, pos_q, kstart, K_base, V_base, PK_base, skt, svt,
    n0, E, qk_scale, offs_n, offs_d,
    CAUSAL_MASK: tl.constexpr, START_MASK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
):
    s, k, v, g = _score_tile(q, rq2, g, pos_q, kstart, K_base, V_base, PK_base, skt, svt, n0, E, qk_scale,
                             offs_n, offs_d, CAUSAL_MASK, START_MASK, HEAD_DIM, BLOCK_D, BLOCK_N, IEEE)
    p = tl.math.exp2(s - lse2[:, None])
    dp = _dot(do, tl.trans(v), IEEE)
    ds = p * (dp - delta[:, None])
    dq += _dot(ds.to(k.dtype), k, IEEE)
    rowsum += tl.sum(ds, 1)
    return dq, rowsum, g


@triton.jit
def _attn_bwd_dq_kernel(
    Q, K, V, LF, PK, DO, O, LSE, DELTA, DQ, DROW, KSTART, LO_BLK,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, slb, slt, slh, sdob, sdot, sdoh, ssb, sst,
    H, GROUP, Tq, Tk, sm_scale, T_BUCKET, ACP_NQ, ACP_GM, ACP_GN, spp, spr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_START: tl.constexpr, HAS_LO: tl.constexpr, IEEE: tl.constexpr,
):
    # grid (B*H, cdiv(Tq, BLOCK_M)); the last (heaviest, causal) query blocks are scheduled first
    pid_bh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    off = Tk - Tq
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < Tq
    pos_q = off + offs_m
    m0 = off + pid_m * BLOCK_M
    E = tl.minimum(m0 + BLOCK_M, Tk)

    Q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
    DO_base = DO + b.to(tl.int64) * sdob + h.to(tl.int64) * sdoh
    K_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
    V_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
    LF_base = LF + b.to(tl.int64) * slb + h.to(tl.int64) * slh
    if BLOCK_D == HEAD_DIM:
        qd_mask = row_ok[:, None]
    else:
        qd_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q_base + offs_m[:, None] * sqt + offs_d[None, :], mask=qd_mask, other=0.0)
    do = tl.load(DO_base + offs_m[:, None] * sdot + offs_d[None, :], mask=qd_mask, other=0.0)
    # delta_i = sum_d o_i do_i (O shares q's contiguous strides); stored for the dk/dv kernel, launched after.
    O_base = O + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
    o = tl.load(O_base + offs_m[:, None] * sqt + offs_d[None, :], mask=qd_mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + pid_bh.to(tl.int64) * Tq + offs_m, delta, mask=row_ok)
    lse2 = tl.load(LSE + pid_bh.to(tl.int64) * Tq + offs_m, mask=row_ok, other=0.0)
    lf_q = tl.load(LF_base + pos_q * slt, mask=row_ok, other=0.0)
    cq = tl.cumsum(lf_q, 0)
    rq2 = (tl.sum(lf_q, 0) - cq) * 1.4426950408889634
    qk_scale = sm_scale * 1.4426950408889634
    PK_base = _prefix_plane(PK, pid_bh, spp, spr, BLOCK_N)

    kstart, lo_blk, n_top, n_masked, n_clean, n_smasked = _row_bounds(
        KSTART, LO_BLK, b, pid_bh, ssb, sst, offs_m, row_ok, m0, E, ACP_NQ, ACP_GM, ACP_GN,
        BLOCK_N, HAS_START, HAS_LO)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    rowsum = tl.zeros([BLOCK_M], dtype=tl.float32)
    g = tl.sum(tl.zeros([BLOCK_N], dtype=tl.float32), 0)
    for it in range(0, n_masked):  # same block order as the forward
        n0 = n_top - it * BLOCK_N
        dq, rowsum, g = _attn_bwd_dq_inner(
            dq, rowsum, g, q, do, lse2, delta, rq2, pos_q, kstart, K_base, V_base, PK_base, skt, svt,
            n0, E, qk_scale, offs_n, offs_d, True, HAS_START or HAS_LO, HEAD_DIM, BLOCK_D, BLOCK_N, IEEE)
    for it in range(0, n_clean):
        n0 = n_top - (n_masked + it) * BLOCK_N
        dq, rowsum, g = _attn_bwd_dq_inner(
            dq, rowsum, g, q, do, lse2, delta, rq2, pos_q, kstart, K_base, V_base, PK_base, skt, svt,
            n0, E, qk_scale, offs_n, offs_d, False, False, HEAD_DIM, BLOCK_D, BLOCK_N, IEEE)
    if HAS_START or HAS_LO:
        for it in range(0, n_smasked):
            n0 = n_top - (n_masked + n_clean + it) * BLOCK_N
            dq, rowsum, g = _attn_bwd_dq_inner(
                dq, rowsum, g, q, do, lse2, delta, rq2, pos_q, kstart, K_base, V_base, PK_base, skt, svt,
                n0, E, qk_scale, offs_n, offs_d, False, True, HEAD_DIM, BLOCK_D, BLOCK_N, IEEE)

    DQ_base = DQ + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh  # DQ shares q's (contiguous) strides
    tl.store(DQ_base + offs_m[:, None] * sqt + offs_d[None, :], (dq * sm_scale).to(DQ.dtype.element_ty),
             mask=qd_mask)
    # DROW is (B, Tq, H) contiguous
    tl.store(DROW + (b.to(tl.int64) * Tq + offs_m) * H + h, rowsum, mask=row_ok)


@triton.jit
def _attn_bwd_dkdv_inner(
    dk, dv, colsum, acc_c, k, v, ck2, pos_k, Q_base, DO_base, PQ_base, LSE_base, DELTA_base,
    KSTART_base, LO_base, sqt, sdot, sst, m0, off, Tq, qk_scale, offs_m, offs_d, ACP_GM, ACP_GN,
    CAUSAL_MASK: tl.constexpr, HAS_START: tl.constexpr, ACP_MASK: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, IEEE: tl.constexpr,
):
    # Transposed formulation (keys on rows): S^T = K Q^T, so P^T / dS^T feed the dv / dk products directly.
    rows = m0 - off + offs_m
    pos_q = m0 + offs_m
    row_ok = rows < Tq
    if BLOCK_D == HEAD_DIM:
        qT = tl.load(Q_base + rows[None, :] * sqt + offs_d[:, None], mask=row_ok[None, :], other=0.0)
        do = tl.load(DO_base + rows[:, None] * sdot + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    else:
        qT = tl.load(Q_base + rows[None, :] * sqt + offs_d[:, None],
                     mask=row_ok[None, :] & (offs_d[:, None] < HEAD_DIM), other=0.0)
        do = tl.load(DO_base + rows[:, None] * sdot + offs_d[None, :],
                     mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    lse2 = tl.load(LSE_base + rows, mask=row_ok, other=0.0)
    delta = tl.load(DELTA_base + rows, mask=row_ok, other=0.0)
    cq = tl.load(PQ_base + rows)  # block-local cumsum of log f over the query block (padded past Tq)
    # decay: sum_{t=j+1}^{i} = (sum_{n0}^{m0-1} + local cumsum of the query block) - local cumsum of the key block
    dq2 = (acc_c + cq) * 1.4426950408889634 - lse2
    sT = _dot(k, qT, IEEE) * qk_scale + (dq2[None, :] - ck2[:, None])
    if CAUSAL_MASK:
        sT = tl.where(pos_k[:, None] <= pos_q[None, :], sT, float("-inf"))
    if HAS_START:
        kstart = tl.load(KSTART_base + rows * sst, mask=row_ok, other=2147483647)
        sT = tl.where(pos_k[:, None] >= kstart[None, :], sT, float("-inf"))
    if ACP_MASK:  # rows whose ACP bound lies above some key of this block
        jmin = tl.load(LO_base + rows // ACP_GM, mask=row_ok, other=0) * ACP_GN
        sT = tl.where(pos_k[:, None] >= jmin[None, :], sT, float("-inf"))
    pT = tl.math.exp2(sT)
    dv += _dot(pT.to(do.dtype), do, IEEE)
    dpT = _dot(v, tl.trans(do), IEEE)
    dsT = pT * (dpT - delta[None, :])
    dk += _dot(dsT.to(qT.dtype), tl.trans(qT), IEEE)
    colsum += tl.sum(dsT, 1)
    return dk, dv, colsum, acc_c + tl.load(PQ_base + (m0 - off) + BLOCK_M - 1)


@triton.jit
def _attn_bwd_dkdv_kernel(
    Q, K, V, LF, PQ, DO, LSE, DELTA, DK, DV, DCOL, KSTART, KEND, LO_BLK, HI_BLK,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, slb, slt, slh, sdob, sdot, sdoh, ssb, sst, seb, set,
    sdkb, sdkt, sdkh,
    H, HKV, Tq, Tk, sm_scale, T_BUCKET, ACP_NQ, ACP_NK, ACP_GM, ACP_GN, spp, spr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_START: tl.constexpr, HAS_END: tl.constexpr, HAS_HI: tl.constexpr, IEEE: tl.constexpr,
):
    # grid (B*Hkv, cdiv(Tk, BLOCK_N)); the first (heaviest) key blocks are scheduled first
    pid_bhk = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = pid_bhk // HKV
    hk = pid_bhk % HKV
    off = Tk - Tq
    n0 = pid_n * BLOCK_N
    offs_n = tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    pos_k = n0 + offs_n
    k_ok = pos_k < Tk
    if BLOCK_D == HEAD_DIM:
        kd_mask = k_ok[:, None]
    else:
        kd_mask = k_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    K_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
    V_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
    k = tl.load(K_base + pos_k[:, None] * skt + offs_d[None, :], mask=kd_mask, other=0.0)
    v = tl.load(V_base + pos_k[:, None] * svt + offs_d[None, :], mask=kd_mask, other=0.0)
    qk_scale = sm_scale * 1.4426950408889634

    # query blocks (aligned at off + mb * BLOCK_M) that can see this key block
    r_first = tl.maximum(n0 - off, 0)
    mb_first = r_first // BLOCK_M
    hi_pos = Tk - 1
    if HAS_END:
        kend = tl.load(KEND + b.to(tl.int64) * seb + pos_k * set, mask=k_ok, other=-1)
        hi_pos = tl.max(kend, 0)
    mb_last = (hi_pos - off) // BLOCK_M  # hi_pos >= off whenever some query sees a key of this block
    if hi_pos < off:
        mb_last = mb_first - 1
    # first query block whose first row is at/after the last key of this block needs no causal mask
    mb_um = tl.maximum((n0 + BLOCK_N - 1 - off + BLOCK_M - 1) // BLOCK_M, mb_first)

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for gi in tl.static_range(0, GROUP):  # GQA: the query heads sharing this kv head (unrolled)
        h = hk * GROUP + gi
        LF_base = LF + b.to(tl.int64) * slb + h.to(tl.int64) * slh
        Q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
        DO_base = DO + b.to(tl.int64) * sdob + h.to(tl.int64) * sdoh
        bh = b * H + h
        LSE_base = LSE + bh.to(tl.int64) * Tq
        PQ_base = _prefix_plane(PQ, bh, spp, spr, BLOCK_M)
        DELTA_base = DELTA + bh.to(tl.int64) * Tq
        KSTART_base = KSTART + b.to(tl.int64) * ssb
        lf_k = tl.load(LF_base + pos_k * slt, mask=k_ok, other=0.0)
        ck2 = tl.cumsum(lf_k, 0) * 1.4426950408889634
        mb_hi = mb_last
        mb_acp = mb_last + 1  # query blocks >= mb_acp hold rows whose ACP bound is above this block's first key
        LO_base = LO_BLK + bh * ACP_NQ
        if HAS_HI:
            HI_base = HI_BLK + bh * ACP_NK
            hi_last = tl.load(HI_base + (tl.minimum(n0 + BLOCK_N, Tk) - 1) // ACP_GN)  # last fine query block
            mb_hi = tl.minimum(mb_hi, ((hi_last + 1) * ACP_GM + BLOCK_M - 1) // BLOCK_M - 1)
            mb_acp = ((tl.load(HI_base + n0 // ACP_GN) + 1) * ACP_GM) // BLOCK_M
        # acc_c = signed sum of log f over [n0, m0_first): block-sized steps, no global cumsum
        m0f = off + mb_first * BLOCK_M
        lo_p = tl.minimum(n0, m0f)
        hi_p = tl.maximum(n0, m0f)
        acc_c = tl.sum(tl.zeros([BLOCK_N], dtype=tl.float32), 0)
        for t0 in range(lo_p, hi_p, BLOCK_N):
            tt = t0 + offs_n
            acc_c += tl.sum(tl.load(LF_base + tt * slt, mask=tt < hi_p, other=0.0), 0)
        if m0f < n0:
            acc_c = -acc_c
        colsum = tl.zeros([BLOCK_N], dtype=tl.float32)
        # query blocks in ascending order: causal diagonal blocks, clean blocks, then blocks with ACP-pruned rows
        mb_mid = tl.minimum(mb_um, mb_hi + 1)
        mb_end = tl.maximum(tl.minimum(mb_acp, mb_hi + 1), mb_mid)
        for mb in range(mb_first, mb_mid):
            dk, dv, colsum, acc_c = _attn_bwd_dkdv_inner(
                dk, dv, colsum, acc_c, k, v, ck2, pos_k, Q_base, DO_base, PQ_base, LSE_base, DELTA_base,
                KSTART_base, LO_base, sqt, sdot, sst, off + mb * BLOCK_M, off, Tq, qk_scale, offs_m, offs_d,
                ACP_GM, ACP_GN, True, HAS_START, HAS_HI, HEAD_DIM, BLOCK_D, BLOCK_M, IEEE)
        for mb in range(mb_mid, mb_end):
            dk, dv, colsum, acc_c = _attn_bwd_dkdv_inner(
                dk, dv, colsum, acc_c, k, v, ck2, pos_k, Q_base, DO_base, PQ_base, LSE_base, DELTA_base,
                KSTART_base, LO_base, sqt, sdot, sst, off + mb * BLOCK_M, off, Tq, qk_scale, offs_m, offs_d,
                ACP_GM, ACP_GN, False, HAS_START, False, HEAD_DIM, BLOCK_D, BLOCK_M, IEEE)
        if HAS_HI:
            for mb in range(mb_end, mb_hi + 1):
                dk, dv, colsum, acc_c = _attn_bwd_dkdv_inner(
                    dk, dv, colsum, acc_c, k, v, ck2, pos_k, Q_base, DO_base, PQ_base, LSE_base, DELTA_base,
                    KSTART_base, LO_base, sqt, sdot, sst, off + mb * BLOCK_M, off, Tq, qk_scale, offs_m, offs_d,
                    ACP_GM, ACP_GN, False, HAS_START, HAS_HI, HEAD_DIM, BLOCK_D, BLOCK_M, IEEE)
        # DCOL is (B, Tk, H) contiguous
        tl.store(DCOL + (b.to(tl.int64) * Tk + pos_k) * H + h, colsum, mask=k_ok)

    DK_base = DK + b.to(tl.int64) * sdkb + hk.to(tl.int64) * sdkh
    DV_base = DV + b.to(tl.int64) * sdkb + hk.to(tl.int64) * sdkh
    tl.store(DK_base + pos_k[:, None] * sdkt + offs_d[None, :], (dk * sm_scale).to(DK.dtype.element_ty),
             mask=kd_mask)
    tl.store(DV_base + pos_k[:, None] * sdkt + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kd_mask)


@triton.jit
def _dlogf_chunk(DROW, DCOL, b, h, c, H, Tq, Tk, sr, CHUNK: tl.constexpr):
    """dc_t = drow_t - dcol_t over chunk c of (b, h), positions Tk-1-c*CHUNK downwards (0 outside [0, Tk); drow
    at query t - (Tk - Tq)), and the positions. DCOL (B, Tk, H) contiguous; DROW (B, Tq, H) with strides
    (Tq*H*sr, H*sr, sr) (sr = 8: column 0 of the one-kernel backward's (B, Tq, H, 8) row sums)."""
    t = Tk - 1 - c * CHUNK - tl.arange(0, CHUNK)
    ok = t >= 0
    dc = -tl.load(DCOL + (b.to(tl.int64) * Tk + t) * H + h, mask=ok, other=0.0)
    dc += tl.load(DROW + ((b.to(tl.int64) * Tq + (t - (Tk - Tq))) * H + h) * sr, mask=ok & (t >= Tk - Tq),
                  other=0.0)
    return dc, t, ok


@triton.jit
def _bwd_fused_setup_kernel(O, DO, DELTA, DQ32, RS8, LF, PQ, LSE, Z, H, Tq, Tk, sob, sot, soh, slb, slt, slh, spr,
                            svr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    """The one-kernel Gluon backward's set-up in one launch: delta = rowsum(o * dO) in fp32 (the dq kernels form it
    otherwise); the zeroed accumulators of its reduce-adds, DQ32 (B, Tq, H, HEAD_DIM) and RS8 (B, Tq, H, 8),
    contiguous; PQ, the block-local prefix sums of log f over the query rows in blocks of ROWS (the kernel's query
    tiles; rows of stride ``spr``, every block written whole: rows past Tq count as log f = 0, so a block's last
    entry is its total), as ``_block_prefix_kernel``'s plane for ROWS; and Z = PQ * log2(e) - LSE, the query side
    of a tile's scores in base 2 (LSE (B*H, Tq)), into (B*H, svr) rows. O and DO share contiguous
    (B, Tq, H, HEAD_DIM) strides; DELTA (B*H, Tq); LF (B, Tk, H) strided. Grid (B*H, cdiv(Tq, ROWS))."""
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (rows < Tq)[:, None] & (offs_d < HEAD_DIM)[None, :]
    offs = b.to(tl.int64) * sob + h.to(tl.int64) * soh + rows[:, None] * sot + offs_d[None, :]
    o = tl.load(O + offs, mask=ok, other=0.0).to(tl.float32)
    do = tl.load(DO + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(DELTA + pid.to(tl.int64) * Tq + rows, tl.sum(o * do, 1), mask=rows < Tq)
    row_q = (b.to(tl.int64) * Tq + rows) * H + h  # (b, row, h) of the (B, Tq, H, .) accumulators
    tl.store(DQ32 + row_q[:, None] * HEAD_DIM + offs_d[None, :], tl.zeros([ROWS, BLOCK_D], tl.float32), mask=ok)
    offs_8 = tl.arange(0, 8)
    tl.store(RS8 + row_q[:, None] * 8 + offs_8[None, :], tl.zeros([ROWS, 8], tl.float32),
             mask=(rows < Tq)[:, None])
    lf = tl.load(LF + b.to(tl.int64) * slb + h.to(tl.int64) * slh + (Tk - Tq + rows) * slt, mask=rows < Tq,
                 other=0.0)
    pq = tl.cumsum(lf, 0)
    tl.store(PQ + pid.to(tl.int64) * spr + rows, pq)
    lse = tl.load(LSE + pid.to(tl.int64) * Tq + rows, mask=rows < Tq, other=0.0)
    tl.store(Z + pid.to(tl.int64) * svr + rows, pq * 1.4426950408889634 - lse, mask=rows < Tq)


@triton.jit
def _dlogf_sums_kernel(DROW, DCOL, S, H, Tq, Tk, NCH, sr, CHUNK: tl.constexpr):
    """Grid (B*H, NCH): S[b*h, c] = the float64 sum of dc over chunk c (``_dlogf_chunk``), the carries of
    ``_dlogf_kernel``."""
    pid = tl.program_id(0)
    c = tl.program_id(1)
    dc, _, _ = _dlogf_chunk(DROW, DCOL, pid // H, pid % H, c, H, Tq, Tk, sr, CHUNK)
    tl.store(S + pid.to(tl.int64) * NCH + c, tl.sum(dc.to(tl.float64), 0))


@triton.jit
def _dlogf_kernel(DROW, DCOL, S, DLF, DQ32, DQ, H, Tq, Tk, NCH, sr, CHUNK: tl.constexpr, VEC: tl.constexpr,
                  ROUND_DQ: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    """Grid (B*H, NCH): d log f_t = sum_{i >= t} (drow_i - dcol_i) over chunk c: the chunk-local fp32 reverse
    ``tl.cumsum`` plus a float64 carry, the sum of the later chunks' S (``_dlogf_sums_kernel``), so no value is
    differenced from a long fp32 sum and the chunks run in parallel (a serial carry over the chunks, one
    program per (b, h), took 39 / 68 us at S2 / S4; these two launches 14 / 13). DLF (B, Tk, H) contiguous.
    ROUND_DQ (the one-kernel backward): grid (B*H, NCH, CHUNK // ROWS); program (pid, c, s) also rounds ROWS of
    the fp32 dq accumulator DQ32's query rows of chunk c (the s-th tile from the chunk's end) to DQ's dtype (both
    (B, Tq, H, HEAD_DIM) contiguous), which saves that launch, and only programs s = 0 form d log f. (One program
    per chunk looping over its 1024 rows ran 256 programs at S1 / S2, too few to keep HBM busy.)"""
    pid = tl.program_id(0)
    c = tl.program_id(1)
    if ROUND_DQ:
        # query rows [r_hi - (s+1)*ROWS, r_hi - s*ROWS) of the chunk's positions [Tk - (c+1)*CHUNK, Tk - c*CHUNK),
        # at row = position - (Tk - Tq)
        r_hi = Tq - c * CHUNK - tl.program_id(2) * ROWS
        r = r_hi - ROWS + tl.arange(0, ROWS)
        offs_d = tl.arange(0, BLOCK_D)
        idx = ((pid // H).to(tl.int64) * Tq + r) * H + pid % H
        idx = idx[:, None] * HEAD_DIM + offs_d[None, :]
        m = ((r >= 0) & (r >= Tq - (c + 1) * CHUNK))[:, None] & (offs_d < HEAD_DIM)[None, :]
        tl.store(DQ + idx, tl.load(DQ32 + idx, mask=m).to(DQ.dtype.element_ty), mask=m)
        if tl.program_id(2) != 0:
            return
    v = tl.arange(0, VEC)
    carry = tl.sum(tl.zeros([VEC], dtype=tl.float64), 0)
    for j0 in range(0, c, VEC):
        carry += tl.sum(tl.load(S + pid.to(tl.int64) * NCH + j0 + v, mask=j0 + v < c, other=0.0), 0)
    b = pid // H
    h = pid % H
    dc, t, ok = _dlogf_chunk(DROW, DCOL, b, h, c, H, Tq, Tk, sr, CHUNK)
    out = tl.cumsum(dc, 0).to(tl.float64) + carry
    tl.store(DLF + (b.to(tl.int64) * Tk + t) * H + h, out.to(tl.float32), mask=ok)


@triton.jit
def _acp_norms_kernel(Q, K, NORMS, B, H, HKV, Tq, Tk, sqb, sqt, sqh, skb, skt, skh, NCH,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    """Partial max L2 norms of the rows of q (programs ``pid < B*H``, one per (b, h)) and of k (the next
    ``B*HKV``, one per (b, hk)) for ACP's "auto" threshold: program (pid, c) reduces the row chunks
    ``c, c + NCH, ...`` of ROWS rows and writes NORMS[pid, c] (0 when it has no rows)."""
    pid = tl.program_id(0)
    c = tl.program_id(1)
    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, BLOCK_D)
    if pid < B * H:
        base = Q + (pid // H).to(tl.int64) * sqb + (pid % H).to(tl.int64) * sqh
        T = Tq
        st = sqt
    else:
        j = pid - B * H
        base = K + (j // HKV).to(tl.int64) * skb + (j % HKV).to(tl.int64) * skh
        T = Tk
        st = skt
    mx = tl.zeros([ROWS], dtype=tl.float32)
    for r0 in range(c * ROWS, T, NCH * ROWS):
        r = r0 + offs_r
        x = tl.load(base + r[:, None] * st + offs_d[None, :],
                    mask=(r < T)[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0).to(tl.float32)
        mx = tl.maximum(mx, tl.sqrt(tl.sum(x * x, 1)))
    tl.store(NORMS + pid.to(tl.int64) * NCH + c, tl.max(mx, 0))


@triton.jit
def _acp_threshold(DELTA_IN, GQ, GK, NORMS, pid, b, h, B, H, HKV, GROUP, sgq, sgk, gk_div, NCH, D, thr_value,
                   sm_scale, sqrt_d, log_tk, log_eps, MODE: tl.constexpr, BLOCK_D: tl.constexpr, VEC: tl.constexpr):
    """ACP's threshold delta (fp32) of one (b, h). MODE 0: DELTA_IN[pid]; 1: ``thr_value``; "auto" with
    U = sm_scale max|q| max|k| from the QK-norm weights (2: max|gamma| sqrt(D)) or from the partial max
    norms of ``_acp_norms_kernel`` (3); delta = -2U - log Tk + log eps, in acp.acp_threshold's order."""
    if MODE == 0:
        delta = tl.load(DELTA_IN + pid)
    elif MODE == 1:
        delta = thr_value + tl.sum(tl.zeros([VEC], dtype=tl.float32), 0)
    else:
        if MODE == 2:
            d = tl.arange(0, BLOCK_D)
            gq = tl.load(GQ + h * sgq + d, mask=d < D, other=0.0).to(tl.float32)
            gk = tl.load(GK + (h // gk_div) * sgk + d, mask=d < D, other=0.0).to(tl.float32)
            qmax = tl.max(tl.abs(gq), 0) * sqrt_d
            kmax = tl.max(tl.abs(gk), 0) * sqrt_d
        else:
            v = tl.arange(0, VEC)
            qrow = NORMS + pid.to(tl.int64) * NCH
            krow = NORMS + (B * H + b * HKV + h // GROUP).to(tl.int64) * NCH
            qm = tl.zeros([VEC], dtype=tl.float32)
            km = tl.zeros([VEC], dtype=tl.float32)
            for i0 in range(0, NCH, VEC):
                qm = tl.maximum(qm, tl.load(qrow + i0 + v, mask=i0 + v < NCH, other=0.0))
                km = tl.maximum(km, tl.load(krow + i0 + v, mask=i0 + v < NCH, other=0.0))
            qmax = tl.max(qm, 0)
            kmax = tl.max(km, 0)
        U = sm_scale * qmax * kmax
        delta = (-2.0 * U - log_tk) + log_eps
    return delta


@triton.jit
def _acp_cumsum_kernel(LF, C, TOT, H, Tk, P, NCH, SUB: tl.constexpr, HP: tl.constexpr):
    """Phase 1 of ACP's tables: chunk-local float64 cumulative sums of log f, all heads of one (b, chunk of P
    positions) per program (grid (B, NCH)), in sub-tiles of SUB positions with a carry.
    C[b, t, h] = sum of LF[b, s, h] over s from the chunk's start to t; TOT[b, chunk, h] = C at the chunk's last
    position (the same value, so c at a chunk's end and the next chunk's carry agree). LF, C (B, Tk, H), TOT
    (B, NCH, H) contiguous."""
    b = tl.program_id(0)
    ch = tl.program_id(1)
    offs_t = tl.arange(0, SUB)
    offs_h = tl.arange(0, HP)
    h_ok = offs_h < H
    t_end = tl.minimum(ch * P + P, Tk)
    carry = tl.zeros([HP], dtype=tl.float64)
    for t0 in range(ch * P, t_end, SUB):
        t = t0 + offs_t
        ok = (t < t_end)[:, None] & h_ok[None, :]
        idx = (b.to(tl.int64) * Tk + t)[:, None] * H + offs_h[None, :]
        cs = tl.cumsum(tl.load(LF + idx, mask=ok, other=0.0).to(tl.float64), 0) + carry[None, :]
        tl.store(C + idx, cs, mask=ok)
        last = tl.minimum(t_end - t0, SUB) - 1  # the sub-tile's last valid row
        carry = tl.sum(tl.where((offs_t == last)[:, None], cs, 0.0), 0)
    tl.store(TOT + (b.to(tl.int64) * NCH + ch) * H + offs_h, carry, mask=h_ok)


@triton.jit
def _acp_c(C, ps, b, h, t, H, Tk, P):
    """c_t = sum of log f over [0, t] (float64) at the positions t (a vector) of one (b, h): the chunk-local sum
    of ``_acp_cumsum_kernel`` plus ``ps``, the (b, h)'s exclusive prefix sums of the chunk totals (a register
    vector, the same in every program, so c_t is an exact function of t)."""
    return tl.load(C + (b.to(tl.int64) * Tk + t) * H + h) + tl.gather(ps, t // P, 0)


@triton.jit
def _search_narrow(lo, hi, k, step):
    """One step of the tables' VEC-ary search for a count that lies in [lo, hi]: of the probes lo + i * step
    (those below hi), the first k passed (the passing ones are a prefix), so the count lies in
    [lo + (k - 1) * step + 1, lo + k * step] (just lo when k = 0). Returns the narrowed (lo, hi)."""
    return tl.where(k > 0, lo + (k - 1) * step + 1, lo), tl.minimum(lo + k * step, hi)


@triton.jit
def _acp_axis(C, ps, b, h, i, delta, off, H, Tk, P, GM: tl.constexpr, GN: tl.constexpr, KEYS: tl.constexpr):
    """The values that ``_acp_counts`` compares, of the blocks ``i`` of the axis it counts: c at the last key of
    key blocks (``KEYS``), else c at the first row of query blocks minus delta (the threshold of those rows)."""
    if KEYS:
        return _acp_c(C, ps, b, h, tl.minimum(i * GN + GN - 1, Tk - 1), H, Tk, P)
    else:
        return _acp_c(C, ps, b, h, tl.minimum(off + i * GM, Tk - 1), H, Tk, P) - delta


@triton.jit
def _acp_counts(C, ps, b, h, x, x_ok, N, delta, off, H, Tk, P, GM: tl.constexpr, GN: tl.constexpr,
                VEC: tl.constexpr, KEYS: tl.constexpr):
    """For a window of VEC blocks with values ``x`` (non-increasing), the length of the prefix of the N blocks of
    the other axis that each sees: with ``KEYS``, the leading key blocks y = c[end_n] pruned for query blocks of
    thresholds x (``y > x``: c[m0] - c[end_n] < delta); else the leading query blocks that keep key blocks of
    x = c[end_n] (``y >= x``, the same comparison negated). Either set is a prefix, as c is non-increasing, and
    the window's first block has the shortest. Its count comes from a VEC-ary search (log_VEC(N) steps); then the
    ACP paper's two-pointer walk (Algorithm 1), vectorised: the window's VEC blocks are compared with VEC blocks
    of the other axis at a time, moving forward while one of them sees them all."""
    v = tl.arange(0, VEC)
    x0 = tl.sum(tl.where(v == 0, x, 0.0), 0)
    lo = 0
    hi = N
    while hi - lo > VEC:  # the first block's count lies in [lo, hi]
        step = (hi - lo + VEC - 1) // VEC
        i = lo + v * step
        y = _acp_axis(C, ps, b, h, i, delta, off, H, Tk, P, GM, GN, KEYS)
        seen = (y > x0) if KEYS else (y >= x0)
        k = tl.sum((seen & (i < hi)).to(tl.int32), 0)  # probes 0..k-1 seen, k.. not
        lo, hi = _search_narrow(lo, hi, k, step)
    p = lo
    cnt = tl.zeros([VEC], dtype=tl.int32) + p
    more = p >= 0  # always true; a tensor so the loop-carried type is stable
    while more:
        i = p + v
        y = tl.where(i < N, _acp_axis(C, ps, b, h, i, delta, off, H, Tk, P, GM, GN, KEYS), float("-inf"))
        seen = (y[None, :] > x[:, None]) if KEYS else (y[None, :] >= x[:, None])
        add = tl.sum(seen.to(tl.int32), 1)
        cnt += add
        more = (tl.max(tl.where(x_ok, add, 0), 0) == VEC) & (p + VEC < N)
        if more:
            p += VEC
    return cnt


@triton.jit
def _acp_tables_kernel(C, TOT, DELTA_IN, DELTA, LO, HI, GQ, GK, NORMS, B, H, HKV, GROUP, Tq, Tk, NQ, NK, NWQ, P,
                       NCH, sgq, sgk, gk_div, NCHN, D, thr_value, sm_scale, sqrt_d, log_tk, log_eps,
                       GM: tl.constexpr, GN: tl.constexpr, VEC: tl.constexpr, NCHP: tl.constexpr,
                       MODE: tl.constexpr, BLOCK_D: tl.constexpr):
    """Phase 2 of ACP's tables: the threshold, LO and HI of one (b, h) per row of programs (grid (B*H, NWQ +
    cdiv(NK, VEC))). Programs w < NWQ (at least one) write LO for VEC query blocks each: the number of leading
    key blocks pruned (``c[m0] - c[end_n] < delta``), capped so that the block holding the query block's first
    row is kept (every row keeps its diagonal). The others write HI for VEC key blocks each, the last query
    block m with LO[m] <= n (-1 if none), from c rather than from LO, so that one launch writes both: LO[m] <= n
    iff query block m keeps key block n by the threshold or by the cap, each a prefix of the query blocks, so
    HI[n] + 1 is the longer prefix (the threshold's by ``_acp_counts`` on the negated comparison of the same
    float64 values, the cap's in closed form), and the forward and both backward kernels prune exactly one
    region. Every program computes the threshold (``_acp_threshold``); program (pid, 0) writes it to DELTA
    (B*H,) fp32."""
    pid = tl.program_id(0)
    w = tl.program_id(1)
    b = pid // H
    h = pid % H
    delta32 = _acp_threshold(DELTA_IN, GQ, GK, NORMS, pid, b, h, B, H, HKV, GROUP, sgq, sgk, gk_div, NCHN, D,
                             thr_value, sm_scale, sqrt_d, log_tk, log_eps, MODE, BLOCK_D, VEC)
    if w == 0:
        tl.store(DELTA + pid, delta32)
    delta = delta32.to(tl.float64)
    chs = tl.arange(0, NCHP)
    tot = tl.load(TOT + (b.to(tl.int64) * NCH + chs) * H + h, mask=chs < NCH, other=0.0)
    ps = tl.cumsum(tot, 0) - tot  # (NCHP,) the totals of the chunks before each chunk
    off = Tk - Tq
    v = tl.arange(0, VEC)
    if w < NWQ:
        if NQ > 0:  # (else the launch's one query program only writes the threshold)
            mq = w * VEC + v
            thr = _acp_axis(C, ps, b, h, mq, delta, off, H, Tk, P, GM, GN, False)
            cnt = _acp_counts(C, ps, b, h, thr, mq < NQ, NK, delta, off, H, Tk, P, GM, GN, VEC, True)
            cnt = tl.minimum(cnt, (off + mq * GM) // GN)  # the diagonal cap
            tl.store(LO + pid.to(tl.int64) * NQ + mq, cnt, mask=mq < NQ)
    else:
        nk = (w - NWQ) * VEC + v
        ce = _acp_axis(C, ps, b, h, nk, delta, off, H, Tk, P, GM, GN, True)
        cnt = _acp_counts(C, ps, b, h, ce, nk < NK, NQ, delta, off, H, Tk, P, GM, GN, VEC, False)
        last = (nk + 1) * GN - 1 - off  # the cap keeps key block n for the query blocks m with m * GM <= last
        cap = tl.minimum(tl.where(last >= 0, last // GM + 1, 0), NQ)
        tl.store(HI + pid.to(tl.int64) * NK + nk, tl.maximum(cnt, cap) - 1, mask=nk < NK)
