"""Public Forgetting Attention op: one function, dispatching on the device.

Layers (top to bottom of this file):
    1. configs / lazy kernel access (``triton_kernels.py`` holds the ``@triton.jit`` code; triton is imported
       only when a kernel is first launched, so importing this module needs no working triton);
    2. launchers ``_fwd_launch`` / ``_bwd_launch`` (plain functions on tensors);
    3. ``torch.library`` custom ops ``forgetting_transformer::fox_fwd`` / ``fox_bwd`` / ``fox_acp_tables`` with
       fake (meta) implementations and ``register_autograd``, so ``torch.compile`` traces the op without graph
       breaks; eager calls take ``_FoxEager`` (an ``autograd.Function`` over the same functions), which skips
       the custom ops' per-call dispatch cost;
    4. the public ``forgetting_attention``: CUDA bf16/fp16 tensors -> Triton kernel, CPU (and fp32) -> the
       PyTorch reference (``backend="triton"`` forces the kernel, e.g. on CPU under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import functools
import math
import os
from typing import Optional

import torch

from . import acp as _acp
from .reference import check_inputs, forgetting_attention_ref

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256

# --------------------------------------------------------------------------------------------------------------
# 1. configs and lazy kernel access
# --------------------------------------------------------------------------------------------------------------


@functools.cache
def _interpreting() -> bool:
    """TRITON_INTERPRET=1 (read once: it must be set before triton is imported anyway)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Block sizes used under the interpreter (one config: the interpreter cannot autotune). Tests may patch this
# dict to exercise other tilings. BLOCK_M != BLOCK_N on purpose (misaligned query/key blocks).
_INTERPRET_CONFIGS = {
    "fwd": dict(BLOCK_M=32, BLOCK_N=16),
    "dq": dict(BLOCK_M=16, BLOCK_N=32),
    "dkdv": dict(BLOCK_M=16, BLOCK_N=32),
}

_KERNELS = {}


def _gpu_configs(kind):
    import triton

    C = triton.Config
    # (BLOCK_M, BLOCK_N, num_warps, num_stages); the first of each list won on an H200 sweep at D=64 or D=128.
    if kind == "fwd":
        raw = [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 4, 4)]
    elif kind == "dq":
        raw = [(64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 4), (128, 32, 4, 3), (64, 32, 4, 2)]
    else:  # dkdv: BLOCK_M = queries per step, BLOCK_N = keys per program
        raw = [(64, 64, 4, 3), (64, 128, 8, 3), (32, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 4), (32, 64, 4, 2)]
    return [C(dict(BLOCK_M=m, BLOCK_N=n), num_warps=w, num_stages=s) for m, n, w, s in raw]


def _prune(kind):
    def prune(configs, named_args, **kwargs):
        D = kwargs.get("BLOCK_D", named_args.get("BLOCK_D"))
        out = []
        for c in configs:
            m, n = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
            if D >= 256 and (m * n > 64 * 64 or c.num_stages > 2):
                continue
            if D >= 128 and kind == "dkdv" and m * n > 64 * 128:
                continue
            out.append(c)
        return out or configs[-1:]

    return prune


def _autotune_enabled() -> bool:
    """Autotune on GPUs unless ``FOX_AUTOTUNE=0`` (then the heuristic config below is used; tests use this)."""
    return not _interpreting() and os.environ.get("FOX_AUTOTUNE", "1") != "0"


def _heuristic_config(kind, head_dim):
    """One config per kernel from the head dim alone (no per-GPU table): (BLOCK_M, BLOCK_N, warps, stages)."""
    if kind == "fwd":
        m, n, w, s = (128, 64, 4, 3) if head_dim <= 64 else (128, 128, 8, 3) if head_dim <= 128 else (64, 64, 4, 2)
    elif kind == "dq":
        m, n, w, s = (64, 64, 4, 3) if head_dim <= 64 else (128, 64, 8, 3) if head_dim <= 128 else (64, 32, 4, 2)
    else:
        m, n, w, s = (64, 64, 4, 3) if head_dim <= 64 else (64, 128, 8, 3) if head_dim <= 128 else (32, 64, 4, 2)
    return dict(BLOCK_M=m, BLOCK_N=n), w, s


def _kernel(kind):
    """The jit kernel for ``kind`` (autotuned on a GPU, plain under the interpreter)."""
    key = (kind, _autotune_enabled())
    if key not in _KERNELS:
        fn = _raw_kernel(kind)
        if _autotune_enabled():
            import triton

            fn = triton.autotune(
                configs=_gpu_configs(kind),
                key=["HEAD_DIM", "T_BUCKET", "GROUP", "HAS_START", "IEEE", "HAS_HI" if kind == "dkdv" else "HAS_LO"],
                prune_configs_by={"early_config_prune": _prune(kind)},
            )(fn)
        _KERNELS[key] = fn
    return _KERNELS[key]


# kind -> (meta dict, num_warps, num_stages): forces one config (launchers.triton_config; the config sweep).
_FORCE_CONFIGS = {}


def _raw_kernel(kind):
    from . import triton_kernels as tk

    return {"fwd": tk._attn_fwd_kernel, "dq": tk._attn_bwd_dq_kernel, "dkdv": tk._attn_bwd_dkdv_kernel}[kind]


def _fixed_config(kind, block_d):
    """The (meta, warps, stages) used when autotuning is off (and the tiles that set ACP's grid)."""
    if _interpreting():
        return _INTERPRET_CONFIGS[kind], 4, 1
    if kind in _FORCE_CONFIGS:
        return _FORCE_CONFIGS[kind]
    return _heuristic_config(kind, block_d)


_ACP_GRID_OVERRIDE = None  # tests only


def _acp_grid(block_d):
    """ACP's grid (GM, GN): the smallest BLOCK_M / BLOCK_N of the three kernels' default configs. The pruned
    region is defined on it; kernels with larger (or autotuned) tiles mask the straddling elements."""
    if _ACP_GRID_OVERRIDE is not None:
        return _ACP_GRID_OVERRIDE
    cfgs = [_fixed_config(kind, block_d)[0] for kind in ("fwd", "dq", "dkdv")]
    return min(c["BLOCK_M"] for c in cfgs), min(c["BLOCK_N"] for c in cfgs)


def _acp_args(acp_tables, block_d, rows_only=False):
    """Kernel args (lo entries per (b, h), [hi entries per (b, h),] GM, GN); ``rows_only``: without hi."""
    n = (0, 0) if acp_tables is None else (acp_tables[0].shape[1], acp_tables[1].shape[1])
    grid = (1, 1) if acp_tables is None else _acp_grid(block_d)
    return n[:1] + grid if rows_only else n + grid


_ACP_MODES = {"tensor": 0, "float": 1, "weights": 2, "norms": 3}
_ACP_NORM_CHUNKS = 1024  # at most this many programs per head for the max norms (tests lower it)
_ACP_VEC = 32  # blocks per window of the tables' searches and walks (on an H200 32 beat 64 and 128)
_ACP_CUMSUM_CHUNKS = 128  # at most this many chunks of positions per sequence for ACP's cumsum (tests lower it)


def _acp_launch(q, k, lf, sm_scale, mode, delta=None, thr_value=0.0, gamma_q=None, gamma_k=None, log_eps=0.0):
    """ACP's threshold and (lo, hi) tables on ACP's grid in three or four launches, each parallel over (batch,
    head) and positions: for ``mode="norms"`` the partial max q / k norms (``_acp_norms_kernel``); chunk-local
    float64 cumsums of log f (``_acp_cumsum_kernel``); the threshold and lo (``_acp_lo_kernel``); hi from lo
    (``_acp_hi_kernel``). Returns (lo, hi, delta (B, H) fp32). ``acp.acp_threshold`` and ``acp._tables_torch``
    are the PyTorch equivalents (tests compare them)."""
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    block_d = max(16, _next_pow2(D))
    GM, GN = _acp_grid(block_d)
    nq, nk = _cdiv(Tq, GM), _cdiv(Tk, GN)
    lo = torch.empty((B * H, nq), device=lf.device, dtype=torch.int32)
    hi = torch.empty((B * H, nk), device=lf.device, dtype=torch.int32)
    out = torch.empty((B, H), device=lf.device, dtype=torch.float32)
    from . import triton_kernels as tk

    gq = gk = norms = out  # dummy pointers where unused
    sgq = sgk = 0
    gk_div, nch_norms = 1, 1
    if mode == "weights":
        gq, gk = gamma_q.contiguous(), gamma_k.contiguous()
        sgq, sgk = (D if g.dim() == 2 else 0 for g in (gq, gk))
        gk_div = H // Hkv if gk.dim() == 2 and gk.shape[0] == Hkv else 1
    elif mode == "norms":
        rows = 16 if _interpreting() else 128
        nch_norms = max(1, min(_cdiv(max(Tq, Tk), rows), _ACP_NORM_CHUNKS))  # a program strides over its chunks
        norms = torch.empty((B * (H + Hkv), nch_norms), device=lf.device, dtype=torch.float32)
        tk._acp_norms_kernel[(B * (H + Hkv), nch_norms)](
            q, k, norms, B, H, Hkv, Tq, Tk, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
            k.stride(2), nch_norms, HEAD_DIM=D, BLOCK_D=block_d, ROWS=rows, num_warps=4)
    # c = cumsum(log f) in chunks of P positions (a multiple of SUB), at most _ACP_CUMSUM_CHUNKS of them, so that
    # the lo kernel adds the totals of the chunks before a position from one vector of registers
    hp = _next_pow2(H)
    sub = max(1, (64 if _interpreting() else 4096) // hp)
    p = sub * max(1, _cdiv(_cdiv(Tk, _ACP_CUMSUM_CHUNKS), sub))
    nch = _cdiv(Tk, p)
    c = torch.empty((B, Tk, H), device=lf.device, dtype=torch.float64)
    tot = torch.empty((B, max(nch, 1), H), device=lf.device, dtype=torch.float64)
    if B * nch > 0:
        tk._acp_cumsum_kernel[(B, nch)](lf, c, tot, H, Tk, p, nch, SUB=sub, HP=hp, num_warps=4)
    vec = 16 if _interpreting() else _ACP_VEC
    tk._acp_lo_kernel[(B * H, max(1, _cdiv(nq, vec)))](  # (with no query blocks: the threshold only)
        c, tot, out if delta is None else delta, out, lo, gq, gk, norms, B, H, Hkv, H // Hkv, Tq, Tk, nq, nk, p,
        nch, sgq, sgk, gk_div, nch_norms, D, float(thr_value), float(sm_scale), math.sqrt(D),
        math.log(max(Tk, 1)), float(log_eps), GM=GM, GN=GN, VEC=vec, NCHP=_next_pow2(nch),
        MODE=_ACP_MODES[mode], BLOCK_D=block_d, num_warps=4)
    if nk > 0:
        tk._acp_hi_kernel[(B * H, _cdiv(nk, vec))](lo, hi, nq, nk, VEC=vec, num_warps=4)
    return lo, hi, out


def _acp_tables(lf, acp_delta, Tq, block_d):
    """(lo, hi) on ACP's grid for a given (B, H) threshold tensor (tests; the op goes through ``fox_acp_tables``)."""
    B, Tk, H = lf.shape
    q, k = lf.new_empty((B, Tq, H, block_d)), lf.new_empty((B, Tk, H, block_d))  # shapes only
    return _acp_launch(q, k, lf, 1.0, "tensor", delta=acp_delta.float().contiguous())[:2]


_TUNED = {}  # (kind, tune key, meta) -> the autotuner's pick


def _launch(kind, grid_fn, tune_key, *args, **meta):
    """Launch ``kind`` on ``args``. Autotuned on a GPU: the autotuner runs once per (``tune_key`` = (T bucket,
    GROUP, dtype), meta), which is at least as fine as its own key; later calls launch its pick directly, which
    saves the autotuner's per-call Python (~45 us of host time per launch on the H200 machines)."""
    if _interpreting() or kind in _FORCE_CONFIGS or not _autotune_enabled():
        cfg, w, s = _fixed_config(kind, meta["BLOCK_D"])
        _raw_kernel(kind)[grid_fn(cfg)](*args, **meta, **cfg, num_warps=w, num_stages=s)
        return
    key = (kind, tune_key, tuple(sorted(meta.items())))
    best = _TUNED.get(key)
    if best is None:
        tuned = _kernel(kind)
        tuned[grid_fn](*args, **meta)
        _TUNED[key] = tuned.best_config
    else:
        _raw_kernel(kind)[grid_fn(best.kwargs)](*args, **meta, **best.all_kwargs())


def _next_pow2(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


# --------------------------------------------------------------------------------------------------------------
# 2. launchers
# --------------------------------------------------------------------------------------------------------------


def _cdiv(a, b):
    return (a + b - 1) // b


def _block_prefix(lf, Tq, query_side=True, key_side=True):
    """(PK, PQ), each (4, B*H, TPAD) fp32: the prefix sums of log f within aligned blocks of 16 / 32 / 64 / 128
    over key positions (``key_side``; else PK is None) and over query rows (``query_side``; else PQ is None),
    which the kernels' inner loops read instead of forming a ``tl.cumsum`` per tile (one launch;
    ``_block_prefix_kernel``)."""
    assert query_side or key_side
    B, Tk, H = lf.shape
    tpad = _cdiv(max(Tk, 1), 128) * 128
    pk = torch.empty((4, B * H, tpad), device=lf.device, dtype=torch.float32) if key_side else None
    pq = torch.empty((4, B * H, tpad), device=lf.device, dtype=torch.float32) if query_side else None
    p = pk if key_side else pq
    from . import triton_kernels as tk

    tk._block_prefix_kernel[(B * H, tpad // 128)](lf, p, pq if query_side else p, H, Tk, Tk - Tq, *p.stride()[:2],
                                                   lf.stride(0), lf.stride(1), lf.stride(2), CHUNK=128,
                                                   QUERY_SIDE=query_side, KEY_SIDE=key_side)
    return pk, pq


def _fwd_launch(q, k, v, lf, kstart, sm_scale, acp_tables=None):
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((B, H, Tq), device=q.device, dtype=torch.float32)
    if Tq == 0:
        return o, lse
    has_start = kstart is not None
    ks = kstart if has_start else lse  # dummy pointer when absent
    ks_strides = (kstart.stride(0), kstart.stride(1)) if has_start else (0, 0)
    block_d = max(16, _next_pow2(D))
    lo = lse if acp_tables is None else acp_tables[0]
    pk, _ = _block_prefix(lf, Tq, query_side=False)  # the dk/dv kernel's PQ is formed by the backward
    _launch(
        "fwd", lambda META: (B * H, _cdiv(Tq, META["BLOCK_M"])), (_next_pow2(Tk), H // Hkv, q.dtype),
        q, k, v, lf, pk, o, lse, ks, lo,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), lf.stride(0), lf.stride(1), lf.stride(2),
        o.stride(0), o.stride(1), o.stride(2), *ks_strides,
        H, H // Hkv, Tq, Tk, sm_scale, _next_pow2(Tk),
        *_acp_args(acp_tables, block_d, rows_only=True), *pk.stride()[:2],
        HEAD_DIM=D, BLOCK_D=block_d, HAS_START=has_start, HAS_LO=acp_tables is not None,
        IEEE=q.dtype == torch.float32,
    )
    return o, lse


# (rows per consumer warpgroup, BLOCK_N, NUM_STAGES, consumer warpgroups) of the Gluon sm90 forward per head dim;
# it runs at every head dim listed (three warpgroups at 64: 192 query rows share each K/V stage). Per-config
# timings: python -m benchmarks.attention.sweep fwd
_SM90_CONFIGS = {64: (64, 128, 3, 3), 128: (64, 128, 2, 2)}


def _sm90_maxnreg(num_warps):
    """Registers per thread at launch so that the compute warps plus the loader's warpgroup fill the 64K register
    file (8 + 4 warps: 168; 12 + 4: 128); ``setmaxnreg`` then moves the loader's share to the compute warps (240
    each for two consumer warpgroups, 160 for three)."""
    return min(255, 65536 // ((num_warps + 4) * 32) // 8 * 8)


# (BLOCK_M query rows per tile, keys per consumer warpgroup, NUM_STAGES, consumer warpgroups) of the Gluon sm90
# dk/dv backward per head dim, the fastest at S1..S4 on an H200; it runs at every head dim listed. 64-row tiles at
# head dim 64 too: the query tile's vectors are read under the score matmul, and 128-row tiles spill with that.
# Per-config timings: python -m benchmarks.attention.sweep dkdv
_SM90_BWD_CONFIGS = {64: (64, 64, 2, 2), 128: (64, 64, 2, 2)}


@functools.lru_cache(maxsize=None)
def _capability(device_index):
    """(major, minor) of a CUDA device, cached: ``torch.cuda.get_device_capability`` costs ~8 us of host time and
    every Gluon call asks three times."""
    return torch.cuda.get_device_capability(device_index)


def _use_sm90(q, k, v, head_dims=_SM90_CONFIGS, *more):
    """Whether a causal pass without documents or padding (checked by the caller; dense or with ACP) runs a Gluon
    kernel: a Hopper GPU (compute capability 9.x), 16-bit inputs, a head dim in ``head_dims``, TMA's 16-byte-aligned
    bases (of q, k, v and ``more``), and ``FOX_GLUON`` not "0". The Gluon and Triton kernels compute the same
    outputs (tested)."""
    return (q.is_cuda and not _interpreting() and os.environ.get("FOX_GLUON", "1") != "0"
            and q.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] in head_dims
            and all(t.data_ptr() % 16 == 0 for t in (q, k, v, *more))
            and _capability(q.device.index if q.device.index is not None else torch.cuda.current_device())[0] == 9)


@functools.lru_cache(maxsize=None)
def _smem_layout(block, dtype):
    """The default NVMMA shared-memory layout of a TMA block (a tuple of dims) of ``dtype``; cached, since
    forming it costs ~15 us of host time and the Gluon launchers build up to 7 descriptors per call."""
    from triton.experimental.gluon import language as gl

    gdt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[dtype]
    return gl.NVMMASharedLayout.get_default_for(list(block), gdt)


@functools.lru_cache(maxsize=None)
def _desc_template(block, dtype):
    """A TMA descriptor of blocks ``block`` (a tuple) and ``dtype``, over a small CPU tensor, checked by the
    descriptor's constructor (layout, block shape, dtype)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    strides = [math.prod(block[i + 1:]) for i in range(len(block))]
    return TensorDescriptor(torch.empty(block, dtype=dtype), list(block), strides, list(block),
                            _smem_layout(block, dtype))


def _desc(base, shape, strides, block):
    """The descriptor of ``_desc_template(block, base.dtype)`` over ``base`` with ``shape`` and ``strides`` (row-major
    elements). The constructor's checks of those (16-byte aligned base and strides, positive shape) are the
    launchers' to keep: redone per descriptor they cost ~5 us of host time, and a forward + backward builds 16.
    The base's alignment is checked here (one cheap test; a misaligned base would make the TMA copies fault)."""
    if base.data_ptr() % 16:
        raise ValueError(f"TMA descriptor base must be 16-byte aligned; got address {base.data_ptr():#x}")
    tpl = _desc_template(block, base.dtype)
    d = object.__new__(type(tpl))
    d.__dict__.update(tpl.__dict__)
    d.base, d.shape, d.strides = base, shape, strides
    return d


def _tma_desc(t, block):
    """TMA descriptor over the (B*T, heads*D) view of a contiguous (B, T, heads, D) tensor, blocks of [block, D]
    (the Gluon kernels' 16-bit Q / K / V / dO tiles; the one-kernel backward's fp32 accumulators). heads * D is a
    multiple of 8 at the Gluon head dims, so the row stride is 16-byte aligned."""
    B, T, heads, D = t.shape
    return _desc(t, [B * T, heads * D], [heads * D, 1], (block, D))


def _tma_vec(t, block):
    """1-D TMA descriptor over the flat fp32 contiguous ``t`` (at least ``block`` long), blocks of ``block``: the
    Gluon kernels' rows of PK / PQ (``_block_prefix``), LSE and delta."""
    return _desc(t, [t.numel()], [1], (block,))


def _fwd_launch_sm90(q, k, v, lf, sm_scale, config=None, acp_tables=None):
    """The causal forward (dense, or with ACP's ``acp_tables``) by the warp-specialised Gluon kernel
    (``gluon_kernels``; Hopper only): the same (o, lse) as ``_fwd_launch``."""
    from . import gluon_kernels as gk

    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    bm, bn, stages, wgs = config or _SM90_CONFIGS[D]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.empty_like(q)
    lse = torch.empty((B, H, Tq), device=q.device, dtype=torch.float32)
    if Tq == 0:
        return o, lse
    pk, _ = _block_prefix(lf, Tq, query_side=False)
    lo = lse if acp_tables is None else acp_tables[0]  # the kernel reads ACP from LO's dtype (int32: a table)
    gk.fox_fwd_sm90_kernel[(B * H, _cdiv(Tq, wgs * bm))](
        _tma_desc(q, bm), _tma_desc(k, bn), _tma_desc(v, bn), _tma_vec(pk, bn), lf, pk, o, lse, lo,
        lf.stride(0), lf.stride(1), lf.stride(2), o.stride(0), o.stride(1), o.stride(2), *pk.stride()[:2],
        *_acp_args(acp_tables, max(16, _next_pow2(D)), rows_only=True), H, H // Hkv, Tq, Tk, sm_scale,
        BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, NUM_STAGES=stages, NUM_WG=wgs,
        num_warps=4, maxnreg=_sm90_maxnreg(4 * wgs))
    return o, lse


# (rows per consumer warpgroup, BLOCK_N, NUM_STAGES, consumer warpgroups) of the Gluon sm90 dq backward per head
# dim, the fastest at S1..S4 on an H200 (three warpgroups at head dim 64; two at 128, which spill with three).
# Per-config timings: python -m benchmarks.attention.sweep dq
_SM90_DQ_CONFIGS = {64: (64, 64, 4, 3), 128: (64, 64, 2, 2)}


def _bwd_dq_sm90(do, q, k, v, lf, pk, o, lse, sm_scale, config=None, acp_tables=None):
    """The dq backward (dense, or with ACP's ``acp_tables``) by the warp-specialised Gluon kernel
    (``gluon_kernels``; Hopper only): the same (dq, drow, delta) as ``_bwd_dq``."""
    from . import gluon_kernels as gk

    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    bm, bn, stages, wgs = config or _SM90_DQ_CONFIGS[D]
    q, k, v, do, o = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous(), o.contiguous()
    dq = torch.empty_like(q)
    delta = torch.empty((B, H, Tq), device=q.device, dtype=torch.float32)
    drow = torch.empty((B, Tq, H), device=q.device, dtype=torch.float32)
    lo = lse if acp_tables is None else acp_tables[0]  # the kernel reads ACP from LO's dtype (int32: a table)
    gk.fox_bwd_dq_sm90_kernel[(B * H, _cdiv(Tq, wgs * bm))](
        _tma_desc(q, bm), _tma_desc(do, bm), _tma_desc(k, bn), _tma_desc(v, bn), _tma_vec(pk, bn), lf, pk, o, lse,
        delta, dq,
        drow, lo, lf.stride(0), lf.stride(1), lf.stride(2), q.stride(0), q.stride(1), q.stride(2), *pk.stride()[:2],
        *_acp_args(acp_tables, max(16, _next_pow2(D)), rows_only=True), H, H // Hkv, Tq, Tk, sm_scale,
        NUM_STAGES=stages, NUM_WG=wgs, num_warps=4, maxnreg=_sm90_maxnreg(4 * wgs))
    return dq, drow, delta


def _query_vec(t, rows=None, block=64):
    """1-D TMA descriptor over a flat fp32 buffer, blocks of ``block`` (a query tile's rows; the dk/dv kernels'
    PQ, LSE and delta): with ``rows``, the (B*H, Tq) ``t`` with its rows padded to ``rows`` entries; a buffer
    shorter than a block padded with zeros (rows past Tq are masked)."""
    if rows is not None and rows != t.shape[-1]:
        t = torch.nn.functional.pad(t.reshape(-1, t.shape[-1]), (0, rows - t.shape[-1]))
    t = t.reshape(-1)
    if t.numel() < block:
        t = torch.nn.functional.pad(t, (0, block - t.numel()))
    return _tma_vec(t, block)


def _bwd_dkdv_sm90(do, q, k, v, lf, pq, lse, delta, sm_scale, config=None, acp_tables=None):
    """The dk/dv backward (dense, or with ACP's ``acp_tables``) by the warp-specialised Gluon kernel
    (``gluon_kernels``; Hopper only): the same (dk, dv, dcol) as ``_bwd_dkdv``."""
    from . import gluon_kernels as gk

    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    bm, keys, stages, wgs = config or _SM90_BWD_CONFIGS[D]
    q, k, v, do = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous()
    svr = _cdiv(Tq, 4) * 4  # a TMA copy starts at a 16-byte boundary: rows of LSE and delta padded to 4 floats
    vec = functools.partial(_query_vec, rows=svr, block=bm)

    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    dcol = torch.empty((B, Tk, H), device=q.device, dtype=torch.float32)
    gk.fox_bwd_dkdv_sm90_kernel[(B * Hkv, _cdiv(Tk, wgs * keys))](
        _tma_desc(q, bm), _tma_desc(do, bm), _tma_desc(k, keys), _tma_desc(v, keys),
        vec(pq, rows=None), vec(lse), vec(delta), lf, pq, dk, dv, dcol,
        dcol if acp_tables is None else acp_tables[1],  # the kernel reads ACP from HI's dtype (int32: a table)
        lf.stride(0), lf.stride(1), lf.stride(2), dk.stride(0), dk.stride(1), dk.stride(2), *pq.stride()[:2], svr,
        *_acp_args(acp_tables, max(16, _next_pow2(D)))[1:], H, H // Hkv, Tq, Tk, sm_scale,
        NUM_STAGES=stages, NUM_WG=wgs, num_warps=4, maxnreg=_sm90_maxnreg(4 * wgs))
    return dk, dv, dcol


# (BLOCK_M, keys per consumer warpgroup, NUM_STAGES, staging slots per consumer warpgroup) of the one-kernel Gluon
# backward per head dim (two consumer warpgroups; two stages were faster than three at S1, S2 and the 760M model's
# shape: python -m benchmarks.attention.sweep fused); the op runs it at the head dims listed unless deterministic
# algorithms are asked for. Not at 128: with the dS and staging buffers two stages need 258 KB of shared memory
# (sm90 allows 227), and one stage spills (python -m benchmarks.attention.compile_kernels, compile_gluon_fused)
_SM90_FUSED_CONFIGS = {64: (64, 64, 2, 1)}


def _use_fused_bwd(q, k, v, do, o):
    """Whether a causal backward without documents or padding (dense or with ACP's tables) runs as one Gluon kernel
    (dk/dv with dq and the row sums of dS by TMA reduce-adds; ``_bwd_fused_sm90``): where ``_use_sm90`` holds for
    ``_SM90_FUSED_CONFIGS``, unless ``torch.use_deterministic_algorithms`` is on or ``FOX_FUSED_BWD`` is "0" (then
    the dq and dk/dv kernels run, which are bitwise reproducible)."""
    return (os.environ.get("FOX_FUSED_BWD", "1") != "0" and not torch.are_deterministic_algorithms_enabled()
            and _use_sm90(q, k, v, _SM90_FUSED_CONFIGS, do, o))


def _bwd_fused_setup(o, do, lf, lse, block_m):
    """The one-kernel backward's set-up in one launch (``_bwd_fused_setup_kernel``; o and dO contiguous, same
    shape (B, Tq, H, D); lf (B, Tk, H); lse (B, H, Tq) from the forward; query tiles of ``block_m`` rows):
    delta = rowsum(o * dO), (B, H, Tq) fp32; pq, the block-local prefix sums of log f over the query rows in
    blocks of ``block_m`` (``_block_prefix``'s plane for them), (B*H, Tq rounded up to block_m) fp32; z = pq *
    log2(e) - lse, the query side of each tile's scores, (B*H, SVR) fp32 with rows padded to SVR = Tq rounded up
    to 4 (a TMA copy starts at a 16-byte boundary; the padding is not written); and the zeroed fp32 accumulators
    of the kernel's reduce-adds, for dq (B, Tq, H, D) and for the row sums of dS (B, Tq, H, 8)."""
    from . import triton_kernels as tk

    B, Tq, H, D = o.shape
    svr = _cdiv(Tq, 4) * 4
    delta = torch.empty((B, H, Tq), device=o.device, dtype=torch.float32)
    pq = torch.empty((B * H, _cdiv(Tq, block_m) * block_m), device=o.device, dtype=torch.float32)
    z = torch.empty((B * H, svr), device=o.device, dtype=torch.float32)
    dq32 = torch.empty((B, Tq, H, D), device=o.device, dtype=torch.float32)
    rs8 = torch.empty((B, Tq, H, 8), device=o.device, dtype=torch.float32)
    tk._bwd_fused_setup_kernel[(B * H, _cdiv(Tq, block_m))](
        o, do, delta, dq32, rs8, lf, pq, lse, z, H, Tq, lf.shape[1], o.stride(0), o.stride(1), o.stride(2),
        lf.stride(0), lf.stride(1), lf.stride(2), pq.stride(0), svr, HEAD_DIM=D, BLOCK_D=max(16, _next_pow2(D)),
        ROWS=block_m)
    return delta, pq, z, dq32, rs8


def _bwd_fused_sm90(do, q, k, v, lf, o, lse, sm_scale, config=None, acp_tables=None, round_dq=True):
    """The dense causal backward as one warp-specialised Gluon kernel
    (``gluon_kernels.fox_bwd_fused_sm90_kernel``; Hopper only): (dq, dk, dv, drow, dcol) as ``_bwd_dq`` and
    ``_bwd_dkdv`` give them (dense, or with ACP's ``acp_tables``), dq the fp32 accumulator of the kernel's
    reduce-adds rounded once to q's dtype (``round_dq=False``: left in fp32, for ``_bwd_dlogf`` to round in its
    launch), drow and dcol the sums of the 16-bit dS (not bitwise reproducible: the adds' order varies)."""
    from . import gluon_kernels as gk

    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    bm, keys, stages, slots = config or _SM90_FUSED_CONFIGS[D]
    q, k, v, do, o = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous(), o.contiguous()
    delta, pq, z, dq32, rs8 = _bwd_fused_setup(o, do, lf, lse, bm)
    svr = z.shape[1]  # a TMA copy starts at a 16-byte boundary: rows of z and delta padded to 4 floats
    vec = functools.partial(_query_vec, rows=svr, block=bm)
    zd = vec(z, rows=None)  # (the kernel reads z in place of PQ and LSE)

    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    dcol = torch.empty((B, Tk, H), device=q.device, dtype=torch.float32)
    gk.fox_bwd_fused_sm90_kernel[(B * Hkv, _cdiv(Tk, 2 * keys))](
        _tma_desc(q, bm), _tma_desc(do, bm), _tma_desc(k, keys), _tma_desc(v, keys), zd, zd,
        vec(delta), _tma_desc(dq32, bm), _tma_desc(rs8, bm), lf, pq, dk, dv, dcol,  # (pq: one plane, stride 0)
        lf.stride(0), lf.stride(1), lf.stride(2), dk.stride(0), dk.stride(1), dk.stride(2), 0, pq.stride(0), svr,
        H, H // Hkv, Tq, Tk, sm_scale,
        dcol if acp_tables is None else acp_tables[1],  # the kernel reads ACP from HI's dtype (int32: a table)
        *_acp_args(acp_tables, max(16, _next_pow2(D)))[1:], NUM_STAGES=stages, DQ_SLOTS=slots, num_warps=4,
        maxnreg=_sm90_maxnreg(8))
    # (drow: a strided view, which _bwd_dlogf reads; dq32 rounded by the caller, or by _bwd_dlogf with d log f)
    return (dq32.to(q.dtype) if round_dq else dq32), dk, dv, rs8[..., 0], dcol


def _bwd_launch(do, q, k, v, lf, o, lse, kstart, kend, sm_scale, acp_tables=None):
    B, Tq, H, D = q.shape
    if Tq == 0:
        return torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v), torch.zeros_like(lf)
    do = do.contiguous()
    o = o.contiguous()
    if kstart is None and kend is None and _use_fused_bwd(q, k, v, do, o):
        dq32, dk, dv, drow, dcol = _bwd_fused_sm90(do, q, k, v, lf, o, lse, sm_scale, acp_tables=acp_tables,
                                                   round_dq=False)
        dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)  # (rounded from dq32 by the d log f launch)
        return dq, dk, dv, _bwd_dlogf(drow, dcol, dq32, dq)
    pk, pq = _block_prefix(lf, Tq)
    # the dq kernel also computes delta = rowsum(o * do) for the dk/dv kernel
    if kstart is None and _use_sm90(q, k, v, _SM90_DQ_CONFIGS, do, o):
        dq, drow, delta = _bwd_dq_sm90(do, q, k, v, lf, pk, o, lse, sm_scale, acp_tables=acp_tables)
    else:
        dq, drow, delta = _bwd_dq(do, q, k, v, lf, pk, o, lse, kstart, sm_scale, acp_tables)
    if kstart is None and kend is None and _use_sm90(q, k, v, _SM90_BWD_CONFIGS, do):
        dk, dv, dcol = _bwd_dkdv_sm90(do, q, k, v, lf, pq, lse, delta, sm_scale, acp_tables=acp_tables)
    else:
        dk, dv, dcol = _bwd_dkdv(do, q, k, v, lf, pq, lse, delta, kstart, kend, sm_scale, acp_tables)
    return dq, dk, dv, _bwd_dlogf(drow, dcol)


_DQ_ROUND_ROWS = 128  # rows of dq32 rounded per program of the d log f launch (32 KB at head dim 64)


def _bwd_dlogf(drow, dcol, dq32=None, dq=None):
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
    chunk = 64 if _interpreting() else 1024
    nch = _cdiv(max(Tk, 1), chunk)
    sums = torch.empty((B * H, nch), device=dcol.device, dtype=torch.float64)
    dlf = torch.empty_like(dcol)
    from . import triton_kernels as tk

    round_dq = dq32 is not None
    D = dq32.shape[-1] if round_dq else 16
    tk._dlogf_sums_kernel[(B * H, nch)](drow, dcol, sums, H, Tq, Tk, nch, sr, CHUNK=chunk)
    rows = min(chunk, _DQ_ROUND_ROWS)  # dq rows rounded per program: CHUNK // rows programs per chunk
    tk._dlogf_kernel[(B * H, nch, chunk // rows if round_dq else 1)](
        drow, dcol, sums, dlf, dq32 if round_dq else dlf, dq if round_dq else dlf, H, Tq, Tk, nch, sr, CHUNK=chunk,
        VEC=16 if _interpreting() else 128, ROUND_DQ=round_dq, HEAD_DIM=D, BLOCK_D=max(16, _next_pow2(D)), ROWS=rows)
    return dlf


def _bwd_dq(do, q, k, v, lf, pk, o, lse, kstart, sm_scale, acp_tables=None):
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    q, o = q.contiguous(), o.contiguous()  # the dq kernel indexes q, o and dq with one set of strides
    dq = torch.empty_like(q)
    delta = torch.empty((B, H, Tq), device=q.device, dtype=torch.float32)
    drow = torch.empty((B, Tq, H), device=q.device, dtype=torch.float32)
    has_start = kstart is not None
    ks = kstart if has_start else lse
    ks_strides = (kstart.stride(0), kstart.stride(1)) if has_start else (0, 0)
    common = dict(HEAD_DIM=D, BLOCK_D=max(16, _next_pow2(D)), IEEE=q.dtype == torch.float32)
    lo = lse if acp_tables is None else acp_tables[0]
    _launch(
        "dq", lambda META: (B * H, _cdiv(Tq, META["BLOCK_M"])), (_next_pow2(Tk), H // Hkv, q.dtype),
        q, k, v, lf, pk, do, o, lse, delta, dq, drow, ks, lo,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), lf.stride(0), lf.stride(1), lf.stride(2),
        do.stride(0), do.stride(1), do.stride(2), *ks_strides,
        H, H // Hkv, Tq, Tk, sm_scale, _next_pow2(Tk),
        *_acp_args(acp_tables, common["BLOCK_D"], rows_only=True), *pk.stride()[:2],
        HAS_START=has_start, HAS_LO=acp_tables is not None, **common,
    )
    return dq, drow, delta


def _bwd_dkdv(do, q, k, v, lf, pq, lse, delta, kstart, kend, sm_scale, acp_tables=None):
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
    common = dict(HEAD_DIM=D, BLOCK_D=max(16, _next_pow2(D)), IEEE=q.dtype == torch.float32)
    lo, hi = (lse, lse) if acp_tables is None else acp_tables
    _launch(
        "dkdv", lambda META: (B * Hkv, _cdiv(Tk, META["BLOCK_N"])), (_next_pow2(Tk), H // Hkv, q.dtype),
        q, k, v, lf, pq, do, lse, delta, dk, dv, dcol, ks, ke, lo, hi,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), lf.stride(0), lf.stride(1), lf.stride(2),
        do.stride(0), do.stride(1), do.stride(2), *ks_strides, *ke_strides,
        dk.stride(0), dk.stride(1), dk.stride(2),
        H, Hkv, Tq, Tk, sm_scale, _next_pow2(Tk),
        *_acp_args(acp_tables, common["BLOCK_D"]), *pq.stride()[:2],
        H // Hkv,
        HAS_START=has_start, HAS_END=has_end, HAS_HI=acp_tables is not None, **common,
    )
    return dk, dv, dcol


# --------------------------------------------------------------------------------------------------------------
# 3. torch.library custom ops (+ fake impls, + autograd) for torch.compile; an autograd.Function for eager
# --------------------------------------------------------------------------------------------------------------
# Both layers call the same plain functions (``_fwd_impl`` / ``_bwd_impl`` / ``_acp_launch``). Eager calls skip
# torch.library's dispatch (redispatch, default filling, dynamo-disable wrappers): ~100 us of host time per op
# call, which is more than the kernels take at small shapes (docs/kernel.md, "Host-side cost").


def _fwd_is_sm90(q, k, v, kstart):
    """Whether the forward runs the Gluon kernel (a causal pass without documents or padding, ``_use_sm90``)."""
    return kstart is None and _use_sm90(q, k, v)


def _fwd_tiles(q, k, v, kstart):
    """(query rows, keys) of one tile of the forward that this call runs, which ``return_stats`` counts: one
    consumer warpgroup's rows by BLOCK_N in the Gluon forward, else the Triton forward's default config (autotuning
    may pick other tiles there)."""
    if _fwd_is_sm90(q, k, v, kstart):
        return _SM90_CONFIGS[q.shape[-1]][:2]
    cfg = _fixed_config("fwd", max(16, _next_pow2(q.shape[-1])))[0]
    return cfg["BLOCK_M"], cfg["BLOCK_N"]


def _fwd_impl(q, k, v, log_fgate, kstart, kend, sm_scale, acp_lo, acp_hi):
    acp_tables = None if acp_lo is None else (acp_lo, acp_hi)
    if _fwd_is_sm90(q, k, v, kstart):
        return _fwd_launch_sm90(q, k, v, log_fgate, sm_scale, acp_tables=acp_tables)
    return _fwd_launch(q, k, v, log_fgate, kstart, sm_scale, acp_tables)


def _bwd_impl(do, q, k, v, log_fgate, o, lse, kstart, kend, sm_scale, acp_lo, acp_hi):
    return _bwd_launch(do, q, k, v, log_fgate, o, lse, kstart, kend, sm_scale,
                       None if acp_lo is None else (acp_lo, acp_hi))


@torch.library.custom_op("forgetting_transformer::fox_fwd", mutates_args=())
def _fox_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_fgate: torch.Tensor,
    kstart: Optional[torch.Tensor], kend: Optional[torch.Tensor], sm_scale: float,
    acp_lo: Optional[torch.Tensor], acp_hi: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    return _fwd_impl(q, k, v, log_fgate, kstart, kend, sm_scale, acp_lo, acp_hi)


@_fox_fwd.register_fake
def _(q, k, v, log_fgate, kstart, kend, sm_scale, acp_lo, acp_hi):
    B, Tq, H, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, Tq), dtype=torch.float32)


@torch.library.custom_op("forgetting_transformer::fox_bwd", mutates_args=())
def _fox_bwd(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_fgate: torch.Tensor,
    o: torch.Tensor, lse: torch.Tensor, kstart: Optional[torch.Tensor], kend: Optional[torch.Tensor],
    sm_scale: float, acp_lo: Optional[torch.Tensor], acp_hi: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd_impl(do, q, k, v, log_fgate, o, lse, kstart, kend, sm_scale, acp_lo, acp_hi)


@_fox_bwd.register_fake
def _(do, q, k, v, log_fgate, o, lse, kstart, kend, sm_scale, acp_lo, acp_hi):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(log_fgate)


@torch.library.custom_op("forgetting_transformer::fox_acp_tables", mutates_args=())
def _fox_acp_tables(
    q: torch.Tensor, k: torch.Tensor, log_fgate: torch.Tensor, sm_scale: float, mode: str,
    delta: Optional[torch.Tensor], thr_value: float, gamma_q: Optional[torch.Tensor],
    gamma_k: Optional[torch.Tensor], log_eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ACP's (lo, hi, delta) (see ``_acp_launch``)."""
    return _acp_launch(q, k, log_fgate, sm_scale, mode, delta, thr_value, gamma_q, gamma_k, log_eps)


@_fox_acp_tables.register_fake
def _(q, k, log_fgate, sm_scale, mode, delta, thr_value, gamma_q, gamma_k, log_eps):
    B, Tq, H, D = q.shape
    GM, GN = _acp_grid(max(16, _next_pow2(D)))
    lo = q.new_empty((B * H, _cdiv(Tq, GM)), dtype=torch.int32)
    return lo, q.new_empty((B * H, _cdiv(k.shape[1], GN)), dtype=torch.int32), q.new_empty((B, H), dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    q, k, v, log_fgate, kstart, kend, sm_scale, acp_lo, acp_hi = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, log_fgate, o, lse, kstart, kend, acp_lo, acp_hi)
    ctx.sm_scale = sm_scale


def _backward(ctx, do, dlse, bwd=_fox_bwd):
    q, k, v, log_fgate, o, lse, kstart, kend, acp_lo, acp_hi = ctx.saved_tensors
    dq, dk, dv, dlf = bwd(do, q, k, v, log_fgate, o, lse, kstart, kend, ctx.sm_scale, acp_lo, acp_hi)
    return dq, dk, dv, dlf, None, None, None, None, None


_fox_fwd.register_autograd(_backward, setup_context=_setup_context)


class _FoxEager(torch.autograd.Function):
    """The eager autograd layer: ``fox_fwd``'s impl, setup_context and backward without the op dispatch."""

    @staticmethod
    def forward(ctx, *inputs):
        o, lse = _fwd_impl(*inputs)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(lse)
        _setup_context(ctx, inputs, (o, lse))
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        return _backward(ctx, do, dlse, bwd=_bwd_impl)


def _eager(*tensors):
    """True for plain tensors outside torch.compile: there the ops' dispatch is skipped (``_FoxEager``). Traced
    calls (dynamo, or FakeTensor / functional tensors of other tracers) take the custom ops."""
    return not torch.compiler.is_compiling() and all(type(t) is torch.Tensor for t in tensors)


# --------------------------------------------------------------------------------------------------------------
# 4. public function
# --------------------------------------------------------------------------------------------------------------


def _check_kernel_inputs(q, k, v, log_fgate):
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q/k/v dtype must be one of float16, bfloat16, float32 for the kernel; got {q.dtype}")
    if log_fgate.dtype != torch.float32:
        raise ValueError(f"log_fgate must be float32 for the kernel; got {log_fgate.dtype}")
    D = q.shape[-1]
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D={D} is not supported by the kernel (1 <= D <= {MAX_HEAD_DIM}; "
                         f"tuned for 16, 32, 64, 96, 128, 256)")
    devs = {t.device for t in (q, k, v, log_fgate)}
    if len(devs) != 1:
        raise ValueError(f"q, k, v, log_fgate must be on one device; got {sorted(map(str, devs))}")


def _row_bounds(q, k, cu_seqlens, seq_start):
    """Per-query first visible key (B, Tq) and per-key last query position (B, Tk), int32, or None."""
    B, Tq = q.shape[:2]
    Tk = k.shape[1]
    kstart = kend = None
    if cu_seqlens is not None:
        cu = cu_seqlens.to(device=q.device, dtype=torch.int64)
        pos = torch.arange(Tk, device=q.device)
        doc = torch.bucketize(pos, cu[1:], right=True)  # (Tk,)
        kstart = cu[doc][None, Tk - Tq:].to(torch.int32)  # (1, Tq)
        kend = (cu[doc + 1] - 1)[None].to(torch.int32)  # (1, Tk)
    if seq_start is not None:
        st = seq_start.to(device=q.device, dtype=torch.int32)[:, None].expand(B, Tq)
        kstart = st if kstart is None else torch.maximum(kstart, st)
    if kstart is not None:
        kstart = kstart.contiguous()
    return kstart, kend


def _acp_tables_for(q, k, log_fgate, sm_scale, adaptive_threshold, acp_eps, qk_norm_weights):
    """Validate ACP's arguments and run ``fox_acp_tables``: (lo, hi, delta (B, H))."""
    B, _, H, D = q.shape
    kind = _acp.threshold_kind(adaptive_threshold, B, H, acp_eps)
    delta, thr_value, gammas, mode = None, 0.0, (None, None), kind
    if kind == "tensor":
        delta = _acp.acp_threshold(q, k, sm_scale, adaptive_threshold)  # (B, H) fp32 on q's device
    elif kind == "float":
        thr_value = float(adaptive_threshold)
    elif qk_norm_weights is not None:
        _acp.check_qk_norm_weights(qk_norm_weights, H, k.shape[2], D)
        gammas, mode = tuple(g.detach().to(q.device) for g in qk_norm_weights), "weights"
    else:
        mode = "norms"
    tables = _acp_launch if _eager(q, k, log_fgate) else _fox_acp_tables  # see section 3
    return tables(q.detach(), k.detach(), log_fgate.detach(), sm_scale, mode, delta, thr_value, *gammas,
                  math.log(acp_eps) if kind == "auto" else 0.0)


def _forgetting_attention_triton(q, k, v, log_fgate, *, sm_scale=None, cu_seqlens=None, seq_start=None,
                                 adaptive_threshold=None, return_stats=False, acp_eps=_acp.DEFAULT_EPS,
                                 qk_norm_weights=None):
    """The Triton path, on any device (CPU needs ``TRITON_INTERPRET=1`` before triton is imported)."""
    check_inputs(q, k, v, log_fgate, cu_seqlens, seq_start)
    _check_kernel_inputs(q, k, v, log_fgate)
    D = q.shape[-1]
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    log_fgate = log_fgate.contiguous()
    for name, t in (("q", q), ("k", k), ("v", v)):
        # within one batch element the kernels index rows with int32 (batch and head offsets are int64)
        if t.shape[1] * t.stride(1) >= 2**31:
            raise ValueError(f"{name}: seq_len * H * D = {t.shape[1] * t.stride(1)} elements per batch element "
                             f"exceeds the kernel's int32 row indexing (< 2^31); split the heads into several calls")
    kstart, kend = _row_bounds(q, k, cu_seqlens, seq_start)
    block_d = max(16, _next_pow2(D))
    tables = (None, None)
    if adaptive_threshold is not None:
        tables = _acp_tables_for(q, k, log_fgate, sm_scale, adaptive_threshold, acp_eps, qk_norm_weights)[:2]
    fwd = _FoxEager.apply if _eager(q, k, v, log_fgate) else _fox_fwd
    o, _ = fwd(q, k, v, log_fgate, kstart, kend, sm_scale, *tables)
    if return_stats:
        bm, bn = _fwd_tiles(q, k, v, kstart)
        lo = None if tables[0] is None else _acp.lo_for_tiling(tables[0], q.shape[1], *_acp_grid(block_d), bm, bn)
        return o, _acp.tile_stats(log_fgate, None, q.shape[1], bm, bn, lo=lo)
    return o


def forgetting_attention(
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
    backend: str | None = None,
    acp_eps: float = _acp.DEFAULT_EPS,
    qk_norm_weights: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Causal softmax attention with a forget gate: ``o_i = sum_j softmax_j(q_i.k_j*s + c_i - c_j) v_j``.

    Args:
        q: ``(B, Tq, H, D)`` queries (bf16/fp16 on the GPU; fp32 also accepted).
        k, v: ``(B, Tk, Hkv, D)``; ``Hkv`` divides ``H`` (GQA/MQA); ``Tq <= Tk``, queries aligned to the end.
        log_fgate: ``(B, Tk, H)`` float32 log forget gates (``<= 0``); ``c = cumsum(log_fgate)``.
        sm_scale: defaults to ``1 / sqrt(D)``.
        cu_seqlens: ``(N + 1,)`` document boundaries of a packed ``B = 1`` batch (default None).
        seq_start: ``(B,)`` first real key of each sequence (left padding; default None). Query rows with no
            visible key return 0.
        adaptive_threshold: Adaptive Computation Pruning (kernel only; default None = dense). ``"auto"``:
            ``delta = -2U - log(Tk) + log(acp_eps)`` per (batch, head), ``U`` from ``qk_norm_weights`` when
            given, else from the max q / k norms; or a float, or a ``(B, H)`` tensor of thresholds. Tiles of the
            ACP grid (64 x 64 for D <= 128) whose every decay ``c_i - c_j`` is below ``delta`` are pruned
            (skipped in the forward and both backward kernels; masked by the reference, which prunes the same
            region). Needs ``log_fgate <= 0``.
        return_stats: also return ``{"computed": (B, H), "pruned": (B, H)}`` tile counts of the forward kernel
            that runs (on Hopper at head dims 64 / 128 a warpgroup's 64 rows by 128 keys, else the Triton forward's
            default tiles); the reference counts tiles of the ACP grid.
        acp_eps: ACP's bound on the pruned attention weight per row (default ``e^-10``).
        qk_norm_weights: ``(gamma_q, gamma_k)`` QK-RMSNorm weights (``(D,)`` or ``(H, D)``) for ``"auto"``.
        backend: ``None`` (default: CUDA bf16/fp16 tensors -> Triton kernel; CPU, or fp32 on CUDA -> PyTorch
            reference), ``"triton"`` or ``"reference"``.
    Returns:
        ``(B, Tq, H, D)`` in q's dtype (``(o, stats)`` with ``return_stats``). Differentiable w.r.t. q, k, v
        and log_fgate.
    """
    if backend is None:
        # fp32 on CUDA goes to the reference: the kernel's GPU configs are tuned and tested for bf16 / fp16
        # (fp32 tiles can exceed shared memory); pass backend="triton" to force it.
        backend = "triton" if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) else "reference"
    if backend == "triton":
        return _forgetting_attention_triton(
            q, k, v, log_fgate, sm_scale=sm_scale, cu_seqlens=cu_seqlens, seq_start=seq_start,
            adaptive_threshold=adaptive_threshold, return_stats=return_stats, acp_eps=acp_eps,
            qk_norm_weights=qk_norm_weights,
        )
    if backend != "reference":
        raise ValueError(f"backend must be None, 'triton' or 'reference'; got {backend!r}")
    # ACP on the reference prunes the region the kernel would prune on a GPU (the same grid)
    return forgetting_attention_ref(
        q, k, v, log_fgate, sm_scale=sm_scale, cu_seqlens=cu_seqlens, seq_start=seq_start,
        adaptive_threshold=adaptive_threshold, return_stats=return_stats, acp_eps=acp_eps,
        qk_norm_weights=qk_norm_weights, acp_grid=_acp_grid(max(16, _next_pow2(q.shape[-1]))),
    )
