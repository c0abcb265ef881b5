"""The public Forgetting Attention op: one function, dispatching on the device and the options.

CUDA bf16 / fp16 tensors run the kernels (``dispatch``: the Triton kernels of ``triton_kernels.py``, or on
Hopper the Gluon kernels of ``gluon_kernels.py``); CPU tensors, and fp32 on CUDA, run the PyTorch reference
(``reference.py``). ``AttentionOptions`` (``options.py``) steers the choice; triton is imported only when a kernel
is first launched, so importing this module needs no working triton.

Modules of the op: ``options`` (the options object), ``tiles`` (tile configs and their shared memory),
``autotune`` (launching a Triton kernel with a config), ``triton_launch`` / ``gluon_launch`` (the launchers),
``dispatch`` (the kernels chained, and the autograd layers), ``acp`` (ACP's grid, thresholds and tables in
PyTorch), ``reference`` (the PyTorch op), ``launchers`` (one stage at a time, for the kernel tools).
"""

from __future__ import annotations

import math

import torch

from . import acp as _acp
from . import dispatch as DP
from . import triton_launch as TL
from .options import AttentionOptions, default_options
from .reference import check_inputs, forgetting_attention_ref
from .tiles import MAX_HEAD_DIM

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
    if DP.eager(q, k, log_fgate):  # (see dispatch: eager calls skip the custom op's dispatch)
        return TL.acp_launch(q.detach(), k.detach(), log_fgate.detach(), sm_scale, mode, (GM, GN), delta,
                             thr_value, *gammas, log_eps)
    return DP.fox_acp_tables(q.detach(), k.detach(), log_fgate.detach(), sm_scale, mode, delta, thr_value, *gammas,
                             log_eps, GM, GN)


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
    if DP.eager(q, k, v, log_fgate):
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                        or log_fgate.requires_grad):
            o, _ = DP.FoxEager.apply(q, k, v, log_fgate, kstart, kend, sm_scale, *tables, options)
        else:  # (nothing to differentiate: the forward without autograd.Function's bookkeeping)
            o, _ = DP.fwd_impl(q, k, v, log_fgate, kstart, kend, sm_scale, *tables, options)
    else:
        o, _ = DP.fox_fwd(q, k, v, log_fgate, kstart, kend, sm_scale, *tables, options.token)
    if return_stats:
        bm, bn = DP.fwd_tiles(q, k, v, kstart, options)
        grid = _acp.grid(D, options.acp_grid)
        lo = None if tables[0] is None else _acp.lo_for_tiling(tables[0], q.shape[1], *grid, bm, bn)
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
    options: AttentionOptions | None = None,
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
            ACP grid (64 x 64 for D <= 128, ``acp.grid``) whose every decay ``c_i - c_j`` is below ``delta`` are
            pruned (skipped in the forward and both backward kernels; masked by the reference, which prunes the
            same region). Needs ``log_fgate <= 0``.
        return_stats: also return ``{"computed": (B, H), "pruned": (B, H)}`` tile counts of the forward kernel
            that runs (on Hopper at head dims 64 / 128 a warpgroup's 64 rows by 128 keys, else the Triton forward's
            fixed tiles); the reference counts tiles of the ACP grid.
        acp_eps: ACP's bound on the pruned attention weight per row (default ``e^-10``).
        qk_norm_weights: ``(gamma_q, gamma_k)`` QK-RMSNorm weights (``(D,)`` or ``(H, D)``) for ``"auto"``.
        backend: ``None`` (``options.backend``), ``"triton"`` or ``"reference"``: overrides the options' backend.
        options: the kernel choices (``AttentionOptions``); None: ``default_options()``.
    Returns:
        ``(B, Tq, H, D)`` in q's dtype (``(o, stats)`` with ``return_stats``). Differentiable w.r.t. q, k, v
        and log_fgate.
    """
    opts = default_options() if options is None else options
    if not isinstance(opts, AttentionOptions):
        raise TypeError(f"options must be an AttentionOptions; got {type(opts).__name__}")
    backend = opts.backend if backend is None else backend
    if backend is None:
        # fp32 on CUDA goes to the reference: the kernel's GPU configs are tuned and tested for bf16 / fp16;
        # pass backend="triton" to force it.
        backend = "triton" if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) else "reference"
    if backend == "triton":
        return forgetting_attention_triton(
            q, k, v, log_fgate, sm_scale=sm_scale, cu_seqlens=cu_seqlens, seq_start=seq_start,
            adaptive_threshold=adaptive_threshold, return_stats=return_stats, acp_eps=acp_eps,
            qk_norm_weights=qk_norm_weights, options=opts,
        )
    if backend != "reference":
        raise ValueError(f"backend must be None, 'triton' or 'reference'; got {backend!r}")
    # ACP on the reference prunes the region the kernel would prune on a GPU (the same grid)
    return forgetting_attention_ref(
        q, k, v, log_fgate, sm_scale=sm_scale, cu_seqlens=cu_seqlens, seq_start=seq_start,
        adaptive_threshold=adaptive_threshold, return_stats=return_stats, acp_eps=acp_eps,
        qk_norm_weights=qk_norm_weights, acp_grid=_acp.grid(q.shape[-1], opts.acp_grid),
    )
