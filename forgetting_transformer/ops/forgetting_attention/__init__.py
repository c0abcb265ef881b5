"""Forgetting Attention, the public op: ``forgetting_attention`` (shapes and defaults in its docstring) and the
options object that steers it.

CUDA bf16 / fp16 tensors run the kernels (``autograd.forgetting_attention_triton``: the Triton kernels of
``triton/``, or on Hopper the Gluon kernels of ``gluon/``); CPU tensors, and fp32 on CUDA, run the PyTorch
reference (``reference.py``). Triton is imported only when a kernel is first launched, so importing this package
needs no working triton.

The options are ``ops/options.py``'s ``AttentionOptions`` (every kernel choice, one typed object; importable
without torch, so the config schema derives from it). The package, each level importing only the levels below it:

    tiles.py  acp.py    tile configs and their shared memory; ACP's grid, thresholds and tables in PyTorch
    reference.py        the op in PyTorch: the oracle and the CPU path
    triton/             the Triton kernels (``kernels.py``) and their launchers with autotuning (``launch.py``)
    gluon/              the Hopper Gluon kernels and their launchers (on top of triton/'s helper kernels)
    autograd.py         the kernel path: one forward route, the custom ops and the eager autograd.Function
    __init__.py         this file: the public function
    stages.py           the kernels one stage at a time, for the kernel tools (``benchmarks/attention``)
"""

from __future__ import annotations

import torch

from . import acp as _acp
from . import autograd
from ..options import AttentionOptions, TileConfig, default_options, set_default_options, use_options
from .reference import forgetting_attention_naive, forgetting_attention_ref

__all__ = ["forgetting_attention", "forgetting_attention_ref", "forgetting_attention_naive", "AttentionOptions",
           "TileConfig", "default_options", "set_default_options", "use_options"]


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
        options: the kernel choices (``AttentionOptions``: the backend, autotuning, the Gluon kernels, the fused or
            deterministic backward, fixed tiles, ACP's grid); None: ``default_options()``, the process default or
            the innermost ``use_options`` block's.
    Returns:
        ``(B, Tq, H, D)`` in q's dtype (``(o, stats)`` with ``return_stats``). Differentiable w.r.t. q, k, v
        and log_fgate.
    """
    opts = default_options() if options is None else options
    if not isinstance(opts, AttentionOptions):
        raise TypeError(f"options must be an AttentionOptions; got {type(opts).__name__}")
    backend = opts.backend
    if backend is None:
        # fp32 on CUDA goes to the reference: the kernel's GPU configs are tuned and tested for bf16 / fp16;
        # pass backend="triton" to force it.
        backend = "triton" if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) else "reference"
    if backend == "triton":
        return autograd.forgetting_attention_triton(
            q, k, v, log_fgate, sm_scale=sm_scale, cu_seqlens=cu_seqlens, seq_start=seq_start,
            adaptive_threshold=adaptive_threshold, return_stats=return_stats, acp_eps=acp_eps,
            qk_norm_weights=qk_norm_weights, options=opts,
        )
    # ACP on the reference prunes the region the kernel would prune on a GPU (the same grid)
    return forgetting_attention_ref(
        q, k, v, log_fgate, sm_scale=sm_scale, cu_seqlens=cu_seqlens, seq_start=seq_start,
        adaptive_threshold=adaptive_threshold, return_stats=return_stats, acp_eps=acp_eps,
        qk_norm_weights=qk_norm_weights, acp_grid=_acp.grid(q.shape[-1], opts.acp_grid),
    )
