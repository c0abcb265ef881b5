"""generate() over the paged static cache against full recomputation without a cache: greedy tokens and logits
for every attention flavour (FoX LLaMA / Pro, RoPE, GQA / MQA, fixed and data-independent gates, the
Transformers), prompts of different lengths in one batch, chunked prefill, sampling, eos, and bad arguments."""

import gc
import weakref

import pytest
import torch

from inference_models import LOCAL, VARIANTS, recompute_alone, recompute_batch, tiny
from forgetting_transformer.inference import PagedKVCache, Sampler, generate, left_pad


@pytest.mark.parametrize("name", VARIANTS)
def test_greedy_tokens_and_logits_equal_full_recomputation(name, prompts):
    model = tiny(VARIANTS[name])
    # block_size 16: the 9-token prompt and 24 new tokens cross two block boundaries
    out = generate(model, prompts, max_new_tokens=24, block_size=16, output_logits=True)
    T = max(len(p) for p in prompts)
    assert out.sequences.shape == (3, T + 24) and out.logits.shape == (3, 24, 97)
    for i, (tokens, logits) in enumerate(recompute_alone(model, prompts, 24)):
        assert torch.equal(out.sequences[i, T:], tokens), f"row {i}"
        torch.testing.assert_close(out.logits[i], logits.float(), rtol=1e-6, atol=1e-6)
    assert torch.equal(out.sequences[:, :T], left_pad(prompts, 0)[0])


@pytest.mark.parametrize("name", ["fox_pro_rope_gqa", "transformer_pro_gqa"])
def test_float32_and_chunked_prefill_equal_full_recomputation(name, prompts):
    model = tiny(VARIANTS[name], dtype=torch.float32)
    want = recompute_alone(model, prompts, 20)
    for chunk in (None, 4):
        out = generate(model, prompts, max_new_tokens=20, block_size=16, prefill_chunk=chunk, output_logits=True)
        for i, (tokens, logits) in enumerate(want):
            assert torch.equal(out.sequences[i, 9:], tokens), (chunk, i)
            torch.testing.assert_close(out.logits[i], logits, rtol=1e-4, atol=1e-5)


def test_sampled_tokens_equal_sampling_by_recomputation(prompts):
    # Both draw one (B, V) batch of noise per step from the global generator: the same seed, the same tokens.
    model = tiny(VARIANTS["fox_pro"])
    sampler = Sampler(do_sample=True, temperature=0.7, top_k=20, top_p=0.9)
    torch.manual_seed(5)
    got = generate(model, prompts, max_new_tokens=16, do_sample=True, temperature=0.7, top_k=20, top_p=0.9)
    torch.manual_seed(5)
    want = recompute_batch(model, prompts, 16, sampler)
    assert torch.equal(got.sequences[:, 9:], want)
    greedy = generate(model, prompts, max_new_tokens=16)
    assert not torch.equal(got.sequences, greedy.sequences)  # sampling chose differently somewhere
    top1 = generate(model, prompts, max_new_tokens=16, do_sample=True, top_k=1)
    assert torch.equal(top1.sequences, greedy.sequences)


def test_sampler_filters_and_draws_from_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    probs = torch.softmax(logits / 0.5, -1)[0]
    kept = Sampler(do_sample=True, temperature=0.5, top_k=3, top_p=0.97).filter(logits)[0].isfinite()
    # top-3 keeps tokens 0-2 (renormalised: 0.844, 0.114, 0.042), and top-p keeps token 2 as well: the more
    # likely ones reach only 0.958
    assert kept.tolist() == [True, True, True, False, False]
    kept = Sampler(do_sample=True, temperature=0.5, top_p=0.85).filter(logits)[0].isfinite()
    assert kept.tolist() == [True, True, False, False, False] and probs[0] < 0.85 <= probs[:2].sum()
    torch.manual_seed(0)
    draws = Sampler(do_sample=True, temperature=0.5)(logits.expand(40000, 5))
    freq = torch.bincount(draws, minlength=5).double() / 40000
    assert (freq - probs.double()).abs().max() < 0.01  # 4 standard errors at this count


def test_eos_pads_ended_sequences_and_stops_when_all_ended(prompts):
    model = tiny(VARIANTS["fox_llama"])
    free = generate(model, prompts, max_new_tokens=30).sequences[:, 9:]
    eos = int(free[0, 3])  # row 0 emits it at step 3 (or earlier)
    out = generate(model, prompts, max_new_tokens=30, eos_token_id=[eos, 96], pad_token_id=0).sequences[:, 9:]
    ends = [int((row == eos).nonzero()[0]) if (row == eos).any() else 30 for row in free]
    assert out.shape[1] == min(30, max(ends) + 1)
    for i, end in enumerate(ends):
        assert torch.equal(out[i, :end + 1], free[i, :end + 1][:out.shape[1]])
        assert (out[i, end + 1:] == 0).all()


def test_cache_stats_count_every_token_without_eviction(prompts):
    model = tiny(VARIANTS["fox_pro_rope_gqa"])
    stats = generate(model, prompts, max_new_tokens=24, block_size=16).stats
    real = torch.tensor([9, 2, 5]) + 23  # the last token is chosen, not cached
    assert torch.equal(stats["tokens"], real) and not stats["acp_eviction"]
    assert torch.equal(stats["kept"], real[None, :, None].expand(2, 3, 4))
    # 2 layers x 3 sequences x 2 kv heads x 2 blocks (32 positions cached) in pools sized for max_len = 33
    # positions (3 blocks a row); no block is released: no block holds padding only
    assert stats["blocks_in_use"] == 24 and stats["pool_blocks"] == stats["full_blocks"] == 36


@pytest.mark.parametrize("compile_step", [False, True])
def test_generate_frees_its_cache_on_return_without_the_cyclic_collector(prompts, monkeypatch, compile_step):
    """The pools (40 GB for a 760M model at 32k x 8) go back when generate() returns, not when Python's cyclic
    collector next runs: no reference cycle holds the cache (its layer views, the decoder; the first compiled
    call's trace objects, which do form cycles, are collected by that call)."""
    made = []
    for_model = PagedKVCache.for_model.__func__

    def recording(cls, *args, **kwargs):
        cache = for_model(cls, *args, **kwargs)
        made.extend(weakref.ref(t) for t in (cache, cache.k_pool, cache.v_pool, cache.c_pool))
        return cache

    monkeypatch.setattr(PagedKVCache, "for_model", classmethod(recording))
    model = tiny(LOCAL)
    torch._dynamo.reset()  # the first call compiles the step
    gc.collect()
    gc.disable()
    try:
        for evict in (False, True):
            generate(model, prompts, max_new_tokens=24, block_size=16, acp_eviction=evict, compile_step=compile_step)
        assert len(made) == 8 and [r() for r in made] == [None] * 8
    finally:
        gc.enable()
        torch._dynamo.reset()


def test_left_padding_blocks_are_released():
    model = tiny(VARIANTS["fox_pro"])
    prompts = [torch.randint(1, 97, (n,)) for n in (40, 3)]
    out = generate(model, prompts, max_new_tokens=4, block_size=16)
    # row 1 starts at 37: its blocks 0 and 1 (positions 0-31) hold only padding, in 2 layers x 4 kv heads
    assert out.stats["blocks_in_use"] == out.stats["full_blocks"] - 2 * 2 * 4


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_new_tokens=0), "max_new_tokens must be an int >= 1"),
    (dict(do_sample=True, temperature=0.0), "temperature must be > 0"),
    (dict(do_sample=True, top_p=1.5), r"top_p must be None or in \(0, 1\]"),
    (dict(do_sample=True, top_k=-1), "top_k must be None or an int >= 0"),
    (dict(block_size=24), "block_size must be a power of two >= 16"),
    (dict(eos_token_id=97), r"eos_token_id must be a token id or a list of them in \[0, 97\)"),
    (dict(pad_token_id=-1), "pad_token_id must be"),
    (dict(prefill_chunk=0), "prefill_chunk must be None or an int >= 1"),
    (dict(cuda_graph=True), "cuda_graph=True needs the model on a CUDA device"),
    (dict(eviction_threshold=-5.0), "pass acp_eviction=True with it"),
    (dict(acp_eviction=True), "no QK-norm .*pass eviction_threshold="),
    (dict(acp_eviction=True, eviction_threshold=0.5), "eviction_threshold must be a float < 0"),
    (dict(attention_mask=torch.ones(2, 3)), "attention_mask goes with input_ids as a"),
    (dict(dtype=torch.int32), r"dtype must be None or one of torch.float32, torch.bfloat16, .*; got torch.int32"),
    (dict(dtype="bf16"), r"dtype must be None or one of torch.float32, .*; got 'bf16'"),
])
def test_bad_arguments_are_clear_errors(kwargs, match):
    model = tiny(VARIANTS["fox_llama"])
    with pytest.raises(ValueError, match=match):
        generate(model, [[1, 2, 3], [4]], **{"max_new_tokens": 2, **kwargs})


def test_bad_inputs_are_clear_errors():
    fox, transformer = tiny(LOCAL), tiny(VARIANTS["transformer_llama"])
    with pytest.raises(ValueError, match="needs a forget gate"):
        generate(transformer, [[1, 2]], max_new_tokens=2, acp_eviction=True)
    with pytest.raises(ValueError, match="row 1 has no real token"):
        generate(fox, torch.ones(2, 3, dtype=torch.long), torch.tensor([[1, 1, 1], [0, 0, 0]]), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"row 0 has padding at the end \(right padding\)"):
        generate(fox, torch.ones(1, 3, dtype=torch.long), torch.tensor([[1, 1, 0]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="token id 200 >= model.vocab_size=97"):
        generate(fox, [[1, 200]], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"token id -2 < 0: token ids must be in \[0, model.vocab_size=97\)"):
        generate(fox, [[1, -2], [3]], max_new_tokens=2)
    with pytest.raises(TypeError, match="model must be a DecoderLM"):
        generate(torch.nn.Linear(2, 2), [[1]], max_new_tokens=2)
    cache = PagedKVCache.for_model(fox, 1, 20, block_size=16)
    cache.begin(torch.zeros(1, dtype=torch.long))
    cache.reserve(16)
    with pytest.raises(ValueError, match="holds max_len=20 positions per sequence; 0 written \\+ 21 more"):
        cache.reserve(21)


def test_generation_through_the_triton_kernel_equals_full_recomputation(prompts, monkeypatch):
    # The decode step with the Triton kernels (interpreted on the CPU, fp32) over the cache as generation fills it:
    # blocks from the free list, left padding, GQA, a prefill chunk of several queries, eviction starts.
    import functools

    import forgetting_transformer.inference.cache as cache_module

    kernel = functools.partial(cache_module.forgetting_attention_decode, backend="triton", num_splits=2)
    monkeypatch.setattr(cache_module, "forgetting_attention_decode", kernel)
    monkeypatch.setattr(cache_module, "paged_write", functools.partial(cache_module.paged_write, backend="triton"))
    model = tiny(LOCAL, dtype=torch.float32)
    out = generate(model, prompts, max_new_tokens=30, block_size=16, prefill_chunk=5, acp_eviction=True,
                   acp_eps=1e-2, output_logits=True)
    assert (out.stats["kept"] < out.stats["tokens"][None, :, None]).any()  # some keys were evicted
    for i, (tokens, logits) in enumerate(recompute_alone(model, prompts, 30)):
        assert torch.equal(out.sequences[i, 9:], tokens), f"row {i}"
        torch.testing.assert_close(out.logits[i], logits, rtol=1e-4, atol=1e-4)


def test_the_compiled_step_compiles_once_for_new_batches_lengths_and_pools(monkeypatch):
    """compile_step=True (Inductor, on the CPU here) gives the tokens and logits of the uncompiled step, and after
    its first compilation serves other batch sizes, prompt lengths, table lengths and pool sizes (eviction's
    growing pools) without compiling again: dynamo's graph count stays at one."""
    import torch._dynamo

    graphs = []

    def counting(gm, example_inputs):  # the backend dynamo calls once per graph it compiles
        graphs.append(gm)
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend=counting, **kw))
    torch._dynamo.reset()
    model = tiny(LOCAL, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    for B, P, n, evict in ((2, 70, 12, False), (3, 40, 30, False), (2, 150, 20, True), (4, 90, 40, True)):
        ids = torch.randint(0, 97, (B, P), generator=g)
        kw = dict(max_new_tokens=n, block_size=16, acp_eviction=evict, output_logits=True)
        got, want = generate(model, ids, compile_step=True, **kw), generate(model, ids, compile_step=False, **kw)
        assert torch.equal(got.sequences, want.sequences), (B, P, evict)
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)
    assert len(graphs) == 1, f"the decoding step compiled {len(graphs)} times"
    torch._dynamo.reset()
