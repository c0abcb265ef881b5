"""Forgetting Transformer (FoX): a decoder-only LM with Forgetting Attention and no positional embedding.

FoX (LLaMA) = pre-norm RMSNorm blocks, Forgetting Attention, SwiGLU MLP, untied LM head.
FoX (Pro)   = the same plus QK-norm, output gate, output norm and KV-shift (each a ModelConfig switch).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import ModelConfig
from .layers import ForgettingAttentionLayer, RMSNorm, SwiGLU, mlp_hidden_size


class FoXBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, head_dim: int, n_kv_heads: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = ForgettingAttentionLayer(
            cfg.d_model, cfg.n_heads, head_dim, n_kv_heads,
            qk_norm=cfg.qk_norm, output_gate=cfg.output_gate, output_norm=cfg.output_norm,
            kv_shift=cfg.kv_shift, norm_eps=cfg.norm_eps,
        )
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, mlp_hidden_size(cfg.d_model, cfg.mlp_hidden_ratio, cfg.mlp_multiple_of))

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class FoXModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        head_dim = cfg.head_dim or cfg.d_model // cfg.n_heads
        n_kv_heads = cfg.n_kv_heads or cfg.n_heads
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(FoXBlock(cfg, head_dim, n_kv_heads) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self):
        """N(0, init_std) for every linear and embedding weight, zero biases, unit norm weights."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=self.cfg.init_std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids (B, T) → per-token loss (B, T) in fp32 when labels are given, else logits (B, T, V)."""
        if input_ids.numel() and int(input_ids.max()) >= self.cfg.vocab_size:
            raise ValueError(f"token id {int(input_ids.max())} >= model.vocab_size={self.cfg.vocab_size}")
        x = self.embed(input_ids)  # (B, T, d_model)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.norm(x))  # (B, T, V)
        if labels is None:
            return logits
        return F.cross_entropy(logits.float().transpose(1, 2), labels, reduction="none")  # (B, T)
