"""Eviction policies (inference/policies.py) against their definitions written out independently: attention
probabilities and kept sets by loops in float64 over the model's own queries and its keys and gates from the
Hugging Face-style ``LayerCache`` (not the paged cache); ACP's dropped mass against eps; budgets counted by hand;
the gate's decay in the scores; and scoring through an evicted cache against attention masked on the full
sequence."""

import math

import pytest
import torch
import torch.nn.functional as F

from inference_models import LOCAL, PRO, VARIANTS, tiny
from forgetting_transformer.inference.cache import PagedKVCache
from forgetting_transformer.inference.eviction import advance, thresholds
from forgetting_transformer.inference.generate import prefill
from forgetting_transformer.inference.policies import (H2O, AccumulatedAttention, Acp, SnapKV, Streaming,
                                                       WindowAttention, continuation_loss, greedy_tokens,
                                                       prefill_prefix, round_half_up)
from forgetting_transformer.models.layers import LayerCache

T, BS = 48, 16  # prompt tokens, cache block size (three blocks per row)
MODELS = {"fox_gqa_rope": VARIANTS["fox_pro_rope_gqa"], "fox_local": LOCAL,
          "transformer_gqa": VARIANTS["transformer_pro_gqa"]}


def prompt(n=T, batch=2, seed=5):
    return torch.randint(1, 97, (batch, n), generator=torch.Generator().manual_seed(seed))


def model_inputs(lm, ids):
    """Per layer (q (B, T, H, D), k (B, T, Hkv, D), c (B, T, H) float64 or None): queries from the layer's own
    ``project`` of its input, keys and gates as a full forward over ``LayerCache``s stores them."""
    caches, inputs = lm.new_cache(), []
    hooks = [b.attn.register_forward_pre_hook(lambda m, args, kw: inputs.append(args[0]), with_kwargs=True)
             for b in lm.blocks]
    with torch.no_grad():
        lm.hidden_states(ids, cache=caches)
        qs = [b.attn.project(x)[0] for b, x in zip(lm.blocks, inputs)]
    for h in hooks:
        h.remove()
    return [(q.double(), lc.keys.double(), None if lc.log_fgate is None else lc.log_fgate.double().cumsum(1))
            for q, lc in zip(qs, caches)]


def probs_row(q, k, c, b, h, i, G):
    """Attention probabilities of query i of head h in sequence b over keys 0..i, by the definition: softmax_j(
    q_i . k_j / sqrt(D) + c_i - c_j), as a list of floats."""
    qi, D = q[b, i, h].tolist(), q.shape[-1]
    logits = []
    for j in range(i + 1):
        s = sum(x * y for x, y in zip(qi, k[b, j, h // G].tolist())) / math.sqrt(D)
        logits.append(s + (float(c[b, i, h] - c[b, j, h]) if c is not None else 0.0))
    m = max(logits)
    e = [math.exp(x - m) for x in logits]
    return [x / sum(e) for x in e]


def brute_scores(lm, ids, queries):
    """(L, B, Hkv, T) float64: for each key, its attention probabilities from the queries ``queries(T)`` (an
    iterable of positions), summed over them and over the query heads of its kv head."""
    layers = model_inputs(lm, ids)
    L, (B, n, H, _), Hkv = len(layers), layers[0][0].shape, layers[0][1].shape[2]
    out = torch.zeros(L, B, Hkv, n, dtype=torch.float64)
    for layer, (q, k, c) in enumerate(layers):
        for b in range(B):
            for h in range(H):
                for i in queries(n):
                    for j, p in enumerate(probs_row(q, k, c, b, h, i, H // Hkv)):
                        out[layer, b, h // (H // Hkv), j] += p
    return out


def top(scores, n):
    """The n positions of the highest scores (a list), equal scores to the later position."""
    return set(sorted(range(len(scores)), key=lambda j: (-scores[j], -j))[:n])


@pytest.fixture(scope="module", params=list(MODELS))
def case(request):
    """(name, model, prompt ids (2, T), prefix with both statistics, brute-force accumulated scores, brute-force
    scores of the last 8 queries)."""
    lm = tiny(dict(MODELS[request.param]), seed=3)
    ids = prompt()
    prefix = prefill_prefix(lm, ids, statistics=[AccumulatedAttention(), WindowAttention(8)], max_len=T + 24,
                            block_size=BS)
    acc = brute_scores(lm, ids, lambda n: range(n))
    win = brute_scores(lm, ids, lambda n: range(n - 8, n))
    return request.param, lm, ids, prefix, acc, win


def test_scores_are_the_models_attention_probabilities(case):
    _, _, _, prefix, acc, win = case
    torch.testing.assert_close(prefix.stats[AccumulatedAttention()], acc, rtol=0, atol=1e-12)
    torch.testing.assert_close(prefix.stats[WindowAttention(8)], win, rtol=0, atol=1e-12)


def rows(keep):
    """{(layer, b, kv head): set of kept positions} of a (L, B, Hkv, T) mask."""
    L, B, Hkv, _ = keep.shape
    return {(i, b, h): set(keep[i, b, h].nonzero().flatten().tolist())
            for i in range(L) for b in range(B) for h in range(Hkv)}


def expected(policy, K, acc, win):
    """{row: kept set} by each policy's definition, from the brute-force scores."""
    L, B, Hkv, n = acc.shape
    out = {}
    for i in range(L):
        for b in range(B):
            for h in range(Hkv):
                if isinstance(policy, Streaming):
                    sink = min(policy.sink, K)
                    kept = set(range(sink)) | set(range(n - (K - sink), n))
                elif isinstance(policy, H2O):
                    r = math.floor(policy.recent_share * K + 0.5)
                    kept = set(range(n - r, n)) | top(acc[i, b, h, :n - r].tolist(), K - r)
                else:
                    w = policy.window
                    s = win[i, b, h, :n - w].tolist()
                    pooled = [max(s[max(0, j - policy.kernel // 2):j + policy.kernel // 2 + 1]) for j in range(n - w)]
                    kept = set(range(n - min(w, K), n)) | (top(pooled, K - w) if K > w else set())
                out[(i, b, h)] = kept
    return out


@pytest.mark.parametrize("policy, K", [
    (Streaming(fraction=0.25), 12), (Streaming(fraction=0.05, sink=4), 2), (Streaming(fraction=0.5, sink=0), 24),
    (H2O(fraction=0.25), 12), (H2O(fraction=0.3, recent_share=0.0), 14), (H2O(fraction=0.1, recent_share=0.25), 5),
    (SnapKV(fraction=0.5, window=8), 24), (SnapKV(fraction=0.3, window=8, kernel=3), 14),
    (SnapKV(fraction=0.1, window=8), 5), (SnapKV(fraction=1.0, window=8), 48),
], ids=lambda x: "-".join(map(str, x.describe().values())) if hasattr(x, "describe") else str(x))
def test_targeted_policies_keep_the_brute_force_sets(case, policy, K):
    *_, prefix, acc, win = case
    selection = policy.select(prefix)
    assert rows(selection.keep) == expected(policy, K, acc, win)
    assert selection.start is None and (selection.keep.sum(-1) == K).all()


def acp_starts(lm, ids, max_len, eps):
    """(L, B, H) the first kept key per query head by the definition: delta = -2U - log(max_len) + log(eps), U
    from the QK-norm weights, then the first j with c_T - c_j >= delta."""
    out = []
    for block, (q, k, c) in zip(lm.blocks, model_inputs(lm, ids)):
        a, D = block.attn, q.shape[-1]
        qmax, kmax = (float(w.detach().abs().max()) * math.sqrt(D) for w in (a.q_norm.weight, a.k_norm.weight))
        delta = -2 * qmax * kmax / math.sqrt(D) - math.log(max_len) + math.log(eps)
        B, n, H = c.shape
        starts = torch.zeros(B, H, dtype=torch.int64)
        for b in range(B):
            for h in range(H):
                j = 0
                while float(c[b, n - 1, h] - c[b, j, h]) < delta:
                    j += 1
                starts[b, h] = j
        out.append(starts)
    return torch.stack(out)


def test_acp_keeps_the_keys_above_its_bound_and_drops_at_most_eps_of_every_later_row():
    """LOCAL's gates decay within a few tokens: ACP drops old keys. Its first kept key per query head is the
    definition's (and what ``eviction.advance`` finds on the paged cache), a row keeps from the earliest of its
    heads, and every query from the prompt's last on loses at most eps of its attention mass (float64, all keys)."""
    lm, C, eps = tiny(dict(LOCAL), seed=4), 24, 0.05
    ids = prompt(T + C, seed=6)
    prefix = prefill_prefix(lm, ids[:, :T], max_len=T + C, block_size=BS)
    selection = Acp(eps=eps).select(prefix)
    want = acp_starts(lm, ids[:, :T], T + C, eps)
    assert torch.equal(selection.start, want) and 0 < int(want.min()) and int(want.max()) < T - 1
    first = want.view(*want.shape[:2], 2, 2).amin(-1)  # (L, B, Hkv): 2 kv heads of 2 query heads
    assert torch.equal(selection.keep, torch.arange(T) >= first[..., None])
    paged = PagedKVCache.for_model(lm, 2, T, block_size=BS)
    prefill(lm, paged, ids[:, :T], torch.zeros(2, dtype=torch.int64))
    advance(paged, thresholds(lm, T + C, eps))
    assert torch.equal(paged.key_start, want)
    worst = 0.0
    for layer, (q, k, c) in enumerate(model_inputs(lm, ids[:, :T + C])):
        for b in range(2):
            for h in range(4):
                for i in range(T - 1, T + C):
                    p = probs_row(q, k, c, b, h, i, 2)
                    worst = max(worst, sum(p[:int(want[layer, b, h])]))
    assert 0 < worst <= eps


def test_budgets_are_honoured_exactly():
    """K per row: halves of fraction * T round up, at least one position; a byte budget counts keys, values and
    float64 gates of every row (the bytes the paged cache's blocks hold per position) and rounds down."""
    assert [round_half_up(f, n) for f, n in [(0.05, 50), (0.35, 10), (0.25, 10), (0.5, 1), (0.01, 48)]] == \
        [3, 4, 3, 1, 0]
    lm = tiny(dict(VARIANTS["fox_pro_rope_gqa"]))  # D = 8 float64, 2 layers, 2 kv heads of 2 query heads
    prefix = prefill_prefix(lm, prompt(64, batch=1), statistics=[AccumulatedAttention(), WindowAttention(32)],
                            block_size=BS)
    per_position = 2 * 8 * 8 + 2 * 8
    assert prefix.bytes_per_position == per_position
    assert prefix.rows * 64 * per_position == prefix.cache.stats()["bytes_in_use"]  # four whole blocks per row
    for kind in (Streaming, H2O, SnapKV):
        for target, K in [(dict(fraction=0.01), 1), (dict(fraction=0.05), 3), (dict(fraction=0.3), 19),
                          (dict(fraction=1.0), 64), (dict(kv_bytes=4 * per_position * 7 + 575), 7),
                          (dict(kv_bytes=4 * per_position * 40), 40), (dict(kv_bytes=10 ** 9), 64)]:
            selection = kind(**target).select(prefix)
            assert (selection.keep.sum(-1) == K).all(), (kind.name, target)
            assert selection.kv_bytes(prefix) == 4 * K * per_position
        with pytest.raises(ValueError, match=f"kv_bytes={4 * per_position - 1} holds no position"):
            kind(kv_bytes=4 * per_position - 1).select(prefix)


def test_fox_scores_include_the_gate_decay():
    """Gates of e^-20 to e^-10 per token: a query sees only itself and its last few keys. Keys three or more
    positions before SnapKV's window get no attention from it, and each key's accumulated attention is its own
    query's (1 per query head); without the decay both would be of order 1/T and log T."""
    lm = tiny(dict(fgate="fixed", fgate_init=[0.05, 0.1], n_kv_heads=2, **PRO), seed=2)
    prefix = prefill_prefix(lm, prompt(), statistics=[AccumulatedAttention(), WindowAttention(8)], block_size=BS)
    window = prefix.stats[WindowAttention(8)]  # (L, B, Hkv, T)
    assert window[..., :T - 8 - 3].max() < 1e-9 and window[..., T - 8:].sum(-1).sub(16).abs().max() < 1e-3
    torch.testing.assert_close(prefix.stats[AccumulatedAttention()], torch.full_like(window, 2.0), rtol=0, atol=1e-3)
    # the same queries and keys with the decay left out give what the gate forbids
    q, k, _ = model_inputs(lm, prompt())[0]
    flat = torch.einsum("bihd,bjhd->bhij", q, k.repeat_interleave(2, 2)) / math.sqrt(8)
    flat = flat.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    assert flat[:, :, T - 8:, :T - 11].sum(2).max() > 0.05


class MaskedAttention(LayerCache):
    """A layer cache for a full forward whose ``attend`` computes dense float64 attention where queries after the
    prompt (positions >= T) see only the prompt keys ``selection`` keeps for their row, from their head's start
    on, plus every key after the prompt: the definition of attention through an evicted cache."""

    def __init__(self, layer, selection):
        super().__init__()
        self.layer, self.selection = layer, selection

    def attend(self, q, k, v, log_fgate):
        B, N, H, D = q.shape
        G = H // k.shape[2]
        keep = self.selection.keep[self.layer].repeat_interleave(G, 1)  # (B, H, T)
        start = self.selection.start
        if start is not None:
            keep = keep & (torch.arange(T) >= start[self.layer][..., None])
        kept = torch.cat([keep, torch.ones(B, H, N - T, dtype=torch.bool)], -1)  # (B, H, N) keys seen after T
        logits = torch.einsum("bihd,bjhd->bhij", q.double(), k.double().repeat_interleave(G, 2)) / math.sqrt(D)
        if log_fgate is not None:
            c = log_fgate.double().cumsum(1).transpose(1, 2)  # (B, H, N)
            logits = logits + c[..., :, None] - c[..., None, :]
        i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
        allowed = (j <= i) & ((i < T) | kept[:, :, None, :])  # (B, H, N, N)
        p = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
        return torch.einsum("bhij,bjhd->bihd", p, v.double().repeat_interleave(G, 2)).to(q.dtype)


def masked_logits(lm, ids, selection):
    with torch.no_grad():
        h = lm.hidden_states(ids, cache=[MaskedAttention(i, selection) for i in range(len(lm.blocks))])
        return lm.lm_head(h)  # (B, N, V)


TARGETED = [Streaming(fraction=0.2), H2O(fraction=0.3), SnapKV(fraction=0.25, window=8), Streaming(fraction=1.0)]


@pytest.mark.parametrize("name, policy", [("fox_local", p) for p in TARGETED + [Acp(eps=0.05)]]
                         + [("transformer_gqa", p) for p in TARGETED], ids=lambda x: getattr(x, "name", x))
def test_scoring_through_the_evicted_cache_is_masked_attention(name, policy):
    """The continuation's per-token loss and the greedy choices (on forced tokens) through the evicted cache
    equal a full forward whose later queries see only the kept prompt keys; keeping everything gives the model's
    own loss."""
    lm, C, n = tiny(dict(MODELS[name]), seed=7), 16, 6
    ids = prompt(T + C + 1, seed=8)
    prefix = prefill_prefix(lm, ids[:, :T], statistics=[s for s in [policy.statistic] if s], max_len=T + C,
                            block_size=BS)
    selection = policy.select(prefix)
    assert (selection.kept_fraction == 1) == (policy.describe().get("fraction") == 1.0)
    loss = continuation_loss(prefix, selection, ids[:, T:T + C], ids[:, T + 1:], chunk=5)
    logits = masked_logits(lm, ids[:, :T + C], selection)[:, T:]
    want = F.cross_entropy(logits.flatten(0, 1), ids[:, T + 1:].flatten(), reduction="none").view(2, C)
    torch.testing.assert_close(loss.double(), want, rtol=0, atol=1e-6)  # (loss is float32)
    if selection.kept_fraction == 1:
        full = lm(ids[:, :T + C], labels=ids[:, 1:T + C + 1])[:, T:].detach()
        torch.testing.assert_close(loss.double(), full.double(), rtol=0, atol=1e-6)
    forced = torch.randint(1, 97, (2, n), generator=torch.Generator().manual_seed(9))
    first = prefix.logits.argmax(-1)[:, None]
    chosen = greedy_tokens(prefix, selection, n, forced=forced)
    seq = torch.cat([ids[:, :T], first, forced[:, :n - 1]], dim=1)
    assert torch.equal(chosen, masked_logits(lm, seq, selection)[:, T:].argmax(-1))


@pytest.mark.parametrize("make, message", [
    (lambda: Streaming(), "give exactly one of fraction and kv_bytes"),
    (lambda: H2O(fraction=0.1, kv_bytes=10), "give exactly one of fraction and kv_bytes"),
    (lambda: SnapKV(fraction=0.0), r"fraction must be in \(0, 1\]; got 0.0"),
    (lambda: Streaming(fraction=1.5), r"fraction must be in \(0, 1\]; got 1.5"),
    (lambda: SnapKV(fraction=0.1, kernel=4), "kernel must be an odd int >= 1; got 4"),
    (lambda: H2O(fraction=0.1, recent_share=2.0), r"recent_share must be in \[0, 1\]; got 2.0"),
    (lambda: Acp(eps=1.5), r"eps must be in \(0, 1\); got 1.5"),
    (lambda: Acp(eps=0.1, threshold=-3.0), "give eps or threshold, not both"),
    (lambda: Acp(threshold=0.5), "threshold must be < 0"),
])
def test_bad_policy_arguments_are_named(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_acp_refuses_a_model_without_a_gate():
    lm = tiny(dict(VARIANTS["transformer_pro_gqa"]))
    with pytest.raises(ValueError, match="needs a forget gate"):
        Acp().select(prefill_prefix(lm, prompt(16), block_size=BS))
