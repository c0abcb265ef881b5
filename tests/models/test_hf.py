"""Hugging Face integration: FoXConfig / FoXForCausalLM, save/load round trip, loss convention, export_hf.py."""

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import MISSING, OmegaConf
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from forgetting_transformer.config import DecoderConfig
from forgetting_transformer.models import build_model
from forgetting_transformer.hf import MODEL_DEFAULTS, MODEL_FIELDS, FoXConfig, FoXForCausalLM
from forgetting_transformer.models.layers import decay_bias_init
from tests.script_modules import load_script

ROOT = Path(__file__).resolve().parents[2]
PRO = dict(qk_norm=True, output_gate=True, output_norm=True, kv_shift=True)
SMALL = dict(vocab_size=97, n_layers=2, d_model=32, head_dim=8)


@pytest.mark.parametrize("switches", [{}, dict(rope=True, **PRO), dict(fgate="fixed", fgate_init=[2, 64], **PRO),
                                      dict(fgate="none", rope=True, n_kv_heads=2, **PRO)])
def test_save_pretrained_round_trip_is_bit_exact(switches, tmp_path):
    torch.manual_seed(0)
    model = FoXForCausalLM(FoXConfig(**SMALL, **switches)).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert AutoConfig.from_pretrained(tmp_path).to_model_config() == model.config.to_model_config()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is FoXForCausalLM
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    x = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        assert torch.equal(model(x).logits, loaded(x).logits)


def test_config_holds_every_model_field_and_writes_them_all(tmp_path):
    cfg = OmegaConf.structured(DecoderConfig(name="fox_pro", **SMALL, fgate="data_independent", fgate_init=[2, 64],
                                             n_kv_heads=2, **PRO))
    hf_cfg = FoXConfig.from_model_config(cfg)
    expected = OmegaConf.to_container(cfg, enum_to_str=True)
    del expected["attention"]  # the run's kernel choices, not the model's
    assert vars(hf_cfg.to_model_config()) == expected
    assert hf_cfg.hidden_size == 32 and hf_cfg.num_hidden_layers == 2
    hf_cfg.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "forgetting_transformer"
    assert set(MODEL_FIELDS) <= set(saved)  # defaults too: the file does not depend on this code's defaults
    with pytest.raises(ValueError, match="does not know"):
        FoXConfig.from_model_config({**OmegaConf.to_container(cfg), "nope": 1})


def test_defaults_are_the_decoder_schemas():
    """FoXConfig keeps its own defaults (models/ does not import the config schemas): the schema's, and a tiny
    FoX (LLaMA) for the keys a run must set."""
    schema = {f.name: f.default for f in dataclasses.fields(DecoderConfig) if f.name != "attention"}
    assert list(MODEL_DEFAULTS) == list(schema)
    required = {k for k, v in schema.items() if v is MISSING}
    assert {k: v for k, v in MODEL_DEFAULTS.items() if k not in required} == {
        k: v for k, v in schema.items() if k not in required}
    assert {k: MODEL_DEFAULTS[k] for k in required} == dict(name="fox_llama", vocab_size=4096, n_layers=4,
                                                            d_model=192)


def test_a_run_config_of_earlier_versions_converts(tmp_path):
    """A decoder run config of an earlier version, with the fla baselines' keys at their defaults, converts."""
    old = dict(name="fox_pro", arch="decoder", **SMALL, **PRO, state_size=128, expand=2, conv_size=4,
               linear_head_dim=128, window_size=2048, ssd_kernel="auto", mamba_mlp_hidden_ratio=2.0)
    hf_cfg = FoXConfig.from_model_config(OmegaConf.create(old))
    assert not hasattr(hf_cfg, "state_size") and hf_cfg.kv_shift and hf_cfg.fgate == "data_dependent"


def test_state_dict_maps_one_to_one_onto_decoder_lm():
    mcfg = DecoderConfig(name="t", **SMALL, fgate="fixed", fgate_init=[2, 64], **PRO)
    torch.manual_seed(0)
    dec = build_model(mcfg).eval()
    hf = FoXForCausalLM(FoXConfig.from_model_config(mcfg)).eval()
    assert {f"model.{k}" for k in dec.state_dict()} == set(hf.state_dict())
    hf.model.load_state_dict(dec.state_dict())  # strict
    x = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        assert torch.equal(hf(x).logits, dec(x))


@pytest.mark.parametrize("fgate", ["data_independent", "data_dependent", "fixed"])
def test_fresh_model_follows_the_decoder_init_scheme(fgate):
    torch.manual_seed(0)
    hf = FoXForCausalLM(FoXConfig(**{**SMALL, "d_model": 256, "head_dim": 64, "vocab_size": 1000},
                                  fgate=fgate, fgate_init=[2, 64], qk_norm=True, output_gate=True))
    attn = hf.model.blocks[0].attn
    assert abs(hf.model.blocks[0].mlp.w_up.weight.std().item() - 0.02) < 0.001
    bias = attn.fgate.proj.bias if fgate == "data_dependent" else attn.fgate.bias
    torch.testing.assert_close(bias.data, decay_bias_init(4, 2, 64).float())  # the gate's bias, not zero
    if fgate == "data_dependent":
        assert abs(attn.fgate.proj.weight.std().item() - 0.02) < 0.002
    assert (attn.q_norm.weight == 1).all() and (hf.model.norm.weight == 1).all()
    dd = FoXForCausalLM(FoXConfig(**SMALL)).model.blocks[0].attn.fgate.proj.bias
    assert (dd == 0).all()


def test_labels_follow_the_hf_convention():
    # labels = input_ids, shifted inside; -100 ignored; mean over the remaining targets.
    torch.manual_seed(0)
    hf = FoXForCausalLM(FoXConfig(**SMALL, **PRO)).eval()
    x = torch.randint(0, 97, (2, 10))
    labels = x.clone()
    labels[0, 6:] = -100
    with torch.no_grad():
        out = hf(x, labels=labels)
        per_token = hf.model(x[:, :-1], x[:, 1:])  # DecoderLM: already-shifted targets, per-token loss (B, T-1)
    keep = labels[:, 1:] != -100
    torch.testing.assert_close(out.loss, per_token[keep].mean())
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[:, :-1].transpose(1, 2), labels[:, 1:]))


def test_inputs_embeds_give_what_the_embedded_ids_give():
    torch.manual_seed(0)
    hf = FoXForCausalLM(FoXConfig(**SMALL, rope=True, **PRO)).eval()
    x = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        emb = hf.model.embed(x)
        ids_out = hf(x, labels=x)
        emb_out = hf(inputs_embeds=emb, labels=x)
        # A cache filled from embeddings continues like one filled from the ids.
        cache = hf(inputs_embeds=emb[:, :6], use_cache=True).past_key_values
        rest = hf(x[:, 6:], past_key_values=cache).logits
        assert torch.equal(hf.model(None, inputs_embeds=emb), hf.model(x))  # DecoderLM's keyword argument
    assert torch.equal(emb_out.logits, ids_out.logits) and torch.equal(emb_out.loss, ids_out.loss)
    torch.testing.assert_close(rest, ids_out.logits[:, 6:], rtol=1e-4, atol=1e-5)


def test_num_items_in_batch_divides_the_summed_token_loss():
    torch.manual_seed(0)
    hf = FoXForCausalLM(FoXConfig(**SMALL, **PRO)).eval()
    x = torch.randint(0, 97, (4, 10))
    labels = x.clone()
    labels[0, 4:] = -100
    labels[3, :7] = -100
    with torch.no_grad():
        per_token = hf.model(x[:, :-1], x[:, 1:])  # (B, T-1) already-shifted targets
        keep = labels[:, 1:] != -100
        for n in (37, torch.tensor(37)):
            torch.testing.assert_close(hf(x, labels=labels, num_items_in_batch=n).loss, per_token[keep].sum() / 37)
        # Gradient accumulation: two micro-batches, each divided by the batch's count, add up to the batch mean
        # however unevenly the targets fall into them.
        count = int(keep.sum())
        parts = [hf(x[i:j], labels=labels[i:j], num_items_in_batch=count).loss for i, j in ((0, 1), (1, 4))]
        torch.testing.assert_close(sum(parts), hf(x, labels=labels).loss)


def test_right_and_left_padding_in_a_forward_give_each_rows_own_logits_and_loss():
    # Without a cache a row may be padded on the right (trailing pads cannot reach earlier tokens), on the left, or
    # both. Reference: each row's real tokens alone.
    torch.manual_seed(0)
    hf = FoXForCausalLM(FoXConfig(**SMALL, rope=True, **PRO)).eval()
    T = 9
    spans = [(0, 9), (0, 5), (3, 9), (2, 6)]  # [start, end) of each row's real tokens
    x = torch.randint(1, 97, (len(spans), T))  # pads are arbitrary tokens, masked out
    mask = torch.zeros_like(x)
    for i, (a, b) in enumerate(spans):
        mask[i, a:b] = 1
    with torch.no_grad():
        out = hf(x, attention_mask=mask, labels=x)
        alone = [hf(x[i : i + 1, a:b]).logits[0] for i, (a, b) in enumerate(spans)]
        alone_loss = torch.cat([hf.model(x[i : i + 1, a : b - 1], x[i : i + 1, a + 1 : b])[0]
                                for i, (a, b) in enumerate(spans)])  # every real row's per-token losses
        # The usual collator marks pads with -100 instead: the same loss, without a mask for the right pads.
        labels = x.masked_fill(mask == 0, -100)
        right_only = hf(x[:2], attention_mask=mask[:2], labels=labels[:2]).loss
        right_no_mask = hf(x[:2], labels=labels[:2]).loss
    for i, (a, b) in enumerate(spans):
        torch.testing.assert_close(out.logits[i, a:b], alone[i], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.loss, alone_loss.mean())
    torch.testing.assert_close(right_no_mask, right_only)
    torch.testing.assert_close(right_only, alone_loss[: 8 + 4].mean())


# ------------------------------------------------------------------------------------------------ export_hf.py

WORDS = ("the of and to in a is that it was he for on are as with his they at be this from have or by one had not "
         "but what all were when we there can an your which their said if do will each about how up out them").split()


@pytest.fixture(scope="module")
def run(tmp_path_factory, train_on_prepared_data):
    """A tiny FoX (Pro) + RoPE run trained by train.py on a data dir with its own tokenizer.json."""
    from forgetting_transformer.data.prepare import prepare_corpus

    tmp = tmp_path_factory.mktemp("hf_export")
    rng = np.random.default_rng(0)
    texts = []
    for i in range(3):
        (tmp / f"doc{i}.txt").write_text(" ".join(rng.choice(WORDS, size=1500)), encoding="utf-8")
        texts.append(tmp / f"doc{i}.txt")
    meta = prepare_corpus([str(t) for t in texts], tmp / "data", vocab_size=300, doc_len=64, heldout_docs=1,
                          progress=False, _print_summary=False)
    out = train_on_prepared_data(tmp / "run", tmp / "data", meta, "model=fox_pro_rope", "data.seq_len=32",
                                 "model.n_layers=1", "model.d_model=32", "model.n_heads=2", "train.max_steps=2")
    return tmp, out


def export_cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "export_hf.py"), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def export_fn():
    module = load_script("export_hf")
    return module.export


def test_export_loads_with_auto_classes_and_matches_the_training_model(run, tmp_path):
    from eval.common import load_run

    tmp, run_dir = run
    res = export_cli(run_dir, tmp_path / "hf", "--step", 2)
    assert res.returncode == 0, res.stderr[-3000:]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    trained, cfg, _ = load_run(run_dir)
    ids = tok(["the of and to in", "what all were when we there can an"], return_tensors="pt", padding=True)
    assert tok.padding_side == "left" and ids.attention_mask[0, 0] == 0  # row 0 is the shorter one
    assert ids.input_ids[1, 0].item() == cfg.data.bos_id  # bos prepended, as the training reader does
    assert tok.decode(tok("the of and")["input_ids"], skip_special_tokens=True) == "the of and"
    x = ids.input_ids[1:]
    with torch.no_grad():
        assert torch.equal(model(x).logits, trained(x))
    out = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert out.shape == (2, ids.input_ids.shape[1] + 5)
    assert model.generation_config.eos_token_id == cfg.data.bos_id == tok.eos_token_id
    assert isinstance(tok.decode(out[0]), str)


def test_export_of_a_missing_step_names_the_steps_and_a_used_out_dir_needs_overwrite(run, tmp_path):
    tmp, run_dir = run
    res = export_cli(run_dir, tmp_path / "hf", "--step", 7)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.stderr.splitlines() == [f"error: no complete checkpoint (step 7) under {run_dir / 'checkpoints'}; "
                                       f"the steps it has: 2"]
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    export = export_fn()
    with pytest.raises(FileExistsError, match=f"{out}: not empty; pass --overwrite"):
        export(run_dir, out)
    assert (out / "keep.txt").read_text() == "mine"
    export(run_dir, out, overwrite=True)  # written beside out, then renamed into its place
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_export_without_a_tokenizer_is_a_clear_error_and_tokenizer_flag_fixes_it(run, tmp_path):
    tmp, run_dir = run
    # A run whose data dir has no tokenizer.json (like GPT-2-tokenised LongCrawl64).
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    cfg = OmegaConf.load(copy / "config.yaml")
    cfg.data.data_dir = str(tmp_path / "no_tokenizer")
    (copy / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    export = export_fn()
    with pytest.raises(FileNotFoundError, match="tokenizer.json.*--tokenizer"):
        export(copy, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    export(copy, tmp_path / "hf", tokenizer=tmp / "data" / "tokenizer.json")
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").bos_token == "<|endoftext|>"
