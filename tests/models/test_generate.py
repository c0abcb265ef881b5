"""Incremental decoding with FoXCache: generate() and cached forwards equal full recomputation, left padding,
inputs_embeds prompts, cache cropping and assisted decoding."""

import copy

import pytest
import torch
from transformers.cache_utils import DynamicCache

from forgetting_transformer.hf import FoXCache, FoXConfig, FoXForCausalLM

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


pytestmark = pytest.mark.usefixtures("one_thread")


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
    with pytest.raises(ValueError, match="cache_implementation='offloaded' is not supported"):
        model.generate(ids, cache_implementation="offloaded", **kw)


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


def test_forward_takes_the_cache_as_cache_or_past_key_values():
    """transformers 5.24 renamed forward's past_key_values to cache: either name continues a FoXCache with the
    same logits; both at once is an error."""
    model = tiny(PRO)
    ids = torch.randint(0, 97, (2, 6))
    with torch.no_grad():
        old = model(ids[:, 5:], past_key_values=model(ids[:, :5], use_cache=True).past_key_values)
        new = model(ids[:, 5:], cache=model(ids[:, :5], use_cache=True).past_key_values)
        torch.testing.assert_close(new.logits, old.logits, rtol=0, atol=0)
        assert new.past_key_values.get_seq_length() == 6
        c1, c2 = (model(ids[:, :5], use_cache=True).past_key_values for _ in range(2))
        with pytest.raises(ValueError, match="not both"):
            model(ids[:, 5:], cache=c1, past_key_values=c2)


def test_unsupported_inputs_are_clear_errors():
    model = tiny({})
    ids = torch.randint(0, 97, (2, 5))
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match=r"row 0 .* between real tokens"):  # inner padding, even without a cache
        model(ids, attention_mask=torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 1, 1]]))
    with pytest.raises(ValueError, match=r"row 0 .*right padding.*padding_side = 'left'"):
        model(ids, attention_mask=right, use_cache=True)  # a cache would put the pads before later tokens
    for use_cache in (True, False):
        with pytest.raises(ValueError, match=r"right padding.*padding_side = 'left'"):
            model.generate(ids, attention_mask=right, max_new_tokens=2, do_sample=False, use_cache=use_cache)
    with pytest.raises(ValueError, match="attention_mask must be"):
        model(ids, attention_mask=torch.ones(2, 4, dtype=torch.long))
    cache = model(ids, use_cache=True).past_key_values
    with pytest.raises(ValueError, match="disagrees"):
        model(ids[:, :1], attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1], [1] * 6]), past_key_values=cache)
    dyn = DynamicCache()
    dyn.update(torch.zeros(2, 4, 5, 8), torch.zeros(2, 4, 5, 8), 0)
    with pytest.raises(TypeError, match="FoXCache"):
        model(ids[:, :1], past_key_values=dyn)
    for kw in (dict(input_ids=ids, inputs_embeds=torch.zeros(2, 5, 32)), {}):
        with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
            model(**kw)
    shape = r"inputs_embeds must be \(batch, seq_len, d_model=32\); got shape \(2, 5, 16\)"
    with pytest.raises(ValueError, match=shape):
        model(inputs_embeds=torch.zeros(2, 5, 16))


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


def test_generate_from_inputs_embeds_equals_recomputation_on_embeddings():
    # A soft prompt (embeddings no token has) then real tokens, row 1 left-padded: generate() runs the prompt from
    # embeddings and the new tokens from ids. Reference: the full forward on [prompt embeds, embed(new tokens)].
    model = tiny(VARIANTS["fox_pro_rope"])
    ids = torch.randint(1, 97, (2, 5))
    with torch.no_grad():
        prompt = torch.cat([0.1 * torch.randn(2, 3, 32), model.model.embed(ids)], dim=1)  # (2, 8, d_model)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :2] = 0
    out = model.generate(inputs_embeds=prompt, attention_mask=mask, max_new_tokens=8, do_sample=False,
                         pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    assert out.sequences.shape == (2, 8)  # only the new tokens: the prompt had no ids
    new, logits = torch.zeros(2, 0, dtype=torch.long), []
    with torch.no_grad():
        for _ in range(8):
            x = torch.cat([prompt, model.model.embed(new)], dim=1)
            m = torch.cat([mask, torch.ones_like(new)], dim=1)
            last = model(inputs_embeds=x, attention_mask=m).logits[:, -1]
            logits.append(last)
            new = torch.cat([new, last.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out.sequences, new)
    torch.testing.assert_close(torch.stack(out.logits, dim=1), torch.stack(logits, dim=1), rtol=1e-4, atol=1e-5)


def test_non_finite_inputs_embeds_are_refused_naming_the_position():
    """NaN logits would pick a token (often eos) and end generation at once without a word."""
    model = tiny(VARIANTS["fox_pro"])
    prompt = torch.randn(2, 4, 32)
    prompt[1, 2, 5] = float("nan")
    with pytest.raises(ValueError, match="inputs_embeds must be finite; row 1, position 2 holds NaN or inf"):
        model.generate(inputs_embeds=prompt, max_new_tokens=3, eos_token_id=0, pad_token_id=0)
    prompt[1, 2, 5] = float("inf")
    with pytest.raises(ValueError, match="row 1, position 2"):
        model(inputs_embeds=prompt)


CROP_VARIANTS = ["fox_llama", "fox_pro", "transformer_pro_gqa"]


def tensors(field) -> tuple:
    """A cache field (None, a tensor or a tuple of tensors) as a tuple of tensors."""
    return () if field is None else field if isinstance(field, tuple) else (field,)


def greedy_with_cache(model, cache, last, mask, steps):
    """Greedy decoding from a cache whose next input is ``last`` (B, 1); returns the tokens and logits."""
    tokens, logits = [], []
    with torch.no_grad():
        for _ in range(steps):
            mask = torch.cat([mask, torch.ones_like(last)], dim=1)
            step = model(last, attention_mask=mask, past_key_values=cache).logits[:, -1]
            last = step.argmax(-1, keepdim=True)
            tokens.append(last)
            logits.append(step)
    return torch.cat(tokens, dim=1), torch.stack(logits, dim=1)


@pytest.mark.parametrize("name", CROP_VARIANTS)
def test_cropped_cache_equals_the_cache_of_the_shorter_prefix(name):
    model = tiny(VARIANTS[name])
    ids = torch.randint(1, 97, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    keep = 7  # inside the prefill chunk: crop(-5) removes the 4-token chunk and one prefill token
    with torch.no_grad():
        cache = model(ids[:, :8], attention_mask=mask[:, :8], use_cache=True).past_key_values
        model(ids[:, 8:], attention_mask=mask, past_key_values=cache)
        cache.crop(0)
        assert cache.get_seq_length() == 12
        cache.crop(-5)
        fresh = model(ids[:, :keep], attention_mask=mask[:, :keep], use_cache=True).past_key_values
    assert cache.get_seq_length() == keep and torch.equal(cache.seq_start, fresh.seq_start)
    for got, want in zip(cache.layers, fresh.layers):
        assert (got.shift_state is not None) == model.config.kv_shift
        for field in ("keys", "values", "log_fgate", "shift_state", "unshifted"):
            a, b = tensors(getattr(got, field)), tensors(getattr(want, field))
            assert len(a) == len(b), field
            for x, y in zip(a, b):
                assert x.shape == y.shape, field
                # Not bit-exact: layer 1's inputs come from attention computed over 8 vs 7 keys.
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=field)
    # Continuing greedily from the cropped cache gives what the fresh shorter cache gives.
    got = greedy_with_cache(model, cache, ids[:, keep : keep + 1], mask[:, :keep], 8)
    want = greedy_with_cache(model, fresh, ids[:, keep : keep + 1], mask[:, :keep], 8)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-5)


def test_crop_to_empty_and_invalid_crops():
    model = tiny(VARIANTS["fox_pro"])
    ids = torch.randint(1, 97, (1, 6))
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
        for bad in (1, -7):
            with pytest.raises(ValueError, match=rf"crop\(tokens_to_remove={bad}\).*between -6"):
                cache.crop(bad)
        assert cache.get_seq_length() == 6  # a refused crop changes nothing
        cache.crop(-6)  # back to empty: the KV-shift starts again from x_{-1} = 0
        assert cache.get_seq_length() == 0 and all(layer.shift_state is None for layer in cache.layers)
        refilled = model(ids[:, :4], past_key_values=cache).logits
    torch.testing.assert_close(refilled, model(ids[:, :4]).logits, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", CROP_VARIANTS)
def test_assisted_generate_equals_greedy_generate(name, monkeypatch):
    # Assisted decoding: the assistant drafts tokens, the model checks them in one chunk, and both caches are
    # cropped back past the rejected drafts. A noisy copy of the model drafts some right and some wrong tokens.
    model = tiny(VARIANTS[name])
    assistant = copy.deepcopy(model)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in assistant.parameters():
            p.add_(0.02 * torch.randn_like(p))
    ids = torch.randint(1, 97, (1, 6))
    plain = model.generate(ids, max_new_tokens=30, do_sample=False)
    crops, chunks = [], []
    crop = FoXCache.crop

    def recording_crop(cache, tokens_to_remove):
        crops.append(tokens_to_remove)
        crop(cache, tokens_to_remove)

    monkeypatch.setattr(FoXCache, "crop", recording_crop)
    model.model.embed.register_forward_hook(lambda mod, args, out: chunks.append(args[0].shape[1]))
    assisted = model.generate(ids, max_new_tokens=30, do_sample=False, assistant_model=assistant)
    assert torch.equal(assisted, plain)
    assert min(crops) < -1  # several drafted tokens were rejected and cropped
    assert len(chunks) < 30  # and some were accepted: fewer forwards of the model than new tokens


def test_static_cache_generate_equals_the_default_cache():
    """cache_implementation='static' (forgetting_transformer.inference): the tokens and logits of the FoXCache path,
    a left-padded batch with an eos that ends one row early."""
    model = tiny(VARIANTS["fox_pro_fixed_gqa"])
    ids = torch.randint(1, 97, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, :6] = 0
    kw = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0, output_logits=True,
              return_dict_in_generate=True)
    free = model.generate(ids, **kw)
    eos = int(free.sequences[1, 12])
    dynamic = model.generate(ids, eos_token_id=eos, **kw)
    static = model.generate(ids, eos_token_id=eos, cache_implementation="static", **kw)
    assert torch.equal(static.sequences, dynamic.sequences)
    torch.testing.assert_close(torch.stack(static.logits, 1), torch.stack(dynamic.logits, 1), rtol=1e-4, atol=1e-5)
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=20, cache_implementation="static")
    assert torch.equal(plain, free.sequences)
    ids[1, :6] = 0  # without a mask, pad tokens in the prompt are padding (transformers' rule)
    kw = dict(max_new_tokens=20, pad_token_id=0)
    assert torch.equal(model.generate(ids, cache_implementation="static", **kw), model.generate(ids, **kw))


def test_acp_eviction_argument_and_config_flag_take_the_static_path(monkeypatch):
    import forgetting_transformer.hf as hf

    calls = []
    static = hf.static_generate
    monkeypatch.setattr(hf, "static_generate", lambda *a, **kw: calls.append(kw) or static(*a, **kw))
    torch.manual_seed(0)
    model = FoXForCausalLM(FoXConfig(vocab_size=97, n_layers=2, d_model=32, head_dim=8, init_std=0.1,
                                     acp_eviction=True, **PRO)).eval()
    ids = torch.randint(1, 97, (2, 6))
    greedy = model.generate(ids, max_new_tokens=8, acp_eviction=False)  # the FoXCache path
    assert not calls
    assert torch.equal(model.generate(ids, max_new_tokens=8), greedy)  # config.acp_eviction
    assert torch.equal(model.generate(ids, max_new_tokens=8, acp_eps=1e-3, block_size=16), greedy)
    assert [c["acp_eviction"] for c in calls] == [True, True] and calls[1]["block_size"] == 16
    model.config.acp_eviction = False
    assert torch.equal(model.generate(ids, max_new_tokens=8, acp_eviction=True), greedy)
    with pytest.raises(ValueError, match=r"\['block_size'\]: arguments of the static-cache path"):
        model.generate(ids, max_new_tokens=8, block_size=16)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_beams=2), "does not implement num_beams=2"),
    (dict(repetition_penalty=1.3), "does not implement repetition_penalty=1.3"),
    (dict(output_scores=True), "does not implement output_scores=True"),
    (dict(inputs_embeds=torch.zeros(1, 4, 32)), r"takes input_ids and attention_mask; got \['inputs_embeds'\]"),
])
def test_static_cache_generate_names_what_it_does_not_implement(kwargs, match):
    model = tiny(PRO)
    with pytest.raises(ValueError, match=match):
        model.generate(torch.ones(1, 4, dtype=torch.long), max_new_tokens=3, cache_implementation="static", **kwargs)
