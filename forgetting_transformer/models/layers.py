"""Building blocks shared by the models: RMSNorm, SwiGLU, KV-shift, and the Forgetting Attention layer."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import forgetting_attention


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 (bf16 sums of squares lose precision), return in the input dtype.
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


def mlp_hidden_size(d_model: int, ratio: float, multiple_of: int) -> int:
    """SwiGLU hidden width: ``ratio * d_model`` rounded up to a multiple of ``multiple_of``."""
    hidden = int(ratio * d_model)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.w_gate = nn.Linear(d_model, hidden, bias=False)
        self.w_up = nn.Linear(d_model, hidden, bias=False)
        self.w_down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class KVShift(nn.Module):
    """Data-dependent token shift: ``y_t = a_t * x_{t-1} + (1 - a_t) * x_t``, ``a_t = sigmoid(w . h_t)`` per head.

    ``x_{-1} = 0``: the first token of a sequence has nothing to mix in.
    """

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.proj = nn.Linear(d_model, n_heads, bias=False)

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # h (B, T, d_model) layer input; x (B, T, H, D) projected keys or values.
        alpha = torch.sigmoid(self.proj(h).float()).unsqueeze(-1)  # (B, T, H, 1)
        x_prev = F.pad(x, (0, 0, 0, 0, 1, 0))[:, :-1]  # (B, T, H, D) shifted right by one token
        return (alpha * x_prev.float() + (1 - alpha) * x.float()).to(x.dtype)


class ForgettingAttentionLayer(nn.Module):
    """Multi-head Forgetting Attention with the FoX (Pro) options, each a separate switch.

    Order inside the layer (as in the paper's Pro block): project q/k/v → KV-shift → QK-norm →
    forgetting attention with ``log f = logsigmoid(W_f x + b_f)`` → output norm → output gate → o_proj.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        head_dim: int,
        n_kv_heads: int,
        *,
        qk_norm: bool = False,
        output_gate: bool = False,
        output_norm: bool = False,
        kv_shift: bool = False,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=False)
        self.fgate_proj = nn.Linear(d_model, n_heads, bias=True)
        self.k_shift = KVShift(d_model, n_kv_heads) if kv_shift else None
        self.v_shift = KVShift(d_model, n_kv_heads) if kv_shift else None
        self.q_norm = RMSNorm(head_dim, norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, norm_eps) if qk_norm else None
        self.o_norm = RMSNorm(head_dim, norm_eps) if output_norm else None
        self.g_proj = nn.Linear(d_model, n_heads * head_dim, bias=False) if output_gate else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)  # (B, T, H, D)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)  # (B, T, Hkv, D)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        if self.k_shift is not None:
            k = self.k_shift(x, k)
            v = self.v_shift(x, v)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # The gate is computed in fp32: log f accumulates over thousands of tokens.
        log_fgate = F.logsigmoid(self.fgate_proj(x).float())  # (B, T, H)
        o = forgetting_attention(q, k, v, log_fgate)  # (B, T, H, D)
        if self.o_norm is not None:
            o = self.o_norm(o)
        if self.g_proj is not None:
            o = o * torch.sigmoid(self.g_proj(x)).view(B, T, self.n_heads, self.head_dim)
        return self.o_proj(o.reshape(B, T, self.n_heads * self.head_dim))
