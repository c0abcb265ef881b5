"""Incremental decoding with FoXCache: generate() and cached forwards equal full recomputation, left padding."""

import pytest
import torch
from transformers.cache_utils import DynamicCache

from forgetting_transformer.models.hf import FoXCache, FoXConfig, FoXForCausalLM

PRO = dict(qk_norm=True, output_gate=True, output_norm=True, kv_shift=True)
VARIANTS = {
    "fox_llama": {},
    "fox_pro": PRO,
    "fox_pro_rope": dict(rope=True, **PRO),
    "fox_pro_fixed_gqa": dict(fgate="fixed", fgate_init=[2, 64], n_kv_heads=2, **PRO),
    "fox_pro_data_independent": dict(fgate="data_independent", fgate_init=[2, 64], **PRO),
    "fox_llama_mqa": dict(n_kv_heads=1),
    "transformer_llama": dict(fgate="none", rope=True),
    "transformer_pro_gqa": dict(fgate="none", rope=True, n_kv_heads=2, **PRO),
}


def tiny(switches, seed=0):
    torch.manual_seed(seed)
    # init_std 0.1: peaked next-token distributions, so greedy choices are not decided by float32 rounding.
    cfg = FoXConfig(vocab_size=97, n_layers=2, d_model=32, head_dim=8, init_std=0.1, **switches)
    return FoXForCausalLM(cfg).eval()


def greedy_by_recomputation(model, ids, steps):
    """Greedy decoding that re-runs the full forward on the growing sequence each step (no cache)."""
    logits = []
    with torch.no_grad():
        for _ in range(steps):
            last = model(ids, use_cache=False).logits[:, -1]  # (B, V)
            logits.append(last)
            ids = torch.cat([ids, last.argmax(-1, keepdim=True)], dim=1)
    return ids, torch.stack(logits, dim=1)


@pytest.mark.parametrize("name", VARIANTS)
def test_greedy_generate_with_cache_equals_full_recomputation(name):
    model = tiny(VARIANTS[name])
    ids = torch.randint(0, 97, (3, 7))
    lengths = []  # tokens per forward: one prefill, then one token per step against the cache
    model.model.embed.register_forward_hook(lambda mod, args, out: lengths.append(args[0].shape[1]))
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                         output_logits=True, return_dict_in_generate=True)
    assert lengths == [7] + [1] * 11
    expected, expected_logits = greedy_by_recomputation(model, ids, 12)
    assert torch.equal(out.sequences, expected)
    torch.testing.assert_close(torch.stack(out.logits, dim=1), expected_logits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", VARIANTS)
def test_cached_chunked_prefill_and_decode_logits_match_full_forward(name):
    model = tiny(VARIANTS[name])
    ids = torch.randint(1, 97, (2, 14))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # row 1 left-padded
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits  # (B, T, V)
        cache = model(ids[:, :5], attention_mask=mask[:, :5], use_cache=True).past_key_values
        parts = [model(ids[:, :5], attention_mask=mask[:, :5]).logits]
        out = model(ids[:, 5:9], attention_mask=mask[:, :9], past_key_values=cache)  # chunked prefill
        parts.append(out.logits)
        for t in range(9, 14):  # decode, one token at a time
            out = model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], past_key_values=out.past_key_values)
            parts.append(out.logits)
    assert isinstance(out.past_key_values, FoXCache) and out.past_key_values.get_seq_length() == 14
    real = mask.bool()  # pad positions' logits are meaningless
    torch.testing.assert_close(torch.cat(parts, dim=1)[real], full[real], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["fox_pro_rope", "fox_llama_mqa", "fox_pro_fixed_gqa", "transformer_pro_gqa"])
def test_left_padded_batch_generates_what_each_row_generates_alone(name):
    model = tiny(VARIANTS[name])
    rows = [torch.randint(1, 97, (n,)) for n in (6, 2, 9)]
    T = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([torch.zeros(T - len(r), dtype=torch.long), r]) for r in rows])
    mask = torch.stack([torch.cat([torch.zeros(T - len(r)), torch.ones(len(r))]).long() for r in rows])
    batch = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0,
                           output_logits=True, return_dict_in_generate=True)
    for i, r in enumerate(rows):
        alone = model.generate(r[None], attention_mask=torch.ones(1, len(r), dtype=torch.long), max_new_tokens=10,
                               do_sample=False, output_logits=True, return_dict_in_generate=True)
        assert torch.equal(batch.sequences[i, T:], alone.sequences[0, len(r):]), f"row {i}"
        torch.testing.assert_close(torch.stack(batch.logits, 1)[i], torch.stack(alone.logits, 1)[0],
                                   rtol=1e-4, atol=1e-5)


def test_chunked_prefill_and_beam_search_through_generate():
    model = tiny(VARIANTS["fox_pro_rope"])
    ids = torch.randint(1, 97, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, **kw), model.generate(ids, prefill_chunk_size=4, **kw))
    # Beam search reorders the cache every step; without a cache it recomputes everything.
    assert torch.equal(model.generate(ids, num_beams=3, **kw), model.generate(ids, num_beams=3, use_cache=False, **kw))
    with pytest.raises(ValueError, match="cache_implementation"):
        model.generate(ids, cache_implementation="static", **kw)


def test_pad_gates_and_pad_tokens_do_not_matter():
    model = tiny(dict(rope=True, **PRO))
    ids = torch.randint(1, 97, (1, 8))
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    other = ids.clone()
    other[0, :3] = torch.randint(1, 97, (3,))  # different pad tokens → different pad gates and keys
    with torch.no_grad():
        a = model(ids, attention_mask=mask).logits[:, 3:]
        b = model(other, attention_mask=mask).logits[:, 3:]
        alone = model(ids[:, 3:]).logits
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a, alone, rtol=1e-5, atol=1e-6)


def test_unsupported_inputs_are_clear_errors():
    model = tiny({})
    ids = torch.randint(0, 97, (2, 5))
    with pytest.raises(ValueError, match="left padding"):
        model(ids, attention_mask=torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="attention_mask must be"):
        model(ids, attention_mask=torch.ones(2, 4, dtype=torch.long))
    cache = model(ids, use_cache=True).past_key_values
    with pytest.raises(ValueError, match="disagrees"):
        model(ids[:, :1], attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1], [1] * 6]), past_key_values=cache)
    with pytest.raises(NotImplementedError, match="cropped"):
        cache.crop(-1)
    dyn = DynamicCache()
    dyn.update(torch.zeros(2, 4, 5, 8), torch.zeros(2, 4, 5, 8), 0)
    with pytest.raises(TypeError, match="FoXCache"):
        model(ids[:, :1], past_key_values=dyn)
    with pytest.raises(NotImplementedError, match="inputs_embeds"):
        model(inputs_embeds=torch.zeros(2, 5, 32))


def test_cache_reorders_with_the_batch():
    # Beam search reorders the cache; every cached tensor (and the padding starts) must follow.
    model = tiny(dict(**PRO))
    ids = torch.randint(1, 97, (2, 6))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])
    with torch.no_grad():
        cache = model(ids, attention_mask=mask, use_cache=True).past_key_values
        cache.reorder_cache(torch.tensor([1, 0]))
        nxt = torch.randint(1, 97, (2, 1))
        got = model(nxt, attention_mask=torch.cat([mask.flip(0), torch.ones(2, 1, dtype=torch.long)], 1),
                    past_key_values=cache).logits[:, -1]
        full = model(torch.cat([ids.flip(0), nxt], 1),
                     attention_mask=torch.cat([mask.flip(0), torch.ones(2, 1, dtype=torch.long)], 1)).logits[:, -1]
    torch.testing.assert_close(got, full, rtol=1e-4, atol=1e-5)
