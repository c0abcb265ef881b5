"""Building blocks shared by the models: RMSNorm, SwiGLU, rotary embedding, KV-shift, forget gates, attention."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.forgetting_attention import forgetting_attention

FGATE_TYPES = ("data_dependent", "data_independent", "fixed", "none")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the layers' precision-sensitive steps (norms, gates, shifts, rotations) compute in: float32 for
    16-bit inputs, float64 for float64 ones. A plain ``.float()`` would round a float64 model's activations to
    float32 there, and float32 results differ by an ulp between vectorised and scalar CPU loops, so a float64
    model's cached decoding would no longer reproduce its full forward to float64 precision."""
    return torch.promote_types(dtype, torch.float32)


class RMSNorm(nn.Module):
    """RMSNorm over the last dim. ``heads=None``: one weight per feature, ``(dim,)``; ``heads=H``: a weight per head
    and feature, ``(H, dim)``, for inputs ``(..., H, dim)`` normalised head by head (the released FoX (Pro)'s
    output norm)."""

    def __init__(self, dim: int, eps: float = 1e-6, heads: int | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim) if heads is None else torch.ones(heads, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 or wider (bf16 sums of squares lose precision), return in the input dtype.
        dt = compute_dtype(x.dtype)
        if self.weight.dim() == 1:
            return F.rms_norm(x.to(dt), (x.shape[-1],), self.weight.to(dt), self.eps).to(x.dtype)
        return (F.rms_norm(x.to(dt), (x.shape[-1],), None, self.eps) * self.weight.to(dt)).to(x.dtype)


def mlp_hidden_size(d_model: int, ratio: float, multiple_of: int) -> int:
    """SwiGLU hidden width: ``ratio * d_model`` rounded up to a multiple of ``multiple_of``. With ``ratio = 2r/3``
    and ``multiple_of=256`` this is the official FoX code's ``256 * ceil(int(d * r * 2/3) / 256)`` for every width
    (r = 3.5 Pro, 4 LLaMA; tests/models/test_official.py checks it)."""
    hidden = int(ratio * d_model)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def mlp_width(cfg) -> int:
    """The decoder's SwiGLU hidden width: ``model.mlp_hidden_size`` when set, else the ratio rule above. Configs
    written before the key existed use the rule."""
    explicit = getattr(cfg, "mlp_hidden_size", None)
    return explicit if explicit is not None else mlp_hidden_size(cfg.d_model, cfg.mlp_hidden_ratio, cfg.mlp_multiple_of)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.w_gate = nn.Linear(d_model, hidden, bias=False)
        self.w_up = nn.Linear(d_model, hidden, bias=False)
        self.w_down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary position embedding (rotate-half convention) of x (B, T, H, D) at integer positions (T,) or (B, T)."""
    D = x.shape[-1]
    dt = compute_dtype(x.dtype)
    inv_freq = base ** (-torch.arange(0, D, 2, device=x.device, dtype=dt) / D)  # (D/2,)
    angles = positions.to(dt)[..., None] * inv_freq  # (T, D/2) or (B, T, D/2)
    if angles.dim() == 2:
        angles = angles[None]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[:, :, None, :]  # (B|1, T, 1, D)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[:, :, None, :]
    xf = x.to(dt)
    rotated = torch.cat([-xf[..., D // 2 :], xf[..., : D // 2]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class KVShift(nn.Module):
    """Data-dependent token shift: ``y_t = a_t * x_{t-1} + (1 - a_t) * x_t``, ``a_t = sigmoid(w . h_t)`` per head.

    ``x_{-1} = 0``: the first token of a sequence has nothing to mix in.
    """

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.proj = nn.Linear(d_model, n_heads, bias=False)

    def forward(self, h: torch.Tensor, x: torch.Tensor, x_last: torch.Tensor | None = None) -> torch.Tensor:
        # h (B, T, d_model) layer input; x (B, T, H, D) projected keys or values; x_last (B, 1, H, D): the
        # unshifted x of the token before x[:, 0] when decoding with a cache (None: x_{-1} = 0).
        dt = compute_dtype(x.dtype)
        alpha = torch.sigmoid(self.proj(h).to(dt)).unsqueeze(-1)  # (B, T, H, 1)
        if x_last is None:
            x_prev = F.pad(x, (0, 0, 0, 0, 1, 0))[:, :-1]  # (B, T, H, D) shifted right by one token
        else:
            x_prev = torch.cat([x_last, x[:, :-1]], dim=1)  # (B, T, H, D)
        return (alpha * x_prev.to(dt) + (1 - alpha) * x.to(dt)).to(x.dtype)


def decay_bias_init(n_heads: int, t_min: float, t_max: float) -> torch.Tensor:
    """Forget-gate biases whose decay time constants ``T_h = -1 / log sigmoid(b_h)`` are geometrically spaced
    from ``t_min`` to ``t_max`` over the heads. With these as fixed gates, the decay bias ``-(i - j) / T_h`` is
    exactly ALiBi with slopes ``1/t_min … 1/t_max``."""
    if n_heads == 1:
        t = torch.tensor([float(t_min)], dtype=torch.float64)
    else:
        t = t_min * (t_max / t_min) ** (torch.arange(n_heads, dtype=torch.float64) / (n_heads - 1))
    f = torch.exp(-1.0 / t)  # gate value with that time constant
    return torch.log(f) - torch.log1p(-f)  # logit(f), in float64 for t_max in the 1e5 range


class ForgetGate(nn.Module):
    """log f_t per head and token, (B, T, H) in ``compute_dtype``, for the three gate types of the paper:

    - ``data_dependent``: ``f = sigmoid(W_f x + b_f)``;
    - ``data_independent``: ``f = sigmoid(b_f)`` with trained ``b_f``;
    - ``fixed``: ``f = sigmoid(b_f)`` with ``b_f`` frozen at its initialisation (ALiBi).
    ``init_range = (T_min, T_max)`` initialises ``b_f`` with ``decay_bias_init`` (required for the last two).
    """

    def __init__(self, d_model: int, n_heads: int, kind: str, init_range=None):
        super().__init__()
        if kind not in FGATE_TYPES[:3]:
            raise ValueError(f"model.fgate={kind!r}: must be one of {FGATE_TYPES}")
        self.kind = kind
        self.init_range = tuple(init_range) if init_range is not None else None
        if kind == "data_dependent":
            self.proj = nn.Linear(d_model, n_heads, bias=True)
        elif kind == "data_independent":
            self.bias = nn.Parameter(torch.zeros(n_heads))
        else:
            self.register_buffer("bias", torch.zeros(n_heads))
        self.reset_bias()

    def reset_bias(self) -> None:
        bias = self.proj.bias if self.kind == "data_dependent" else self.bias
        with torch.no_grad():
            if self.init_range is None:
                bias.zero_()
            else:
                bias.copy_(decay_bias_init(bias.numel(), *self.init_range))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fp32 or wider: log f accumulates over thousands of tokens.
        if self.kind == "data_dependent":
            logits = self.proj(x)
            return F.logsigmoid(logits.to(compute_dtype(logits.dtype)))  # (B, T, H)
        return F.logsigmoid(self.bias.to(compute_dtype(self.bias.dtype))).expand(x.shape[0], x.shape[1], -1)


def left_padding(seq_start: torch.Tensor | None, past: int, T: int, device) -> torch.Tensor | None:
    """(B, T) bool: which of T new tokens, after ``past`` cached ones, lie before their row's ``seq_start`` (B,)
    (left padding); None without ``seq_start``."""
    if seq_start is None:
        return None
    return past + torch.arange(T, device=device) < seq_start[:, None]


class AttentionBase(nn.Module):
    """The submodules every attention layer shares (``Attention``; ``path.PathAttention``), built in one place.

    Registered in this order: ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``; the position encoding's own modules
    (``build_position``); ``fgate``; ``k_shift``, ``v_shift``; ``q_norm``, ``k_norm``; ``o_norm``; ``g_proj``
    (each switch None when off). The names are the state-dict keys of checkpoints and Hugging Face exports, and
    the order is the one in which a model's initialisation draws their weights, so neither may change.
    ``position`` holds the keyword arguments of ``build_position``.
    """

    def __init__(self, cfg, head_dim: int, n_heads: int, n_kv_heads: int, **position):
        super().__init__()
        d = cfg.d_model
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.q_proj = nn.Linear(d, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d, n_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d, n_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, d, bias=False)
        self.build_position(cfg, **position)
        self.fgate = None if cfg.fgate == "none" else ForgetGate(d, n_heads, cfg.fgate, cfg.fgate_init)
        self.k_shift = KVShift(d, n_kv_heads) if cfg.kv_shift else None
        self.v_shift = KVShift(d, n_kv_heads) if cfg.kv_shift else None
        # QK-norm weights are shared across heads (as in the released models); its eps may differ from norm_eps
        # (1e-5 in the official code). The output norm's weights are per head, or shared in configs of earlier
        # versions (model.output_norm_per_head=false). Keys missing from such configs keep their old meaning.
        qk_eps = getattr(cfg, "qk_norm_eps", None)
        qk_eps = cfg.norm_eps if qk_eps is None else qk_eps
        self.q_norm = RMSNorm(head_dim, qk_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(head_dim, qk_eps) if cfg.qk_norm else None
        o_heads = n_heads if getattr(cfg, "output_norm_per_head", False) else None
        self.o_norm = RMSNorm(head_dim, cfg.norm_eps, heads=o_heads) if cfg.output_norm else None
        self.g_proj = nn.Linear(d, n_heads * head_dim, bias=False) if cfg.output_gate else None

    def build_position(self, cfg, **position) -> None:
        """The position encoding's settings and submodules, registered after the four projections."""
        raise NotImplementedError

    def project_qkv(self, x: torch.Tensor, pad: torch.Tensor | None, shift_state: tuple | None):
        """x (B, T, d_model) → q (B, T, H, D) and k, v (B, T, Hkv, D) after KV-shift and QK-norm, and the
        unshifted (k, v) each (B, T, Hkv, D) for the next call's shift (None without KV-shift). ``pad`` (B, T):
        left-padding tokens (``left_padding``) or None; ``shift_state``: the cached unshifted (k, v) whose last
        token precedes x, or None (``x_{-1} = 0``)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)  # (B, T, H, D)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)  # (B, T, Hkv, D)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        unshifted = None
        if self.k_shift is not None:
            if pad is not None:
                # Zero the pads' unshifted k/v so the first real token mixes in x_{-1} = 0, as in an unpadded row.
                k, v = k.masked_fill(pad[:, :, None, None], 0.0), v.masked_fill(pad[:, :, None, None], 0.0)
            k_last, v_last = (None, None) if shift_state is None else (s[:, -1:] for s in shift_state)
            unshifted = (k, v)
            k, v = self.k_shift(x, k, k_last), self.v_shift(x, v, v_last)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v, unshifted

    def log_fgate(self, x: torch.Tensor, pad: torch.Tensor | None) -> torch.Tensor | None:
        """x (B, T, d_model) → log f (B, T, H) fp32 or wider (None without a forget gate), 0 at the pads ``pad``
        (B, T): pad gates cancel out of every c_i - c_j a real query sees, so zeroing them makes the cumulative
        sums identical to the unpadded row's."""
        if self.fgate is None:
            return None
        log_fgate = self.fgate(x)  # (B, T, H)
        return log_fgate if pad is None else log_fgate.masked_fill(pad[:, :, None], 0.0)

    def output(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """Per-head attention outputs o (B, T, H, D) → the layer's output (B, T, d_model): output norm, output
        gate (from the layer input x), o_proj."""
        B, T = x.shape[:2]
        if self.o_norm is not None:
            o = self.o_norm(o)
        if self.g_proj is not None:
            o = o * torch.sigmoid(self.g_proj(x)).view(B, T, self.n_heads, self.head_dim)
        return self.o_proj(o.reshape(B, T, self.n_heads * self.head_dim))


class Attention(AttentionBase):
    """Multi-head causal attention with every FoX / Transformer switch of the paper.

    Order inside the layer (the paper's Pro block): project q/k/v → KV-shift → QK-norm → RoPE →
    attention (Forgetting Attention when there is a forget gate, else softmax attention) → output norm →
    output gate → o_proj.
    """

    def __init__(self, cfg, head_dim: int, n_heads: int, n_kv_heads: int):
        super().__init__(cfg, head_dim, n_heads, n_kv_heads)
        # ACP: skip keys the forget gates have decayed past a weight bound (acp_eps per row); U from QK-norm weights
        self.acp = dict(adaptive_threshold="auto", acp_eps=cfg.acp_eps) if cfg.acp else {}

    def build_position(self, cfg) -> None:
        self.rope_base = cfg.rope_base if cfg.rope else None  # RoPE has no parameters

    def forward(self, x: torch.Tensor, *, cache: LayerCache | None = None, seq_start: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d_model) → (B, T, d_model). The keyword arguments are for inference (all None in training):

        - ``cache``: this layer's ``LayerCache``; x holds the tokens after the cached ones (queries attend to the
          cached keys plus their own), and the cache is extended with them. A cache with an ``attend(q, k, v,
          log_fgate)`` method computes the attention itself (``forgetting_transformer.inference``).
        - ``seq_start`` (B,): index, counted over cached + new tokens, of each row's first real token (left
          padding before it is masked as keys; pad queries give 0).
        - ``positions`` (T,) or (B, T): RoPE positions of the new tokens (default ``0 .. T-1``).
        """
        q, k, v, log_fgate = self.project(x, cache=cache, seq_start=seq_start, positions=positions)
        attend = getattr(cache, "attend", None)
        if attend is not None:  # a cache with its own attention over the cached keys (inference/: paged blocks)
            o = attend(q, k, v, log_fgate)  # (B, T, H, D)
        elif self.fgate is not None:
            acp = self.acp
            if acp and self.q_norm is not None:
                acp = dict(acp, qk_norm_weights=(self.q_norm.weight, self.k_norm.weight))
            o = forgetting_attention(q, k, v, log_fgate, seq_start=seq_start, **acp)  # (B, T, H, D)
        elif seq_start is None and q.shape[1] == k.shape[1]:  # no padding, no earlier keys (or an empty cache)
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                enable_gqa=self.n_kv_heads != self.n_heads,
            ).transpose(1, 2)  # (B, T, H, D)
        else:
            o = _masked_sdpa(q, k, v, seq_start)
        return self.output(x, o)

    def project(self, x: torch.Tensor, *, cache: LayerCache | None = None, seq_start: torch.Tensor | None = None,
                positions: torch.Tensor | None = None):
        """x (B, T, d_model) → the attention op's inputs: q (B, T, H, D); k, v (B, Tk, Hkv, D) and log f
        (B, Tk, H) fp32 or wider (None without a forget gate), Tk = cached + new tokens. Separate from ``forward``
        so that analyses (eval/gates) read exactly what the op receives."""
        T = x.shape[1]
        past = cache.get_seq_length() if cache is not None else 0
        pad = left_padding(seq_start, past, T, x.device)  # (B, T) or None
        # The unshifted (B, T, Hkv, D) k, v: LayerCache keeps the last token's for the next call; the Hugging Face
        # cache keeps every token's, so it can be cropped back to any length.
        q, k, v, shift_state = self.project_qkv(x, pad, cache.shift_state if cache is not None else None)
        if self.rope_base is not None:
            pos = torch.arange(T, device=x.device) if positions is None else positions
            q, k = apply_rotary(q, pos, self.rope_base), apply_rotary(k, pos, self.rope_base)
        log_fgate = self.log_fgate(x, pad)  # (B, T, H) or None
        if cache is not None:
            k, v, log_fgate = cache.update(k, v, log_fgate, shift_state)  # (B, Tk, Hkv, D) ×2, (B, Tk, H) | None
        return q, k, v, log_fgate


def _masked_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_start: torch.Tensor | None) -> torch.Tensor:
    """Causal softmax attention of q (B, Tq, H, D) aligned to the end of k, v (B, Tk, Hkv, D), keys before
    ``seq_start`` (B,) masked; like ``forgetting_attention``, query rows with no visible key give 0."""
    B, Tq, H, _ = q.shape
    Tk = k.shape[1]
    pos_k = torch.arange(Tk, device=q.device)
    pos_q = pos_k[Tk - Tq :]
    mask = (pos_k[None, :] <= pos_q[:, None])[None]  # (1, Tq, Tk)
    if seq_start is not None:
        mask = mask & (pos_k[None, None, :] >= seq_start[:, None, None])  # (B, Tq, Tk)
    visible = mask.any(dim=-1, keepdim=True)  # (B|1, Tq, 1)
    # A row with no visible key would softmax to NaN, and NaN * 0 would leak into later layers: let it see every
    # key, then zero its output.
    mask = (mask | ~visible)[:, None]  # (B|1, 1, Tq, Tk)
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, enable_gqa=k.shape[2] != H,
    ).transpose(1, 2)  # (B, Tq, H, D)
    return o * visible[:, :, :, None].to(o.dtype)


class LayerCache:
    """What one attention layer carries from earlier tokens to later ones when decoding incrementally.

    - ``keys``, ``values`` (B, Tk, Hkv, D): after KV-shift, QK-norm and RoPE, exactly as attention consumes them;
    - ``log_fgate`` (B, Tk, H) fp32 (None without a forget gate): per-token log forget gates; the attention op
      takes their cumulative sum, so the decay bias ``c_i - c_j`` of new queries against cached keys is the one
      the full forward computes;
    - ``shift_state`` ``(k, v)`` each (B, 1, Hkv, D) (None without KV-shift): the last token's projected keys and
      values before the shift, the ``x_{t-1}`` of the next token's shift.

    ``forgetting_transformer.hf.FoXCacheLayer`` is the Hugging Face ``Cache`` layer built on it.
    """

    def __init__(self):
        self.keys = self.values = self.log_fgate = self.shift_state = None

    def get_seq_length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[1]

    def update(self, k, v, log_fgate, shift_state):
        """Append the new tokens' k, v (B, T, Hkv, D) and log_fgate (B, T, H); return the full cached tensors.
        ``shift_state``: the new tokens' (k, v) before the KV-shift, each (B, T, Hkv, D), or None."""
        if self.keys is None:
            self.keys, self.values, self.log_fgate = k, v, log_fgate
        else:
            self.keys = torch.cat([self.keys, k], dim=1)
            self.values = torch.cat([self.values, v], dim=1)
            if log_fgate is not None:
                self.log_fgate = torch.cat([self.log_fgate, log_fgate], dim=1)
        self.shift_state = None if shift_state is None else tuple(s[:, -1:] for s in shift_state)
        return self.keys, self.values, self.log_fgate
