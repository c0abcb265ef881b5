"""Public Forgetting Attention op: one function, dispatching on the device.

CUDA tensors go to the Triton kernel once it exists (issue 3); until then, and always on CPU, the plain-PyTorch
reference computes it. The dispatch lives here and only here.
"""

from __future__ import annotations

import torch

from .reference import forgetting_attention_ref


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
) -> torch.Tensor:
    """Causal softmax attention with a forget gate: ``o_i = sum_j softmax_j(q_i.k_j*s + c_i - c_j) v_j``.

    Args:
        q: ``(B, Tq, H, D)`` queries.
        k, v: ``(B, Tk, Hkv, D)``; ``Hkv`` divides ``H`` (GQA/MQA); ``Tq <= Tk``, queries aligned to the end.
        log_fgate: ``(B, Tk, H)`` float32 log forget gates (``<= 0``); ``c = cumsum(log_fgate)``.
        sm_scale: defaults to ``1 / sqrt(D)``.
        cu_seqlens: ``(N + 1,)`` document boundaries of a packed ``B = 1`` batch.
        seq_start: ``(B,)`` first real key of each sequence (left padding).
        adaptive_threshold, return_stats: Adaptive Computation Pruning (kernel only).
    Returns:
        ``(B, Tq, H, D)`` in q's dtype.
    """
    return forgetting_attention_ref(
        q, k, v, log_fgate, sm_scale=sm_scale, cu_seqlens=cu_seqlens, seq_start=seq_start,
        adaptive_threshold=adaptive_threshold, return_stats=return_stats,
    )
