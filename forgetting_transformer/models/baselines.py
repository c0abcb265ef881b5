"""The paper's recurrent and local-attention baselines, with their token mixers from flash-linear-attention (fla).

Every baseline is a ``CausalLM`` like ``DecoderLM`` (models/decoder.py) around a different token mixer: untied
embedding and LM head, pre-norm RMSNorm residual blocks, our SwiGLU MLP, a final RMSNorm, N(0, init_std) weights,
the per-token loss from ``chunked_cross_entropy``. ``model.arch`` picks the mixer (docs/baselines.md has the
paper's settings):

- ``fla_mamba2``: Mamba-2 (fla ``Mamba2``), no MLP, so ``2 * model.n_layers`` blocks (the paper's 24/48/48);
  the SSD scan runs on fla's GLA kernels (``_mamba2_ssd_class``).
- ``fla_deltanet``: DeltaNet (fla ``DeltaNet``: short convolutions, L2-normalised SiLU q/k, β, output norm).
- ``fla_hgrn2``: HGRN2 (fla ``HGRN2Attention``), state expansion ``model.linear_head_dim``.
- ``fla_samba``: Samba: Mamba (fla ``Mamba``) and sliding-window attention layers alternating, each followed by
  a SwiGLU MLP (``model.mamba_mlp_hidden_ratio`` after Mamba, ``model.mlp_hidden_ratio`` after attention).
- ``fla_swa``: a Transformer (LLaMA) whose attention sees only the last ``model.window_size`` keys (fla's
  ``parallel_attn`` Triton kernel with RoPE).

fla is imported only when one of these models is built, so ``forgetting_transformer.models`` works without it.
fla's kernels are Triton: on a CPU they run only under the Triton interpreter (``TRITON_INTERPRET=1`` set before
Python starts; slow, meant for tests). These models have no decoding cache: ``generate`` is not supported.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from .decoder import CausalLM
from .fla_import import import_fla, interpreting, quiet_fla
from .layers import RMSNorm, SwiGLU, apply_rotary, mlp_hidden_size

FLA_ARCHS = ("fla_mamba2", "fla_deltanet", "fla_hgrn2", "fla_samba", "fla_swa")
def _recurrent_mode() -> bool:
    """fla's chunked kernels (``chunk_fwd_h``: chunk_simple_gla, chunk_gla, chunk_delta_rule) fail under the
    Triton interpreter (a cast on a loop index that is a Python int there), so on the CPU the same recurrences run
    through fla's fused_recurrent kernels, which it also uses itself for sequences of <= 64 tokens. On a GPU the
    chunked kernels (the fast training path) run; scripts/gpu_baselines.sh checks they agree."""
    return interpreting()


def _inverse_softplus_dt(n: int, dt_min: float, dt_max: float, floor: float, device) -> torch.Tensor:
    """Bias b with softplus(b) = dt, dt log-uniform in [dt_min, dt_max] (the Mamba time-step init)."""
    dt = torch.exp(torch.rand(n, device=device) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    dt = dt.clamp(min=floor)
    return dt + torch.log(-torch.expm1(-dt))


@functools.cache
def _mamba2_ssd_class():
    """fla's ``Mamba2`` layer with its training forward pass replaced.

    fla's Mamba2 runs its fast path only with the ``mamba_ssm`` CUDA package; otherwise it falls back to a naive
    SSD that materialises a (chunks, chunk, chunk, heads, state) tensor: ~100 GB per layer at the 760M size and
    16k tokens. Mamba-2's SSD with one group is gated linear attention with a scalar per-head decay:
    ``S_t = exp(dt_t A) S_{t-1} + B_t^T (dt_t x_t)``, ``y_t = C_t S_t + D x_t``, so fla's ``chunk_simple_gla``
    computes it (q = C, k = B, v = dt x, log decay g = dt A). Under the Triton interpreter (see
    ``_recurrent_mode``) and for fp32 inputs it runs ``fused_recurrent_simple_gla`` instead (the same recurrence,
    step by step, exact in fp32); bf16 (training, autocast) runs the chunked kernel. Parameters are fla's.

    ``ssd_kernel="gla"`` runs the same scan through fla's GLA kernels instead (``chunk_gla`` /
    ``fused_recurrent_gla``), with the scalar decay repeated over the state dimension: the same recurrence, other
    kernels. On Hopper GPUs fla's gated ``simple_gla`` backward is wrong with triton < 3.7.1 (fla refuses it) and
    crashes at 2k-token sequences with 3.7.1 (triton-lang/triton#11366), so ``"auto"`` picks ``"gla"`` there.
    """
    fla = import_fla()

    class Mamba2SSD(fla["layers"].Mamba2):
        def __init__(self, *args, ssd_kernel: str = "auto", **kwargs):
            super().__init__(*args, **kwargs)
            self.ssd_kernel = ssd_kernel

        def _scan(self, q, k, v, log_decay):
            """q, k (B, T, H, N), v (B, T, H, P), log_decay (B, T, H) fp32 → y (B, T, H, P)."""
            kernel = self.ssd_kernel
            if kernel == "auto":
                kernel = "gla" if v.is_cuda and torch.cuda.get_device_capability(v.device)[0] == 9 else "simple_gla"
            # fp32 (tests, exact evaluation) runs the recurrent kernels: fla's chunked GLA kernels fault with fp32
            # inputs on Hopper ("misaligned address" in chunk_gla_fwd_o_gk, triton 3.6); training is bf16
            recurrent = _recurrent_mode() or v.dtype == torch.float32
            prefix = "fused_recurrent_" if recurrent else "chunk_"
            if kernel == "simple_gla":
                return fla[prefix + "simple_gla"](q, k, v, g=log_decay, scale=1.0)[0]
            gk = log_decay[..., None].expand(q.shape).contiguous()  # (B, T, H, N): one decay for every state row
            if recurrent:
                return fla["fused_recurrent_gla"](q, k, v, gk=gk, scale=1.0)[0]
            return fla["chunk_gla"](q, k, v, g=gk, scale=1.0)[0]

        def forward(self, hidden_states: torch.Tensor, **unused) -> torch.Tensor:
            B, T, _ = hidden_states.shape
            H, P, N = self.num_heads, self.head_dim, self.ssm_state_size
            gate, xbc, dt = self.in_proj(hidden_states).split([self.intermediate_size, self.conv_dim, H], dim=-1)
            xbc = self.act(self.conv1d(xbc.transpose(1, 2))[..., :T].transpose(1, 2))  # causal depthwise conv
            x, b, c = xbc.split([self.intermediate_size, N, N], dim=-1)  # one group: B, C shared by all heads
            dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(*self.dt_limit)  # (B, T, H)
            log_decay = dt * -torch.exp(self.A_log.float())  # (B, T, H), dt * A with A < 0
            x = x.reshape(B, T, H, P)
            v = (x.float() * dt[..., None]).to(x.dtype)
            q = c[:, :, None, :].expand(B, T, H, N)
            k = b[:, :, None, :].expand(B, T, H, N)
            y = self._scan(q.contiguous(), k.contiguous(), v, log_decay)
            y = y + x * self.D.to(x.dtype)[:, None]  # (B, T, H, P); D per head
            y = self.norm(y.reshape(B, T, self.intermediate_size), gate)  # RMSNorm(y * silu(gate))
            return self.out_proj(y.to(hidden_states.dtype))

        def reset_special_parameters(self) -> None:
            """fla's init of the SSM parameters: A = U(A_init_range), D = 1, softplus(dt_bias) log-uniform."""
            with torch.no_grad():
                self.A_log.copy_(torch.empty_like(self.A_log).uniform_(*self.A_init_range).log())
                self.D.fill_(1.0)
                self.dt_bias.copy_(_inverse_softplus_dt(self.num_heads, self.dt_min, self.dt_max, 1e-4,
                                                        self.dt_bias.device))

    return Mamba2SSD


class SlidingWindowAttention(nn.Module):
    """Causal softmax attention over the last ``window`` keys (the query's own included), RoPE on q and k, no
    biases; fla's ``parallel_attn`` Triton kernel. fla's ``Attention`` layer is not used: it requires flash-attn."""

    def __init__(self, cfg, parallel_attn):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.n_heads = cfg.n_heads or cfg.d_model // cfg.head_dim
        self.window, self.rope, self.rope_base = cfg.window_size, cfg.rope, cfg.rope_base
        self._attn = parallel_attn
        inner = self.n_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.d_model, inner, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, inner, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, inner, bias=False)
        self.o_proj = nn.Linear(inner, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, **unused) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (p(x).view(B, T, self.n_heads, self.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
        if self.rope:
            positions = torch.arange(T, device=x.device)
            q, k = apply_rotary(q, positions, self.rope_base), apply_rotary(k, positions, self.rope_base)
        o = self._attn(q, k, v, scale=self.head_dim ** -0.5, window_size=self.window)  # (B, T, H, D)
        return self.o_proj(o.reshape(B, T, -1))


class FlaBlock(nn.Module):
    """``x + mixer(norm(x))``, then ``x + mlp(norm(x))`` unless the block has no MLP (Mamba-2)."""

    def __init__(self, cfg, mixer: nn.Module, mlp_hidden: int | None):
        super().__init__()
        self.mixer_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mixer = mixer
        if mlp_hidden is not None:
            self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
            self.mlp = SwiGLU(cfg.d_model, mlp_hidden)
        else:
            self.mlp_norm = self.mlp = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.mixer(self.mixer_norm(x))
        x = x + (out[0] if isinstance(out, tuple) else out)  # fla layers return (output, attentions, cache)
        if self.mlp is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return x


def _build_blocks(cfg, fla) -> list[nn.Module]:
    L, d = fla["layers"], cfg.d_model
    mlp = mlp_hidden_size(d, cfg.mlp_hidden_ratio, cfg.mlp_multiple_of)
    mode = "fused_recurrent" if _recurrent_mode() else "chunk"
    if cfg.arch == "fla_mamba2":
        ssd = _mamba2_ssd_class()
        return [FlaBlock(cfg, ssd(hidden_size=d, head_dim=cfg.head_dim, state_size=cfg.state_size,
                                  expand=cfg.expand, n_groups=1, conv_kernel=cfg.conv_size, chunk_size=256,
                                  norm_eps=cfg.norm_eps, ssd_kernel=cfg.ssd_kernel), None)
                for _ in range(2 * cfg.n_layers)]
    if cfg.arch == "fla_deltanet":
        return [FlaBlock(cfg, L.DeltaNet(mode=mode, hidden_size=d, num_heads=d // cfg.linear_head_dim,
                                         use_beta=True, use_gate=False, use_short_conv=True,
                                         conv_size=cfg.conv_size, qk_activation="silu", qk_norm="l2",
                                         norm_eps=cfg.norm_eps), mlp)
                for _ in range(cfg.n_layers)]
    if cfg.arch == "fla_hgrn2":
        return [FlaBlock(cfg, L.HGRN2Attention(mode=mode, hidden_size=d, num_heads=d // cfg.linear_head_dim,
                                               expand_ratio=cfg.linear_head_dim, use_short_conv=False,
                                               norm_eps=cfg.norm_eps), mlp)
                for _ in range(cfg.n_layers)]
    if cfg.arch == "fla_swa":
        return [FlaBlock(cfg, SlidingWindowAttention(cfg, fla["parallel_attn"]), mlp) for _ in range(cfg.n_layers)]
    if cfg.arch == "fla_samba":
        mamba_mlp = mlp_hidden_size(d, cfg.mamba_mlp_hidden_ratio, cfg.mlp_multiple_of)
        # Samba's layout: Mamba at even layers, sliding-window attention at odd ones (fla's Samba default).
        return [FlaBlock(cfg, SlidingWindowAttention(cfg, fla["parallel_attn"]), mlp) if i % 2 else
                FlaBlock(cfg, L.Mamba(hidden_size=d, state_size=cfg.state_size, conv_kernel=cfg.conv_size,
                                      intermediate_size=cfg.expand * d), mamba_mlp)
                for i in range(cfg.n_layers)]
    raise ValueError(f"model.arch={cfg.arch!r} is not an fla baseline; choose one of {FLA_ARCHS}")


class FlaLM(CausalLM):
    """A baseline LM (see the module docstring); ``model.arch`` selects the token mixer."""

    def __init__(self, cfg):
        fla = import_fla()
        with quiet_fla():
            super().__init__(cfg, _build_blocks(cfg, fla))
        self._norm_types = (RMSNorm, *fla["norms"])
        self._mamba_type = fla["layers"].Mamba
        if cfg.arch == "fla_samba" and not fla["mamba_fast_path"]:
            warnings.warn("fla_samba: mamba_ssm / causal_conv1d are not installed, so fla's Mamba layers run a "
                          "sequential PyTorch scan over the tokens: fine for tests, far too slow for pretraining "
                          "(docs/baselines.md)", stacklevel=2)
        self.reset_parameters()

    def reset_parameters(self):
        """In place, on the parameters' device: N(0, init_std) for linear, convolution and embedding weights, zero
        biases, unit norm weights (fla's convention, with our init_std), then the SSM parameters as fla
        initialises them (Mamba-2: A, D, dt bias; Mamba: A, D, dt projection)."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding, nn.Conv1d)):  # fla's ShortConvolution is an nn.Conv1d
                nn.init.normal_(m.weight, mean=0.0, std=self.cfg.init_std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, self._norm_types):
                if m.weight is not None:
                    nn.init.ones_(m.weight)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for m in self.modules():
            if hasattr(m, "reset_special_parameters"):
                m.reset_special_parameters()
            elif isinstance(m, self._mamba_type):
                _reset_mamba(m)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (B, T) → final-norm hidden states (B, T, d_model), the LM head's input."""
        self.check_token_ids(input_ids)
        if input_ids.device.type != "cuda" and not interpreting():
            raise RuntimeError(f"model.arch={self.cfg.arch} runs fla's Triton kernels: use a CUDA device, or set "
                               f"TRITON_INTERPRET=1 before starting Python to run them (slowly) on the CPU")
        x = self.embed(input_ids)  # (B, T, d_model)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def _reset_mamba(m: nn.Module) -> None:
    """fla's Mamba (Samba) init of the SSM parameters: S4D-real A = 1..N per channel, D = 1, dt projection
    U(±dt_rank^-0.5) with softplus(bias) log-uniform in [0.001, 0.1]."""
    with torch.no_grad():
        n = m.A_log.shape[-1]
        m.A_log.copy_(torch.arange(1, n + 1, dtype=torch.float32, device=m.A_log.device).log().expand_as(m.A_log))
        m.D.fill_(1.0)
        std = m.dt_rank ** -0.5
        m.dt_proj.weight.uniform_(-std, std)
        m.dt_proj.bias.copy_(_inverse_softplus_dt(m.intermediate_size, 0.001, 0.1, 1e-4, m.dt_proj.bias.device))
