"""The released FoX checkpoints: scripts/convert_official.py and models/official.py against four tiny models saved
and run by the official code (../shared/fixtures/official_fox: config.json, xz-compressed model.safetensors, and
the official fp32 outputs in fixture.npz)."""

import json
import lzma
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import forgetting_transformer.hf  # noqa: F401  (registers the Auto classes)
from forgetting_transformer.models.layers import mlp_hidden_size
from forgetting_transformer.models.official import (OfficialFormatError, decoder_settings, decoder_state_dict,
                                                    official_config, official_mlp_width, official_state_dict)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT.parent / "shared" / "fixtures" / "official_fox"
MODELS = ("fox-pro", "fox-llama", "transformer-pro", "transformer-llama")
TOL = dict(logits=2e-5, loss=1e-5, layer=1e-5)  # the fixtures' README: official fp32 vs fp64 internals ≤ 3.3e-6
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"official fixtures not found at {FIXTURES}")]


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """Each fixture as a released directory (config.json, generation_config.json, model.safetensors)."""
    root = tmp_path_factory.mktemp("released")
    for name in MODELS:
        d = root / name
        d.mkdir()
        for f in ("config.json", "generation_config.json"):
            shutil.copyfile(FIXTURES / name / f, d / f)
        (d / "model.safetensors").write_bytes(lzma.open(FIXTURES / name / "model.safetensors.xz").read())
    return root


@pytest.fixture(scope="module")
def converted(released, tmp_path_factory):
    from scripts.convert_official import convert

    root = tmp_path_factory.mktemp("converted")
    return {name: convert(str(released / name), root / name, no_tokenizer=True) for name in MODELS}


def golden(name):
    return np.load(FIXTURES / name / "fixture.npz")


def outputs(model, ids, labels):
    """fp32 logits, per-token loss, each block's output and the final norm's, as the fixture stores them."""
    inner, seen = model.model, {}
    hooks = [b.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(f"layer_out.{i}", o))
             for i, b in enumerate(inner.blocks)]
    hooks.append(inner.norm.register_forward_hook(lambda m, a, o: seen.__setitem__("final_norm", o)))
    with torch.no_grad():
        logits = model(ids).logits
        loss = inner(ids, labels)  # the official convention: loss[b, t] = CE(logits[b, t], labels[b, t])
    for h in hooks:
        h.remove()
    return {"logits": logits, "loss": loss, **seen}


def max_diff(model, name) -> dict:
    fx = golden(name)
    ids, labels = torch.from_numpy(fx["input_ids"]), torch.from_numpy(fx["labels"])
    got = outputs(model, ids, labels)
    return {k: (got[k] - torch.from_numpy(fx[k])).abs().max().item() for k in got}


def within(diff: dict) -> bool:
    return (diff["logits"] <= TOL["logits"] and diff["loss"] <= TOL["loss"]
            and all(v <= TOL["layer"] for k, v in diff.items() if k.startswith(("layer_out", "final_norm"))))


@pytest.mark.parametrize("name", MODELS)
def test_converted_model_equals_the_official_outputs(converted, name):
    model = AutoModelForCausalLM.from_pretrained(converted[name]).eval()
    assert model.config.name == name.replace("-", "_")  # the preset it is
    diff = max_diff(model, name)
    assert within(diff), diff
    fx = golden(name)
    with torch.no_grad():
        argmax = model(torch.from_numpy(fx["input_ids"])).logits.argmax(-1)
    assert torch.equal(argmax, torch.from_numpy(fx["logits"]).argmax(-1))


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_continuation_equals_the_official_one(converted, name, cache):
    """16 greedy tokens through the Hugging Face cache and through the static paged cache (its CPU path)."""
    model = AutoModelForCausalLM.from_pretrained(converted[name]).eval()
    fx = golden(name)
    ids = torch.from_numpy(fx["input_ids"])
    extra = {} if cache == "dynamic" else dict(cache_implementation="static", cuda_graph=False)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                         output_logits=True, return_dict_in_generate=True, **extra)
    assert torch.equal(out.sequences[:, ids.shape[1]:], torch.from_numpy(fx["generate_tokens"]))
    step_logits = torch.stack(out.logits, dim=1)
    assert (step_logits - torch.from_numpy(fx["generate_step_logits"])).abs().max().item() <= TOL["logits"]


def _model_from(tensors, settings):
    from forgetting_transformer.hf import FoXConfig, FoXForCausalLM

    model = FoXForCausalLM(FoXConfig(**settings)).eval()
    model.model.load_state_dict(decoder_state_dict(tensors, settings), strict=True)
    return model


@pytest.mark.parametrize("name", MODELS)
def test_every_mapped_tensor_and_option_is_checked_by_the_tolerances(released, name):
    """What a one-line slip in the mapping would do, each tensor or option at a time, leaves the tolerances: a
    tensor taken from the wrong place (here: each one perturbed, or the MLP halves swapped) or an option set
    otherwise (eps, norm layout, rope base) fails the comparison the conversion passes."""
    config = json.loads((released / name / "config.json").read_text())
    tensors = load_file(str(released / name / "model.safetensors"))
    settings = decoder_settings(config, tensors)
    assert within(max_diff(_model_from(tensors, settings), name))
    gen = torch.Generator().manual_seed(0)
    for key in tensors:  # noise of 5% of the tensor's mean magnitude (a scale alone would vanish in the norms)
        changed = dict(tensors)
        noise = torch.randn(tensors[key].shape, generator=gen)
        changed[key] = tensors[key] + 0.05 * tensors[key].abs().mean() * noise
        assert not within(max_diff(_model_from(changed, settings), name)), key
    swapped = dict(tensors)
    gate_up = tensors["model.layers.0.mlp.gate_proj.weight"]
    swapped["model.layers.0.mlp.gate_proj.weight"] = torch.cat(gate_up.chunk(2)[::-1])
    assert not within(max_diff(_model_from(swapped, settings), name))
    options = {"norm_eps": 1e-5}
    if settings["qk_norm"]:
        options["qk_norm_eps"] = 1e-6  # the eps of the other norms
    if settings["rope"]:
        options["rope_base"] = 10000.0
    for key, value in options.items():
        assert not within(max_diff(_model_from(tensors, {**settings, key: value}), name)), key
    if settings["output_norm"]:  # the output norm's weights shared across heads (head 0's) instead of per head
        shared = {**settings, "output_norm_per_head": False}
        state = decoder_state_dict(tensors, settings)
        state = {k: v[0] if k.endswith("o_norm.weight") else v for k, v in state.items()}
        model = _model_from(tensors, settings)
        model.model = type(model.model)(SimpleNamespace(**{**vars(model.config.to_model_config()), **shared}))
        model.model.load_state_dict(state, strict=True)
        assert not within(max_diff(model.eval(), name))


@pytest.mark.parametrize("name", MODELS)
def test_export_back_gives_the_released_tensors_and_config(released, converted, name, tmp_path):
    from scripts.convert_official import to_official

    out = to_official(str(converted[name]), tmp_path / "back")
    original, back = load_file(str(released / name / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert original.keys() == back.keys() and all(torch.equal(original[k], back[k]) for k in original)
    src = json.loads((released / name / "config.json").read_text())
    got = json.loads((out / "config.json").read_text())
    # the released keys that set the function agree (the MLP width: explicit in the export, by rule in the source)
    assert decoder_settings(got) == decoder_settings(src, original)
    assert got["model_type"] == src["model_type"]


def test_the_mlp_width_rule_is_the_official_one_at_every_width():
    for d in range(64, 8193, 64):
        for ratio, r in ((2.3333333333333335, 3.5), (2.6666666666666665, 4)):
            assert mlp_hidden_size(d, ratio, 256) == official_mlp_width(d, r, None), (d, r)
    assert official_mlp_width(1024, 3.5, None) == 2560 and official_mlp_width(1024, 4, None) == 2816
    assert official_mlp_width(1024, 3.5, 1000) == 1000


@pytest.mark.parametrize("preset, size, width", [("fox_pro", "360m", 2560), ("fox_llama", "360m", 2816),
                                                  ("transformer_pro", "760m", 3584), ("fox_pro", "tiny", 512)])
def test_presets_are_the_released_definition(preset, size, width):
    from hydra import compose, initialize_config_dir

    from forgetting_transformer.config import register_configs
    from forgetting_transformer.models.layers import mlp_width

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={preset}", f"model/size={size}"])
    m = cfg.model
    assert mlp_width(m) == width
    if preset.endswith("pro"):
        assert m.qk_norm_eps == 1e-5 and m.output_norm_per_head and m.norm_eps == 1e-6


def _write(d: Path, config: dict, tensors: dict) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(d / "model.safetensors"))
    return d


@pytest.mark.parametrize("change, message", [
    (lambda c, t: c.update(use_v_shift=False), "use_k_shift"),
    (lambda c, t: c.update(qk_norm_share_param_across_head=False), "qk_norm_share_param_across_head"),
    (lambda c, t: c.update(window_size=512), "window_size"),
    (lambda c, t: c.update(tie_word_embeddings=True), "tie_word_embeddings"),
    (lambda c, t: c.update(hidden_act="sigmoid"), "hidden_act"),
    (lambda c, t: c.update(some_new_flag=1), "some_new_flag"),
    (lambda c, t: c.update(model_type="hgrn2-project_fox"), "HGRN2"),
    (lambda c, t: c.update(model_type="llama"), "llama"),
    (lambda c, t: t.pop("model.layers.1.attn.fgate_proj.bias"), "fgate_proj.bias is missing"),
    (lambda c, t: t.update({"model.layers.2.attn.q_proj.weight": torch.zeros(1)}), "does not account for"),
    (lambda c, t: t.update({"model.norm.weight": torch.zeros(7)}), "has shape"),
])
def test_what_cannot_be_mapped_exactly_is_refused_by_name(released, tmp_path, change, message, capsys):
    from scripts.convert_official import main

    config = json.loads((released / "fox-pro" / "config.json").read_text())
    tensors = load_file(str(released / "fox-pro" / "model.safetensors"))
    change(config, tensors)
    src = _write(tmp_path / "src", config, tensors)
    assert main([str(src), "--out", str(tmp_path / "out"), "--no-tokenizer"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_an_older_config_without_the_sharing_flag_takes_it_from_the_weights(released):
    config = json.loads((released / "fox-pro" / "config.json").read_text())
    tensors = load_file(str(released / "fox-pro" / "model.safetensors"))
    del config["qk_norm_share_param_across_head"]
    assert decoder_settings(config, tensors)["qk_norm"]
    per_head = {k: (v.repeat(2) if k.endswith(("q_norm.weight", "k_norm.weight")) else v) for k, v in tensors.items()}
    with pytest.raises(OfficialFormatError, match="qk_norm_share_param_across_head"):
        decoder_settings(config, per_head)


def test_a_non_empty_out_dir_is_kept_unless_overwrite(released, tmp_path):
    from scripts.convert_official import convert

    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty; pass --overwrite"):
        convert(str(released / "fox-llama"), out, no_tokenizer=True)
    assert (out / "keep.txt").read_text() == "mine"
    convert(str(released / "fox-llama"), out, no_tokenizer=True, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()


def test_a_hub_id_offline_is_a_clear_error(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "convert_official.py"),
                        "zhixuan-lin/fox-pro-760m-longcrawl64-48b", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 2 and "could not download" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_export_refuses_what_the_official_code_cannot_express():
    base = dict(name="x", arch="decoder", mixer="softmax", vocab_size=16, n_layers=1, d_model=8, head_dim=4,
                n_heads=None, n_kv_heads=None, mlp_hidden_ratio=8 / 3, mlp_multiple_of=64, mlp_hidden_size=None,
                rope=False, rope_base=5e5, norm_eps=1e-6, init_std=0.02, fgate="data_dependent", fgate_init=None,
                qk_norm=True, qk_norm_eps=None, output_gate=True, output_norm=True, output_norm_per_head=False,
                kv_shift=True, acp=False, acp_eps=math.exp(-10), acp_eviction=False)
    with pytest.raises(OfficialFormatError, match="qk_norm_eps"):
        official_config(base)  # the QK-norm eps is 1e-6 here, 1e-5 in the official code
    with pytest.raises(OfficialFormatError, match="mixer"):
        official_config({**base, "mixer": "path"})
    ok = official_config({**base, "qk_norm_eps": 1e-5})
    assert ok["use_output_norm"] and ok["qk_norm_share_param_across_head"] and ok["intermediate_size"] == 64
    # a shared output norm is written per head, each head a copy
    sd = {"embed.weight": torch.zeros(16, 8), "norm.weight": torch.ones(8), "lm_head.weight": torch.zeros(16, 8),
          "blocks.0.attn.o_norm.weight": torch.arange(4.0)}
    sd.update({f"blocks.0.{k}": torch.zeros(1) for k in (
        "attn_norm.weight", "mlp_norm.weight", "attn.q_proj.weight", "attn.o_proj.weight", "mlp.w_down.weight",
        "attn.k_proj.weight", "attn.v_proj.weight", "attn.k_shift.proj.weight", "attn.v_shift.proj.weight",
        "attn.fgate.proj.weight", "attn.fgate.proj.bias", "attn.g_proj.weight", "attn.q_norm.weight",
        "attn.k_norm.weight", "mlp.w_gate.weight", "mlp.w_up.weight")})
    out = official_state_dict(sd, {**base, "qk_norm_eps": 1e-5})
    assert torch.equal(out["model.layers.0.attn.output_norm.weight"], torch.arange(4.0).repeat(2))


def _gpt2_style_tokenizer_files(d: Path):
    """A small byte-level BPE saved as the official JSONGPT2Tokenizer saves GPT-2's: vocab.json, merges.txt and a
    tokenizer_config.json naming the class; <|endoftext|> is its special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(['He said "hi"\n\tthen left.', "caf\u00e9 \\ back\\slash", "plain words " * 20], trainer)
    d.mkdir(parents=True, exist_ok=True)
    tok.model.save(str(d))
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "JSONGPT2Tokenizer"}))
    return tok


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_the_released_tokenizer_escapes_text_as_longcrawl64_did(released, tmp_path, mode):
    """The official JSONGPT2Tokenizer's files convert to a tokenizer that escapes (``auto``: json) or not (``none``);
    the ids an evaluation gets are the BPE ids of the escaped text behind <|endoftext|> (bos), and decoding gives
    the text back."""
    from transformers import AutoTokenizer

    from scripts.convert_official import convert

    src = tmp_path / "src"
    shutil.copytree(released / "fox-llama", src)
    bpe = _gpt2_style_tokenizer_files(src)
    out = convert(str(src), tmp_path / "out", text_escape=mode)
    tok = AutoTokenizer.from_pretrained(out)
    bos = bpe.token_to_id("<|endoftext|>")
    assert tok.bos_token_id == tok.eos_token_id == tok.pad_token_id == bos
    assert AutoModelForCausalLM.from_pretrained(out).generation_config.bos_token_id == bos
    text = 'She wrote: "caf\u00e9"\n\tand a \\ backslash, \u6f22\u5b57 \U0001F600.'
    escaped = json.dumps(text)[1:-1] if mode == "auto" else text
    ids = tok(text).input_ids
    assert ids == [bos] + bpe.encode(escaped).ids
    assert tok.decode(ids[1:]) == text
    assert json.loads((out / "conversion.json").read_text())["text_escape"] == ("json" if mode == "auto" else "none")
    from eval.common import load_model_and_tokenizer

    model, eval_tok, info = load_model_and_tokenizer(out)  # what every evaluation loads
    assert eval_tok(text).input_ids == ids and info["name"] == "fox_llama"
    with torch.no_grad():
        assert torch.equal(model(torch.tensor([ids])).logits,
                           AutoModelForCausalLM.from_pretrained(out).eval()(torch.tensor([ids])).logits)


@pytest.mark.parametrize("name", MODELS)
def test_the_paper_presets_build_the_released_760m_models(name):
    """experiment=longcrawl64/<model>_760m_48b builds, tensor for tensor, the model the released 760M config (the
    fixture manifest's, with the release's fix-ups) converts to, and computes it with the same settings."""
    from hydra import compose, initialize_config_dir

    from forgetting_transformer.config import register_configs
    from forgetting_transformer.models.decoder import DecoderLM
    from forgetting_transformer.models.layers import mlp_width

    manifest = json.loads((FIXTURES / name / "manifest.json").read_text())
    released = {**manifest["released_760m_config"], **manifest["release_fixups"], "vocab_size": 50257,
                "model_type": manifest["model_type"]}
    released = {k: v for k, v in released.items() if k != "_target_"}
    ours = decoder_settings(released)
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment=longcrawl64/{name.replace('-', '_')}_760m_48b",
                                           "data.data_dir=/nonexistent"])
    m = cfg.model
    heads = m.n_heads or m.d_model // m.head_dim
    preset = dict(n_layers=m.n_layers, d_model=m.d_model, head_dim=m.head_dim, n_heads=heads, fgate=str(m.fgate),
                  rope=m.rope, rope_base=m.rope_base, norm_eps=m.norm_eps, qk_norm=m.qk_norm,
                  qk_norm_eps=(m.qk_norm_eps if m.qk_norm else None), output_gate=m.output_gate,
                  output_norm=m.output_norm, output_norm_per_head=m.output_norm_per_head and m.output_norm,
                  kv_shift=m.kv_shift, mlp_hidden_size=mlp_width(m), vocab_size=m.vocab_size)
    assert preset == {k: ours[k] for k in preset}
    with torch.device("meta"):
        a = DecoderLM(SimpleNamespace(**{**ours, "loss_chunk": 4096}))
        b = DecoderLM(m)
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
