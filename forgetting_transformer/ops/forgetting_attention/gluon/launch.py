"""Launchers of the warp-specialised Gluon kernels (``gluon/kernels.py``; Hopper), and when the op runs them.

    use_sm90        whether a causal call without documents or padding runs a Gluon kernel
    use_fused_bwd   whether its backward runs as one kernel (head dim 64)
    fwd_sm90        the forward: (o, lse), as ``triton.launch.fwd``
    bwd_dq_sm90     the dq kernel: (dq, drow, delta), as ``triton.launch.bwd_dq``
    bwd_dkdv_sm90   the dk/dv kernel: (dk, dv, dcol), as ``triton.launch.bwd_dkdv``
    bwd_fused_sm90  the one-kernel backward with its set-up launch: (dq, dk, dv, drow, dcol)

The launchers copy a checked TMA descriptor template per (block, dtype) and set its base, shape and strides.
``config`` is one tuple of ``tiles.GLUON_*_CONFIGS``' layout (None: the head dim's entry); ``grid`` is ACP's
(GM, GN) when ``acp_tables`` are given.
"""

from __future__ import annotations

import functools
import math

import torch

from ... import launch_cache
from .. import tiles
from ...options import interpreting
from ..tiles import cdiv, padded_head_dim
from ..triton import launch as TL  # the Triton helper kernels the Gluon path runs on (block prefix sums, ACP args)

@functools.lru_cache(maxsize=None)
def _capability(device_index):
    """(major, minor) of a CUDA device, cached: ``torch.cuda.get_device_capability`` costs ~8 us of host time and
    every Gluon call asks three times."""
    return torch.cuda.get_device_capability(device_index)


def use_sm90(q, k, v, head_dims, options, *more):
    """Whether a causal pass without documents or padding (checked by the caller; dense or with ACP) runs a Gluon
    kernel: ``options.gluon``, a Hopper GPU (compute capability 9.x), 16-bit inputs, a head dim in ``head_dims``
    and TMA's 16-byte-aligned bases (of q, k, v and ``more``). The Gluon and Triton kernels compute the same
    outputs (tested)."""
    return (options.gluon and q.is_cuda and not interpreting()
            and q.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] in head_dims
            and all(t.data_ptr() % 16 == 0 for t in (q, k, v, *more))
            and _capability(q.device.index if q.device.index is not None else torch.cuda.current_device())[0] == 9)


def use_fused_bwd(q, k, v, do, o, options):
    """Whether a causal backward without documents or padding (dense or with ACP's tables) runs as one Gluon kernel
    (dk/dv with dq and the row sums of dS by TMA reduce-adds; ``bwd_fused_sm90``): where ``use_sm90`` holds for
    ``GLUON_FUSED_CONFIGS``, with ``options.fused_backward`` and unless a deterministic backward is asked for
    (``options.deterministic`` or ``torch.use_deterministic_algorithms``; then the dq and dk/dv kernels run, which
    are bitwise reproducible)."""
    return (options.fused_backward and not options.deterministic and not torch.are_deterministic_algorithms_enabled()
            and use_sm90(q, k, v, tiles.GLUON_FUSED_CONFIGS, options, do, o))


@functools.lru_cache(maxsize=None)
def smem_layout(block, dtype):
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
                            smem_layout(block, dtype))


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


def tma_desc(t, block):
    """TMA descriptor over the (B*T, heads*D) view of a contiguous (B, T, heads, D) tensor, blocks of [block, D]
    (the Gluon kernels' 16-bit Q / K / V / dO tiles; the one-kernel backward's fp32 accumulators). heads * D is a
    multiple of 8 at the Gluon head dims, so the row stride is 16-byte aligned."""
    B, T, heads, D = t.shape
    return _desc(t, [B * T, heads * D], [heads * D, 1], (block, D))


def tma_vec(t, block):
    """1-D TMA descriptor over the flat fp32 contiguous ``t`` (at least ``block`` long), blocks of ``block``: the
    Gluon kernels' rows of PK / PQ (``triton.launch.block_prefix``), LSE and delta."""
    return _desc(t, [t.numel()], [1], (block,))


def query_vec(t, rows=None, block=64):
    """1-D TMA descriptor over a flat fp32 buffer, blocks of ``block`` (a query tile's rows; the dk/dv kernels'
    PQ, LSE and delta): with ``rows``, the (B*H, Tq) ``t`` with its rows padded to ``rows`` entries; a buffer
    shorter than a block padded with zeros (rows past Tq are masked)."""
    if rows is not None and rows != t.shape[-1]:
        t = torch.nn.functional.pad(t.reshape(-1, t.shape[-1]), (0, rows - t.shape[-1]))
    t = t.reshape(-1)
    if t.numel() < block:
        t = torch.nn.functional.pad(t, (0, block - t.numel()))
    return tma_vec(t, block)


def fwd_sm90(q, k, v, lf, sm_scale, config=None, acp_tables=None, grid=None):
    """The causal forward (dense, or with ACP's ``acp_tables``) by the Gluon kernel: the same (o, lse) as
    ``triton.launch.fwd``."""
    from . import kernels as gk

    B, Tq, H, D = q.shape
    config = config or tiles.GLUON_FWD_CONFIGS[D]
    bm, bn, stages, wgs = config
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.empty_like(q)
    lse = torch.empty((B, H, Tq), device=q.device, dtype=torch.float32)
    if Tq == 0:
        return o, lse
    pk, _ = TL.block_prefix(lf, Tq, query_side=False)
    lo = lse if acp_tables is None else acp_tables[0]  # the kernel reads ACP from LO's dtype (int32: a table)
    key = ("fwd_sm90", q.shape, k.shape, q.dtype, k.dtype, v.dtype, lf.dtype, lf.stride(), lo.dtype, lo.shape,
           config, grid and tuple(grid), launch_cache.aligned(lf, lo))

    def build():
        Tk, Hkv = k.shape[1], k.shape[2]
        ints = (lf.stride(0), lf.stride(1), lf.stride(2), o.stride(0), o.stride(1), o.stride(2), *pk.stride()[:2],
                *TL.acp_args(acp_tables, grid, rows_only=True), H, H // Hkv, Tq, Tk)
        meta = dict(BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=D, NUM_STAGES=stages, NUM_WG=wgs, num_warps=4,
                    maxnreg=tiles.gluon_maxnreg(4 * wgs))
        return (B * H, cdiv(Tq, wgs * bm)), ints, meta

    launch_grid, ints, meta = launch_cache.static(key, build)
    launch_cache.launch_keyed(key, gk.fox_fwd_sm90_kernel, launch_grid,
        tma_desc(q, bm), tma_desc(k, bn), tma_desc(v, bn), tma_vec(pk, bn), lf, pk, o, lse, lo, *ints,
        float(sm_scale), **meta)
    return o, lse


def bwd_dq_sm90(do, q, k, v, lf, pk, o, lse, sm_scale, config=None, acp_tables=None, grid=None):
    """The dq backward (dense, or with ACP's ``acp_tables``) by the Gluon kernel: the same (dq, drow, delta) as
    ``triton.launch.bwd_dq``."""
    from . import kernels as gk

    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    bm, bn, stages, wgs = config or tiles.GLUON_DQ_CONFIGS[D]
    q, k, v, do, o = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous(), o.contiguous()
    dq = torch.empty_like(q)
    delta = torch.empty((B, H, Tq), device=q.device, dtype=torch.float32)
    drow = torch.empty((B, Tq, H), device=q.device, dtype=torch.float32)
    lo = lse if acp_tables is None else acp_tables[0]  # the kernel reads ACP from LO's dtype (int32: a table)
    launch_cache.launch(gk.fox_bwd_dq_sm90_kernel, (B * H, cdiv(Tq, wgs * bm)),
        tma_desc(q, bm), tma_desc(do, bm), tma_desc(k, bn), tma_desc(v, bn), tma_vec(pk, bn), lf, pk, o, lse,
        delta, dq,
        drow, lo, lf.stride(0), lf.stride(1), lf.stride(2), q.stride(0), q.stride(1), q.stride(2), *pk.stride()[:2],
        *TL.acp_args(acp_tables, grid, rows_only=True), H, H // Hkv, Tq, Tk, sm_scale,
        NUM_STAGES=stages, NUM_WG=wgs, num_warps=4, maxnreg=tiles.gluon_maxnreg(4 * wgs))
    return dq, drow, delta


def bwd_dkdv_sm90(do, q, k, v, lf, pq, lse, delta, sm_scale, config=None, acp_tables=None, grid=None):
    """The dk/dv backward (dense, or with ACP's ``acp_tables``) by the Gluon kernel: the same (dk, dv, dcol) as
    ``triton.launch.bwd_dkdv``."""
    from . import kernels as gk

    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    bm, keys, stages, wgs = config or tiles.GLUON_DKDV_CONFIGS[D]
    q, k, v, do = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous()
    svr = cdiv(Tq, 4) * 4  # a TMA copy starts at a 16-byte boundary: rows of LSE and delta padded to 4 floats
    vec = functools.partial(query_vec, rows=svr, block=bm)

    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    dcol = torch.empty((B, Tk, H), device=q.device, dtype=torch.float32)
    launch_cache.launch(gk.fox_bwd_dkdv_sm90_kernel, (cdiv(Tk, wgs * keys) * B * Hkv,),  # key blocks fastest
        tma_desc(q, bm), tma_desc(do, bm), tma_desc(k, keys), tma_desc(v, keys),
        vec(pq, rows=None), vec(lse), vec(delta), lf, pq, dk, dv, dcol,
        dcol if acp_tables is None else acp_tables[1],  # the kernel reads ACP from HI's dtype (int32: a table)
        lf.stride(0), lf.stride(1), lf.stride(2), dk.stride(0), dk.stride(1), dk.stride(2), *pq.stride()[:2], svr,
        *TL.acp_args(acp_tables, grid)[1:], H, H // Hkv, Tq, Tk, sm_scale,
        NUM_STAGES=stages, NUM_WG=wgs, num_warps=4, maxnreg=tiles.gluon_maxnreg(4 * wgs))
    return dk, dv, dcol


def bwd_fused_setup(o, do, lf, lse, block_m):
    """The one-kernel backward's set-up in one launch (``_bwd_fused_setup_kernel``; o and dO contiguous, same
    shape (B, Tq, H, D); lf (B, Tk, H); lse (B, H, Tq) from the forward; query tiles of ``block_m`` rows):
    delta = rowsum(o * dO), (B, H, Tq) fp32; pq, the block-local prefix sums of log f over the query rows in
    blocks of ``block_m`` (``block_prefix``'s plane for them), (B*H, Tq rounded up to block_m) fp32; z = pq *
    log2(e) - lse, the query side of each tile's scores, (B*H, SVR) fp32 with rows padded to SVR = Tq rounded up
    to 4 (a TMA copy starts at a 16-byte boundary; the padding is not written); and the zeroed fp32 accumulators
    of the kernel's reduce-adds, for dq (B, Tq, H, D) and for the row sums of dS (B, Tq, H, 8)."""
    from ..triton import kernels as tk

    B, Tq, H, D = o.shape
    svr = cdiv(Tq, 4) * 4
    dev = o.device
    delta = torch.empty((B, H, Tq), device=dev, dtype=torch.float32)
    pq = torch.empty((B * H, cdiv(Tq, block_m) * block_m), device=dev, dtype=torch.float32)
    z = torch.empty((B * H, svr), device=dev, dtype=torch.float32)
    dq32 = torch.empty((B, Tq, H, D), device=dev, dtype=torch.float32)
    rs8 = torch.empty((B, Tq, H, 8), device=dev, dtype=torch.float32)
    key = ("fused_setup", o.shape, o.stride(), do.stride(), o.dtype, do.dtype, lf.shape, lf.stride(), lf.dtype,
           lse.dtype, block_m, launch_cache.aligned(o, do, lf, lse))
    ints = launch_cache.static(key, lambda: (H, Tq, lf.shape[1], o.stride(0), o.stride(1), o.stride(2),
                                             lf.stride(0), lf.stride(1), lf.stride(2), pq.stride(0), svr))
    launch_cache.launch_keyed(key, tk._bwd_fused_setup_kernel, (B * H, cdiv(Tq, block_m)),
        o, do, delta, dq32, rs8, lf, pq, lse, z, *ints, HEAD_DIM=D, BLOCK_D=padded_head_dim(D), ROWS=block_m)
    return delta, pq, z, dq32, rs8


def bwd_fused_sm90(do, q, k, v, lf, o, lse, sm_scale, config=None, acp_tables=None, grid=None, round_dq=True):
    """The dense causal backward as one Gluon kernel (``gluon.kernels.fox_bwd_fused_sm90_kernel``): (dq, dk, dv,
    drow, dcol) as ``bwd_dq`` and ``bwd_dkdv`` give them (dense, or with ACP's ``acp_tables``), dq the fp32
    accumulator of the kernel's reduce-adds rounded once to q's dtype (``round_dq=False``: left in fp32, for
    ``triton.launch.bwd_dlogf`` to round in its launch), drow and dcol the sums of the 16-bit dS (not bitwise
    reproducible: the adds' order varies)."""
    from . import kernels as gk

    B, Tq, H, D = q.shape
    config = config or tiles.GLUON_FUSED_CONFIGS[D]
    bm, keys, stages, slots = config
    q, k, v, do, o = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous(), o.contiguous()
    delta, pq, z, dq32, rs8 = bwd_fused_setup(o, do, lf, lse, bm)
    svr = z.shape[1]  # a TMA copy starts at a 16-byte boundary: rows of z and delta padded to 4 floats
    zd = query_vec(z, block=bm)  # (the kernel reads z in place of PQ and LSE)
    dd = query_vec(delta, rows=svr, block=bm)

    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    dcol = torch.empty((B, k.shape[1], H), device=q.device, dtype=torch.float32)
    hi = dcol if acp_tables is None else acp_tables[1]  # the kernel reads ACP from HI's dtype (int32: a table)
    key = ("fused", q.shape, k.shape, q.dtype, k.dtype, v.dtype, do.dtype, lf.dtype, lf.stride(), hi.dtype, hi.shape,
           config, grid and tuple(grid), launch_cache.aligned(lf, hi))

    def build():
        Tk, Hkv = k.shape[1], k.shape[2]
        ints = (lf.stride(0), lf.stride(1), lf.stride(2), dk.stride(0), dk.stride(1), dk.stride(2), 0,
                pq.stride(0), svr, H, H // Hkv, Tq, Tk)  # (pq: one plane, stride 0)
        return (cdiv(Tk, 2 * keys) * B * Hkv,), ints, TL.acp_args(acp_tables, grid)[1:], tiles.gluon_maxnreg(8)

    launch_grid, ints, acp, maxnreg = launch_cache.static(key, build)
    launch_cache.launch_keyed(key, gk.fox_bwd_fused_sm90_kernel, launch_grid,
        tma_desc(q, bm), tma_desc(do, bm), tma_desc(k, keys), tma_desc(v, keys), zd, zd,
        dd, tma_desc(dq32, bm), tma_desc(rs8, bm), lf, pq, dk, dv, dcol, *ints, float(sm_scale), hi, *acp,
        NUM_STAGES=stages, DQ_SLOTS=slots, num_warps=4, maxnreg=maxnreg)
    # (drow: a strided view, which bwd_dlogf reads; dq32 rounded by the caller, or by bwd_dlogf with d log f)
    return (dq32.to(q.dtype) if round_dq else dq32), dk, dv, rs8[..., 0], dcol
