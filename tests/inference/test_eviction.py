"""ACP eviction: the first kept key against its definition, the dropped attention mass of every decoding query
computed in float64 over all keys (kept and dropped) against eps, dropped keys staying below the threshold for
every later query, released and compacted blocks, and generated tokens equal to full-cache decoding."""

import math

import pytest
import torch
import torch.nn.functional as F

from inference_models import LOCAL, PRO, VARIANTS, tiny
from test_decode_kernel import dense_attention
from forgetting_transformer.inference import PagedKVCache, evict, generate, thresholds
from forgetting_transformer.inference.eviction import sequence_thresholds
from forgetting_transformer.inference.cache import DecodeLayer
from forgetting_transformer.ops.forgetting_attention.acp import acp_threshold
from forgetting_transformer.ops.decode import forgetting_attention_decode


def first_kept(c, seq_start, old, delta):
    """Brute force: the first key j >= max(old, seq_start) with c[-1] - c[j] >= delta, c (L,) of one head."""
    j = max(old, seq_start)
    while c[-1] - c[j] < delta:
        j += 1
    return j


def test_advance_moves_every_layer_by_its_own_gates_and_thresholds():
    """One pass over all layers (what the decoding loop runs) equals the definition layer by layer, with
    per-layer, per-sequence thresholds (L, B, H) and with per-layer ones (L, H)."""
    torch.manual_seed(1)
    NL, B, H, Hkv, D, BS = 3, 2, 4, 2, 8, 16
    for per_sequence in (True, False):
        cache = PagedKVCache(n_layers=NL, batch_size=B, max_len=160, n_heads=H, n_kv_heads=Hkv, head_dim=D,
                             gated=True, kv_shift=False, dtype=torch.float64, device="cpu", block_size=BS)
        seq_start = torch.tensor([3, 0])
        cache.begin(seq_start)
        lf = F.logsigmoid(torch.randn(NL, B, 120, H) * 2 + torch.linspace(-3, 4, NL * H).view(NL, 1, 1, H))
        lf = lf.double()
        lf[:, 0, :3] = 0.0
        c = torch.cumsum(lf, dim=2)
        deltas = -torch.rand(NL, B, H, dtype=torch.float64) * 8 - 1
        if not per_sequence:
            deltas = deltas[:, 0]
        want = seq_start[None, :, None].expand(NL, B, H).clone()
        T = 0
        for n in (40, 1, 33, 46):
            cache.reserve(n)
            for layer in range(NL):
                kv = torch.randn(B, n, Hkv, D, dtype=torch.float64)
                cache.write(layer, kv, kv, lf[layer, :, T:T + n], None)
            cache.advance(n)
            T += n
            evict(cache, deltas)
            for layer in range(NL):
                for b in range(B):
                    for h in range(H):
                        d = deltas[layer, b, h] if per_sequence else deltas[layer, h]
                        want[layer, b, h] = first_kept(c[layer, b, :T, h], int(seq_start[b]),
                                                       int(want[layer, b, h]), float(d))
            assert torch.equal(cache.key_start, want), (per_sequence, T)
        assert (want[-1] < T // 2).any() and (want[0] > T // 2).any()  # slow and fast heads both present


def test_advance_and_release_follow_the_definition_and_compaction_keeps_every_kept_key():
    torch.manual_seed(0)
    B, H, Hkv, D, BS = 2, 4, 2, 16, 16
    cache = PagedKVCache(n_layers=1, batch_size=B, max_len=200, n_heads=H, n_kv_heads=Hkv, head_dim=D, gated=True,
                         kv_shift=False, dtype=torch.float64, device="cpu", block_size=BS)
    seq_start = torch.tensor([0, 5])
    cache.begin(seq_start)
    k, v = torch.randn(B, 90, Hkv, D, dtype=torch.float64), torch.randn(B, 90, Hkv, D, dtype=torch.float64)
    # heads 0 to 2 forget within a few tokens, head 3 (sharing kv head 1 with head 2) hardly at all; row 1's pads
    # carry log f = 0
    lf = F.logsigmoid(torch.randn(B, 90, H) + torch.tensor([-3.0, -1.0, 0.0, 6.0])).double()
    lf[1, :5] = 0.0
    c = torch.cumsum(lf, dim=1)
    delta = torch.tensor([-6.0, -9.0, -4.0, -3.0], dtype=torch.float64)
    want = seq_start[:, None].expand(B, H).clone()
    L = 0
    for n in (30, 1, 1, 20, 18):
        cache.reserve(n)
        cache.write(0, k[:, L:L + n], v[:, L:L + n], lf[:, L:L + n], None)
        cache.advance(n)
        L += n
        evict(cache, delta[None])
        for b in range(B):
            for h in range(H):
                want[b, h] = first_kept(c[b, :L, h], int(seq_start[b]), int(want[b, h]), float(delta[h]))
        assert torch.equal(cache.key_start[0], want), L
        # a block is released once it lies wholly before the first kept key of both heads of its kv head
        released = torch.arange(cache.n_alloc) < (want.view(B, Hkv, 2).amin(-1) // BS)[..., None]
        assert torch.equal(cache.tables[0, :, :, :cache.n_alloc] < 0, released), L
    assert (want[:, :2] > L // 2).all()  # the fast heads dropped most of their keys

    def attention():
        q = torch.randn(B, 1, H, D, dtype=torch.float64, generator=torch.Generator().manual_seed(L))
        got = forgetting_attention_decode(q, cache.k_pool, cache.v_pool, cache.tables[0], cache.lengths,
                                          cache.key_start[0], c_q=c[:, L - 1:L], c_pool=cache.c_pool)
        return got, dense_attention(q, k[:, :L], v[:, :L], c[:, :L], cache.lengths, want, 1 / math.sqrt(D))

    before, dense = attention()
    torch.testing.assert_close(before, dense, rtol=1e-12, atol=1e-12)
    in_use, pool = cache.stats()["blocks_in_use"], cache.pool_blocks
    assert cache.compact(headroom=2) and cache.version == 1
    assert cache.pool_blocks == in_use + 2 < pool // 2
    assert torch.equal(attention()[0], before)  # the same keys, moved
    n = 20  # the compacted cache takes new tokens (and grows again)
    cache.reserve(n)
    cache.write(0, k[:, L:L + n], v[:, L:L + n], lf[:, L:L + n], None)
    cache.advance(n)
    L += n
    evict(cache, delta[None])
    want = cache.key_start[0].clone()
    got, dense = attention()
    torch.testing.assert_close(got, dense, rtol=1e-12, atol=1e-12)


def test_thresholds_follow_the_training_rule_at_the_maximum_length():
    model = tiny(LOCAL)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.q_norm.weight.uniform_(0.2, 1.5)
            block.attn.k_norm.weight.uniform_(0.2, 1.5)
    deltas = thresholds(model, 1000, eps=1e-4)
    for block, delta in zip(model.blocks, deltas):
        a = block.attn
        q, k = torch.zeros(1, 1, 4, 8), torch.zeros(()).expand(1, 1000, 2, 8)  # Tk = 1000
        want = acp_threshold(q, k, 1 / math.sqrt(8), "auto", eps=1e-4,
                             qk_norm_weights=(a.q_norm.weight, a.k_norm.weight))[0]
        torch.testing.assert_close(delta.float(), want)
    assert torch.equal(thresholds(tiny(VARIANTS["fox_llama"]), 10, threshold=-7.5), torch.full((2, 4), -7.5).double())


def record_decoding(monkeypatch):
    """Every write to the cache (layer, keys, cumulative gates) and every decode attention (layer, queries, first
    kept keys, lengths), in order."""
    writes, attends = [], []
    write, attend = PagedKVCache.write, DecodeLayer.attend

    def recording_write(cache, layer, k, v, log_fgate, shift_state):
        c = write(cache, layer, k, v, log_fgate, shift_state)
        writes.append((layer, k.clone(), c.clone()))
        return c

    def recording_attend(view, q, k, v, log_fgate):
        c = view.cache
        attends.append((view.index, q.clone(), c.key_start[view.index].clone(), c.lengths + q.shape[1]))
        return attend(view, q, k, v, log_fgate)

    monkeypatch.setattr(PagedKVCache, "write", recording_write)
    monkeypatch.setattr(DecodeLayer, "attend", recording_attend)
    return writes, attends


@pytest.mark.parametrize("name, kwargs", [
    ("local_pro_gqa", dict(acp_eps=1e-3)),
    ("fox_llama", dict(eviction_threshold=-6.0)),  # no QK-norm: an explicit threshold
])
def test_dropped_mass_stays_below_eps_and_dropped_keys_stay_below_the_threshold(name, kwargs, prompts,
                                                                                 monkeypatch):
    model = tiny(LOCAL if name == "local_pro_gqa" else VARIANTS[name])
    writes, attends = record_decoding(monkeypatch)
    out = generate(model, prompts, max_new_tokens=60, block_size=16, acp_eviction=True, **kwargs)
    seq_start = torch.tensor([0, 7, 4])
    # each sequence's bound counts its own tokens: 9, 2 and 5 prompt tokens, 60 new ones
    deltas = sequence_thresholds(model, 9 - seq_start + 60, kwargs.get("acp_eps", 1.0 - 1e-9),
                                 kwargs.get("eviction_threshold"))  # (L, B, H)
    G = 4 // model.blocks[0].attn.n_kv_heads
    keys = [torch.cat([k for i, k, _ in writes if i == layer], 1) for layer in range(2)]  # (B, S, Hkv, D)
    gates = [torch.cat([c for i, _, c in writes if i == layer], 1) for layer in range(2)]  # (B, S, H)
    worst, dropped_any = 0.0, False
    for layer, q, key_start, lengths in attends:
        k, c = keys[layer].repeat_interleave(G, dim=2), gates[layer]  # (B, S, H, D), (B, S, H)
        for b in range(3):
            i = int(lengths[b]) - 1  # one query token per step
            j = torch.arange(int(seq_start[b]), i + 1)
            s = torch.einsum("hd,jhd->hj", q[b, 0].double(), k[b, j].double()) / math.sqrt(8)
            w = torch.softmax(s + (c[b, i][:, None] - c[b, j].T), dim=-1)  # (H, keys): all keys, none dropped
            dropped = j[None, :] < key_start[b][:, None]  # (H, keys)
            worst = max(worst, float((w * dropped).sum(-1).max()))
            dropped_any |= bool(dropped.any())
            # a dropped key is below the threshold for this query, and so for every query after the drop
            assert ((c[b, i][:, None] - c[b, j].T < deltas[layer, b][:, None]) | ~dropped).all()
    assert dropped_any and len(attends) == 2 * 59
    if "acp_eps" in kwargs:
        assert 0 < worst <= kwargs["acp_eps"]
    assert out.stats["acp_eviction"]


def test_eviction_keeps_the_greedy_tokens_and_frees_the_blocks_of_local_heads(prompts):
    model = tiny(LOCAL)
    full = generate(model, prompts, max_new_tokens=120, block_size=16, output_logits=True)
    kept = generate(model, prompts, max_new_tokens=120, block_size=16, output_logits=True, acp_eviction=True)
    assert torch.equal(kept.sequences, full.sequences)
    torch.testing.assert_close(kept.logits, full.logits, rtol=0, atol=1e-4)
    s = kept.stats
    assert torch.equal(s["tokens"], torch.tensor([9, 2, 5]) + 119)
    assert (s["kept"] < s["tokens"][None, :, None]).all()  # every (layer, sequence, head) dropped keys
    assert (s["kept_fraction"] < 0.75).all()
    assert s["blocks_in_use"] < 0.6 * full.stats["blocks_in_use"]
    assert s["pool_blocks"] < 0.6 * full.stats["pool_blocks"]  # the memory itself shrank, not just the tables


def test_eviction_of_slow_heads_drops_nothing_and_the_pools_grow_only_past_the_prompt(prompts):
    model = tiny(dict(fgate="fixed", fgate_init=[500, 1000], **PRO))
    g = torch.Generator().manual_seed(2)
    long_prompts = [torch.randint(1, 97, (n,), generator=g) for n in (64, 50)]
    # 60 new tokens: more than the short prompts' one block holds again, fewer than the long prompts' four blocks
    for batch, grows in ((prompts, True), (long_prompts, False)):
        full = generate(model, batch, max_new_tokens=60, block_size=16)
        kept = generate(model, batch, max_new_tokens=60, block_size=16, acp_eviction=True)
        assert torch.equal(kept.sequences, full.sequences)
        assert torch.equal(kept.stats["kept"], kept.stats["tokens"][None, :, None].expand(2, len(batch), 4))
        assert kept.stats["blocks_in_use"] == full.stats["blocks_in_use"] <= kept.stats["pool_blocks"]
        # the pools start with room for the prompt and as many tokens again: a reallocation only past that
        assert (kept.stats["reallocations"] > 0) == grows


@pytest.mark.parametrize("chunk", [16, 7])
def test_chunked_prefill_with_long_padding_and_eviction_equals_the_full_cache(chunk):
    # row 1's 37 pads fill two blocks that the first chunks reach before its first real token
    model = tiny(LOCAL)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 97, (n,), generator=g) for n in (70, 33)]
    full = generate(model, prompts, max_new_tokens=30, block_size=16, output_logits=True)
    for eviction in (False, True):
        out = generate(model, prompts, max_new_tokens=30, block_size=16, output_logits=True, prefill_chunk=chunk,
                       acp_eviction=eviction)
        assert torch.equal(out.sequences, full.sequences)
        torch.testing.assert_close(out.logits, full.logits, rtol=0, atol=1e-5)
        # every block of padding only went back to the pools: row 1's blocks 0 and 1, in 2 layers x 2 kv heads
        assert out.stats["blocks_in_use"] <= full.stats["blocks_in_use"] == 2 * 2 * (7 + 5)


def test_each_sequence_is_evicted_by_its_own_bound(prompts, monkeypatch):
    """The threshold of a sequence counts its own tokens (prompt without padding + max_new_tokens), as if it were
    decoded alone: padding to the batch's longest prompt does not make it keep more."""
    import sys

    gen = sys.modules["forgetting_transformer.inference.generate"]  # (the package's ``generate`` is the function)
    model = tiny(LOCAL)
    seen = []
    real_evict = gen.evict
    monkeypatch.setattr(gen, "evict", lambda cache, deltas: (seen.append(deltas), real_evict(cache, deltas))[1])
    generate(model, prompts, max_new_tokens=20, block_size=16, acp_eviction=True, acp_eps=1e-4)
    assert seen and all(torch.equal(d, seen[0]) for d in seen)
    for b, p in enumerate(prompts):
        alone = thresholds(model, len(p) + 20, eps=1e-4)  # (L, H)
        assert torch.equal(seen[0][:, b], alone)
    assert not torch.equal(seen[0][:, 0], seen[0][:, 1])  # 9 and 2 prompt tokens: different bounds
