"""Launchers of the Triton kernels (``kernels.py``): plain functions on tensors, any device with triton
(a CUDA GPU, or the CPU under ``TRITON_INTERPRET=1``).

Autotuned launches (``launch``) time the configs of ``tiles.AUTOTUNE_CONFIGS`` that fit the device's shared memory
(the others are pruned before any launch) once per shape class, then launch the pick directly, which saves the
autotuner's per-call Python (~45 us of host time per launch on the H200 machines). With autotuning off, or under
the interpreter, the config of ``tiles.fixed_config``.

    block_prefix   the block-local prefix sums of log f that the attention kernels read
    fwd            the forward: (o, lse)
    bwd_dq         the dq kernel: (dq, row sums of dS, delta)
    bwd_dkdv       the dk/dv kernel: (dk, dv, column sums of dS)
    bwd_dlogf      d log f from the row and column sums (and the one-kernel backward's dq rounding)
    acp_launch     ACP's threshold and (lo, hi) tables

``options`` (an ``AttentionOptions``) picks the tile configs (``launch``) and ACP's grid; ``acp_tables``
is None (dense) or ACP's (lo, hi) on that grid.
"""

from __future__ import annotations

import math

import torch

from ... import launch_cache
from .. import acp as _acp
from .. import tiles
from ...options import interpreting
from ..tiles import cdiv, next_pow2, padded_head_dim

_KERNELS = {}  # kind -> the autotuned jit function
_TUNED = {}  # (kind, tune key, meta) -> the autotuner's pick (a triton.Config)


def raw_kernel(kind):
    """The ``@triton.jit`` function of ``kind`` ("fwd", "dq" or "dkdv")."""
    from . import kernels as tk

    return {"fwd": tk._attn_fwd_kernel, "dq": tk._attn_bwd_dq_kernel, "dkdv": tk._attn_bwd_dkdv_kernel}[kind]


def tuned_kernel(kind):
    """``kind``'s kernel under ``triton.autotune`` over the configs that fit (``tiles.prune``)."""
    if kind not in _KERNELS:
        import triton

        configs = [triton.Config(c.meta(), num_warps=c.num_warps, num_stages=c.num_stages)
                   for c in tiles.AUTOTUNE_CONFIGS[kind]]
        _KERNELS[kind] = triton.autotune(
            configs=configs,
            key=["HEAD_DIM", "T_BUCKET", "GROUP", "HAS_START", "IEEE", "HAS_HI" if kind == "dkdv" else "HAS_LO"],
            prune_configs_by={"early_config_prune": tiles.prune(kind)},
        )(raw_kernel(kind))
    return _KERNELS[kind]


def autotuned(kind, options) -> bool:
    """Whether ``kind`` is autotuned under ``options`` (never under the interpreter, nor with a named config)."""
    return options.autotune and not interpreting() and options.triton_config(kind) is None


def launch(kind, options, grid_fn, tune_key, *args, **meta):
    """Launch ``kind`` on ``args`` (Q first). Autotuned: the autotuner runs once per (``tune_key`` = (device, T
    bucket, GROUP, dtype), ``meta``), at least as fine as its own key; later calls launch its pick. Else the
    config of ``tiles.fixed_config``."""
    q = args[0]
    if not autotuned(kind, options):
        cfg = tiles.fixed_config(kind, meta["BLOCK_D"], q.element_size(), q.device.index if q.is_cuda else None,
                                 options)
        launch_cache.launch(raw_kernel(kind), grid_fn(cfg.meta()), *args, **meta, **cfg.meta(),
                            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return
    key = (kind, tune_key, tuple(sorted(meta.items())))
    best = _TUNED.get(key)
    if best is None:
        tuned = tuned_kernel(kind)
        tuned[grid_fn](*args, **meta)
        _TUNED[key] = tuned.best_config
    else:
        launch_cache.launch(raw_kernel(kind), grid_fn(best.kwargs), *args, **meta, **best.all_kwargs())


def acp_args(acp_tables, grid, rows_only=False):
    """Kernel args (lo entries per (b, h), [hi entries per (b, h),] GM, GN); ``rows_only``: without hi."""
    if acp_tables is None:
        return (0, 1, 1) if rows_only else (0, 0, 1, 1)
    if grid is None:
        raise ValueError("ACP's tables need the grid (GM, GN) they were formed on")
    n = (acp_tables[0].shape[1], acp_tables[1].shape[1])
    grid = tuple(grid)
    return n[:1] + grid if rows_only else n + grid


def _tune_key(q, Tk, group):
    return q.device.index, next_pow2(Tk), group, q.dtype


ACP_MODES = {"tensor": 0, "float": 1, "weights": 2, "norms": 3}
ACP_NORM_CHUNKS = 1024  # at most this many programs per head for the max norms (tests lower it)
ACP_VEC = 32  # blocks per window of the tables' searches and walks (on an H200 32 beat 64 and 128)
ACP_CUMSUM_CHUNKS = 128  # at most this many chunks of positions per sequence for ACP's cumsum (tests lower it)


def acp_launch(q, k, lf, sm_scale, mode, grid, delta=None, thr_value=0.0, gamma_q=None, gamma_k=None,
               log_eps=0.0):
    """ACP's threshold and (lo, hi) tables on ``grid`` (GM, GN) in two or three launches, each parallel over
    (batch, head) and positions: for ``mode="norms"`` the partial max q / k norms (``_acp_norms_kernel``);
    chunk-local float64 cumsums of log f (``_acp_cumsum_kernel``); the threshold, lo and hi
    (``_acp_tables_kernel``). Returns (lo, hi, delta (B, H) fp32). ``acp.acp_threshold`` and
    ``acp._tables_torch`` are the PyTorch equivalents (tests compare them)."""
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    block_d = padded_head_dim(D)
    GM, GN = grid
    nq, nk = cdiv(Tq, GM), cdiv(Tk, GN)
    lo = torch.empty((B * H, nq), device=lf.device, dtype=torch.int32)
    hi = torch.empty((B * H, nk), device=lf.device, dtype=torch.int32)
    out = torch.empty((B, H), device=lf.device, dtype=torch.float32)
    from . import kernels as tk

    gq = gk = norms = out  # dummy pointers where unused
    sgq = sgk = 0
    gk_div, nch_norms = 1, 1
    if mode == "weights":
        gq, gk = gamma_q.contiguous(), gamma_k.contiguous()
        sgq, sgk = (D if g.dim() == 2 else 0 for g in (gq, gk))
        gk_div = H // Hkv if gk.dim() == 2 and gk.shape[0] == Hkv else 1
    elif mode == "norms":
        rows = 16 if interpreting() else 128
        nch_norms = max(1, min(cdiv(max(Tq, Tk), rows), ACP_NORM_CHUNKS))  # a program strides over its chunks
        norms = torch.empty((B * (H + Hkv), nch_norms), device=lf.device, dtype=torch.float32)
        key = ("acp_norms", q.shape, q.stride(), k.shape, k.stride(), q.dtype, k.dtype, nch_norms, rows,
               launch_cache.aligned(q, k))
        launch_cache.launch_keyed(key, tk._acp_norms_kernel, (B * (H + Hkv), nch_norms),
            q, k, norms, B, H, Hkv, Tq, Tk, *q.stride()[:3], *k.stride()[:3], nch_norms, HEAD_DIM=D, BLOCK_D=block_d,
            ROWS=rows, num_warps=4)
    # c = cumsum(log f) in chunks of P positions (a multiple of SUB), at most ACP_CUMSUM_CHUNKS of them, so that
    # the lo kernel adds the totals of the chunks before a position from one vector of registers
    hp = next_pow2(H)
    sub = max(1, (64 if interpreting() else 4096) // hp)
    p = sub * max(1, cdiv(cdiv(Tk, ACP_CUMSUM_CHUNKS), sub))
    nch = cdiv(Tk, p)
    c = torch.empty((B, Tk, H), device=lf.device, dtype=torch.float64)
    tot = torch.empty((B, max(nch, 1), H), device=lf.device, dtype=torch.float64)
    if B * nch > 0:
        key = ("acp_cumsum", lf.shape, lf.dtype, p, nch, sub, launch_cache.aligned(lf))
        launch_cache.launch_keyed(key, tk._acp_cumsum_kernel, (B, nch), lf, c, tot, H, Tk, p, nch, SUB=sub, HP=hp,
                                  num_warps=4)
    vec = 16 if interpreting() else ACP_VEC
    nwq = max(1, cdiv(nq, vec))  # (with no query blocks, one program writes the threshold)
    delta = out if delta is None else delta
    ints = (B, H, Hkv, H // Hkv, Tq, Tk, nq, nk, nwq, p, nch, sgq, sgk, gk_div, nch_norms, D)
    key = ("acp_tables", ints, mode, GM, GN, vec, delta.dtype, gq.dtype, gk.dtype, launch_cache.aligned(delta, gq, gk))
    launch_cache.launch_keyed(key, tk._acp_tables_kernel, (B * H, nwq + cdiv(nk, vec)),
        c, tot, delta, out, lo, hi, gq, gk, norms, *ints, float(thr_value), float(sm_scale), math.sqrt(D),
        math.log(max(Tk, 1)), float(log_eps), GM=GM, GN=GN, VEC=vec, NCHP=next_pow2(nch),
        MODE=ACP_MODES[mode], BLOCK_D=block_d, num_warps=4)
    return lo, hi, out


def acp_tables(lf, acp_delta, Tq, grid):
    """(lo, hi) on ``grid`` for a given (B, H) threshold tensor (``acp_launch`` without q and k)."""
    B, Tk, H = lf.shape
    q, k = lf.new_empty((B, Tq, H, 16)), lf.new_empty((B, Tk, H, 16))  # shapes only
    return acp_launch(q, k, lf, 1.0, "tensor", grid, delta=acp_delta.float().contiguous())[:2]


def block_prefix(lf, Tq, query_side=True, key_side=True):
    """(PK, PQ), each (4, B*H, TPAD) fp32: the prefix sums of log f within aligned blocks of 16 / 32 / 64 / 128
    over key positions (``key_side``; else PK is None) and over query rows (``query_side``; else PQ is None),
    which the kernels' inner loops read instead of forming a ``tl.cumsum`` per tile (one launch;
    ``_block_prefix_kernel``)."""
    assert query_side or key_side
    B, Tk, H = lf.shape
    tpad = cdiv(max(Tk, 1), 128) * 128
    pk = torch.empty((4, B * H, tpad), device=lf.device, dtype=torch.float32) if key_side else None
    pq = torch.empty((4, B * H, tpad), device=lf.device, dtype=torch.float32) if query_side else None
    p = pk if key_side else pq
    from . import kernels as tk

    key = ("block_prefix", lf.shape, lf.stride(), lf.dtype, Tq, query_side, key_side, launch_cache.aligned(lf))
    ints = launch_cache.static(key, lambda: (H, Tk, Tk - Tq, *p.stride()[:2], *lf.stride()))
    launch_cache.launch_keyed(key, tk._block_prefix_kernel, (B * H, tpad // 128), lf, p, pq if query_side else p,
                              *ints, CHUNK=128, QUERY_SIDE=query_side, KEY_SIDE=key_side)
    return pk, pq


def fwd(q, k, v, lf, kstart, sm_scale, options, acp_tables=None):
    """The forward: (o (B, Tq, H, D), lse (B, H, Tq) fp32, base 2)."""
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((B, H, Tq), device=q.device, dtype=torch.float32)
    if Tq == 0:
        return o, lse
    has_start = kstart is not None
    ks = kstart if has_start else lse  # dummy pointer when absent
    ks_strides = (kstart.stride(0), kstart.stride(1)) if has_start else (0, 0)
    block_d = padded_head_dim(D)
    lo = lse if acp_tables is None else acp_tables[0]
    pk, _ = block_prefix(lf, Tq, query_side=False)  # the dk/dv kernel's PQ is formed by the backward
    launch(
        "fwd", options, lambda META: (B * H, cdiv(Tq, META["BLOCK_M"])), _tune_key(q, Tk, H // Hkv),
        q, k, v, lf, pk, o, lse, ks, lo,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), lf.stride(0), lf.stride(1), lf.stride(2),
        o.stride(0), o.stride(1), o.stride(2), *ks_strides,
        H, H // Hkv, Tq, Tk, sm_scale, next_pow2(Tk),
        *acp_args(acp_tables, _acp.grid(D, options.acp_grid), rows_only=True), *pk.stride()[:2],
        HEAD_DIM=D, BLOCK_D=block_d, HAS_START=has_start, HAS_LO=acp_tables is not None,
        IEEE=q.dtype == torch.float32,
    )
    return o, lse


def bwd_dq(do, q, k, v, lf, pk, o, lse, kstart, sm_scale, options, acp_tables=None):
    """The dq kernel: (dq, row sums of dS (B, Tq, H) fp32, delta = rowsum(o * do) (B, H, Tq) fp32)."""
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    q, o = q.contiguous(), o.contiguous()  # the dq kernel indexes q, o and dq with one set of strides
    dq = torch.empty_like(q)
    delta = torch.empty((B, H, Tq), device=q.device, dtype=torch.float32)
    drow = torch.empty((B, Tq, H), device=q.device, dtype=torch.float32)
    has_start = kstart is not None
    ks = kstart if has_start else lse
    ks_strides = (kstart.stride(0), kstart.stride(1)) if has_start else (0, 0)
    block_d = padded_head_dim(D)
    lo = lse if acp_tables is None else acp_tables[0]
    launch(
        "dq", options, lambda META: (B * H, cdiv(Tq, META["BLOCK_M"])), _tune_key(q, Tk, H // Hkv),
        q, k, v, lf, pk, do, o, lse, delta, dq, drow, ks, lo,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), lf.stride(0), lf.stride(1), lf.stride(2),
        do.stride(0), do.stride(1), do.stride(2), *ks_strides,
        H, H // Hkv, Tq, Tk, sm_scale, next_pow2(Tk),
        *acp_args(acp_tables, _acp.grid(D, options.acp_grid), rows_only=True), *pk.stride()[:2],
        HAS_START=has_start, HAS_LO=acp_tables is not None, HEAD_DIM=D, BLOCK_D=block_d,
        IEEE=q.dtype == torch.float32,
    )
    return dq, drow, delta


def bwd_dkdv(do, q, k, v, lf, pq, lse, delta, kstart, kend, sm_scale, options, acp_tables=None):
    """The dk/dv kernel: (dk, dv, column sums of dS (B, Tk, H) fp32)."""
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    dcol = torch.empty((B, Tk, H), device=q.device, dtype=torch.float32)
    has_start = kstart is not None
    has_end = kend is not None
    ks = kstart if has_start else lse
    ke = kend if has_end else lse
    ks_strides = (kstart.stride(0), kstart.stride(1)) if has_start else (0, 0)
    ke_strides = (kend.stride(0), kend.stride(1)) if has_end else (0, 0)
    block_d = padded_head_dim(D)
    lo, hi = (lse, lse) if acp_tables is None else acp_tables
    launch(
        "dkdv", options, lambda META: (B * Hkv, cdiv(Tk, META["BLOCK_N"])), _tune_key(q, Tk, H // Hkv),
        q, k, v, lf, pq, do, lse, delta, dk, dv, dcol, ks, ke, lo, hi,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), lf.stride(0), lf.stride(1), lf.stride(2),
        do.stride(0), do.stride(1), do.stride(2), *ks_strides, *ke_strides,
        dk.stride(0), dk.stride(1), dk.stride(2),
        H, Hkv, Tq, Tk, sm_scale, next_pow2(Tk),
        *acp_args(acp_tables, _acp.grid(D, options.acp_grid)), *pq.stride()[:2],
        H // Hkv,
        HAS_START=has_start, HAS_END=has_end, HAS_HI=acp_tables is not None, HEAD_DIM=D, BLOCK_D=block_d,
        IEEE=q.dtype == torch.float32,
    )
    return dk, dv, dcol


DQ_ROUND_ROWS = 128  # rows of dq32 rounded per program of the d log f launch (32 KB at head dim 64)


def bwd_dlogf(drow, dcol, dq32=None, dq=None):
    """d c_t = (row sums of dS at query t) - (column sums of dS at key t); d log f = reverse cumsum of dc, in two
    launches over chunks of positions (``_dlogf_sums_kernel``: the chunks' float64 sums; ``_dlogf_kernel``: each
    chunk's local cumsum plus the sum of the chunks after it). dcol (B, Tk, H) contiguous; drow (B, Tq, H) with
    strides (Tq*H*s, H*s, s): contiguous, or a column of the one-kernel backward's (B, Tq, H, 8) row sums. With
    ``dq32`` (the one-kernel backward's fp32 accumulator, (B, Tq, H, D) contiguous) the second launch also
    rounds it into ``dq`` (same shape, q's dtype)."""
    B, Tq, H = drow.shape
    Tk = dcol.shape[1]
    sr = drow.stride(2)
    assert dcol.is_contiguous() and drow.stride()[:2] == (Tq * H * sr, H * sr), (drow.stride(), dcol.stride())
    chunk = 64 if interpreting() else 1024
    nch = cdiv(max(Tk, 1), chunk)
    sums = torch.empty((B * H, nch), device=dcol.device, dtype=torch.float64)
    dlf = torch.empty_like(dcol)
    from . import kernels as tk

    round_dq = dq32 is not None
    D = dq32.shape[-1] if round_dq else 16
    key = ("dlogf", drow.shape, sr, drow.dtype, dcol.shape, dcol.dtype, chunk, launch_cache.aligned(drow, dcol))
    launch_cache.launch_keyed(key, tk._dlogf_sums_kernel, (B * H, nch), drow, dcol, sums, H, Tq, Tk, nch, sr,
                              CHUNK=chunk)
    rows = min(chunk, DQ_ROUND_ROWS)  # dq rows rounded per program: CHUNK // rows programs per chunk
    dq32, dq = (dq32, dq) if round_dq else (dlf, dlf)
    key += (round_dq, D, rows, dq32.dtype, dq.dtype, launch_cache.aligned(dq32, dq))
    launch_cache.launch_keyed(key, tk._dlogf_kernel, (B * H, nch, chunk // rows if round_dq else 1),
        drow, dcol, sums, dlf, dq32, dq, H, Tq, Tk, nch, sr, CHUNK=chunk, VEC=16 if interpreting() else 128,
        ROUND_DQ=round_dq, HEAD_DIM=D, BLOCK_D=padded_head_dim(D), ROWS=rows)
    return dlf
