"""What the gate analysis computes, on a loaded ``DecoderLM`` and one sequence (batch of 1):

- ``capture``: each chosen Attention module's input and output, taken with forward hooks (the model code is used
  as is, never patched);
- ``project``: q, k, v and log f recomputed from that input by the module's own ``Attention.project`` (the code
  ``Attention.forward`` runs); ``module_output`` finishes the module from per-head attention outputs
  (``Attention.output``), so ``check_layer`` can verify that the float64 reference op on the recomputed inputs
  reproduces the output the hook captured (it fails loudly if they disagree);
- ``forget_gate_matrix`` F_ij = exp(c_i - c_j) (j <= i, 0 above the diagonal), ``attention_map``
  A_ij = softmax_{j<=i}(q_i.k_j / sqrt(d) + c_i - c_j), both float64;
- ``acp_layer_stats``: ACP's threshold delta per head (``acp.acp_threshold``), the forward tiles pruned at a
  block size (``acp.tile_stats``) and the fraction of causal (i, j) with c_i - c_j < delta.
"""

from __future__ import annotations

import math

import torch

from forgetting_transformer.ops.forgetting_attention import acp
from forgetting_transformer.ops.forgetting_attention.reference import forgetting_attention_ref


def attention_modules(model) -> list:
    """The Attention module of every block of a ``DecoderLM``, in layer order. PaTH (model.mixer=path) is refused:
    its scores go through the Householder transforms, which the maps and ACP's bounds here do not model."""
    from forgetting_transformer.models.decoder import is_path

    if is_path(model.cfg):
        raise ValueError(f"the gate analysis recomputes softmax (Forgetting) attention; model {model.cfg.name!r} "
                         f"has model.mixer=path (PaTH), whose attention it does not cover")
    return [block.attn for block in model.blocks]


def check_indices(option: str, values, n: int, what: str) -> None:
    """Every value must index one of ``n`` layers / heads; the error names the option and the value."""
    if not values:
        raise ValueError(f"{option}: empty; give at least one index")
    for i, v in enumerate(values):
        if not 0 <= v < n:
            raise ValueError(f"{option}: {v} is out of range: the model has {n} {what} (0..{n - 1})")
        if v in values[:i]:
            raise ValueError(f"{option}: {v} is given twice")


def has_forget_gate(model) -> bool:
    return attention_modules(model)[0].fgate is not None


def no_gate_error(model_name: str, what: str) -> ValueError:
    return ValueError(f"{what} needs a forget gate, but model {model_name!r} has none (model.fgate=none, a "
                      f"Transformer); only the attention maps A can be computed for it (--what A)")


@torch.no_grad()
def capture(model, input_ids: torch.Tensor, layers) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """One forward pass of ``input_ids`` (1, T) → ``{layer: (input x (1, T, d_model), output (1, T, d_model))}``
    of the chosen layers' Attention modules."""
    mods = attention_modules(model)
    check_indices("--layers", layers, len(mods), "layers")
    captured = {}

    def hook(i):
        def fn(module, args, kwargs, output):
            # The recomputation covers full-sequence calls only (no cache, padding or custom positions); the
            # analysis makes exactly such a call, so anything else means the model is being driven differently.
            extra = {k: v for k, v in kwargs.items() if v is not None}
            if len(args) != 1 or extra:
                raise RuntimeError(f"layer {i}: unexpected attention call (args {len(args)}, kwargs {sorted(extra)})")
            captured[i] = (args[0].detach(), output.detach())
        return fn

    handles = [mods[i].register_forward_hook(hook(i), with_kwargs=True) for i in layers]
    try:
        model.hidden_states(input_ids)
    finally:
        for h in handles:
            h.remove()
    return captured


@torch.no_grad()
def project(attn, x: torch.Tensor):
    """x (B, T, d_model) → q (B, T, H, D), k, v (B, T, Hkv, D) exactly as the attention op receives them, and
    log f (B, T, H) fp32 (None without a forget gate): the module's own ``Attention.project``."""
    return attn.project(x)


@torch.no_grad()
def module_output(attn, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """Per-head attention outputs o (B, T, H, D) → the module's output (B, T, d_model): ``Attention.output``."""
    return attn.output(x, o.to(x.dtype))


@torch.no_grad()
def heads_output(q, k, v, log_f) -> torch.Tensor:
    """Attention op output (B, T, H, D) from the recomputed inputs (dense reference; without a forget gate,
    log f = 0 gives plain causal softmax attention)."""
    if log_f is None:
        log_f = torch.zeros(q.shape[:3], dtype=torch.float32, device=q.device)
    return forgetting_attention_ref(q, k, v, log_f)


def _kv_head(h: int, n_heads: int, n_kv_heads: int) -> int:
    return h // (n_heads // n_kv_heads)  # GQA: query head h reads kv head h // group


def log_decay(log_f_h: torch.Tensor) -> torch.Tensor:
    """log f (T,) of one head → D (T, T) float64 with D_ij = c_i - c_j = sum_{l=j+1..i} log f_l for j <= i and
    -inf above the diagonal."""
    c = torch.cumsum(log_f_h.double(), dim=0)
    T = c.shape[0]
    upper = torch.ones(T, T, dtype=torch.bool, device=c.device).triu(1)
    return (c[:, None] - c[None, :]).masked_fill(upper, float("-inf"))


def forget_gate_matrix(log_f_h: torch.Tensor) -> torch.Tensor:
    """F (T, T) float64, F_ij = prod_{l=j+1..i} f_l = exp(c_i - c_j) for j <= i, 0 above the diagonal."""
    return log_decay(log_f_h).exp()


def attention_map(q_h: torch.Tensor, k_h: torch.Tensor, log_f_h: torch.Tensor | None) -> torch.Tensor:
    """A (T, T) float64 of one head: softmax over j <= i of q_i.k_j / sqrt(d) + c_i - c_j (no decay term without a
    forget gate); exactly 0 above the diagonal, rows sum to 1."""
    T, D = q_h.shape
    s = (q_h.double() @ k_h.double().T) / math.sqrt(D)
    if log_f_h is not None:
        s = s + log_decay(log_f_h)
    else:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1)


def head_matrices(q, k, log_f, heads, *, gates: bool, attention: bool) -> dict[str, torch.Tensor]:
    """For the chosen query heads of one layer (batch element 0): ``{"F": (h, T, T), "A": (h, T, T)}`` float64
    (each only when asked for)."""
    H, Hkv = q.shape[2], k.shape[2]
    out = {}
    if gates:
        out["F"] = torch.stack([forget_gate_matrix(log_f[0, :, h]) for h in heads])
    if attention:
        out["A"] = torch.stack([attention_map(q[0, :, h], k[0, :, _kv_head(h, H, Hkv)],
                                              None if log_f is None else log_f[0, :, h]) for h in heads])
    return out


def check_layer(attn, layer: int, x, out, q, k, v, log_f, heads, A=None, rtol: float = 1e-3) -> None:
    """Verify the recomputation against the model: the module output rebuilt from the recomputed q, k, v, log f
    must equal the captured one, and (when given) A @ v of the chosen heads must equal the attention op's output.
    Raises RuntimeError, so an attention path the analysis does not model (e.g. ACP pruning) cannot silently skew
    it."""
    o = heads_output(q, k, v, log_f)  # (1, T, H, D)
    _compare(f"layer {layer}: the module output rebuilt from the recomputed q, k, v, log f", module_output(attn, x, o),
             out, rtol)
    if A is not None:
        H, Hkv = q.shape[2], k.shape[2]
        for i, h in enumerate(heads):
            av = A[i] @ v[0, :, _kv_head(h, H, Hkv)].double()  # (T, D)
            _compare(f"layer {layer} head {h}: A @ v", av, o[0, :, h], rtol)


def _compare(what: str, got: torch.Tensor, ref: torch.Tensor, rtol: float) -> None:
    err = (got.double() - ref.double()).abs().max().item()
    scale = max(1.0, ref.double().abs().max().item())
    if not err <= rtol * scale:
        raise RuntimeError(f"{what} differs from the model's (max abs error {err:.3g}, scale {scale:.3g}): "
                           f"the analysis' float64 reference attention no longer reproduces the model's Attention")


def pruned_elements(log_f: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """(B, H) int64: the number of causal (i, j), j <= i, with c_i - c_j < delta (delta (B, H) < 0).

    c is non-increasing (log f <= 0), so for query i those j form a prefix 0..n_i - 1 with
    n_i = #{j : c_j > c_i - delta}; one binary search per query instead of a T x T matrix."""
    c = acp.cumsum(log_f)  # (B, H, T) float64, non-increasing
    bound = -(c - delta.double()[..., None])  # c_j > c_i - delta  <=>  -c_j < -(c_i - delta)
    return torch.searchsorted(-c, bound.contiguous(), side="left").sum(-1)


def acp_layer_stats(attn, q, k, log_f, *, block=(64, 64), threshold="auto", eps: float = acp.DEFAULT_EPS) -> dict:
    """ACP of one layer on one sequence, per head: ``delta`` (the threshold), ``mean_log_fgate`` (the mean log f
    over the sequence: -1 / it is the head's decay time in tokens), forward ``tiles_pruned`` /
    ``tiles_total`` (causal BLOCK_M x BLOCK_N tiles, the kernel's unit of work) and their ratio ``tile_fraction``,
    and ``element_fraction``: the share of the T(T+1)/2 causal (i, j) with c_i - c_j < delta.

    ``threshold="auto"`` is the kernel's ``delta = -2U - log T + log eps``, with U from the QK-norm weights when the
    layer has QK-norm, else from the max norms of this sequence's q and k."""
    if log_f is None:
        raise ValueError("ACP needs a forget gate; this layer has none")
    if not isinstance(threshold, str) and not threshold < 0:
        raise ValueError(f"--threshold {threshold}: must be < 0 (ACP prunes (i, j) with c_i - c_j < delta, "
                         f"and c_i - c_i = 0)")
    B, T, H, D = q.shape
    qk_norm = (attn.q_norm.weight, attn.k_norm.weight) if attn.q_norm is not None else None
    delta = acp.acp_threshold(q, k, 1.0 / math.sqrt(D), threshold, eps=eps, qk_norm_weights=qk_norm)  # (B, H)
    tiles = acp.tile_stats(log_f, delta, T, block[0], block[1])
    total = tiles["computed"] + tiles["pruned"]
    elements = pruned_elements(log_f, delta)
    return {"delta": delta[0].tolist(), "mean_log_fgate": log_f[0].double().mean(0).tolist(),
            "tiles_pruned": tiles["pruned"][0].tolist(),
            "tiles_total": total[0].tolist(),
            "tile_fraction": (tiles["pruned"][0].double() / total[0].double()).tolist(),
            "element_fraction": (elements[0].double() / (T * (T + 1) / 2)).tolist()}
