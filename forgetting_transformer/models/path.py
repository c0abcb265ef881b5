"""PaTH attention and PaTH-FoX: a drop-in alternative to ``layers.Attention`` with the same switches.

PaTH (Yang et al. 2025) encodes position by accumulating data-dependent Householder-like transforms
``H_t = I - beta_t w_t w_t^T`` between each key and query (``ops/path/reference.py`` has the formulas); with a
forget gate it is PaTH-FoX, which adds FoX's decay bias ``c_i - c_j``. Per token and kv head the layer computes

- ``w_t``: a low-rank projection of the layer input (``d_model -> w_rank -> Hkv * D``), a causal depthwise
  convolution of width ``conv_size`` with SiLU, then L2 normalisation per head (float32, float64 in a float64
  model);
- ``beta_t = 2 * sigmoid(b_proj(x_t))`` in ``(0, 2)`` (as w): beyond 1 the transform has a negative eigenvalue.

Order inside the layer: project q/k/v → KV-shift → QK-norm → PaTH attention (with the forget gate's ``log f`` when
there is one) → output norm → output gate → o_proj, as in ``Attention`` but with no RoPE: the transforms carry
the positional information. ACP is not available (fla's kernel has no pruning).

The attention runs through flash-linear-attention's ``parallel_path_attn`` (``backend="triton"``, the default on
CUDA) or through ``path_attention_ref`` (``backend="reference"``, the default elsewhere). Decoding with a
``PathCache`` follows fla: each new token's transform is applied to every cached key, so a new query attends to the
cache with plain (gated) softmax attention.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.forgetting_attention import forgetting_attention
from ..ops.options import default_options, interpreting
from ..ops.path import path_attention_ref, path_transform_keys
from .fla_import import INSTALL_HINT, import_fla, quiet_fla
from .layers import AttentionBase, compute_dtype, left_padding

BACKENDS = (None, "triton", "reference")
KERNEL_HEAD_DIMS = (16, 32, 64, 128)  # parallel_path_attn's supported head dims
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@functools.cache
def _parallel_path_attn():
    """fla's ``parallel_path_attn``, imported once through the models' fla importer (``fla_import``)."""
    try:
        import_fla()
    except ImportError as e:
        raise ImportError(f"PaTH's Triton backend runs fla's parallel_path_attn: {INSTALL_HINT}") from e
    with quiet_fla():
        from fla.ops.path_attn.parallel import parallel_path_attn
    return parallel_path_attn


@torch.compiler.disable
def _fla_path_attn(q, k, v, w, beta, g, *, scale: float, use_cache: bool):
    """fla's kernel outside torch.compile's graph. fla disables compile on ``parallel_path_attn`` itself, but the
    first call also imports fla, and Dynamo cannot trace the import (fla's version checks at import time)."""
    return _parallel_path_attn()(q, k, v, w, beta, g, scale=scale, use_cache=use_cache)


class PathCache:
    """What one PaTH layer carries from earlier tokens to later ones when decoding incrementally.

    - ``keys`` (B, Tk, Hkv, D) float32 (float64 for a float64 model): the cached keys after QK-norm, each already
      transformed by every later token's ``H_t``, so they are exactly what the next query attends to. Kept in
      float32 because every decoded token rewrites all of them, and rounding to bf16 at each rewrite would
      accumulate;
    - ``values`` (B, Tk, Hkv, D) after KV-shift;
    - ``log_fgate`` (B, Tk, H) fp32 or wider (None without a forget gate);
    - ``conv_state`` (B, conv_size - 1, Hkv * D): the last tokens' inputs to the convolution of ``w``;
    - ``shift_state`` ``(k, v)`` each (B, 1, Hkv, D) (None without KV-shift): the last token's unshifted k, v.
    """

    def __init__(self):
        self.keys = self.values = self.log_fgate = self.conv_state = self.shift_state = None

    def get_seq_length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[1]


class PathInputs(NamedTuple):
    """The attention inputs of the new tokens (``PathAttention.project``) and the states the cache keeps."""

    q: torch.Tensor  # (B, T, H, D)
    k: torch.Tensor  # (B, T, Hkv, D)
    v: torch.Tensor  # (B, T, Hkv, D)
    w: torch.Tensor  # (B, T, Hkv, D) unit norm, float32 or wider
    beta: torch.Tensor  # (B, T, Hkv) in (0, 2), float32 or wider
    log_fgate: torch.Tensor | None  # (B, T, H) fp32 or wider
    conv_state: torch.Tensor  # (B, conv_size - 1, Hkv * D)
    shift_state: tuple | None  # unshifted (k, v) of the last token, each (B, 1, Hkv, D)


class PathAttention(AttentionBase):
    """Multi-head causal PaTH attention (PaTH-FoX with a forget gate) with the Pro switches of ``Attention``.

    ``cfg`` is the model config (``d_model``, ``fgate``, ``fgate_init``, ``qk_norm``, ``output_gate``,
    ``output_norm``, ``kv_shift``, ``norm_eps``; ``rope`` and ``acp`` must be false); the submodules of those
    switches come from ``AttentionBase``, the PaTH ones (``w_proj``, ``w_conv``, ``b_proj``) from
    ``build_position``. Keyword arguments:

    - ``w_rank``: rank of the projection that produces ``w`` (default 32, fla's choice); None: a full
      ``d_model x Hkv * D`` projection;
    - ``conv_size``: width of the causal convolution over ``w`` (default 3, fla's);
    - ``backend``: None (the attention options' ``backend`` if set, i.e. a run's ``model.attention.backend``;
      else fla's kernel on CUDA, the reference otherwise), ``"triton"`` or ``"reference"``.
    """

    def __init__(self, cfg, head_dim: int, n_heads: int, n_kv_heads: int, *, w_rank: int | None = 32,
                 conv_size: int = 3, backend: str | None = None):
        if cfg.rope:
            raise ValueError("PaTH attention takes no RoPE (model.rope must be false): its Householder transforms "
                             "carry the positional information")
        if cfg.acp:
            raise ValueError("model.acp is not available with PaTH attention: fla's kernel has no pruning")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
        if conv_size < 1 or (w_rank is not None and w_rank < 1):
            raise ValueError(f"conv_size and w_rank must be >= 1 (w_rank None: full rank); got {conv_size}, {w_rank}")
        super().__init__(cfg, head_dim, n_heads, n_kv_heads, w_rank=w_rank, conv_size=conv_size)
        self.backend = backend

    def build_position(self, cfg, *, w_rank: int | None, conv_size: int) -> None:
        """The transforms' parameters: ``w_proj`` and ``w_conv`` for w, ``b_proj`` for beta."""
        d, kv_dim = cfg.d_model, self.n_kv_heads * self.head_dim
        self.conv_size = conv_size
        # Low rank by default: a full projection would add d_model x Hkv*D parameters per layer.
        self.w_proj = (nn.Linear(d, kv_dim, bias=False) if w_rank is None
                       else nn.Sequential(nn.Linear(d, w_rank, bias=False), nn.Linear(w_rank, kv_dim, bias=False)))
        self.w_conv = nn.Conv1d(kv_dim, kv_dim, conv_size, groups=kv_dim, bias=False)  # depthwise, causal by padding
        self.b_proj = nn.Linear(d, self.n_kv_heads, bias=True)

    def forward(self, x: torch.Tensor, *, cache: PathCache | None = None, seq_start: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d_model) → (B, T, d_model); the keyword arguments are for inference, as in ``Attention``:

        - ``cache``: this layer's ``PathCache``. Empty: the T tokens are attended in parallel and the cache is
          filled; otherwise the new tokens are decoded one at a time against it. Either way it is extended.
        - ``seq_start`` (B,): index, over cached + new tokens, of each row's first real token (left padding is
          masked as keys; pad queries give 0). fla's kernel has no mask: its parallel pass runs each padded row
          alone on its real tokens.
        - ``positions``: accepted for the decoder's signature and unused: without RoPE, nothing in the layer
          depends on absolute positions.
        """
        past = cache.get_seq_length() if cache is not None else 0
        inp = self.project(x, cache=cache, seq_start=seq_start)
        if past == 0:
            o, keys = self.attend(inp, seq_start=seq_start, return_keys=cache is not None)  # (B, T, H, D)
            if cache is not None:
                cache.keys, cache.values, cache.log_fgate = keys, inp.v, inp.log_fgate
        else:
            o = self._decode(inp, cache, seq_start)  # (B, T, H, D)
        if cache is not None:
            cache.conv_state, cache.shift_state = inp.conv_state, inp.shift_state
        return self.output(x, o)

    def project(self, x: torch.Tensor, *, cache: PathCache | None = None,
                seq_start: torch.Tensor | None = None) -> PathInputs:
        """x (B, T, d_model) → the new tokens' attention inputs (``PathInputs``); reads the cache's convolution
        and shift states, writes nothing."""
        T = x.shape[1]
        pad = left_padding(seq_start, cache.get_seq_length() if cache is not None else 0, T, x.device)  # (B, T)
        q, k, v, unshifted = self.project_qkv(x, pad, cache.shift_state if cache is not None else None)
        shift_state = None if unshifted is None else tuple(s[:, -1:] for s in unshifted)
        w, conv_state = self._householder_vectors(x, pad, cache.conv_state if cache is not None else None)
        # float32 as the kernel wants (float64 in a float64 model)
        beta = 2.0 * torch.sigmoid(self.b_proj(x).to(compute_dtype(x.dtype)))  # (B, T, Hkv) in (0, 2)
        return PathInputs(q, k, v, w, beta, self.log_fgate(x, pad), conv_state, shift_state)

    def _householder_vectors(self, x: torch.Tensor, pad: torch.Tensor | None, conv_state: torch.Tensor | None):
        """x (B, T, d_model) → (w (B, T, Hkv, D) unit norm per head in float32 or wider, the new conv_state
        (B, conv_size - 1, Hkv * D)): projection, causal convolution continuing ``conv_state``, SiLU, L2 norm."""
        B, T, _ = x.shape
        u = self.w_proj(x)  # (B, T, Hkv * D)
        if pad is not None:  # the first real token's convolution window sees zeros, as in an unpadded row
            u = u.masked_fill(pad[:, :, None], 0.0)
        if conv_state is None:
            conv_state = u.new_zeros(B, self.conv_size - 1, u.shape[-1])
        u = torch.cat([conv_state.to(u.dtype), u], dim=1)  # (B, conv_size - 1 + T, Hkv * D)
        w = F.silu(F.conv1d(u.transpose(1, 2), self.w_conv.weight, groups=u.shape[-1]).transpose(1, 2))
        w = w.view(B, T, self.n_kv_heads, self.head_dim).to(compute_dtype(x.dtype))
        return F.normalize(w, dim=-1), u[:, T:]  # (B, T, Hkv, D); the last conv_size - 1 inputs

    def _resolve_backend(self, q: torch.Tensor) -> str:
        # the layer's own choice, else the run's model.attention.backend (the attention options in force)
        backend = self.backend or default_options().backend
        if backend is None:
            backend = "triton" if q.is_cuda and q.dtype in KERNEL_DTYPES else "reference"
        if backend == "triton" and not (q.is_cuda or interpreting()):
            raise RuntimeError("PaTH backend='triton' runs fla's Triton kernel, which needs a CUDA tensor or the "
                               "Triton interpreter (TRITON_INTERPRET=1 set before Python starts); "
                               "backend='reference' runs on any device")
        return backend

    def attend(self, inp: PathInputs, *, seq_start: torch.Tensor | None = None, return_keys: bool = False):
        """PaTH attention of the new tokens among themselves → (o (B, T, H, D), keys): ``keys`` (B, T, Hkv, D)
        float32 or wider are the keys transformed by every later transform (the cache after these tokens) when
        ``return_keys``, else None."""
        q, k, v, w, beta, log_fgate = inp[:6]
        if self._resolve_backend(q) == "reference":
            o = path_attention_ref(q, k, v, w, beta, log_fgate, seq_start=seq_start)
            return o, path_transform_keys(k, w, beta) if return_keys else None
        if seq_start is not None:
            return self._attend_rows(inp, seq_start, return_keys)
        if self.head_dim not in KERNEL_HEAD_DIMS or q.dtype not in KERNEL_DTYPES:
            raise ValueError(f"fla's PaTH kernel needs head_dim in {KERNEL_HEAD_DIMS} and q/k/v in {KERNEL_DTYPES};"
                             f" got head_dim={self.head_dim}, {q.dtype}")
        scale = 1.0 / math.sqrt(self.head_dim)
        # fla scales the decay bias together with the scores, (q.k + g_i - g_j) * scale; FoX's bias is unscaled.
        g = None if log_fgate is None else log_fgate.float() / scale
        o, keys = _fla_path_attn(q, k, v, w.float(), beta.float(), g, scale=scale, use_cache=return_keys)
        return o, None if keys is None else keys.float()

    def _attend_rows(self, inp: PathInputs, seq_start: torch.Tensor, return_keys: bool):
        """Left-padded rows through fla's kernel, which has no padding mask: each row alone on its real tokens (the
        projections already treated the pads as absent), as the reference masks them. Pad queries give 0; pad
        keys are 0 (decoding masks them by seq_start) → (o (B, T, H, D), keys (B, T, Hkv, D) float32 or None)."""
        o = torch.zeros_like(inp.q)
        keys = torch.zeros(inp.k.shape, dtype=torch.float32, device=inp.k.device) if return_keys else None
        for b, start in enumerate(seq_start.tolist()):
            if start >= o.shape[1]:
                continue  # all padding
            row = PathInputs(*(None if t is None else t[b : b + 1, start:] for t in inp[:6]), None, None)
            o_b, keys_b = self.attend(row, return_keys=return_keys)
            o[b : b + 1, start:] = o_b
            if keys is not None:
                keys[b : b + 1, start:] = keys_b
        return o, keys

    def _decode(self, inp: PathInputs, cache: PathCache, seq_start: torch.Tensor | None) -> torch.Tensor:
        """The new tokens, one at a time, against the cache (extended in place) → o (B, T, H, D). Token t first
        applies ``H_t = I - beta_t w_t w_t^T`` to every cached key, then attends to them and its own key with
        plain (gated) softmax attention."""
        keys, values, gates = cache.keys, cache.values, cache.log_fgate
        outs = []
        for t in range(inp.q.shape[1]):
            w = inp.w[:, t : t + 1].to(keys.dtype)  # (B, 1, Hkv, D)
            beta = inp.beta[:, t : t + 1, :, None].to(keys.dtype)  # (B, 1, Hkv, 1)
            keys = keys - beta * (keys * w).sum(-1, keepdim=True) * w  # (B, Tk, Hkv, D): H_t k_j for every j < t
            keys = torch.cat([keys, inp.k[:, t : t + 1].to(keys.dtype)], dim=1)
            values = torch.cat([values, inp.v[:, t : t + 1]], dim=1)
            if gates is not None:
                gates = torch.cat([gates, inp.log_fgate[:, t : t + 1]], dim=1)  # (B, Tk, H)
            q = inp.q[:, t : t + 1]  # (B, 1, H, D)
            log_f = gates if gates is not None else q.new_zeros(q.shape[0], keys.shape[1], self.n_heads,
                                                                 dtype=compute_dtype(q.dtype))  # no gate: softmax
            outs.append(forgetting_attention(q, keys.to(q.dtype), values, log_f, seq_start=seq_start))
        cache.keys, cache.values, cache.log_fgate = keys, values, gates
        return torch.cat(outs, dim=1)
