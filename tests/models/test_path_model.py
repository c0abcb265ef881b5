"""PaTH and PaTH-FoX as decoder models (model.mixer=path): the blocks hold PathAttention; with every beta at 0 the
model is the FoX / softmax model with the same weights; meta-device init leaves nothing uninitialised; decoding
through ``new_cache`` and through Hugging Face ``generate()`` equals the argmax of a full recompute; an export
round-trips; the static generation path refuses PaTH naming the mixer. Tiny float64 / float32 models on the CPU
(the layer's reference backend)."""

import pytest
import torch
from omegaconf import OmegaConf

from forgetting_transformer.config import PATH_HEAD_DIMS, DecoderConfig
from forgetting_transformer.models import build_model
from forgetting_transformer.hf import FoXConfig, FoXForCausalLM
from forgetting_transformer.models.layers import Attention, LayerCache
from forgetting_transformer.models.path import KERNEL_HEAD_DIMS, PathAttention, PathCache
from forgetting_transformer.training.parallel import init_weights

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only waits
PRO = dict(qk_norm=True, output_gate=True, output_norm=True, kv_shift=True)
VOCAB = 61


def tiny(seed=0, dtype=torch.float32, **switches):
    cfg = OmegaConf.structured(DecoderConfig(name="path_tiny", vocab_size=VOCAB, n_layers=2, d_model=32,
                                             head_dim=16, **switches))
    torch.manual_seed(seed)
    return build_model(cfg).to(dtype).eval()


def test_the_config_mirrors_the_kernels_head_dims():
    assert PATH_HEAD_DIMS == KERNEL_HEAD_DIMS  # config.py imports nothing from the models


@pytest.mark.parametrize("fgate", ["data_dependent", "none"])
def test_mixer_path_builds_path_attention_and_softmax_keeps_attention(fgate):
    path, softmax = tiny(mixer="path", fgate=fgate, **PRO), tiny(fgate=fgate, **PRO)
    assert all(isinstance(b.attn, PathAttention) for b in path.blocks)
    assert all(type(b.attn) is Attention for b in softmax.blocks)
    assert (path.blocks[0].attn.fgate is None) == (fgate == "none")
    assert all(isinstance(c, PathCache) for c in path.new_cache())
    assert all(isinstance(c, LayerCache) for c in softmax.new_cache())
    full = tiny(mixer="path", path_w_rank=None, path_conv_size=2, **PRO).blocks[0].attn
    assert isinstance(full.w_proj, torch.nn.Linear) and full.w_conv.kernel_size == (2,)


@pytest.mark.parametrize("switches", [dict(fgate="data_dependent", **PRO), dict(fgate="none", **PRO),
                                      dict(fgate="data_independent", fgate_init=[2, 64])])
def test_with_beta_zero_the_model_is_the_softmax_model_with_the_same_weights(switches):
    # beta = 2 sigmoid(b) = 0 makes every Householder transform the identity: PaTH-FoX is FoX, PaTH is softmax
    # attention without position encoding (the model-level wiring; test_path.py checks the layer).
    softmax = tiny(dtype=torch.float64, **switches)
    path = tiny(seed=1, dtype=torch.float64, mixer="path", **switches)
    missing, unexpected = path.load_state_dict(softmax.state_dict(), strict=False)
    assert not unexpected and all(k.split(".")[3] in ("w_proj", "w_conv", "b_proj") for k in missing)
    for b in path.blocks:
        torch.nn.init.zeros_(b.attn.b_proj.weight)
        torch.nn.init.constant_(b.attn.b_proj.bias, -1e4)  # sigmoid underflows to exactly 0
    x = torch.randint(0, VOCAB, (2, 12))
    torch.testing.assert_close(path(x), softmax(x), rtol=1e-10, atol=1e-10)


def test_meta_build_then_init_gives_the_eager_weights_with_nothing_left_uninitialised():
    cfg = OmegaConf.structured(DecoderConfig(name="t", vocab_size=VOCAB, n_layers=2, d_model=32, head_dim=16,
                                             mixer="path", **PRO))
    torch.manual_seed(3)
    eager = build_model(cfg)
    with torch.device("meta"):
        model = build_model(cfg)
    init_weights(model, torch.device("cpu"), seed=3)  # raises naming any tensor reset_parameters misses
    for name, t in model.state_dict().items():
        assert torch.equal(t, eager.state_dict()[name]), name
    conv = model.blocks[0].attn.w_conv.weight
    assert abs(conv.std().item() - cfg.init_std) < 0.01  # N(0, init_std), not torch's default init


def greedy_recompute(model, ids, steps):
    """Argmax of the full forward on the growing sequence (no cache)."""
    for _ in range(steps):
        ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=1)
    return ids


@torch.no_grad()
def test_decoding_through_new_cache_matches_the_full_forward():
    model = tiny(dtype=torch.float64, mixer="path", **PRO)
    x = torch.randint(0, VOCAB, (2, 11))
    cache = model.new_cache()
    parts = [model(x[:, :6], cache=cache), model(x[:, 6:9], cache=cache), model(x[:, 9:10], cache=cache),
             model(x[:, 10:], cache=cache)]
    torch.testing.assert_close(torch.cat(parts, dim=1), model(x), rtol=1e-6, atol=1e-6)  # gates, norms: fp32


def hf_of(model):
    hf = FoXForCausalLM(FoXConfig.from_model_config(model.cfg))
    hf.model.load_state_dict(model.state_dict())
    return hf.eval()


@torch.no_grad()
@pytest.mark.parametrize("fgate", ["data_dependent", "none"])
def test_hf_generate_equals_the_argmax_of_a_full_recompute(fgate):
    model = tiny(mixer="path", fgate=fgate, **PRO)
    hf = hf_of(model)
    x = torch.randint(0, VOCAB, (1, 9))
    out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False,
                      pad_token_id=0, eos_token_id=None)
    assert torch.equal(out, greedy_recompute(model, x, 8))


@torch.no_grad()
def test_hf_forward_with_a_cache_matches_without_and_beams_reorder_it():
    hf = hf_of(tiny(dtype=torch.float64, mixer="path", **PRO))
    x = torch.randint(0, VOCAB, (2, 10))
    first = hf(input_ids=x[:, :7], use_cache=True)
    rest = hf(input_ids=x[:, 7:], cache=first.past_key_values)
    torch.testing.assert_close(torch.cat([first.logits, rest.logits], 1), hf(input_ids=x).logits,
                               rtol=1e-6, atol=1e-6)
    cache = hf(input_ids=x[:, :7], use_cache=True).past_key_values
    cache.reorder_cache(torch.tensor([1, 1]))  # both rows continue row 1
    swapped = hf(input_ids=x[1:, 7:].expand(2, -1), cache=cache).logits
    torch.testing.assert_close(swapped, hf(input_ids=x[1:]).logits[:, 7:].expand(2, -1, -1), rtol=1e-6, atol=1e-6)
    with pytest.raises(NotImplementedError, match="PaTH cache .* cannot be cropped"):
        cache.crop(-1)


def test_export_round_trip_keeps_the_keys_and_the_logits(tmp_path):
    model = tiny(mixer="path", fgate="data_dependent", path_w_rank=None, path_conv_size=4, **PRO)
    hf_of(model).save_pretrained(tmp_path)
    loaded = FoXForCausalLM.from_pretrained(tmp_path).eval()
    assert (loaded.config.mixer, loaded.config.path_w_rank, loaded.config.path_conv_size) == ("path", None, 4)
    x = torch.randint(0, VOCAB, (2, 10))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=x).logits, model(x))


@pytest.mark.parametrize("kwargs", [dict(cache_implementation="static"), dict(acp_eviction=True)])
def test_the_static_generation_path_refuses_path_naming_the_mixer(kwargs):
    hf = hf_of(tiny(mixer="path", **PRO))
    with pytest.raises(NotImplementedError, match="model.mixer=path .*default cache"):
        hf.generate(torch.randint(0, VOCAB, (1, 5)), max_new_tokens=2, **kwargs)


def test_the_gate_analysis_refuses_path_naming_the_mixer(tmp_path):
    from eval.gates.run import analyze

    with pytest.raises(ValueError, match="model.mixer=path"):
        analyze(tiny(mixer="path", **PRO), torch.randint(0, VOCAB, (1, 8)), tmp_path, what=["A"], progress=False)


def test_the_attention_options_backend_reaches_the_path_layer(monkeypatch):
    # model.attention.backend (the options in force for a run) picks PaTH's backend too; on a CPU without the
    # Triton interpreter the kernel is refused, which shows the option arrived
    from forgetting_transformer.models import path as path_module
    from forgetting_transformer.ops.forgetting_attention import use_options

    monkeypatch.setattr(path_module, "interpreting", lambda: False)
    model, x = tiny(mixer="path", **PRO), torch.randint(0, VOCAB, (1, 6))
    with use_options(backend="reference"):
        model(x)
    with use_options(backend="triton"), pytest.raises(RuntimeError, match="backend='triton'"):
        model(x)
