"""Tiny models of every attention flavour, and greedy / sampled decoding by full recomputation: the reference that
the static-cache path is tested against."""

import torch

from forgetting_transformer.config import DecoderConfig
from forgetting_transformer.models import build_model

PRO = dict(qk_norm=True, output_gate=True, output_norm=True, kv_shift=True)
VARIANTS = {
    "fox_llama": {},
    "fox_pro": PRO,
    "fox_pro_rope_gqa": dict(rope=True, n_kv_heads=2, **PRO),
    "fox_pro_fixed_mqa": dict(fgate="fixed", fgate_init=[2, 64], n_kv_heads=1, **PRO),
    "fox_pro_data_independent": dict(fgate="data_independent", fgate_init=[2, 64], **PRO),
    "transformer_llama": dict(fgate="none", rope=True),
    "transformer_pro_gqa": dict(fgate="none", rope=True, n_kv_heads=2, **PRO),
}
# forget gates decaying within a few tokens: heads whose old keys ACP eviction can drop
LOCAL = dict(fgate="fixed", fgate_init=[1.5, 3.0], n_kv_heads=2, **PRO)


def tiny(switches, seed=0, dtype=torch.float64):
    """A 2-layer DecoderLM of 4 heads of 8 (init_std 0.1: peaked next-token distributions, so greedy choices are
    not decided by rounding)."""
    torch.manual_seed(seed)
    cfg = DecoderConfig(name="t", arch="decoder", vocab_size=97, n_layers=2, d_model=32, head_dim=8, init_std=0.1,
                        **switches)
    return build_model(cfg).to(dtype).eval()


def recompute_alone(model, prompts, steps):
    """Greedy decoding of each prompt alone (no padding, no cache): the full forward on the growing sequence.
    Returns per prompt (new tokens (steps,), logits (steps, V))."""
    out = []
    with torch.no_grad():
        for p in prompts:
            ids, logits = torch.as_tensor(p)[None], []
            for _ in range(steps):
                last = model(ids)[0, -1]  # (V,)
                logits.append(last)
                ids = torch.cat([ids, last.argmax()[None, None]], dim=1)
            out.append((ids[0, len(p):], torch.stack(logits)))
    return out


def recompute_batch(model, prompts, steps, choose):
    """The prompts left-padded into one batch, the full forward (no cache) on the growing batch, ``choose``
    (B, V) → (B,) picking the next tokens. Returns new tokens (B, steps)."""
    T = max(len(p) for p in prompts)
    ids = torch.stack([torch.cat([torch.zeros(T - len(p), dtype=torch.long), torch.as_tensor(p)]) for p in prompts])
    seq_start = torch.tensor([T - len(p) for p in prompts])
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, choose(model(ids, seq_start=seq_start)[:, -1])[:, None]], dim=1)
    return ids[:, T:]


def three_prompts():
    """Prompts of 9, 2 and 5 tokens."""
    g = torch.Generator().manual_seed(3)
    return [torch.randint(1, 97, (n,), generator=g) for n in (9, 2, 5)]
