"""The kernel path of the op: inputs checked, row bounds and ACP's tables formed, the kernels chained into a forward
and a backward, and the autograd layers over them.

``forgetting_attention_triton`` is the path the public function takes for the kernels; ``attend`` is its one
forward route and ``acp_tables_for`` its one route to ACP's tables.

``fwd_impl`` / ``bwd_impl`` pick the kernels per call (``gluon.launch.use_sm90`` / ``use_fused_bwd``: the Gluon
kernels on Hopper where they apply, the Triton kernels elsewhere) under an ``AttentionOptions``. Two autograd
layers call them: the ``torch.library`` custom ops ``forgetting_transformer::fox_fwd`` / ``fox_bwd`` /
``fox_acp_tables``, with fake (meta) implementations and ``register_autograd``, so that ``torch.compile`` traces
the op without graph breaks (the options travel as ``AttentionOptions.token``); and ``FoxEager``, an
``autograd.Function`` over the same functions for eager calls, which skips torch.library's dispatch
(redispatch, default filling, dynamo-disable wrappers: ~100 us of host time per op call, more than the kernels
take at small shapes).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import acp as _acp
from . import tiles
from .gluon import launch as GL
from ..options import from_token
from .reference import check_inputs
from .tiles import MAX_HEAD_DIM, cdiv, padded_head_dim
from .triton import launch as TL


def fwd_is_sm90(q, k, v, kstart, options):
    """Whether the forward runs the Gluon kernel (a causal pass without documents or padding, ``use_sm90``)."""
    return kstart is None and GL.use_sm90(q, k, v, tiles.GLUON_FWD_CONFIGS, options)


def fwd_tiles(q, k, v, kstart, options):
    """(query rows, keys) of one tile of the forward that this call runs, which ``return_stats`` counts: one
    consumer warpgroup's rows by BLOCK_N in the Gluon forward, else the Triton forward's fixed config (autotuning
    may pick other tiles there)."""
    if fwd_is_sm90(q, k, v, kstart, options):
        return tiles.GLUON_FWD_CONFIGS[q.shape[-1]][:2]
    cfg = tiles.fixed_config("fwd", padded_head_dim(q.shape[-1]), q.element_size(),
                             q.device.index if q.is_cuda else None, options)
    return cfg.block_m, cfg.block_n


def fwd_impl(q, k, v, log_fgate, kstart, kend, sm_scale, acp_lo, acp_hi, options):
    acp_tables = None if acp_lo is None else (acp_lo, acp_hi)
    if fwd_is_sm90(q, k, v, kstart, options):
        return GL.fwd_sm90(q, k, v, log_fgate, sm_scale, acp_tables=acp_tables,
                           grid=_acp.grid(q.shape[-1], options.acp_grid))
    return TL.fwd(q, k, v, log_fgate, kstart, sm_scale, options, acp_tables)


def bwd(do, q, k, v, lf, o, lse, kstart, kend, sm_scale, options, acp_tables=None):
    """The backward: (dq, dk, dv, d log f)."""
    B, Tq, H, D = q.shape
    if Tq == 0:
        return torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v), torch.zeros_like(lf)
    do = do.contiguous()
    o = o.contiguous()
    grid = _acp.grid(D, options.acp_grid)
    if kstart is None and kend is None and GL.use_fused_bwd(q, k, v, do, o, options):
        dq32, dk, dv, drow, dcol = GL.bwd_fused_sm90(do, q, k, v, lf, o, lse, sm_scale, acp_tables=acp_tables,
                                                     grid=grid, round_dq=False)
        dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)  # (rounded from dq32 by the d log f launch)
        return dq, dk, dv, TL.bwd_dlogf(drow, dcol, dq32, dq)
    pk, pq = TL.block_prefix(lf, Tq)
    # the dq kernel also computes delta = rowsum(o * do) for the dk/dv kernel
    if kstart is None and GL.use_sm90(q, k, v, tiles.GLUON_DQ_CONFIGS, options, do, o):
        dq, drow, delta = GL.bwd_dq_sm90(do, q, k, v, lf, pk, o, lse, sm_scale, acp_tables=acp_tables, grid=grid)
    else:
        dq, drow, delta = TL.bwd_dq(do, q, k, v, lf, pk, o, lse, kstart, sm_scale, options, acp_tables)
    if kstart is None and kend is None and GL.use_sm90(q, k, v, tiles.GLUON_DKDV_CONFIGS, options, do):
        dk, dv, dcol = GL.bwd_dkdv_sm90(do, q, k, v, lf, pq, lse, delta, sm_scale, acp_tables=acp_tables, grid=grid)
    else:
        dk, dv, dcol = TL.bwd_dkdv(do, q, k, v, lf, pq, lse, delta, kstart, kend, sm_scale, options, acp_tables)
    return dq, dk, dv, TL.bwd_dlogf(drow, dcol)


def acp_tables_impl(q, k, log_fgate, sm_scale, mode, delta, thr_value, gamma_q, gamma_k, log_eps, grid_m, grid_n):
    """ACP's (lo, hi, delta) on the grid (grid_m, grid_n) (``triton.launch.acp_launch``)."""
    return TL.acp_launch(q, k, log_fgate, sm_scale, mode, (grid_m, grid_n), delta, thr_value, gamma_q, gamma_k,
                         log_eps)


def bwd_impl(do, q, k, v, log_fgate, o, lse, kstart, kend, sm_scale, acp_lo, acp_hi, options):
    return bwd(do, q, k, v, log_fgate, o, lse, kstart, kend, sm_scale, options,
               None if acp_lo is None else (acp_lo, acp_hi))


@torch.library.custom_op("forgetting_transformer::fox_fwd", mutates_args=())
def fox_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_fgate: torch.Tensor,
    kstart: Optional[torch.Tensor], kend: Optional[torch.Tensor], sm_scale: float,
    acp_lo: Optional[torch.Tensor], acp_hi: Optional[torch.Tensor], options: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    return fwd_impl(q, k, v, log_fgate, kstart, kend, sm_scale, acp_lo, acp_hi, from_token(options))


@fox_fwd.register_fake
def _(q, k, v, log_fgate, kstart, kend, sm_scale, acp_lo, acp_hi, options):
    B, Tq, H, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, Tq), dtype=torch.float32)


@torch.library.custom_op("forgetting_transformer::fox_bwd", mutates_args=())
def fox_bwd(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_fgate: torch.Tensor,
    o: torch.Tensor, lse: torch.Tensor, kstart: Optional[torch.Tensor], kend: Optional[torch.Tensor],
    sm_scale: float, acp_lo: Optional[torch.Tensor], acp_hi: Optional[torch.Tensor], options: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return bwd_impl(do, q, k, v, log_fgate, o, lse, kstart, kend, sm_scale, acp_lo, acp_hi, from_token(options))


@fox_bwd.register_fake
def _(do, q, k, v, log_fgate, o, lse, kstart, kend, sm_scale, acp_lo, acp_hi, options):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(log_fgate)


@torch.library.custom_op("forgetting_transformer::fox_acp_tables", mutates_args=())
def fox_acp_tables(
    q: torch.Tensor, k: torch.Tensor, log_fgate: torch.Tensor, sm_scale: float, mode: str,
    delta: Optional[torch.Tensor], thr_value: float, gamma_q: Optional[torch.Tensor],
    gamma_k: Optional[torch.Tensor], log_eps: float, grid_m: int, grid_n: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return acp_tables_impl(q, k, log_fgate, sm_scale, mode, delta, thr_value, gamma_q, gamma_k, log_eps, grid_m,
                           grid_n)


@fox_acp_tables.register_fake
def _(q, k, log_fgate, sm_scale, mode, delta, thr_value, gamma_q, gamma_k, log_eps, grid_m, grid_n):
    B, Tq, H, D = q.shape
    lo = q.new_empty((B * H, cdiv(Tq, grid_m)), dtype=torch.int32)
    hi = q.new_empty((B * H, cdiv(k.shape[1], grid_n)), dtype=torch.int32)
    return lo, hi, q.new_empty((B, H), dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    q, k, v, log_fgate, kstart, kend, sm_scale, acp_lo, acp_hi, options = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, log_fgate, o, lse, kstart, kend, acp_lo, acp_hi)
    ctx.sm_scale = sm_scale
    ctx.options = options  # (the backward runs with the forward's options)


def _backward(ctx, do, dlse, bwd_fn=fox_bwd):
    q, k, v, log_fgate, o, lse, kstart, kend, acp_lo, acp_hi = ctx.saved_tensors
    dq, dk, dv, dlf = bwd_fn(do, q, k, v, log_fgate, o, lse, kstart, kend, ctx.sm_scale, acp_lo, acp_hi,
                             ctx.options)
    return dq, dk, dv, dlf, None, None, None, None, None, None


fox_fwd.register_autograd(_backward, setup_context=_setup_context)


class FoxEager(torch.autograd.Function):
    """The eager autograd layer: ``fox_fwd``'s impl, setup_context and backward without the op dispatch (the
    options as an ``AttentionOptions``, not a token)."""

    @staticmethod
    def forward(ctx, *inputs):
        o, lse = fwd_impl(*inputs)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(lse)
        _setup_context(ctx, inputs, (o, lse))
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        return _backward(ctx, do, dlse, bwd_fn=bwd_impl)


def eager(*tensors):
    """True for plain tensors outside torch.compile: there the ops' dispatch is skipped (``FoxEager``). Traced
    calls (dynamo, or FakeTensor / functional tensors of other tracers) take the custom ops."""
    return not torch.compiler.is_compiling() and all(type(t) is torch.Tensor for t in tensors)


def attend(q, k, v, log_fgate, kstart, kend, sm_scale, acp_lo, acp_hi, options):
    """The one forward route: (B, Tq, H, D). Traced calls take the custom op ``fox_fwd``; eager calls
    ``FoxEager``, or with nothing to differentiate ``fwd_impl`` alone (no autograd bookkeeping)."""
    if not eager(q, k, v, log_fgate):
        return fox_fwd(q, k, v, log_fgate, kstart, kend, sm_scale, acp_lo, acp_hi, options.token)[0]
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, log_fgate)):
        return FoxEager.apply(q, k, v, log_fgate, kstart, kend, sm_scale, acp_lo, acp_hi, options)[0]
    return fwd_impl(q, k, v, log_fgate, kstart, kend, sm_scale, acp_lo, acp_hi, options)[0]


SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_kernel_inputs(q, k, v, log_fgate):
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q/k/v dtype must be one of float16, bfloat16, float32 for the kernel; got {q.dtype}")
    if log_fgate.dtype != torch.float32:
        raise ValueError(f"log_fgate must be float32 for the kernel; got {log_fgate.dtype}")
    D = q.shape[-1]
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D={D} is not supported by the kernel (1 <= D <= {MAX_HEAD_DIM})")
    devs = {t.device for t in (q, k, v, log_fgate)}
    if len(devs) != 1:
        raise ValueError(f"q, k, v, log_fgate must be on one device; got {sorted(map(str, devs))}")


def row_bounds(q, k, cu_seqlens, seq_start):
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


def acp_tables_for(q, k, log_fgate, sm_scale, adaptive_threshold, acp_eps, qk_norm_weights, options):
    """Validate ACP's arguments and form its tables (``fox_acp_tables``) on the grid of ``options``: (lo, hi,
    delta (B, H))."""
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
    GM, GN = _acp.grid(D, options.acp_grid)
    log_eps = math.log(acp_eps) if kind == "auto" else 0.0
    args = (q.detach(), k.detach(), log_fgate.detach(), sm_scale, mode, delta, thr_value, *gammas, log_eps, GM, GN)
    return acp_tables_impl(*args) if eager(q, k, log_fgate) else fox_acp_tables(*args)


def forgetting_attention_triton(q, k, v, log_fgate, *, sm_scale=None, cu_seqlens=None, seq_start=None,
                                adaptive_threshold=None, return_stats=False, acp_eps=_acp.DEFAULT_EPS,
                                qk_norm_weights=None, options):
    """The kernel path, on any device (a CPU needs ``TRITON_INTERPRET=1`` before triton is imported)."""
    check_inputs(q, k, v, log_fgate, cu_seqlens, seq_start)
    check_kernel_inputs(q, k, v, log_fgate)
    D = q.shape[-1]
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    log_fgate = log_fgate.contiguous()
    for name, t in (("q", q), ("k", k), ("v", v)):
        # within one batch element the kernels index rows with int32 (batch and head offsets are int64)
        if t.shape[1] * t.stride(1) >= 2**31:
            raise ValueError(f"{name}: seq_len * H * D = {t.shape[1] * t.stride(1)} elements per batch element "
                             f"exceeds the kernel's int32 row indexing (< 2^31); split the heads into several calls")
    kstart, kend = row_bounds(q, k, cu_seqlens, seq_start)
    tables = (None, None)
    if adaptive_threshold is not None:
        tables = acp_tables_for(q, k, log_fgate, sm_scale, adaptive_threshold, acp_eps, qk_norm_weights,
                                options)[:2]
    o = attend(q, k, v, log_fgate, kstart, kend, sm_scale, *tables, options)
    if return_stats:
        bm, bn = fwd_tiles(q, k, v, kstart, options)
        grid = _acp.grid(D, options.acp_grid)
        lo = None if tables[0] is None else _acp.lo_for_tiling(tables[0], q.shape[1], *grid, bm, bn)
        return o, _acp.tile_stats(log_fgate, None, q.shape[1], bm, bn, lo=lo)
    return o
