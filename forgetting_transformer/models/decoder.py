"""Decoder-only LM covering FoX and the Transformer baselines of the paper, every difference a config switch.

- FoX (LLaMA): pre-norm RMSNorm blocks, Forgetting Attention (``fgate=data_dependent``), SwiGLU, no RoPE.
- FoX (Pro): + QK-norm, output gate, output norm, KV-shift.
- Transformer (LLaMA) / (Pro): ``fgate=none`` with RoPE (softmax attention through SDPA).
- Ablations: ``fgate=data_independent|fixed`` with ``fgate_init=[T_min, T_max]``; FoX + RoPE (``rope=true``).
- PaTH / PaTH-FoX (``mixer=path``, without / with a forget gate): ``path.PathAttention`` in place of the attention,
  the same switches (docs/path.md).
Untied LM head; N(0, init_std) initialisation.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .layers import Attention, ForgetGate, LayerCache, RMSNorm, SwiGLU, mlp_width
from .path import PathAttention, PathCache


def resolve_heads(cfg) -> tuple[int, int, int]:
    """(head_dim, n_heads, n_kv_heads): ``n_heads`` defaults to ``d_model // head_dim`` so sweeping head_dim keeps
    the width; ``n_kv_heads`` defaults to ``n_heads`` (no GQA)."""
    n_heads = cfg.n_heads or cfg.d_model // cfg.head_dim
    return cfg.head_dim, n_heads, cfg.n_kv_heads or n_heads


def is_path(cfg) -> bool:
    """``model.mixer=path``; configs written before the key existed are softmax attention."""
    return getattr(cfg, "mixer", "softmax") == "path"


def token_mixer(cfg) -> nn.Module:
    """The attention layer ``model.mixer`` names: ``Attention`` (softmax) or ``PathAttention`` (path)."""
    if is_path(cfg):
        return PathAttention(cfg, *resolve_heads(cfg), w_rank=cfg.path_w_rank, conv_size=cfg.path_conv_size)
    return Attention(cfg, *resolve_heads(cfg))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = token_mixer(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, mlp_width(cfg))

    def forward(self, x, *, cache=None, seq_start=None, positions=None):
        x = x + self.attn(self.attn_norm(x), cache=cache, seq_start=seq_start, positions=positions)
        return x + self.mlp(self.mlp_norm(x))


VOCAB_ALIGN = 128  # LM-head rows are padded to a multiple of this for the matmul


def _chunk_loss(h, weight, labels, vocab_size):
    # (B*T, V) rows: cross_entropy over a transposed (B, V, T) view runs PyTorch's "spatial" softmax kernel,
    # which took half of a 760M training step at 16k context on an H200.
    logits = F.linear(h, weight)[..., :vocab_size].float()  # (B, t, V)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape)


def chunked_cross_entropy(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int,
                          chunk_loss=_chunk_loss) -> torch.Tensor:
    """Per-token loss (B, T) of ``logits = h @ weight.T`` without holding fp32 logits for the whole sequence:
    ``chunk`` tokens at a time, each chunk's logits recomputed in the backward pass. ``chunk_loss`` is the
    per-chunk function (``training/parallel.py`` passes a compiled one, which fuses the upcast and softmax)."""
    V = weight.shape[0]
    # A vocabulary that is not a multiple of 8 (GPT-2's 50,257) leaves the logits' rows unaligned, and cuBLAS
    # falls back to pre-Hopper kernels (3x slower on an H200; ~17% of a 760M step). Zero rows pad the matmul;
    # their logits are sliced off before the softmax, so the loss and gradients are unchanged.
    if V % VOCAB_ALIGN:
        weight = F.pad(weight, (0, 0, 0, -V % VOCAB_ALIGN))
    if h.shape[1] <= chunk:
        return chunk_loss(h, weight, labels, V)
    grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    parts = []
    for s in range(0, h.shape[1], chunk):
        args = (h[:, s : s + chunk], weight, labels[:, s : s + chunk], V)
        parts.append(checkpoint(chunk_loss, *args, use_reentrant=False) if grad else chunk_loss(*args))
    return torch.cat(parts, dim=1)


class CausalLM(nn.Module):
    """What every language model here shares: embedding → ``blocks`` → final norm → LM head, the token-id check,
    and the output (logits, or the chunked per-token loss). Subclasses pass their ``blocks`` and define
    ``hidden_states``. Submodules are registered in data-flow order, which ``reset_parameters`` initialises in."""

    def __init__(self, cfg, blocks: list[nn.Module]):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(blocks)
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.chunk_loss = _chunk_loss  # LM head + cross-entropy of one chunk; training may swap in a compiled one

    def forward(self, input_ids: torch.Tensor | None, labels: torch.Tensor | None = None, **inference) -> torch.Tensor:
        """input_ids (B, T) → per-token loss (B, T) in fp32 when labels are given, else logits (B, T, V).
        ``inference``: the keyword arguments of ``hidden_states``."""
        h = self.hidden_states(input_ids, **inference)
        if labels is None:
            return self.lm_head(h)  # (B, T, V)
        return chunked_cross_entropy(h, self.lm_head.weight, labels, self.cfg.loss_chunk, self.chunk_loss)  # (B, T)

    def check_token_ids(self, input_ids: torch.Tensor) -> None:
        """Token ids must be in [0, vocab_size): the embedding would raise an IndexError naming neither."""
        if not input_ids.numel():
            return
        low, high = (int(v) for v in torch.aminmax(input_ids))
        if low < 0:
            raise ValueError(f"token id {low} < 0: token ids must be in [0, model.vocab_size={self.cfg.vocab_size})")
        if high >= self.cfg.vocab_size:
            raise ValueError(f"token id {high} >= model.vocab_size={self.cfg.vocab_size}")


class DecoderLM(CausalLM):
    def __init__(self, cfg):
        super().__init__(cfg, [Block(cfg) for _ in range(cfg.n_layers)])
        self.reset_parameters()

    def reset_parameters(self):
        """N(0, init_std) for every linear, embedding and convolution (PaTH's) weight, zero biases, unit norm
        weights; forget-gate biases zero or from ``fgate_init``."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding, nn.Conv1d)):
                nn.init.normal_(m.weight, mean=0.0, std=self.cfg.init_std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)
        for m in self.modules():
            if isinstance(m, ForgetGate):
                m.reset_bias()

    def new_cache(self) -> list[LayerCache | PathCache]:
        """Empty per-block decoding caches for ``forward(..., cache=...)`` (``PathCache`` for PaTH)."""
        return [PathCache() if is_path(self.cfg) else LayerCache() for _ in self.blocks]

    def hidden_states(self, input_ids: torch.Tensor | None, *, inputs_embeds: torch.Tensor | None = None, cache=None,
                      seq_start: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids (B, T) → final-norm hidden states (B, T, d_model), the LM head's input.

        inputs_embeds (B, T, d_model): the blocks' input instead of ``embed(input_ids)`` (pass ``input_ids=None``),
            e.g. soft prompts or another model's embeddings.

        Inference only (None in training):
            cache: one ``LayerCache`` per block; input_ids are the tokens after the cached ones, and the caches
                are extended with them (prefill: empty caches, any T; decode: T = 1; chunked prefill: any T).
            seq_start: (B,) index, over cached + new tokens, of each row's first real token (left padding).
            positions: (T,) or (B, T) RoPE positions; default: counted from each row's first real token.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds; got "
                             + ("both" if input_ids is not None else "neither"))
        if inputs_embeds is not None:
            if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != self.cfg.d_model:
                raise ValueError(f"inputs_embeds must be (batch, seq_len, d_model={self.cfg.d_model}); "
                                 f"got shape {tuple(inputs_embeds.shape)}")
            finite = torch.isfinite(inputs_embeds).all(-1)  # (B, T)
            if not bool(finite.all()):
                b, t = (int(i) for i in (~finite).nonzero()[0])
                raise ValueError(f"inputs_embeds must be finite; row {b}, position {t} holds NaN or inf")
        else:
            self.check_token_ids(input_ids)
        if cache is not None and len(cache) != len(self.blocks):
            raise ValueError(f"cache has {len(cache)} layers; the model has {len(self.blocks)}")
        past = cache[0].get_seq_length() if cache is not None else 0
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, d_model)
        if positions is None and (past or seq_start is not None):
            positions = past + torch.arange(x.shape[1], device=x.device)  # (T,)
            if seq_start is not None:
                positions = (positions[None] - seq_start[:, None]).clamp(min=0)  # (B, T); pads at 0
        for i, block in enumerate(self.blocks):
            x = block(x, cache=None if cache is None else cache[i], seq_start=seq_start, positions=positions)
        return self.norm(x)
