"""Hopper (sm90) kernels of Forgetting Attention in Gluon, triton's explicit-layout dialect: warp-specialised.

The forward (``fox_fwd_sm90_kernel``) and, below it, the two halves of the backward: dk/dv
(``fox_bwd_dkdv_sm90_kernel``) and dq (``fox_bwd_dq_sm90_kernel``, the forward's mirror), each with its own
docstring (docs/kernel.md). The forward:

One program per (query block of NUM_WG * BLOCK_M rows, batch*head), heaviest blocks first, with the numerics of
``triton.kernels._attn_fwd_kernel`` (block-local log f prefix sums, base-2 online softmax, the same o and
log-sum-exp), in three partitions:
  * a one-warp loader (24 registers after ``setmaxnreg``) issues TMA copies of Q and of each key block's K (with
    the block's row of PK, the block-local log f prefix sums) and V into a ring of NUM_STAGES shared-memory
    stages, K and V on separate mbarriers;
  * NUM_WG consumer warpgroups (2: the default partition and a worker, 240 registers each; 3: 160 each, the
    pick of the forward and the dq kernel at head dim 64), BLOCK_M query rows each, run wgmma for Q K^T and P V
    and the softmax, and
    free a stage with one mbarrier arrive each once their MMA has read it. They synchronise only through those
    barriers, so one warpgroup's softmax overlaps the others' MMAs (the ping-pong FlashAttention-3 schedules
    explicitly);
  * each consumer reads a key block's prefix sums from shared memory when it needs them (a prefetched copy in
    registers, with its pointers, cost 32 + 64 registers per thread at BLOCK_N = 128 and made three warpgroups
    spill) and loads only the block's total one tile ahead;
  * each consumer computes only the key blocks its own rows see: the top blocks of a program lie wholly after
    the first warpgroups' rows (three warpgroups of 64 rows share blocks of 128 keys), and under ACP a local
    head's lowest blocks lie wholly before the last warpgroups' first kept keys. It hands those stages on
    unread (``_pass_stage``); the skipped tiles were wholly masked, so the results are the same bit for bit.
    The dk/dv kernel does the same per warpgroup of keys under ACP.
At head dim 64 the backward, dense or with ACP, runs as one kernel by default (``fox_bwd_fused_sm90_kernel``: the
dk/dv kernel, which also forms dq by TMA reduce-adds; docs/kernel.md). The kernels run causal attention, dense or
with ACP (the forward and dq kernels read ACP's LO table, the dk/dv and one-kernel backward its HI table: the same
pruned region as the Triton kernels); documents and left padding stay with the Triton kernels.
``gluon.launch.use_sm90`` decides.
"""
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

LOG2E = gl.constexpr(1.4426950408889634)


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """TMA bulk reduce: global[box at ``coord``] += shared ``src`` (``cp.reduce.async.bulk.tensor`` .add). Gluon's
    ``tma`` module has no wrapper for it on triton 3.6 or 3.7.1; the builder's op is there on both. Completion is
    tracked like a TMA store's (``tma.store_wait``)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _acp_lo_blk(LO, pid_bh, r0, Tq, ACP_NQ, ACP_GM, ACP_GN, BLOCK_N: gl.constexpr, HAS_ACP: gl.constexpr):
    """The lowest key block (a multiple of BLOCK_N) that some query row from ``r0`` on keeps under ACP: its row's
    ``LO[r0 // ACP_GM] * ACP_GN`` rounded down, since LO grows with the query block (log f <= 0); one scalar
    load, so the loader and every consumer compute the same schedule (0 without ACP; for r0 >= Tq, no row:
    the largest int32 block)."""
    lo_blk = 0
    if HAS_ACP:
        lo_blk = gl.load(LO + pid_bh.to(gl.int64) * ACP_NQ + gl.minimum(r0, Tq - 1) // ACP_GM) * ACP_GN
        lo_blk = gl.where(r0 < Tq, (lo_blk // BLOCK_N) * BLOCK_N, (2147483647 // BLOCK_N) * BLOCK_N)
    return lo_blk


@gluon.jit
def _schedule(pid_m, Tq, Tk, lo_blk, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Key blocks of query block ``pid_m`` down to ``lo_blk`` (ACP), walked down from the diagonal: the top
    block, the number of causal-masked blocks, the total, E (one past the block's last key) and the highest
    block wholly at/below the block's first query."""
    m0 = Tk - Tq + pid_m * BLOCK_M
    E = gl.minimum(m0 + BLOCK_M, Tk)
    n_top = ((E - 1) // BLOCK_N) * BLOCK_N
    n_um = ((m0 + 1) // BLOCK_N) * BLOCK_N - BLOCK_N
    n_masked = (n_top - gl.maximum(n_um, lo_blk - BLOCK_N)) // BLOCK_N
    return n_top, n_masked, (n_top - lo_blk) // BLOCK_N + 1, E, n_um


@gluon.jit
def _fwd_load(q_desc, k_desc, v_desc, ck_desc, q_smem, k_bufs, v_bufs, ck_bufs, q_bar, k_ready, v_ready, k_empty,
              v_empty, LO, spp, spr, ACP_NQ, ACP_GM, ACP_GN, H, GROUP, Tq, Tk, HAS_ACP: gl.constexpr):
    """Loader partition: each consumer warpgroup's Q rows (one barrier), then K (with its PK row) and V of each
    key block (``_kv_ring_load``)."""
    NUM_WG: gl.constexpr = q_smem.type.shape[0]
    BLOCK_M: gl.constexpr = q_smem.type.shape[1]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    HEAD_DIM: gl.constexpr = k_bufs.type.shape[2]
    pid_bh = gl.program_id(0)
    pid_m = gl.num_programs(1) - 1 - gl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    lo_blk = _acp_lo_blk(LO, pid_bh, pid_m * NUM_WG * BLOCK_M, Tq, ACP_NQ, ACP_GM, ACP_GN, BLOCK_N, HAS_ACP)
    n_top, n_masked, n_total, E, n_um = _schedule(pid_m, Tq, Tk, lo_blk, NUM_WG * BLOCK_M, BLOCK_N)
    mbarrier.expect(q_bar, NUM_WG * q_desc.block_type.nbytes)
    for w in gl.static_range(NUM_WG):
        tma.async_copy_global_to_shared(q_desc, [b * Tq + (pid_m * NUM_WG + w) * BLOCK_M, h * HEAD_DIM], q_bar,
                                        q_smem.index(w))
    _kv_ring_load(k_desc, v_desc, ck_desc, k_bufs, v_bufs, ck_bufs, k_ready, v_ready, k_empty, v_empty,
                  b * Tk + n_top, (h // GROUP) * HEAD_DIM, _pk_row(pid_bh, spp, spr, BLOCK_N) + n_top, n_total)


@gluon.jit
def _pk_row(pid_bh, spp, spr, BLOCK_N: gl.constexpr):
    """The flat offset in PK (``triton.launch.block_prefix``: (4, B*H, TPAD)) of head ``pid_bh``'s
    prefix sums within aligned blocks of BLOCK_N keys."""
    gl.static_assert(BLOCK_N == 16 or BLOCK_N == 32 or BLOCK_N == 64 or BLOCK_N == 128)
    PLANE: gl.constexpr = (BLOCK_N >= 32) + (BLOCK_N >= 64) + (BLOCK_N >= 128)
    return PLANE * spp + pid_bh * spr


@gluon.jit
def _kv_ring_load(k_desc, v_desc, ck_desc, k_bufs, v_bufs, ck_bufs, k_ready, v_ready, k_empty, v_empty, row_top, col,
                  ck_top, n_total):
    """K and V of ``n_total`` key blocks, from row ``row_top`` downwards, into stage i % NUM_STAGES, each on its
    own barrier so Q K^T can start before V has arrived (the forward's and the dq kernel's loader). The block's
    row of PK (block-local log f prefix sums, from flat offset ``ck_top`` downwards) comes with K: the consumers
    read it from shared memory when they need it instead of holding a prefetched copy and its pointers in
    registers."""
    NUM_STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    for i in range(n_total):
        st = i % NUM_STAGES
        ph = (i // NUM_STAGES) & 1
        row = row_top - i * BLOCK_N
        mbarrier.wait(k_empty.index(st), ph ^ 1)  # fresh barriers count as a completed phase 1
        mbarrier.expect(k_ready.index(st), k_desc.block_type.nbytes + ck_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [row, col], k_ready.index(st), k_bufs.index(st))
        tma.async_copy_global_to_shared(ck_desc, [ck_top - i * BLOCK_N], k_ready.index(st), ck_bufs.index(st))
        mbarrier.wait(v_empty.index(st), ph ^ 1)
        mbarrier.expect(v_ready.index(st), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [row, col], v_ready.index(st), v_bufs.index(st))


@gluon.jit
def _pass_stage(i, ready, empty, ready2, empty2):
    """Hand stage i % NUM_STAGES of a ring back without reading it (a tile this warpgroup's rows or keys never
    see): wait until it is filled, then arrive on its empty barriers, as a consumer that used it would. The wait
    is needed: an arrive issued before the fill could complete the empty barrier's previous phase while another
    warpgroup still reads the stage's earlier contents."""
    NUM_STAGES: gl.constexpr = ready.type.shape[0]
    st = i % NUM_STAGES
    ph = (i // NUM_STAGES) & 1
    mbarrier.wait(ready.index(st), ph)
    mbarrier.arrive(empty.index(st), count=1)
    mbarrier.wait(ready2.index(st), ph)
    mbarrier.arrive(empty2.index(st), count=1)


@gluon.jit
def _block_total(PK_base, n0, E, BLOCK_N: gl.constexpr):
    """The sum of log f over the keys of block n0 before E (a scalar; any value for n0 < 0, the prefetch past
    the last block)."""
    return gl.load(PK_base + gl.maximum(gl.minimum(n0 + BLOCK_N, E) - 1, 0))


@gluon.jit
def _mask_tile(s, pos_k, pos_q, kstart, CAUSAL: gl.constexpr, START: gl.constexpr):
    """Scores of keys after the row's query (``CAUSAL``) or before the row's first kept key under ACP (``START``)
    set to -inf (forward and dq kernels)."""
    if CAUSAL:
        s = gl.where(gl.expand_dims(pos_k, 0) <= gl.expand_dims(pos_q, 1), s, float("-inf"))
    if START:
        s = gl.where(gl.expand_dims(pos_k, 0) >= gl.expand_dims(kstart, 1), s, float("-inf"))
    return s


@gluon.jit
def _fwd_tile(acc, m_i, l_i, g, tot_k, i, n_top, E, q_smem, k_bufs, v_bufs, ck_bufs, k_ready, v_ready, k_empty,
              v_empty, PK_base, pos_q, kstart, offs_n, qk_scale,
              s_layout: gl.constexpr, p_layout: gl.constexpr, row_o: gl.constexpr, CAUSAL: gl.constexpr,
              START: gl.constexpr, masked, MASK_AT_RUN_TIME: gl.constexpr):
    """Key block i: S = Q K^T, the softmax, then acc += P V, each MMA waited at once (the consumer warpgroups
    overlap each other's MMAs and softmax). The ``CAUSAL`` / ``START`` masks (``_mask_tile``) on every tile, or with
    ``MASK_AT_RUN_TIME`` only where the run-time ``masked`` is true (a branch around them)."""
    NUM_STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_smem.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    st = i % NUM_STAGES
    ph = (i // NUM_STAGES) & 1
    n0 = n_top - i * BLOCK_N
    # the next block's total, loaded one tile ahead so its latency is not on the critical path
    tot_next = _block_total(PK_base, n0 - BLOCK_N, E, BLOCK_N)
    k_s = k_bufs.index(st)
    mbarrier.wait(k_ready.index(st), ph)
    s = warpgroup_mma(q_smem, k_s.permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
                      use_acc=False, is_async=True)
    ck = ck_bufs.index(st).load(gl.SliceLayout(0, s_layout))  # block-local cumsum of log f over the keys
    s, _, _ = warpgroup_mma_wait(0, deps=(s, q_smem, k_s))
    mbarrier.arrive(k_empty.index(st), count=1)
    # key part of the decay: sum_{t=j+1}^{E-1} log f_t = (block-local suffix) + (running total g). The query
    # part is a per-row constant that cancels in the softmax: _fwd_compute adds it to the log-sum-exp at the
    # end, which saves one add per score
    dk2 = ((tot_k - ck) + g) * LOG2E
    # an explicit FMA: with the ACP loop's branch around the masks, ptxas otherwise multiplies every score by
    # qk_scale and folds LOG2E into a second op (28 more instructions per tile at head dim 64; checked by
    # tests/ops/test_kernel.py::test_kernels_compile_for_sm90); the dense kernels' SASS is unchanged by it
    s = gl.fma(s, qk_scale, gl.expand_dims(dk2, 0))
    if MASK_AT_RUN_TIME:
        if masked:
            s = _mask_tile(s, n0 + offs_n, pos_q, kstart, CAUSAL, START)
    else:
        s = _mask_tile(s, n0 + offs_n, pos_q, kstart, CAUSAL, START)
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s - gl.expand_dims(m_safe, 1))
    alpha = gl.exp2(m_i - m_safe)
    l_i = l_i * alpha + gl.sum(p, 1)
    v_s = v_bufs.index(st)
    p16 = gl.convert_layout(p.to(v_s.dtype), p_layout)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
    mbarrier.wait(v_ready.index(st), ph)
    acc = warpgroup_mma(p16, v_s, acc, is_async=True)
    acc, _ = warpgroup_mma_wait(0, deps=(acc, v_s))
    mbarrier.arrive(v_empty.index(st), count=1)
    return acc, m_new, l_i, g + tot_k, tot_next


@gluon.jit
def _query_rows(LF, PK, LO, slb, slt, slh, spp, spr, ACP_NQ, ACP_GM, ACP_GN, H, Tq, Tk,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, WG, NUM_WG: gl.constexpr,
                s_layout: gl.constexpr, HAS_ACP: gl.constexpr):
    """A consumer warpgroup's rows WG*BLOCK_M .. of the program's NUM_WG*BLOCK_M-row query block (forward and dq
    kernels): the key-block schedule (top block, causal-masked / clean / total counts, and this warpgroup's
    share: t_skip top blocks wholly after its rows and, under ACP, t_end, from which on the blocks lie wholly
    before its rows' first kept keys; E), the rows and their positions, each row's first kept key under ACP, the
    query part of the decay (log2 units), PK's row base and the key offsets of a tile."""
    num_warps: gl.constexpr = 4
    gl.static_assert(BLOCK_N == 16 or BLOCK_N == 32 or BLOCK_N == 64 or BLOCK_N == 128)
    PLANE: gl.constexpr = (BLOCK_N >= 32) + (BLOCK_N >= 64) + (BLOCK_N >= 128)  # PK's plane for blocks of BLOCK_N
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    pid_bh = gl.program_id(0)
    pid_m = gl.num_programs(1) - 1 - gl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    lo_blk = _acp_lo_blk(LO, pid_bh, pid_m * NUM_WG * BLOCK_M, Tq, ACP_NQ, ACP_GM, ACP_GN, BLOCK_N, HAS_ACP)
    n_top, n_masked, n_total, E, n_um = _schedule(pid_m, Tq, Tk, lo_blk, NUM_WG * BLOCK_M, BLOCK_N)
    m_start = (pid_m * NUM_WG + WG) * BLOCK_M
    offs_m = m_start + gl.arange(0, BLOCK_M, layout=row_s)
    row_ok = offs_m < Tq
    pos_q = Tk - Tq + offs_m
    kstart = gl.zeros([BLOCK_M], gl.int32, row_s)  # each row's first kept key (ACP)
    n_clean = gl.maximum(n_um // BLOCK_N + 1, 0)
    # this warpgroup's share of the program's blocks: the first t_skip lie wholly after its last row, and (ACP)
    # those from t_end on wholly before its rows' first kept keys (the lowest block it keeps is its first row's,
    # since LO grows with the row)
    t_skip = gl.minimum(gl.maximum(n_top - (Tk - Tq + m_start + BLOCK_M - 1) + BLOCK_N - 1, 0) // BLOCK_N, n_masked)
    t_end = n_total
    if HAS_ACP:
        kstart = gl.load(LO + pid_bh.to(gl.int64) * ACP_NQ + offs_m // ACP_GM, mask=row_ok, other=0) * ACP_GN
        n_clean_lo = ((gl.max(kstart, 0) + BLOCK_N - 1) // BLOCK_N) * BLOCK_N  # blocks at/above: no mask
        n_clean = gl.maximum((n_um - gl.maximum(n_clean_lo, lo_blk)) // BLOCK_N + 1, 0)
        lo_w = gl.minimum(_acp_lo_blk(LO, pid_bh, m_start, Tq, ACP_NQ, ACP_GM, ACP_GN, BLOCK_N, HAS_ACP), n_top)
        t_end = gl.maximum(gl.minimum((n_top - lo_w) // BLOCK_N + 1, n_total), t_skip)
        n_masked = gl.minimum(n_masked, t_end)  # (a masked block can lie below all of this warpgroup's bounds)
        # every block once: a warpgroup with no row (all past Tq: kstart 0) computes its clean blocks anyway
        t_end = gl.maximum(t_end, n_masked + n_clean)
    # query part of the decay, sum_{t=i+1}^{E-1} log f_t (the scan runs in a blocked layout: scans of
    # wgmma-layout slices are not supported)
    scan_layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    offs_ms = m_start + gl.arange(0, BLOCK_M, layout=scan_layout)
    LF_base = LF + b.to(gl.int64) * slb + h.to(gl.int64) * slh
    lf_q = gl.load(LF_base + (Tk - Tq + offs_ms) * slt, mask=offs_ms < Tq, other=0.0)
    rq = gl.sum(lf_q, 0) - gl.associative_scan(lf_q, 0, _add)
    for w in range(WG + 1, NUM_WG):  # plus the log f of the later warpgroups' rows
        offs_r = offs_ms + (w - WG) * BLOCK_M
        rq += gl.sum(gl.load(LF_base + (Tk - Tq + offs_r) * slt, mask=offs_r < Tq, other=0.0), 0)
    rq2 = gl.convert_layout(rq * LOG2E, row_s)
    PK_base = PK + PLANE * spp.to(gl.int64) + pid_bh.to(gl.int64) * spr
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    return n_top, n_masked, n_clean, n_total, t_skip, t_end, E, offs_m, row_ok, pos_q, kstart, rq2, PK_base, offs_n


@gluon.jit
def _fwd_compute(q_smem, k_bufs, v_bufs, ck_bufs, q_bar, k_ready, v_ready, k_empty, v_empty,
                 LF, PK, O, LSE, LO, slb, slt, slh, sob, sot, soh, spp, spr, ACP_NQ, ACP_GM, ACP_GN, H, Tq, Tk,
                 sm_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, WG,
                 NUM_WG: gl.constexpr, HAS_ACP: gl.constexpr):
    """One consumer warpgroup: the FlashAttention-2 loop of ``_attn_fwd_kernel`` for rows WG*BLOCK_M ..
    of the program's NUM_WG*BLOCK_M-row query block (``q_smem``: this warpgroup's rows). Key blocks in
    descending order: the causal diagonal ones, the clean ones, then (ACP) those that straddle some row's bound
    ``LO[row // ACP_GM] * ACP_GN``; the last group can differ between the warpgroups, the total cannot (they
    consume one ring of stages)."""
    num_warps: gl.constexpr = 4
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    pid_bh = gl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    m_start = ((gl.num_programs(1) - 1 - gl.program_id(1)) * NUM_WG + WG) * BLOCK_M
    n_top, n_masked, n_clean, n_total, t_skip, t_end, E, offs_m, row_ok, pos_q, kstart, rq2, PK_base, offs_n = \
        _query_rows(LF, PK, LO, slb, slt, slh, spp, spr, ACP_NQ, ACP_GM, ACP_GN, H, Tq, Tk, BLOCK_M, BLOCK_N, WG,
                    NUM_WG, s_layout, HAS_ACP)
    qk_scale = sm_scale * LOG2E

    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    g = gl.sum(gl.zeros([BLOCK_N], gl.float32, gl.SliceLayout(0, s_layout)), 0)
    tot = _block_total(PK_base, n_top, E, BLOCK_N)
    for i in range(0, t_skip):  # wholly after this warpgroup's rows: only the decay's running sum moves
        g += tot
        tot = _block_total(PK_base, n_top - (i + 1) * BLOCK_N, E, BLOCK_N)
        _pass_stage(i, k_ready, k_empty, v_ready, v_empty)
    mbarrier.wait(q_bar, 0)
    if HAS_ACP:
        if HEAD_DIM == 64:
            # one copy of the tile code with a branch around its masks: against the two variants below, the ACP
            # forward ran 7.5% / 1.2% faster at S1 / S2 and 0.7% / 1.5% slower at head dim 128 (S3 / S4;
            # docs/kernel.md, design choices: a loop with two variants pays a branch to a far variant per tile)
            for i in range(t_skip, t_end):
                acc, m_i, l_i, g, tot = _fwd_tile(acc, m_i, l_i, g, tot, i, n_top, E, q_smem, k_bufs, v_bufs,
                                                  ck_bufs, k_ready, v_ready, k_empty, v_empty, PK_base, pos_q,
                                                  kstart, offs_n, qk_scale, s_layout, p_layout, row_o, True, True,
                                                  (i < n_masked) | (i >= n_masked + n_clean), True)
        else:
            # one loop with both tile variants, so the kernel carries two copies of the tile code per warpgroup,
            # as the dense one does: a third (a loop of its own for the blocks that straddle a row's first kept
            # key, which the masked variant handles too) made this kernel 7-8% slower at head dim 64 even where
            # that loop ran no iteration (every head global; docs/kernel.md, design choices). The dense kernel
            # keeps two loops: one loop ran 2-3% slower there
            for i in range(t_skip, t_end):
                if (i < n_masked) | (i >= n_masked + n_clean):  # causal diagonal blocks; blocks straddling a bound
                    acc, m_i, l_i, g, tot = _fwd_tile(acc, m_i, l_i, g, tot, i, n_top, E, q_smem, k_bufs, v_bufs,
                                                      ck_bufs, k_ready, v_ready, k_empty, v_empty, PK_base, pos_q,
                                                      kstart, offs_n, qk_scale, s_layout, p_layout, row_o, True,
                                                      True, False, False)
                else:
                    acc, m_i, l_i, g, tot = _fwd_tile(acc, m_i, l_i, g, tot, i, n_top, E, q_smem, k_bufs, v_bufs,
                                                      ck_bufs, k_ready, v_ready, k_empty, v_empty, PK_base, pos_q,
                                                      kstart, offs_n, qk_scale, s_layout, p_layout, row_o, False,
                                                      False, False, False)
        for i in range(t_end, n_total):  # wholly before this warpgroup's rows' first kept keys
            _pass_stage(i, k_ready, k_empty, v_ready, v_empty)
    else:
        for i in range(t_skip, n_masked):
            acc, m_i, l_i, g, tot = _fwd_tile(acc, m_i, l_i, g, tot, i, n_top, E, q_smem, k_bufs, v_bufs, ck_bufs,
                                              k_ready, v_ready, k_empty, v_empty, PK_base, pos_q, kstart, offs_n,
                                              qk_scale, s_layout, p_layout, row_o, True, False, False, False)
        for i in range(n_masked, n_masked + n_clean):
            acc, m_i, l_i, g, tot = _fwd_tile(acc, m_i, l_i, g, tot, i, n_top, E, q_smem, k_bufs, v_bufs, ck_bufs,
                                              k_ready, v_ready, k_empty, v_empty, PK_base, pos_q, kstart, offs_n,
                                              qk_scale, s_layout, p_layout, row_o, False, False, False, False)

    l_ok = l_i > 0.0
    lse2 = gl.where(l_ok, m_i + gl.log2(gl.where(l_ok, l_i, 1.0)) - rq2, 0.0)  # with the decay's query part
    gl.store(LSE + pid_bh.to(gl.int64) * Tq + offs_m, lse2, mask=row_ok)
    o = acc / gl.expand_dims(gl.convert_layout(gl.where(l_ok, l_i, 1.0), row_o), 1)
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // HEAD_DIM, HEAD_DIM // 8], [num_warps, 1],
                                                [1, 0])
    o = gl.convert_layout(o.to(O.dtype.element_ty), out_layout)
    om = m_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
    od = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, out_layout))
    O_base = O + b.to(gl.int64) * sob + h.to(gl.int64) * soh
    gl.store(O_base + gl.expand_dims(om, 1) * sot + gl.expand_dims(od, 0), o, mask=gl.expand_dims(om < Tq, 1))


# The partitions below take the kernel's arguments: gl.warp_specialize passes no constexprs (they arrive as
# tensors), so the tile sizes and the number of consumer warpgroups are read from the shared-memory types (q_smem:
# NUM_WG x BLOCK_M x D), ACP from LO's type (int32 table, or a float dummy for the dense kernel), and a consumer's
# warpgroup index WG is a run-time value (it only offsets the rows).
@gluon.jit
def _fwd_compute_wg(q_desc, k_desc, v_desc, ck_desc, q_smem, k_bufs, v_bufs, ck_bufs, q_bar, k_ready, v_ready,
                    k_empty, v_empty, LF, PK, O, LSE, LO, slb, slt, slh, sob, sot, soh, spp, spr, ACP_NQ, ACP_GM,
                    ACP_GN, H, GROUP, Tq, Tk, sm_scale, WG):
    _fwd_compute(q_smem.index(WG), k_bufs, v_bufs, ck_bufs, q_bar, k_ready, v_ready, k_empty, v_empty,
                 LF, PK, O, LSE, LO, slb, slt, slh, sob, sot, soh, spp, spr, ACP_NQ, ACP_GM, ACP_GN, H, Tq, Tk,
                 sm_scale, q_smem.type.shape[1], k_bufs.type.shape[1], k_bufs.type.shape[2], WG, q_smem.type.shape[0],
                 LO.dtype.element_ty == gl.int32)


@gluon.jit
def _fwd_load_all(q_desc, k_desc, v_desc, ck_desc, q_smem, k_bufs, v_bufs, ck_bufs, q_bar, k_ready, v_ready,
                  k_empty, v_empty, LF, PK, O, LSE, LO, slb, slt, slh, sob, sot, soh, spp, spr, ACP_NQ, ACP_GM,
                  ACP_GN, H, GROUP, Tq, Tk, sm_scale):
    _fwd_load(q_desc, k_desc, v_desc, ck_desc, q_smem, k_bufs, v_bufs, ck_bufs, q_bar, k_ready, v_ready, k_empty,
              v_empty, LO, spp, spr, ACP_NQ, ACP_GM, ACP_GN, H, GROUP, Tq, Tk, LO.dtype.element_ty == gl.int32)


@gluon.jit
def _kv_ring(k_desc, v_desc, ck_desc, NUM_STAGES: gl.constexpr, NUM_WG: gl.constexpr):
    """The K/V ring of the forward and dq kernels: NUM_STAGES stages of K and V tiles (and K's row of PK) in
    shared memory, with their ready barriers (one TMA arrival) and empty barriers (one arrive per consumer
    warpgroup)."""
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [NUM_STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [NUM_STAGES] + v_desc.block_type.shape, v_desc.layout)
    ck_bufs = gl.allocate_shared_memory(gl.float32, [NUM_STAGES] + ck_desc.block_type.shape, ck_desc.layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=NUM_WG)
        mbarrier.init(v_empty.index(s), count=NUM_WG)
    return k_bufs, v_bufs, ck_bufs, k_ready, v_ready, k_empty, v_empty


@gluon.jit
def fox_fwd_sm90_kernel(q_desc, k_desc, v_desc, ck_desc, LF, PK, O, LSE, LO, slb, slt, slh, sob, sot, soh, spp, spr,
                        ACP_NQ, ACP_GM, ACP_GN, H, GROUP, Tq, Tk, sm_scale,
                        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                        NUM_STAGES: gl.constexpr, NUM_WG: gl.constexpr):
    """grid (B*H, cdiv(Tq, NUM_WG*BLOCK_M)), heaviest query blocks first, num_warps=4: NUM_WG (2 or 3) consumer
    warpgroups of BLOCK_M rows each (the default partition and workers; 240 registers each for 2, 160 for 3)
    and a one-warp loader. q_desc / k_desc / v_desc: TMA descriptors over the (B*T, heads*D) views of
    contiguous q, k, v with blocks [BLOCK_M, D] / [BLOCK_N, D]; ck_desc: 1-D over the flat PK
    (``triton.launch.block_prefix``), blocks [BLOCK_N]. Rows that a block reads past its batch element's
    end are masked (causal) or never stored. ACP when LO is an int32 pointer: ACP's table (B*H, ACP_NQ) on its
    (ACP_GM x ACP_GN) grid (``_acp_tables_kernel``); each row skips the keys below ``LO[row // ACP_GM] *
    ACP_GN``. Dense: any fp32 pointer."""
    gl.static_assert(NUM_WG == 2 or NUM_WG == 3)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_WG] + q_desc.block_type.shape, q_desc.layout)
    k_bufs, v_bufs, ck_bufs, k_ready, v_ready, k_empty, v_empty = _kv_ring(k_desc, v_desc, ck_desc, NUM_STAGES,
                                                                            NUM_WG)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    args = (q_desc, k_desc, v_desc, ck_desc, q_smem, k_bufs, v_bufs, ck_bufs, q_bar, k_ready, v_ready, k_empty,
            v_empty, LF, PK, O, LSE, LO, slb, slt, slh, sob, sot, soh, spp, spr, ACP_NQ, ACP_GM, ACP_GN, H, GROUP,
            Tq, Tk, sm_scale)
    if NUM_WG == 3:  # FlashAttention-3's split at head dim 64: more rows share each K/V stage
        gl.warp_specialize([(_fwd_compute_wg, args + (gl.to_tensor(0),)), (_fwd_compute_wg, args + (gl.to_tensor(1),)),
                            (_fwd_compute_wg, args + (gl.to_tensor(2),)), (_fwd_load_all, args)],
                           [4, 4, 1], [160, 160, 24])
    else:
        gl.warp_specialize([(_fwd_compute_wg, args + (gl.to_tensor(0),)), (_fwd_compute_wg, args + (gl.to_tensor(1),)),
                            (_fwd_load_all, args)],
                           [4, 1], [240, 24])


# --------------------------------------------------------------------------------------------------------------
# backward: dk, dv and the column sums of dS (the dk/dv half; the dq half is below)
# --------------------------------------------------------------------------------------------------------------


@gluon.jit
def _key_program(H, GROUP, Tk, BLOCK_N: gl.constexpr):
    """(b, kv head, first key) of a dk/dv or one-kernel backward program. Its 1-D grid runs key blocks fastest,
    heaviest (first) block first: a wave of programs then spans few heads, so that each head's Q, dO, LSE and
    dq accumulator stay in L2 while its key blocks read them (heads fastest spread a wave over every head)."""
    HKV = H // GROUP
    nblk = (Tk + BLOCK_N - 1) // BLOCK_N
    pid = gl.program_id(0)
    bh = pid // nblk
    return bh // HKV, bh % HKV, (pid % nblk) * BLOCK_N


@gluon.jit
def _bwd_schedule(n0, Tq, Tk, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Query tiles (aligned at the first query) that see key block ``n0``, ascending: the first, the end of the
    causal-masked ones, the end of the clean ones (after it: the partial last tile, masked) and the end."""
    off = Tk - Tq
    mb_first = gl.maximum(n0 - off, 0) // BLOCK_M
    mb_end = (Tq + BLOCK_M - 1) // BLOCK_M
    # the first tile whose first query is at/after the block's last key needs no causal mask
    mb_um = gl.maximum((gl.minimum(n0 + BLOCK_N, Tk) - 1 - off + BLOCK_M - 1) // BLOCK_M, mb_first)
    mb_mid = gl.minimum(mb_um, mb_end)
    mb_clean = gl.maximum(Tq // BLOCK_M, mb_mid)
    return mb_first, mb_mid, mb_clean, mb_end


@gluon.jit
def _bwd_acp_end(HI, bh, n_blk, Tk, mb_first, mb_end, ACP_NK, ACP_GM, ACP_GN, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, HAS_ACP: gl.constexpr):
    """One past the last query tile that sees key block ``n_blk`` of (b, h) ``bh``: ``mb_end``, or under ACP
    the tile holding the last query block ``HI`` keeps for the block's last key (HI grows with the key)."""
    if HAS_ACP:
        hi_last = gl.load(HI + bh.to(gl.int64) * ACP_NK + (gl.minimum(n_blk + BLOCK_N, Tk) - 1) // ACP_GN)
        mb_end = gl.maximum(gl.minimum(mb_end, ((hi_last + 1) * ACP_GM + BLOCK_M - 1) // BLOCK_M), mb_first)
    return mb_end


@gluon.jit
def _bwd_load(q_desc, do_desc, k_desc, v_desc, cq_desc, lse_desc, dl_desc, q_bufs, do_bufs, cq_bufs, lse_bufs,
              dl_bufs, k_smem, v_smem, kv_bar, q_ready, do_ready, q_empty, do_empty, HI, H, GROUP, Tq, Tk, spp,
              spr, svr, ACP_NK, ACP_GM, ACP_GN, HAS_ACP: gl.constexpr, FUSED: gl.constexpr):
    """Loader partition: this program's K and V block once (one TMA copy per consumer warpgroup's keys), then for
    each query tile (of each query head of the kv head) Q with the tile's rows of PQ (block-local log f prefix
    sums), LSE and delta on one barrier and dO on another, into stage i % NUM_STAGES, so K Q^T can start before dO
    lands. ``FUSED`` (the one-kernel backward): instead of PQ and LSE, the tile's rows of z = PQ log2(e) - LSE
    (``cq_desc`` over (B*H, svr) rows; ``_bwd_fused_setup``), one vector fewer per tile for both warpgroups to
    read."""
    NUM_STAGES: gl.constexpr = q_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.type.shape[1]
    HEAD_DIM: gl.constexpr = q_bufs.type.shape[2]
    NUM_WG: gl.constexpr = k_smem.type.shape[0]
    KEYS: gl.constexpr = k_smem.type.shape[1]
    BLOCK_N: gl.constexpr = NUM_WG * KEYS
    PLANE: gl.constexpr = (BLOCK_M >= 32) + (BLOCK_M >= 64) + (BLOCK_M >= 128)  # PQ's plane for tiles of BLOCK_M
    b, hk, n0 = _key_program(H, GROUP, Tk, BLOCK_N)
    mb_first, mb_mid, mb_clean, mb_end = _bwd_schedule(n0, Tq, Tk, BLOCK_M, BLOCK_N)
    mbarrier.expect(kv_bar, NUM_WG * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
    for w in gl.static_range(NUM_WG):
        tma.async_copy_global_to_shared(k_desc, [b * Tk + n0 + w * KEYS, hk * HEAD_DIM], kv_bar, k_smem.index(w))
        tma.async_copy_global_to_shared(v_desc, [b * Tk + n0 + w * KEYS, hk * HEAD_DIM], kv_bar, v_smem.index(w))
    q_bytes: gl.constexpr = q_desc.block_type.nbytes + (2 if FUSED else 3) * cq_desc.block_type.nbytes
    i = mb_first * 0  # stage counter over all heads' tiles
    for gi in range(GROUP):
        h = hk * GROUP + gi
        mb_end_h = _bwd_acp_end(HI, b * H + h, n0, Tk, mb_first, mb_end, ACP_NK, ACP_GM, ACP_GN, BLOCK_M,
                                BLOCK_N, HAS_ACP)
        for mb in range(mb_first, mb_end_h):
            st = i % NUM_STAGES
            ph = (i // NUM_STAGES) & 1
            r0 = mb * BLOCK_M
            mbarrier.wait(q_empty.index(st), ph ^ 1)  # fresh barriers count as a completed phase 1
            bar = q_ready.index(st)
            mbarrier.expect(bar, q_bytes)
            tma.async_copy_global_to_shared(q_desc, [b * Tq + r0, h * HEAD_DIM], bar, q_bufs.index(st))
            if FUSED:
                tma.async_copy_global_to_shared(cq_desc, [(b * H + h) * svr + r0], bar, cq_bufs.index(st))
            else:
                tma.async_copy_global_to_shared(cq_desc, [PLANE * spp + (b * H + h) * spr + r0], bar,
                                                cq_bufs.index(st))
                tma.async_copy_global_to_shared(lse_desc, [(b * H + h) * svr + r0], bar, lse_bufs.index(st))
            tma.async_copy_global_to_shared(dl_desc, [(b * H + h) * svr + r0], bar, dl_bufs.index(st))
            mbarrier.wait(do_empty.index(st), ph ^ 1)
            mbarrier.expect(do_ready.index(st), do_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(do_desc, [b * Tq + r0, h * HEAD_DIM], do_ready.index(st),
                                            do_bufs.index(st))
            i += 1


@gluon.jit
def _bwd_tile(dk, dv, colsum, acc_c, i, m0, off, Tq, k_s, v_s, q_bufs, do_bufs, cq_bufs, lse_bufs, dl_bufs, q_ready,
              do_ready, q_empty, do_empty, ck2, pos_k, khi, PQ_base, offs_m, qk_scale, ds_bufs, ds_full, ds_empty, WG,
              ones_q, s_layout: gl.constexpr, a_layout: gl.constexpr, MASK: gl.constexpr, ACP: gl.constexpr,
              FUSED: gl.constexpr):
    """One query tile of ``triton.kernels._attn_bwd_dkdv_inner`` (keys on rows: S^T = K Q^T, so P^T and dS^T are
    the register A operands of the dv and dk products). ``MASK``: causal and rows past Tq, plus (``ACP``) the
    rows at/after each key's ``khi``. ``FUSED`` (the one-kernel backward): dS^T, rounded once to 16 bits, is also
    handed to the warpgroup that forms this tile's dq share and row sums (``_ds_handoff``, ``_dq_share``), and
    ``colsum`` is a (KEYS, 8) wgmma accumulator of its column sums: the 16-bit dS^T in registers (the dk
    product's A operand) times ``ones_q`` (8 x BLOCK_M), queued behind dk (summed in registers instead, from the
    rounded dS converted back to fp32, they cost 17%: docs/kernel.md, design choices)."""
    NUM_STAGES: gl.constexpr = q_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.type.shape[1]
    KEYS: gl.constexpr = k_s.type.shape[0]
    st = i % NUM_STAGES
    ph = (i // NUM_STAGES) & 1
    rows = m0 - off + offs_m
    row_ok = rows < Tq
    tot = gl.load(PQ_base + (m0 - off) + BLOCK_M - 1)  # the query tile's sum of log f
    q_s = q_bufs.index(st)
    do_s = do_bufs.index(st)
    vec_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    mbarrier.wait(q_ready.index(st), ph)
    sT = warpgroup_mma(k_s, q_s.permute((1, 0)), gl.zeros([KEYS, BLOCK_M], gl.float32, s_layout),
                       use_acc=False, is_async=True)
    # decay: sum_{t=j+1}^{i} = (sum over [n0, m0) + local cumsum of the query tile) - local cumsum of the keys
    # (rows past Tq of a partial last tile hold the next row's values or TMA's zeros: masked below). Its query
    # part is read from shared memory while the score matmul runs: read after the wait, these loads were the
    # tile loop's most-stalled point (Nsight Compute; with 128-row tiles the early copy spills)
    if FUSED:  # z = (block-local cumsum of log f over the query tile) * log2(e) - LSE, formed in the set-up
        dq2 = acc_c * LOG2E + cq_bufs.index(st).load(vec_layout)
    else:
        cq = cq_bufs.index(st).load(vec_layout)  # block-local cumsum of log f over the query tile
        dq2 = (acc_c + cq) * LOG2E - lse_bufs.index(st).load(vec_layout)
    mbarrier.wait(do_ready.index(st), ph)
    dpT = warpgroup_mma(v_s, do_s.permute((1, 0)), gl.zeros([KEYS, BLOCK_M], gl.float32, s_layout),
                        use_acc=False, is_async=True)
    sT, _, _ = warpgroup_mma_wait(1, deps=(sT, k_s, q_s))
    sT = sT * qk_scale + (gl.expand_dims(dq2, 0) - gl.expand_dims(ck2, 1))
    if MASK:  # causal, and the rows past Tq of a partial last tile (TMA read them from the next sequence)
        ok = (gl.expand_dims(pos_k, 1) <= gl.expand_dims(m0 + offs_m, 0)) & gl.expand_dims(row_ok, 0)
        if ACP:
            ok = ok & (gl.expand_dims(rows, 0) < gl.expand_dims(khi, 1))
        sT = gl.where(ok, sT, float("-inf"))
    pT = gl.exp2(sT)
    pT16 = gl.convert_layout(pT.to(do_s.dtype), a_layout)
    dpT, _, _ = warpgroup_mma_wait(0, deps=(dpT, v_s, do_s))
    dv = warpgroup_mma(pT16, do_s, dv, is_async=True)
    dsT = pT * (dpT - gl.expand_dims(dl_bufs.index(st).load(vec_layout), 0))
    if FUSED:
        ds16 = dsT.to(q_s.dtype)
        _ds_handoff(ds16, i, WG, ds_bufs, ds_full, ds_empty)
        dsT16 = gl.convert_layout(ds16, a_layout)
    else:
        colsum += gl.sum(dsT, 1)
        dsT16 = gl.convert_layout(dsT.to(q_s.dtype), a_layout)
    dk = warpgroup_mma(dsT16, q_s, dk, is_async=True)
    if FUSED:  # colsum (KEYS, 8) += dS^T ones
        colsum = warpgroup_mma(dsT16, ones_q.permute((1, 0)), colsum, is_async=True)
        dv, dk, colsum, _, _, _ = warpgroup_mma_wait(0, deps=(dv, dk, colsum, do_s, q_s, ones_q))
    else:
        dv, dk, _, _ = warpgroup_mma_wait(0, deps=(dv, dk, do_s, q_s))
    mbarrier.arrive(q_empty.index(st), count=1)
    mbarrier.arrive(do_empty.index(st), count=1)
    return dk, dv, colsum, acc_c + tot


@gluon.jit
def _ds_handoff(ds16, i, WG, ds_bufs, ds_full, ds_empty):
    """The one-kernel backward: store this warpgroup's dS^T of tile i (its KEYS keys x the tile's queries) into
    buffer i % 2 of ``ds_bufs`` (2 x NUM_WG tiles: buffer b's are rows of one (NUM_WG * KEYS, BLOCK_M) tile) once
    tile i - 2's dq share has read it, and tell warpgroup i % 2, which forms tile i's share (``_dq_share``)."""
    NUM_WG: gl.constexpr = 2
    buf = i % 2
    mbarrier.wait(ds_empty.index(buf), ((i // 2) & 1) ^ 1)  # fresh barriers count as a completed phase 1
    ds_bufs.index(buf * NUM_WG + WG).store(ds16)
    fence_async_shared()  # the generic proxy's stores, before the wgmma (async proxy) reads them
    mbarrier.arrive(ds_full.index(buf), count=1)


@gluon.jit
def _zero_share(i, WG, q_ready, q_empty, do_ready, do_empty, ds_bufs, ds_full, ds_empty, s_layout: gl.constexpr):
    """The one-kernel backward under ACP, tile i of the program that this warpgroup's keys do not see (causal, or
    past the last row they reach): hand its stage on unread (``_pass_stage``) and a zero dS^T to the tile's dq
    share, which the other warpgroup's half makes."""
    KEYS: gl.constexpr = ds_bufs.type.shape[1]
    BLOCK_M: gl.constexpr = ds_bufs.type.shape[2]
    _pass_stage(i, q_ready, q_empty, do_ready, do_empty)
    _ds_handoff(gl.zeros([KEYS, BLOCK_M], ds_bufs.dtype, s_layout), i, WG, ds_bufs, ds_full, ds_empty)


@gluon.jit
def _dq_share(j, WG, ds_bufs, k_smem, ones_s, dq_stage, rs_stage, ds_full, ds_empty, st_full, st_empty, sm_scale):
    """The one-kernel backward, warpgroup j % 2 (``WG``), after its tile j + 1: tile j's dq share of the program's
    keys, dS K (times sm_scale), and the row sums of dS (dS times ones: ``ones_s``, 8 x (NUM_WG * KEYS); 8 equal
    columns), both by wgmma from the dS tile both warpgroups stored (``_ds_handoff``), into this warpgroup's
    staging slot for the writer warp's TMA reduce-adds (``_dq_write``). The row sums come from the same 16-bit dS
    as the column sums (``_bwd_tile``), whose rounding d log f, their difference, would otherwise see. A tile
    late, so the other warpgroup has a whole tile to store its half."""
    NUM_WG: gl.constexpr = 2
    KEYS: gl.constexpr = ds_bufs.type.shape[1]
    BLOCK_M: gl.constexpr = ds_bufs.type.shape[2]
    HEAD_DIM: gl.constexpr = k_smem.type.shape[2]
    d_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    r_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 8, 16])
    buf = j % 2
    u = j // 2
    # the program's dS (BLOCK_M queries x NUM_WG * KEYS keys: MN-major) and K (NUM_WG * KEYS keys x D)
    ds_all = ds_bufs._reinterpret(ds_bufs.dtype, [2, NUM_WG * KEYS, BLOCK_M], ds_bufs.type.layout).index(buf)
    k_all = k_smem._reinterpret(k_smem.dtype, [NUM_WG * KEYS, HEAD_DIM], k_smem.type.layout)
    mbarrier.wait(ds_full.index(buf), u & 1)
    ds_t = ds_all.permute((1, 0))
    dq = warpgroup_mma(ds_t, k_all, gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, d_layout), use_acc=False,
                       is_async=True)
    # (the ones as a K-major operand: an 8 x (NUM_WG * KEYS) tile, transposed; as an N-major [keys, 8] tile without
    # swizzle, the wgmma read garbage)
    ones_t = ones_s.permute((1, 0))
    rs = warpgroup_mma(ds_t, ones_t, gl.zeros([BLOCK_M, 8], gl.float32, r_layout), use_acc=False, is_async=True)
    dq, rs, _, _, _ = warpgroup_mma_wait(0, deps=(dq, rs, ds_t, k_all, ones_t))
    mbarrier.arrive(ds_empty.index(buf), count=1)
    SLOTS: gl.constexpr = dq_stage.type.shape[0] // NUM_WG
    slot = WG * SLOTS + u % SLOTS
    mbarrier.wait(st_empty.index(slot), ((u // SLOTS) & 1) ^ 1)
    dq_stage.index(slot).store(dq * sm_scale)
    rs_stage.index(slot).store(rs)
    fence_async_shared()
    mbarrier.arrive(st_full.index(slot), count=1)


@gluon.jit
def _dq_prev(i, WG, k_smem, ds_bufs, ones_s, dq_stage, rs_stage, ds_full, ds_empty, st_full, st_empty, sm_scale,
             FUSED: gl.constexpr):
    """``FUSED``: after tile i (or, with i the tile count, after the last), tile i - 1's dq share if it is this
    warpgroup's (``_dq_share``)."""
    if FUSED:
        if (i > 0) & ((i - 1) % 2 == WG):
            _dq_share(i - 1, WG, ds_bufs, k_smem, ones_s, dq_stage, rs_stage, ds_full, ds_empty, st_full, st_empty,
                      sm_scale)


@gluon.jit
def _bwd_compute(k_s, v_s, q_bufs, do_bufs, cq_bufs, lse_bufs, dl_bufs, kv_bar, q_ready, do_ready, q_empty,
                 do_empty, LF, PQ, DK, DV, DCOL, HI, slb, slt, slh, sdkb, sdkt, sdkh, spp, spr, svr, ACP_NK, ACP_GM,
                 ACP_GN, H, GROUP, Tq, Tk, sm_scale, WG, k_smem, ds_bufs, ones_s, ones_q, dq_stage, rs_stage, ds_full,
                 ds_empty, st_full, st_empty, NUM_WG: gl.constexpr, HAS_ACP: gl.constexpr, FUSED: gl.constexpr):
    """One consumer warpgroup: keys WG*KEYS .. of the program's NUM_WG*KEYS-key block (``k_s`` / ``v_s``: this
    warpgroup's rows), the loop of ``triton.kernels._attn_bwd_dkdv_kernel`` over the query tiles of each query head: the
    causal diagonal tiles, the clean ones, then those with rows past Tq or (ACP) rows that some of the keys do
    not reach. Under ACP key j reaches rows below ``(HI[j // ACP_GN] + 1) * ACP_GM`` (the region the LO table
    leaves to the forward: LO grows with the query block); the last tile is the program's (all warpgroups
    consume one ring of stages). ``FUSED`` (the one-kernel backward, two warpgroups): also each tile's dq
    share and the row sums of dS (``_ds_handoff``, ``_dq_share``), and the column sums by wgmma (``_bwd_tile``;
    the other arguments after ``WG`` are its buffers and barriers, unused otherwise); under ACP it walks all the
    program's tiles and hands a zero dS^T for those its own keys do not see (``_zero_share``)."""
    num_warps: gl.constexpr = 4
    KEYS: gl.constexpr = k_s.type.shape[0]
    HEAD_DIM: gl.constexpr = k_s.type.shape[1]
    BLOCK_M: gl.constexpr = q_bufs.type.shape[1]
    gl.static_assert(BLOCK_M == 16 or BLOCK_M == 32 or BLOCK_M == 64 or BLOCK_M == 128)
    PLANE: gl.constexpr = (BLOCK_M >= 32) + (BLOCK_M >= 64) + (BLOCK_M >= 128)  # PQ's plane for tiles of BLOCK_M
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    d_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=d_layout, k_width=2)
    r_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, 8, 16])
    scan_layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    b, hk, n_blk = _key_program(H, GROUP, Tk, NUM_WG * KEYS)
    mb_first, mb_mid, mb_clean, mb_end = _bwd_schedule(n_blk, Tq, Tk, BLOCK_M, NUM_WG * KEYS)  # the program's
    off = Tk - Tq
    n0 = n_blk + WG * KEYS
    pos_k = n0 + gl.arange(0, KEYS, layout=gl.SliceLayout(1, s_layout))
    offs_ks = n0 + gl.arange(0, KEYS, layout=scan_layout)
    offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    qk_scale = sm_scale * LOG2E
    m0f = off + mb_first * BLOCK_M
    lo_p = gl.minimum(n0, m0f)
    hi_p = gl.maximum(n0, m0f)
    base = mb_first * 0  # stage counter at the head's first tile

    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, d_layout)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, d_layout)
    if FUSED:
        gl.static_assert(NUM_WG == 2)
        ones_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
        ones_s = ones_s.index(WG)
        ones_s.store(gl.full([8, NUM_WG * KEYS], 1.0, ones_s.dtype, ones_layout))
        ones_q = ones_q.index(WG)
        ones_q.store(gl.full([8, BLOCK_M], 1.0, ones_q.dtype, ones_layout))
        fence_async_shared()
    mbarrier.wait(kv_bar, 0)
    for gi in range(GROUP):  # GQA: the query heads sharing this kv head
        h = hk * GROUP + gi
        bh = b * H + h
        LF_base = LF + b.to(gl.int64) * slb + h.to(gl.int64) * slh
        lf_k = gl.load(LF_base + offs_ks * slt, mask=offs_ks < Tk, other=0.0)
        ck2 = gl.convert_layout(gl.associative_scan(lf_k, 0, _add) * LOG2E, gl.SliceLayout(1, s_layout))
        # acc_c = signed sum of log f over [n0, m0f): block-sized steps, no global cumsum
        acc_c = gl.sum(gl.zeros([KEYS], gl.float32, scan_layout), 0)
        for t0 in range(lo_p, hi_p, KEYS):
            tt = t0 + gl.arange(0, KEYS, layout=scan_layout)
            acc_c += gl.sum(gl.load(LF_base + tt * slt, mask=tt < hi_p, other=0.0), 0)
        if m0f < n0:
            acc_c = -acc_c
        PQ_base = PQ + PLANE * spp.to(gl.int64) + bh.to(gl.int64) * spr
        if FUSED:  # (KEYS, 8) wgmma accumulator: 8 equal columns, the column sums of the 16-bit dS
            colsum = gl.zeros([KEYS, 8], gl.float32, r_layout)
        else:
            colsum = gl.zeros([KEYS], gl.float32, gl.SliceLayout(1, s_layout))
        khi = gl.zeros([KEYS], gl.int32, gl.SliceLayout(1, s_layout))
        mb_end_h = _bwd_acp_end(HI, bh, n_blk, Tk, mb_first, mb_end, ACP_NK, ACP_GM, ACP_GN, BLOCK_M,
                                NUM_WG * KEYS, HAS_ACP)
        # the program's tiles of this head [mb_first, mb_end_h) (the loader's), and this warpgroup's share:
        # [wf, wm) causal-masked, [wm, wc) clean, [wc, we) masked (a partial last tile; ACP)
        wf = mb_first
        wm = gl.minimum(mb_mid, mb_end_h)
        wc = gl.minimum(mb_clean, mb_end_h)
        we = mb_end_h
        if HAS_ACP:  # rows at/after khi[j] do not see key j; tiles from the first such row on are masked
            khi = (gl.load(HI + bh.to(gl.int64) * ACP_NK + pos_k // ACP_GN, mask=pos_k < Tk, other=Tq) + 1) * ACP_GM
            # the tiles of this warpgroup's own keys: those before wf lie wholly before its first key (causal),
            # those from we on wholly after the last row its keys reach; it only hands their stages on
            # (``_pass_stage``; they were wholly masked, so the results are the same bit for bit). A local head's
            # key block sees ~3 query tiles, of which each warpgroup's keys see 2
            w_first, w_mid, w_clean, _ = _bwd_schedule(n0, Tq, Tk, BLOCK_M, KEYS)
            wf = gl.minimum(w_first, mb_end_h)
            we = gl.maximum(gl.minimum(_bwd_acp_end(HI, bh, n0, Tk, wf, mb_end, ACP_NK, ACP_GM, ACP_GN, BLOCK_M,
                                                    KEYS, HAS_ACP), mb_end_h), wf)
            wm = gl.maximum(gl.minimum(w_mid, we), wf)
            wc = gl.maximum(gl.minimum(gl.minimum(w_clean, we), gl.min(khi, 0) // BLOCK_M), wm)
        i0 = base - mb_first
        if FUSED:  # one loop over the program's tiles, so the dq share's code is inlined once (with a copy in
            # each of the three loops below, the kernel spilled 2.6x as much); dense, [wf, we) is all of them
            for mb in range(mb_first, mb_end_h):
                if HAS_ACP and ((mb < wf) | (mb >= we)):  # not seen by this warpgroup's keys: a zero share
                    acc_c += gl.where(mb < wf, gl.load(PQ_base + mb * BLOCK_M + BLOCK_M - 1), 0.0)  # as _bwd_tile
                    _zero_share(i0 + mb, WG, q_ready, q_empty, do_ready, do_empty, ds_bufs, ds_full, ds_empty,
                                s_layout)
                elif (mb < wm) | (mb >= wc):
                    dk, dv, colsum, acc_c = _bwd_tile(dk, dv, colsum, acc_c, i0 + mb, off + mb * BLOCK_M, off, Tq, k_s,
                                                      v_s, q_bufs, do_bufs, cq_bufs, lse_bufs, dl_bufs, q_ready,
                                                      do_ready, q_empty, do_empty, ck2, pos_k, khi, PQ_base, offs_m,
                                                      qk_scale, ds_bufs, ds_full, ds_empty, WG, ones_q, s_layout,
                                                      a_layout, True, HAS_ACP, True)
                else:
                    dk, dv, colsum, acc_c = _bwd_tile(dk, dv, colsum, acc_c, i0 + mb, off + mb * BLOCK_M, off, Tq, k_s,
                                                      v_s, q_bufs, do_bufs, cq_bufs, lse_bufs, dl_bufs, q_ready,
                                                      do_ready, q_empty, do_empty, ck2, pos_k, khi, PQ_base, offs_m,
                                                      qk_scale, ds_bufs, ds_full, ds_empty, WG, ones_q, s_layout,
                                                      a_layout, False, False, True)
                _dq_prev(i0 + mb, WG, k_smem, ds_bufs, ones_s, dq_stage, rs_stage, ds_full, ds_empty, st_full,
                         st_empty, sm_scale, FUSED)
        else:
            if HAS_ACP:
                for mb in range(mb_first, wf):  # wholly before this warpgroup's first key: only the decay's sum moves
                    acc_c += gl.load(PQ_base + mb * BLOCK_M + BLOCK_M - 1)  # the tile's sum of log f, as _bwd_tile adds
                    _pass_stage(i0 + mb, q_ready, q_empty, do_ready, do_empty)
            for mb in range(wf, wm):
                dk, dv, colsum, acc_c = _bwd_tile(dk, dv, colsum, acc_c, i0 + mb, off + mb * BLOCK_M, off, Tq, k_s, v_s,
                                                  q_bufs, do_bufs, cq_bufs, lse_bufs, dl_bufs, q_ready, do_ready,
                                                  q_empty, do_empty, ck2, pos_k, khi, PQ_base, offs_m, qk_scale,
                                                  ds_bufs, ds_full, ds_empty, WG, ones_q, s_layout, a_layout,
                                                  True, HAS_ACP, False)
            for mb in range(wm, wc):
                dk, dv, colsum, acc_c = _bwd_tile(dk, dv, colsum, acc_c, i0 + mb, off + mb * BLOCK_M, off, Tq, k_s, v_s,
                                                  q_bufs, do_bufs, cq_bufs, lse_bufs, dl_bufs, q_ready, do_ready,
                                                  q_empty, do_empty, ck2, pos_k, khi, PQ_base, offs_m, qk_scale,
                                                  ds_bufs, ds_full, ds_empty, WG, ones_q, s_layout, a_layout,
                                                  False, False, False)
            for mb in range(wc, we):
                dk, dv, colsum, acc_c = _bwd_tile(dk, dv, colsum, acc_c, i0 + mb, off + mb * BLOCK_M, off, Tq, k_s, v_s,
                                                  q_bufs, do_bufs, cq_bufs, lse_bufs, dl_bufs, q_ready, do_ready,
                                                  q_empty, do_empty, ck2, pos_k, khi, PQ_base, offs_m, qk_scale,
                                                  ds_bufs, ds_full, ds_empty, WG, ones_q, s_layout, a_layout,
                                                  True, HAS_ACP, False)
            if HAS_ACP:
                for mb in range(we, mb_end_h):  # wholly after the last row its keys reach
                    _pass_stage(i0 + mb, q_ready, q_empty, do_ready, do_empty)
        base += mb_end_h - mb_first
        if FUSED:  # column 0 of the accumulator; DCOL is (B, Tk, H) contiguous
            ck = gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, r_layout)), 0)
            key = n0 + gl.expand_dims(gl.arange(0, KEYS, layout=gl.SliceLayout(1, r_layout)), 1)
            gl.store(DCOL + (b.to(gl.int64) * Tk + key) * H + h + ck * 0, colsum, mask=(ck == 0) & (key < Tk))
        else:  # DCOL is (B, Tk, H) contiguous
            gl.store(DCOL + (b.to(gl.int64) * Tk + pos_k) * H + h, colsum, mask=pos_k < Tk)
    _dq_prev(base, WG, k_smem, ds_bufs, ones_s, dq_stage, rs_stage, ds_full, ds_empty, st_full, st_empty, sm_scale,
             FUSED)  # the last tile's share

    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // HEAD_DIM, HEAD_DIM // 8], [num_warps, 1],
                                                [1, 0])
    on = n0 + gl.arange(0, KEYS, layout=gl.SliceLayout(1, out_layout))
    od = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, out_layout))
    offs = gl.expand_dims(on, 1) * sdkt + gl.expand_dims(od, 0)
    ok = gl.expand_dims(on < Tk, 1)
    base = b.to(gl.int64) * sdkb + hk.to(gl.int64) * sdkh  # DK and DV share k's contiguous strides
    gl.store(DK + base + offs, gl.convert_layout((dk * sm_scale).to(DK.dtype.element_ty), out_layout), mask=ok)
    gl.store(DV + base + offs, gl.convert_layout(dv.to(DV.dtype.element_ty), out_layout), mask=ok)


# The partitions below share one signature (see the forward's: ACP when HI is an int32 pointer, WG at run time);
# k_smem / v_smem are NUM_WG x KEYS x D.
@gluon.jit
def _bwd_compute_wg(q_desc, do_desc, k_desc, v_desc, cq_desc, lse_desc, dl_desc, q_bufs, do_bufs, cq_bufs, lse_bufs,
                    dl_bufs, k_smem, v_smem, kv_bar, q_ready, do_ready, q_empty, do_empty, LF, PQ, DK, DV, DCOL, HI,
                    slb, slt, slh, sdkb, sdkt, sdkh, spp, spr, svr, ACP_NK, ACP_GM, ACP_GN, H, GROUP, Tq, Tk,
                    sm_scale, WG):
    _bwd_compute(k_smem.index(WG), v_smem.index(WG), q_bufs, do_bufs, cq_bufs, lse_bufs, dl_bufs, kv_bar, q_ready,
                 do_ready, q_empty, do_empty, LF, PQ, DK, DV, DCOL, HI, slb, slt, slh, sdkb, sdkt, sdkh, spp, spr, svr,
                 ACP_NK, ACP_GM, ACP_GN, H, GROUP, Tq, Tk, sm_scale, WG, k_smem, q_bufs, q_bufs, q_bufs, q_bufs, q_bufs,
                 q_ready, q_ready, q_ready, q_ready, k_smem.type.shape[0], HI.dtype.element_ty == gl.int32, False)


@gluon.jit
def _bwd_load_all(q_desc, do_desc, k_desc, v_desc, cq_desc, lse_desc, dl_desc, q_bufs, do_bufs, cq_bufs, lse_bufs,
                  dl_bufs, k_smem, v_smem, kv_bar, q_ready, do_ready, q_empty, do_empty, LF, PQ, DK, DV, DCOL, HI,
                  slb, slt, slh, sdkb, sdkt, sdkh, spp, spr, svr, ACP_NK, ACP_GM, ACP_GN, H, GROUP, Tq, Tk,
                  sm_scale):
    _bwd_load(q_desc, do_desc, k_desc, v_desc, cq_desc, lse_desc, dl_desc, q_bufs, do_bufs, cq_bufs, lse_bufs,
              dl_bufs, k_smem, v_smem, kv_bar, q_ready, do_ready, q_empty, do_empty, HI, H, GROUP, Tq, Tk, spp, spr,
              svr, ACP_NK, ACP_GM, ACP_GN, HI.dtype.element_ty == gl.int32, False)


@gluon.jit
def fox_bwd_dkdv_sm90_kernel(q_desc, do_desc, k_desc, v_desc, cq_desc, lse_desc, dl_desc, LF, PQ, DK, DV, DCOL, HI,
                             slb, slt, slh, sdkb, sdkt, sdkh, spp, spr, svr, ACP_NK, ACP_GM, ACP_GN, H, GROUP, Tq, Tk,
                             sm_scale, NUM_STAGES: gl.constexpr, NUM_WG: gl.constexpr):
    """grid (cdiv(Tk, NUM_WG*KEYS) * B*Hkv,), key blocks fastest (``_key_program``), num_warps=4: NUM_WG (2 or 3)
    consumer warpgroups of KEYS keys each (the default partition and workers; 240 registers each for 2, 160 for 3)
    and a one-warp loader. q_desc / do_desc: TMA descriptors over the (B*Tq, H*D) views of contiguous q and do,
    blocks [BLOCK_M, D]; k_desc / v_desc: over (B*Tk, Hkv*D), blocks [KEYS, D]; cq_desc / lse_desc / dl_desc:
    1-D, blocks [BLOCK_M], over the flat PQ (``_block_prefix_kernel``), the forward's LSE and the dq kernel's delta
    (both (B*H, svr): rows padded to a multiple of 4, since a TMA copy must start at a 16-byte boundary). Writes
    dk (times sm_scale), dv and DCOL (B, Tk, H), the column sums of dS. ACP when HI is an int32 pointer: ACP's
    table (B*H, ACP_NK) on its (ACP_GM x ACP_GN) grid, the last query block that sees each key block (dense: any
    fp32 pointer)."""
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [NUM_STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [NUM_STAGES] + do_desc.block_type.shape, do_desc.layout)
    cq_bufs = gl.allocate_shared_memory(gl.float32, [NUM_STAGES] + cq_desc.block_type.shape, cq_desc.layout)
    lse_bufs = gl.allocate_shared_memory(gl.float32, [NUM_STAGES] + cq_desc.block_type.shape, cq_desc.layout)
    dl_bufs = gl.allocate_shared_memory(gl.float32, [NUM_STAGES] + cq_desc.block_type.shape, cq_desc.layout)
    gl.static_assert(NUM_WG == 2 or NUM_WG == 3)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [NUM_WG] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [NUM_WG] + v_desc.block_type.shape, v_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    do_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(q_ready.index(s), count=1)
        mbarrier.init(do_ready.index(s), count=1)
        mbarrier.init(q_empty.index(s), count=NUM_WG)  # one arrive per consumer warpgroup
        mbarrier.init(do_empty.index(s), count=NUM_WG)
    args = (q_desc, do_desc, k_desc, v_desc, cq_desc, lse_desc, dl_desc, q_bufs, do_bufs, cq_bufs, lse_bufs, dl_bufs,
            k_smem, v_smem, kv_bar, q_ready, do_ready, q_empty, do_empty, LF, PQ, DK, DV, DCOL, HI,
            slb, slt, slh, sdkb, sdkt, sdkh, spp, spr, svr, ACP_NK, ACP_GM, ACP_GN, H, GROUP, Tq, Tk, sm_scale)
    if NUM_WG == 3:
        gl.warp_specialize([(_bwd_compute_wg, args + (gl.to_tensor(0),)), (_bwd_compute_wg, args + (gl.to_tensor(1),)),
                            (_bwd_compute_wg, args + (gl.to_tensor(2),)), (_bwd_load_all, args)], [4, 4, 1],
                           [160, 160, 24])
    else:
        gl.warp_specialize([(_bwd_compute_wg, args + (gl.to_tensor(0),)), (_bwd_compute_wg, args + (gl.to_tensor(1),)),
                            (_bwd_load_all, args)], [4, 1], [240, 24])


# The one-kernel backward's partitions (one signature: the kernel's arguments; two consumer warpgroups; ACP when HI is
# an int32 pointer, as in the dk/dv kernel).
@gluon.jit
def _fused_compute_wg(q_desc, do_desc, k_desc, v_desc, cq_desc, lse_desc, dl_desc, dq_desc, rs_desc, q_bufs, do_bufs,
                      cq_bufs, lse_bufs, dl_bufs, k_smem, v_smem, ds_bufs, ones_s, ones_q, dq_stage, rs_stage, kv_bar,
                      q_ready, do_ready, q_empty, do_empty, ds_full, ds_empty, st_full, st_empty, LF, PQ, DK, DV, DCOL,
                      HI, slb, slt, slh, sdkb, sdkt, sdkh, spp, spr, svr, ACP_NK, ACP_GM, ACP_GN, H, GROUP, Tq, Tk,
                      sm_scale, WG):
    _bwd_compute(k_smem.index(WG), v_smem.index(WG), q_bufs, do_bufs, cq_bufs, lse_bufs, dl_bufs, kv_bar, q_ready,
                 do_ready, q_empty, do_empty, LF, PQ, DK, DV, DCOL, HI, slb, slt, slh, sdkb, sdkt, sdkh, spp, spr,
                 svr, ACP_NK, ACP_GM, ACP_GN, H, GROUP, Tq, Tk, sm_scale, WG, k_smem, ds_bufs, ones_s, ones_q,
                 dq_stage, rs_stage, ds_full, ds_empty, st_full, st_empty, 2, HI.dtype.element_ty == gl.int32, True)


@gluon.jit
def _fused_load(q_desc, do_desc, k_desc, v_desc, cq_desc, lse_desc, dl_desc, dq_desc, rs_desc, q_bufs, do_bufs, cq_bufs,
                lse_bufs, dl_bufs, k_smem, v_smem, ds_bufs, ones_s, ones_q, dq_stage, rs_stage, kv_bar, q_ready,
                do_ready, q_empty, do_empty, ds_full, ds_empty, st_full, st_empty, LF, PQ, DK, DV, DCOL, HI, slb, slt,
                slh, sdkb, sdkt, sdkh, spp, spr, svr, ACP_NK, ACP_GM, ACP_GN, H, GROUP, Tq, Tk, sm_scale):
    _bwd_load(q_desc, do_desc, k_desc, v_desc, cq_desc, lse_desc, dl_desc, q_bufs, do_bufs, cq_bufs, lse_bufs,
              dl_bufs, k_smem, v_smem, kv_bar, q_ready, do_ready, q_empty, do_empty, HI, H, GROUP, Tq, Tk, spp, spr,
              svr, ACP_NK, ACP_GM, ACP_GN, HI.dtype.element_ty == gl.int32, True)


@gluon.jit
def _dq_write(q_desc, do_desc, k_desc, v_desc, cq_desc, lse_desc, dl_desc, dq_desc, rs_desc, q_bufs, do_bufs, cq_bufs,
              lse_bufs, dl_bufs, k_smem, v_smem, ds_bufs, ones_s, ones_q, dq_stage, rs_stage, kv_bar, q_ready, do_ready,
              q_empty, do_empty, ds_full, ds_empty, st_full, st_empty, LF, PQ, DK, DV, DCOL, HI, slb, slt, slh, sdkb,
              sdkt, sdkh, spp, spr, svr, ACP_NK, ACP_GM, ACP_GN, H, GROUP, Tq, Tk, sm_scale):
    """Writer partition (one warp): for each tile in the consumers' order (the loader's schedule), once its dq
    share is staged (``_dq_share``: tile i by warpgroup i % 2, in that warpgroup's slot (i // 2) % SLOTS), add it
    and its row sums to the fp32 accumulators by TMA reduce-adds and free the slot when the reduces have read
    it."""
    BLOCK_M: gl.constexpr = dq_stage.type.shape[1]
    HEAD_DIM: gl.constexpr = dq_stage.type.shape[2]
    BLOCK_N: gl.constexpr = k_smem.type.shape[0] * k_smem.type.shape[1]
    SLOTS: gl.constexpr = dq_stage.type.shape[0] // 2
    b, hk, n_blk = _key_program(H, GROUP, Tk, BLOCK_N)
    mb_first, _, _, mb_end = _bwd_schedule(n_blk, Tq, Tk, BLOCK_M, BLOCK_N)
    i = mb_first * 0
    for gi in range(GROUP):
        h = hk * GROUP + gi
        mb_end_h = _bwd_acp_end(HI, b * H + h, n_blk, Tk, mb_first, mb_end, ACP_NK, ACP_GM, ACP_GN, BLOCK_M, BLOCK_N,
                                HI.dtype.element_ty == gl.int32)  # (the loader's tiles)
        for mb in range(mb_first, mb_end_h):
            u = i // 2
            slot = (i % 2) * SLOTS + u % SLOTS
            mbarrier.wait(st_full.index(slot), (u // SLOTS) & 1)
            _tma_reduce_add(dq_desc, [b * Tq + mb * BLOCK_M, h * HEAD_DIM], dq_stage.index(slot))
            _tma_reduce_add(rs_desc, [b * Tq + mb * BLOCK_M, h * 8], rs_stage.index(slot))
            tma.store_wait(0)  # both reduces have read the slot
            mbarrier.arrive(st_empty.index(slot), count=1)
            i += 1


@gluon.jit
def fox_bwd_fused_sm90_kernel(q_desc, do_desc, k_desc, v_desc, cq_desc, lse_desc, dl_desc, dq_desc, rs_desc, LF, PQ, DK,
                              DV, DCOL, slb, slt, slh, sdkb, sdkt, sdkh, spp, spr, svr, H, GROUP, Tq, Tk, sm_scale, HI,
                              ACP_NK, ACP_GM, ACP_GN, NUM_STAGES: gl.constexpr, DQ_SLOTS: gl.constexpr):
    """The one-kernel backward: ``fox_bwd_dkdv_sm90_kernel`` with two consumer warpgroups of KEYS keys (240
    registers each) and its loader, which also forms dq and the row and column sums of dS, plus a writer warp. Per
    query tile both warpgroups store their dS^T (16-bit) to shared memory (``_ds_handoff``); one of them
    (alternating) forms the tile's dq share dS K (times sm_scale) and the row sums by wgmma over both warpgroups'
    keys, a tile later (``_dq_share``), and stages them in fp32 (DQ_SLOTS slots per warpgroup); the writer adds
    those to fp32 accumulators by TMA reduce-adds (``_dq_write``). Each warpgroup sums its keys' columns of dS
    by wgmma over the head's tiles and writes them to DCOL (B, Tk, H) (``_bwd_tile``). dq_desc: over the
    (B*Tq, H*D) view of a zeroed fp32 (B, Tq, H, D) accumulator, blocks [BLOCK_M, D]; rs_desc: over (B*Tq, H*8)
    of a zeroed fp32 (B, Tq, H, 8), blocks [BLOCK_M, 8] (8 equal columns: the row sums). The adds' order varies
    from run to run, so dq and the row sums are not bitwise reproducible. Dense, or with ACP's HI table as in the
    dk/dv kernel (the loader and the writer follow the program's tiles, each warpgroup its own keys' and a zero
    dS^T for the rest: ``_zero_share``); HI and ACP's grid come last, after ``sm_scale``, so that the dense
    kernel compiles to the same SASS as without them (in the middle of the list they made ptxas schedule its
    tile loop differently: 0.8% slower at S2). The other arguments
    as in the dk/dv kernel, except that ``cq_desc`` is over z = PQ log2(e) - LSE, (B*H, svr) rows, and
    ``lse_desc`` is not read (z and delta from ``_bwd_fused_setup``)."""
    NUM_WG: gl.constexpr = 2
    KEYS: gl.constexpr = k_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [NUM_STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [NUM_STAGES] + do_desc.block_type.shape, do_desc.layout)
    cq_bufs = gl.allocate_shared_memory(gl.float32, [NUM_STAGES] + cq_desc.block_type.shape, cq_desc.layout)
    lse_bufs = cq_bufs  # (never read here: the loader brings z in cq_bufs instead of PQ and LSE)
    dl_bufs = gl.allocate_shared_memory(gl.float32, [NUM_STAGES] + cq_desc.block_type.shape, cq_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [NUM_WG] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [NUM_WG] + v_desc.block_type.shape, v_desc.layout)
    ds_bufs = gl.allocate_shared_memory(q_desc.dtype, [2 * NUM_WG, KEYS, BLOCK_M],
                                        gl.NVMMASharedLayout.get_default_for([KEYS, BLOCK_M], q_desc.dtype))
    ones_s = gl.allocate_shared_memory(q_desc.dtype, [NUM_WG, 8, NUM_WG * KEYS],
                                       gl.NVMMASharedLayout.get_default_for([8, NUM_WG * KEYS], q_desc.dtype))
    ones_q = gl.allocate_shared_memory(q_desc.dtype, [NUM_WG, 8, BLOCK_M],
                                       gl.NVMMASharedLayout.get_default_for([8, BLOCK_M], q_desc.dtype))
    dq_stage = gl.allocate_shared_memory(gl.float32, [DQ_SLOTS * NUM_WG] + dq_desc.block_type.shape, dq_desc.layout)
    rs_stage = gl.allocate_shared_memory(gl.float32, [DQ_SLOTS * NUM_WG] + rs_desc.block_type.shape, rs_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    do_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    st_full = gl.allocate_shared_memory(gl.int64, [DQ_SLOTS * NUM_WG, 1], mbarrier.MBarrierLayout())
    st_empty = gl.allocate_shared_memory(gl.int64, [DQ_SLOTS * NUM_WG, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(q_ready.index(s), count=1)
        mbarrier.init(do_ready.index(s), count=1)
        mbarrier.init(q_empty.index(s), count=NUM_WG)
        mbarrier.init(do_empty.index(s), count=NUM_WG)
    for s in gl.static_range(2):
        mbarrier.init(ds_full.index(s), count=NUM_WG)  # both warpgroups' halves stored
        mbarrier.init(ds_empty.index(s), count=1)  # the share's wgmma has read them
    for s in gl.static_range(DQ_SLOTS * NUM_WG):
        mbarrier.init(st_full.index(s), count=1)
        mbarrier.init(st_empty.index(s), count=1)
    args = (q_desc, do_desc, k_desc, v_desc, cq_desc, lse_desc, dl_desc, dq_desc, rs_desc, q_bufs, do_bufs, cq_bufs,
            lse_bufs, dl_bufs, k_smem, v_smem, ds_bufs, ones_s, ones_q, dq_stage, rs_stage, kv_bar, q_ready, do_ready,
            q_empty, do_empty, ds_full, ds_empty, st_full, st_empty, LF, PQ, DK, DV, DCOL, HI, slb, slt, slh, sdkb,
            sdkt, sdkh, spp, spr, svr, ACP_NK, ACP_GM, ACP_GN, H, GROUP, Tq, Tk, sm_scale)
    gl.warp_specialize([(_fused_compute_wg, args + (gl.to_tensor(0),)), (_fused_compute_wg, args + (gl.to_tensor(1),)),
                        (_fused_load, args), (_dq_write, args)], [4, 1, 1], [240, 24, 24])


# --------------------------------------------------------------------------------------------------------------
# backward: dq, the row sums of dS and delta (the mirror of the forward: one program per query block)
# --------------------------------------------------------------------------------------------------------------


@gluon.jit
def _dq_load(q_desc, do_desc, k_desc, v_desc, ck_desc, q_smem, do_smem, k_bufs, v_bufs, ck_bufs, q_bar, k_ready,
             v_ready, k_empty, v_empty, LO, spp, spr, ACP_NQ, ACP_GM, ACP_GN, H, GROUP, Tq, Tk,
             HAS_ACP: gl.constexpr):
    """Loader partition: each consumer warpgroup's Q and dO rows (one barrier), then K (with its PK row) and V
    of each key block (``_kv_ring_load``)."""
    NUM_WG: gl.constexpr = q_smem.type.shape[0]
    BLOCK_M: gl.constexpr = q_smem.type.shape[1]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    HEAD_DIM: gl.constexpr = k_bufs.type.shape[2]
    pid_bh = gl.program_id(0)
    pid_m = gl.num_programs(1) - 1 - gl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    lo_blk = _acp_lo_blk(LO, pid_bh, pid_m * NUM_WG * BLOCK_M, Tq, ACP_NQ, ACP_GM, ACP_GN, BLOCK_N, HAS_ACP)
    n_top, n_masked, n_total, E, n_um = _schedule(pid_m, Tq, Tk, lo_blk, NUM_WG * BLOCK_M, BLOCK_N)
    mbarrier.expect(q_bar, NUM_WG * (q_desc.block_type.nbytes + do_desc.block_type.nbytes))
    for w in gl.static_range(NUM_WG):
        row = b * Tq + (pid_m * NUM_WG + w) * BLOCK_M
        tma.async_copy_global_to_shared(q_desc, [row, h * HEAD_DIM], q_bar, q_smem.index(w))
        tma.async_copy_global_to_shared(do_desc, [row, h * HEAD_DIM], q_bar, do_smem.index(w))
    _kv_ring_load(k_desc, v_desc, ck_desc, k_bufs, v_bufs, ck_bufs, k_ready, v_ready, k_empty, v_empty,
                  b * Tk + n_top, (h // GROUP) * HEAD_DIM, _pk_row(pid_bh, spp, spr, BLOCK_N) + n_top, n_total)


@gluon.jit
def _dq_tile(dq, rowsum, g, tot_k, i, n_top, E, q_smem, do_smem, k_bufs, v_bufs, ck_bufs, k_ready, v_ready,
             k_empty, v_empty, PK_base, rql2, delta, pos_q, kstart, offs_n, qk_scale,
             s_layout: gl.constexpr, p_layout: gl.constexpr, CAUSAL: gl.constexpr, START: gl.constexpr):
    """One key block of ``triton.kernels._attn_bwd_dq_kernel``: S = Q K^T and dP = dO V^T by wgmma, P from the
    forward's log-sum-exp (in ``rql2``), dS = P (dP - delta), dq += dS K with dS as the register A operand."""
    NUM_STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_smem.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    st = i % NUM_STAGES
    ph = (i // NUM_STAGES) & 1
    n0 = n_top - i * BLOCK_N
    pos_k = n0 + offs_n
    tot_next = _block_total(PK_base, n0 - BLOCK_N, E, BLOCK_N)
    k_s = k_bufs.index(st)
    v_s = v_bufs.index(st)
    mbarrier.wait(k_ready.index(st), ph)
    s = warpgroup_mma(q_smem, k_s.permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
                      use_acc=False, is_async=True)
    ck = ck_bufs.index(st).load(gl.SliceLayout(0, s_layout))  # block-local cumsum of log f over the keys
    mbarrier.wait(v_ready.index(st), ph)
    dp = warpgroup_mma(do_smem, v_s.permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
                       use_acc=False, is_async=True)
    s, _, _ = warpgroup_mma_wait(1, deps=(s, q_smem, k_s))
    dk2 = ((tot_k - ck) + g) * LOG2E
    s = _mask_tile(s * qk_scale + (gl.expand_dims(dk2, 0) - gl.expand_dims(rql2, 1)), pos_k, pos_q, kstart, CAUSAL,
                   START)
    p = gl.exp2(s)
    dp, _, _ = warpgroup_mma_wait(0, deps=(dp, do_smem, v_s))
    mbarrier.arrive(v_empty.index(st), count=1)
    ds = p * (dp - gl.expand_dims(delta, 1))
    rowsum += gl.sum(ds, 1)
    ds16 = gl.convert_layout(ds.to(k_s.dtype), p_layout)
    dq = warpgroup_mma(ds16, k_s, dq, is_async=True)
    dq, _ = warpgroup_mma_wait(0, deps=(dq, k_s))
    mbarrier.arrive(k_empty.index(st), count=1)
    return dq, rowsum, g + tot_k, tot_next


@gluon.jit
def _dq_compute(q_smem, do_smem, k_bufs, v_bufs, ck_bufs, q_bar, k_ready, v_ready, k_empty, v_empty, LF, PK, O, LSE,
                DELTA, DQ, DROW, LO, slb, slt, slh, sqb, sqt, sqh, spp, spr, ACP_NQ, ACP_GM, ACP_GN, H, Tq, Tk,
                sm_scale,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, WG,
                NUM_WG: gl.constexpr, HAS_ACP: gl.constexpr):
    """One consumer warpgroup: the loop of ``triton.kernels._attn_bwd_dq_kernel`` for its rows (``q_smem`` /
    ``do_smem``), over the forward's key blocks in the forward's order. Also forms delta = rowsum(o * dO) for its
    rows (stored for the dk/dv kernel) and stores dq (times sm_scale) and the row sums of dS."""
    num_warps: gl.constexpr = 4
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // HEAD_DIM, HEAD_DIM // 8], [num_warps, 1],
                                                [1, 0])
    pid_bh = gl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    m_start = ((gl.num_programs(1) - 1 - gl.program_id(1)) * NUM_WG + WG) * BLOCK_M
    n_top, n_masked, n_clean, n_total, t_skip, t_end, E, offs_m, row_ok, pos_q, kstart, rq2, PK_base, offs_n = \
        _query_rows(LF, PK, LO, slb, slt, slh, spp, spr, ACP_NQ, ACP_GM, ACP_GN, H, Tq, Tk, BLOCK_M, BLOCK_N, WG,
                    NUM_WG, s_layout, HAS_ACP)
    qk_scale = sm_scale * LOG2E
    lse2 = gl.load(LSE + pid_bh.to(gl.int64) * Tq + offs_m, mask=row_ok, other=0.0)
    # delta = rowsum(o * dO) (O and DQ share q's contiguous strides; dO from shared memory)
    om = m_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
    od = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, out_layout))
    offs = b.to(gl.int64) * sqb + h.to(gl.int64) * sqh + gl.expand_dims(om, 1) * sqt + gl.expand_dims(od, 0)
    o = gl.load(O + offs, mask=gl.expand_dims(om < Tq, 1), other=0.0)
    mbarrier.wait(q_bar, 0)
    do = do_smem.load(out_layout)
    delta = gl.convert_layout(gl.sum(o.to(gl.float32) * do.to(gl.float32), 1), row_s)
    gl.store(DELTA + pid_bh.to(gl.int64) * Tq + offs_m, delta, mask=row_ok)

    dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    rowsum = gl.zeros([BLOCK_M], gl.float32, row_s)
    g = gl.sum(gl.zeros([BLOCK_N], gl.float32, gl.SliceLayout(0, s_layout)), 0)
    tot = _block_total(PK_base, n_top, E, BLOCK_N)
    rql2 = rq2 + lse2
    for i in range(0, t_skip):  # wholly after this warpgroup's rows
        g += tot
        tot = _block_total(PK_base, n_top - (i + 1) * BLOCK_N, E, BLOCK_N)
        _pass_stage(i, k_ready, k_empty, v_ready, v_empty)
    for i in range(t_skip, n_masked):
        dq, rowsum, g, tot = _dq_tile(dq, rowsum, g, tot, i, n_top, E, q_smem, do_smem, k_bufs, v_bufs, ck_bufs,
                                      k_ready, v_ready, k_empty, v_empty, PK_base, rql2, delta, pos_q, kstart,
                                      offs_n, qk_scale, s_layout, p_layout, True, HAS_ACP)
    for i in range(n_masked, n_masked + n_clean):
        dq, rowsum, g, tot = _dq_tile(dq, rowsum, g, tot, i, n_top, E, q_smem, do_smem, k_bufs, v_bufs, ck_bufs,
                                      k_ready, v_ready, k_empty, v_empty, PK_base, rql2, delta, pos_q, kstart,
                                      offs_n, qk_scale, s_layout, p_layout, False, False)
    if HAS_ACP:  # (compiled out of the dense kernel, where t_end = n_total)
        for i in range(n_masked + n_clean, t_end):
            dq, rowsum, g, tot = _dq_tile(dq, rowsum, g, tot, i, n_top, E, q_smem, do_smem, k_bufs, v_bufs,
                                          ck_bufs, k_ready, v_ready, k_empty, v_empty, PK_base, rql2, delta, pos_q,
                                          kstart, offs_n, qk_scale, s_layout, p_layout, False, True)
        for i in range(t_end, n_total):  # wholly before this warpgroup's rows' first kept keys
            _pass_stage(i, k_ready, k_empty, v_ready, v_empty)

    # DROW is (B, Tq, H) contiguous
    gl.store(DROW + (b.to(gl.int64) * Tq + offs_m) * H + h, rowsum, mask=row_ok)
    dq = gl.convert_layout((dq * sm_scale).to(DQ.dtype.element_ty), out_layout)
    gl.store(DQ + offs, dq, mask=gl.expand_dims(om < Tq, 1))


# The partitions below take the kernel's arguments (see the forward's: q_smem / do_smem are NUM_WG x BLOCK_M x D,
# ACP when LO is an int32 pointer, WG at run time).
@gluon.jit
def _dq_compute_wg(q_desc, do_desc, k_desc, v_desc, ck_desc, q_smem, do_smem, k_bufs, v_bufs, ck_bufs, q_bar,
                   k_ready, v_ready, k_empty, v_empty, LF, PK, O, LSE, DELTA, DQ, DROW, LO, slb, slt, slh, sqb, sqt,
                   sqh, spp, spr, ACP_NQ, ACP_GM, ACP_GN, H, GROUP, Tq, Tk, sm_scale, WG):
    _dq_compute(q_smem.index(WG), do_smem.index(WG), k_bufs, v_bufs, ck_bufs, q_bar, k_ready, v_ready, k_empty, v_empty,
                LF, PK, O, LSE, DELTA, DQ, DROW, LO, slb, slt, slh, sqb, sqt, sqh, spp, spr, ACP_NQ, ACP_GM, ACP_GN,
                H, Tq, Tk, sm_scale, q_smem.type.shape[1], k_bufs.type.shape[1], k_bufs.type.shape[2], WG,
                q_smem.type.shape[0], LO.dtype.element_ty == gl.int32)


@gluon.jit
def _dq_load_all(q_desc, do_desc, k_desc, v_desc, ck_desc, q_smem, do_smem, k_bufs, v_bufs, ck_bufs, q_bar,
                 k_ready, v_ready, k_empty, v_empty, LF, PK, O, LSE, DELTA, DQ, DROW, LO, slb, slt, slh, sqb, sqt,
                 sqh, spp, spr, ACP_NQ, ACP_GM, ACP_GN, H, GROUP, Tq, Tk, sm_scale):
    _dq_load(q_desc, do_desc, k_desc, v_desc, ck_desc, q_smem, do_smem, k_bufs, v_bufs, ck_bufs, q_bar, k_ready,
             v_ready, k_empty, v_empty, LO, spp, spr, ACP_NQ, ACP_GM, ACP_GN, H, GROUP, Tq, Tk,
             LO.dtype.element_ty == gl.int32)


@gluon.jit
def fox_bwd_dq_sm90_kernel(q_desc, do_desc, k_desc, v_desc, ck_desc, LF, PK, O, LSE, DELTA, DQ, DROW, LO, slb, slt, slh,
                           sqb, sqt, sqh, spp, spr, ACP_NQ, ACP_GM, ACP_GN, H, GROUP, Tq, Tk, sm_scale,
                           NUM_STAGES: gl.constexpr, NUM_WG: gl.constexpr):
    """grid (B*H, cdiv(Tq, NUM_WG*BLOCK_M)), heaviest query blocks first, num_warps=4: NUM_WG (2 or 3) consumer
    warpgroups of BLOCK_M rows each and a one-warp loader, as in ``fox_fwd_sm90_kernel``. q_desc / do_desc: TMA
    descriptors over the (B*Tq, H*D) views of contiguous q and dO, blocks [BLOCK_M, D]; k_desc / v_desc: over
    (B*Tk, Hkv*D), blocks [BLOCK_N, D]; ck_desc: 1-D over the flat PK, blocks [BLOCK_N]. O, DQ: contiguous like q
    (strides sqb, sqt, sqh); LSE / DELTA (B*H, Tq);
    DROW (B, Tq, H). Writes dq (times sm_scale), delta = rowsum(o * dO) and DROW, the row sums of dS. ACP as in
    the forward."""
    gl.static_assert(NUM_WG == 2 or NUM_WG == 3)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_WG] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [NUM_WG] + do_desc.block_type.shape, do_desc.layout)
    k_bufs, v_bufs, ck_bufs, k_ready, v_ready, k_empty, v_empty = _kv_ring(k_desc, v_desc, ck_desc, NUM_STAGES,
                                                                            NUM_WG)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    args = (q_desc, do_desc, k_desc, v_desc, ck_desc, q_smem, do_smem, k_bufs, v_bufs, ck_bufs, q_bar, k_ready,
            v_ready, k_empty, v_empty, LF, PK, O, LSE, DELTA, DQ, DROW, LO, slb, slt, slh, sqb, sqt, sqh, spp, spr,
            ACP_NQ, ACP_GM, ACP_GN, H, GROUP, Tq, Tk, sm_scale)
    if NUM_WG == 3:
        gl.warp_specialize([(_dq_compute_wg, args + (gl.to_tensor(0),)), (_dq_compute_wg, args + (gl.to_tensor(1),)),
                            (_dq_compute_wg, args + (gl.to_tensor(2),)), (_dq_load_all, args)],
                           [4, 4, 1], [160, 160, 24])
    else:
        gl.warp_specialize([(_dq_compute_wg, args + (gl.to_tensor(0),)), (_dq_compute_wg, args + (gl.to_tensor(1),)),
                            (_dq_load_all, args)],
                           [4, 1], [240, 24])
