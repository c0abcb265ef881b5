"""The text escape travels from the data to every evaluation: a corpus converted with --text-escape json (meta.json),
a run trained on it (config.yaml's data.text_escape), load_model_and_tokenizer, generation, lm-eval's requests,
the Hugging Face export, and the refusal of data and model whose escapes differ."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer

from eval.common import (GenerationOptions, check_same_tokenizer, eos_and_pad, generate_batched, generate_texts,
                         load_model_and_tokenizer, model_text_escape, run_text_escape)
from forgetting_transformer.data.tokenizer import json_escape, json_unescape
from tests.script_modules import load_script

ROOT = Path(__file__).resolve().parents[2]
WORDS = ["the", "cat", "sat", '"quoted"', "a\nnew line", "tab\there", "back\\slash", "café", "漢字", "end."]


@pytest.fixture(scope="module")
def json_run(tmp_path_factory, train_on_prepared_data):
    """(run dir, data dir, {file name: text}): a tiny FoX trained one step on documents converted with
    text_escape=json."""
    from forgetting_transformer.data.prepare import prepare_corpus

    tmp = tmp_path_factory.mktemp("json_run")
    rng = np.random.default_rng(0)
    texts = {}
    for i in range(4):
        texts[f"doc{i}.txt"] = " ".join(rng.choice(WORDS, size=500))
        (tmp / f"doc{i}.txt").write_text(texts[f"doc{i}.txt"], encoding="utf-8")
    meta = prepare_corpus([str(tmp / name) for name in texts], tmp / "data", vocab_size=300, doc_len=256,
                          heldout_docs=1, text_escape="json", progress=False, _print_summary=False)
    assert meta["text_escape"] == "json"
    run = train_on_prepared_data(tmp / "run", tmp / "data", meta, "data.seq_len=64", "model.n_layers=1",
                                 "model.d_model=32", "model.n_heads=2", "train.max_steps=1")
    return run, tmp / "data", texts


def plain_bpe(data_dir) -> Tokenizer:
    return Tokenizer.from_file(str(Path(data_dir) / "tokenizer.json"))


def test_the_run_records_the_escape_and_its_tokenizer_applies_it(json_run):
    run, data, texts = json_run
    assert OmegaConf.load(run / "config.yaml").data.text_escape == "json" and model_text_escape(run) == "json"
    assert run_text_escape(OmegaConf.create({"data": {"bos_id": 0}})) == "none"  # a config from before the key
    _, tok, _ = load_model_and_tokenizer(run)
    assert tok.text_escape == "json"
    plain, text = plain_bpe(data), 'He said "go".\nThen: café\t漢字 \\o/'
    assert tok(text).input_ids == [tok.bos_token_id] + plain.encode(json_escape(text)).ids
    assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text
    # the held-out row decodes to the start of its document: newlines, quotes and accents unescaped
    held = next(json.loads(line) for line in (data / "documents.jsonl").read_text().splitlines()
                if json.loads(line)["split"] == "heldout")
    from forgetting_transformer.data.longcrawl64 import open_token_array

    row = np.asarray(open_token_array(data / "heldout.zarr")[0]).tolist()
    decoded = tok.decode(row)
    assert len(decoded) > 100 and "\n" in decoded and '"' in decoded and "\\" in decoded and "é" in decoded
    assert texts[Path(held["source"]).name].startswith(decoded)


def test_generated_ids_are_decoded_with_the_unescape(json_run):
    run, data, _ = json_run
    model, tok, _ = load_model_and_tokenizer(run)
    prompts = [tok("the cat\nsat").input_ids, tok('"quoted" café').input_ids]
    options = GenerationOptions(batch_size=2)
    eos, pad = eos_and_pad(model)
    new = generate_batched(model, prompts, 6, options, eos_token_id=eos, pad_token_id=pad)
    texts = generate_texts(model, tok, prompts, 6, options, desc="gen", unit="prompt", progress=False)
    plain = plain_bpe(data)
    assert texts == [json_unescape(plain.decode(ids, skip_special_tokens=True)) for ids in new]


def test_lm_eval_requests_are_scored_on_the_escaped_ids(json_run):
    from eval.lm_eval_harness.model import FoXLM

    run, data, _ = json_run
    lm = FoXLM(path=str(run), device="cpu", batch_size=2, max_length=256)
    plain, bos = plain_bpe(data), lm.bos_id
    context, continuation = 'Question: "why"?\nAnswer:', " café"
    assert lm.tok_encode(context) == [bos] + plain.encode(json_escape(context)).ids
    ctx, cont = lm._encode_pair(context, continuation)  # what loglikelihood requests hold
    assert ctx + cont == [bos] + plain.encode(json_escape(context + continuation)).ids and cont
    assert lm.tok_decode(cont) == continuation
    (score, _), = lm._loglikelihood_tokens([((context, continuation), ctx, cont)], disable_tqdm=True)
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([ctx + cont])).logits[0].float()
    logp = torch.log_softmax(logits[:-1], -1)[-len(cont):].gather(-1, torch.tensor(cont)[:, None])
    assert score == pytest.approx(float(logp.sum()), abs=1e-4)


def export(run, out):
    module = load_script("export_hf")
    return module.export(run, out)


def test_the_export_records_the_escape_for_auto_tokenizer(json_run, tmp_path):
    from transformers import AutoTokenizer

    run, data, _ = json_run
    hf = export(run, tmp_path / "hf")
    assert json.loads((hf / "tokenizer_config.json").read_text())["text_escape"] == "json"
    text = "a\n\"b\" é"
    want = [0] + plain_bpe(data).encode(json_escape(text)).ids
    assert AutoTokenizer.from_pretrained(hf)(text).input_ids == want
    model, tok, _ = load_model_and_tokenizer(hf)
    assert tok.text_escape == model_text_escape(hf) == "json" and tok(text).input_ids == want
    # --tokenizer with the plain tokenizer.json: read with the export's escape
    _, tok, _ = load_model_and_tokenizer(hf, tokenizer=data / "tokenizer.json")
    assert tok.text_escape == "json" and tok(text).input_ids == want


def test_data_and_model_of_different_escapes_are_refused_naming_both(json_run, tmp_path):
    from eval.per_token_loss.run import evaluate_run
    from forgetting_transformer.data.prepare import prepare_corpus
    from forgetting_transformer.hf.tokenizer import save_tokenizer

    run, data, texts = json_run
    for name, text in texts.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    # the same documents and tokenizer, not escaped
    prepare_corpus([str(tmp_path / n) for n in texts], tmp_path / "plain", tokenizer=str(data / "tokenizer.json"),
                   doc_len=256, heldout_docs=1, progress=False, _print_summary=False)
    refused = r"plain holds text escaped with text_escape=none \(its meta.json\) but the model .*run reads " \
              r"text_escape=json"
    with pytest.raises(ValueError, match=refused):
        check_same_tokenizer(run, tmp_path / "plain")
    with pytest.raises(ValueError, match=refused):
        evaluate_run(run, tmp_path / "out", rows=1, length=64, batch_size=1, device="cpu", data_dir=tmp_path / "plain")
    meta = json.loads((data / "meta.json").read_text())
    assert check_same_tokenizer(run, data) == meta["tokenizer_fingerprint"]  # the model's own data
    # the reverse: a Hugging Face dir whose tokenizer reads plain text, on the escaped data
    hf = export(run, tmp_path / "hf")
    save_tokenizer(data / "tokenizer.json", hf, bos_id=meta["bos_id"], text_escape="none")
    with pytest.raises(ValueError, match=r"data holds text escaped with text_escape=json .* reads text_escape=none"):
        check_same_tokenizer(hf, data)
    # a --tokenizer dir that records another escape than the model's is refused too
    with pytest.raises(ValueError, match="records text_escape=none but the model reads text escaped with "
                                         "text_escape=json"):
        load_model_and_tokenizer(run, tokenizer=hf)
