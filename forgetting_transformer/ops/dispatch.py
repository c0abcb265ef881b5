"""The op's kernels chained into a forward and a backward, and the autograd layers over them.

``fwd_impl`` / ``bwd_impl`` pick the kernels per call (``gluon_launch.use_sm90`` / ``use_fused_bwd``: the Gluon
kernels on Hopper where they apply, the Triton kernels elsewhere) under an ``AttentionOptions``. Two autograd
layers call them: the ``torch.library`` custom ops ``forgetting_transformer::fox_fwd`` / ``fox_bwd`` /
``fox_acp_tables``, with fake (meta) implementations and ``register_autograd``, so that ``torch.compile`` traces
the op without graph breaks (the options travel as ``AttentionOptions.token``); and ``FoxEager``, an
``autograd.Function`` over the same functions for eager calls, which skips torch.library's dispatch
(redispatch, default filling, dynamo-disable wrappers: ~100 us of host time per op call, more than the kernels
take at small shapes).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import acp as _acp
from . import gluon_launch as GL
from . import tiles
from . import triton_launch as TL
from .options import from_token
from .tiles import cdiv, padded_head_dim


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
    """ACP's (lo, hi, delta) on the grid (grid_m, grid_n) (see ``triton_launch.acp_launch``)."""
    return TL.acp_launch(q, k, log_fgate, sm_scale, mode, (grid_m, grid_n), delta, thr_value, gamma_q, gamma_k,
                         log_eps)


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
