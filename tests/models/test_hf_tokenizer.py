"""FoXTokenizerFast: the transformers tokenizer that applies a model's text escape (json: LongCrawl64's), on a
small byte-level BPE trained here; save_tokenizer / AutoTokenizer carry the escape through tokenizer_config.json."""

import json

import pytest
from transformers import AutoTokenizer

import forgetting_transformer.hf  # noqa: F401  (registers FoXTokenizerFast with AutoTokenizer)
from forgetting_transformer.data.tokenizer import EOT, json_escape, train_bpe
from forgetting_transformer.hf.tokenizer import (FoXTokenizerFast, fox_tokenizer, save_tokenizer,
                                                        saved_text_escape)

TEXTS = ['He said "stop".\nThen\tleft.', "café 漢字 😀 \\ back\\slash", "plain words only", "a\x00b\x1fc"]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """(tokenizers.Tokenizer, its tokenizer.json): a 400-token byte-level BPE trained on escaped and plain text."""
    corpus = [t for t in TEXTS * 30] + [json_escape(t) for t in TEXTS * 30]
    tok = train_bpe(corpus, 400, progress=False)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tok.save(str(path))
    return tok, path


def test_json_mode_gives_the_plain_ids_of_the_escaped_text_and_decodes_back(bpe):
    plain, path = bpe
    tok = fox_tokenizer(path, bos_id=0, text_escape="json")
    assert isinstance(tok, FoXTokenizerFast) and tok.text_escape == "json" and tok.bos_token == EOT
    for text in TEXTS:
        ids = plain.encode(json_escape(text)).ids
        assert (ids == plain.encode(text).ids) == (text == "plain words only")  # nothing else escapes to itself
        assert tok(text).input_ids == tok.encode(text) == [0] + ids  # bos prepended, as in training
        assert tok(text, add_special_tokens=False).input_ids == ids
        assert tok.tokenize(text) == plain.encode(json_escape(text)).tokens
        assert tok.decode([0] + ids, skip_special_tokens=True) == text
    batch = tok(TEXTS[:2], padding=True)  # left-padded, each row its text's escaped ids
    for row, mask, text in zip(batch.input_ids, batch.attention_mask, TEXTS[:2]):
        assert [i for i, m in zip(row, mask) if m] == [0] + plain.encode(json_escape(text)).ids
    assert batch.attention_mask[0][0] == 0 or batch.attention_mask[1][0] == 0
    assert tok.batch_decode(batch.input_ids, skip_special_tokens=True) == TEXTS[:2]


def test_none_mode_is_the_plain_tokenizer(bpe):
    plain, path = bpe
    tok = fox_tokenizer(path, bos_id=0)
    assert tok.text_escape == "none"
    for text in TEXTS:
        assert tok(text).input_ids == [0] + plain.encode(text).ids
        assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text
    assert tok("a\nb", return_offsets_mapping=True).offset_mapping[-1] == (2, 3)


def test_decoding_a_cut_off_escape_uses_the_fallback(bpe):
    plain, path = bpe
    tok = fox_tokenizer(path, bos_id=0, text_escape="json")
    ids = plain.encode(json_escape("x\né"))  # x \n \u00e9
    cut = ids.ids[:-1]
    assert plain.decode(cut).startswith("x\\n\\u00")  # the last token held the rest of the escape
    assert tok.decode(cut) == "x\n"  # json.loads fails; the fallback drops the broken escape
    assert tok.decode(plain.encode('say "hi').ids) == 'say "hi'  # a bare quote the model produced


def test_offsets_are_refused_in_json_mode(bpe):
    tok = fox_tokenizer(bpe[1], bos_id=0, text_escape="json")
    with pytest.raises(ValueError, match="return_offsets_mapping is not supported with text_escape=json"):
        tok("a\nb", return_offsets_mapping=True)


@pytest.mark.parametrize("mode", ["json", "none"])
def test_the_saved_escape_comes_back_through_auto_tokenizer(bpe, tmp_path, mode):
    plain, path = bpe
    save_tokenizer(path, tmp_path / "tok", bos_id=0, text_escape=mode)
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "FoXTokenizerFast" and config["text_escape"] == mode
    assert saved_text_escape(tmp_path / "tok") == mode
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert type(tok) is FoXTokenizerFast and tok.text_escape == mode and tok.padding_side == "left"
    text = TEXTS[0]
    assert tok(text).input_ids == [0] + plain.encode(json_escape(text) if mode == "json" else text).ids
    assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text


def test_a_source_recording_another_escape_is_refused_naming_both(bpe, tmp_path):
    save_tokenizer(bpe[1], tmp_path / "json", bos_id=0, text_escape="json")
    with pytest.raises(ValueError, match=r"json records text_escape=json but the model reads text escaped with "
                                         r"text_escape=none"):
        fox_tokenizer(tmp_path / "json", bos_id=0, text_escape="none")
    saved = AutoTokenizer.from_pretrained(tmp_path / "json")
    with pytest.raises(ValueError, match="records text_escape=json .* text_escape=none"):
        save_tokenizer(saved, tmp_path / "again", bos_id=0, text_escape="none")
    assert fox_tokenizer(saved, bos_id=0, text_escape="json").text_escape == "json"
    # a directory that records no escape (a tokenizer saved by other code) takes the one asked for
    saved.save_pretrained(tmp_path / "other")
    cfg = json.loads((tmp_path / "other" / "tokenizer_config.json").read_text())
    del cfg["text_escape"]
    (tmp_path / "other" / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert saved_text_escape(tmp_path / "other") is None
    assert fox_tokenizer(tmp_path / "other", bos_id=0, text_escape="json").text_escape == "json"


def test_a_bad_recorded_escape_names_the_file(bpe, tmp_path):
    save_tokenizer(bpe[1], tmp_path / "t", bos_id=0, text_escape="json")
    cfg_file = tmp_path / "t" / "tokenizer_config.json"
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()), "text_escape": "xml"}))
    with pytest.raises(ValueError, match=r"tokenizer_config.json: text_escape='xml': expected one of none, json"):
        saved_text_escape(tmp_path / "t")
    with pytest.raises(ValueError, match=r"tokenizer_config.json text_escape='xml'"):
        AutoTokenizer.from_pretrained(tmp_path / "t")("text")
    with pytest.raises(ValueError, match="no token with id bos_id=999"):
        fox_tokenizer(bpe[1], bos_id=999)
