"""The text escape of a data dir (data.text_escape, LongCrawl64's ``json.dumps(text)[1:-1]``): the escape and
unescape functions, the converter's --text-escape and meta.json record, the reader's check and the fingerprint."""

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from forgetting_transformer.config import TextEscape
from forgetting_transformer.data import LongCrawl64Dataset, ensure_data, ensure_prepared, prepare_corpus, read_rows
from forgetting_transformer.data.tokenizer import (TEXT_ESCAPES, escape_text, json_escape, json_unescape,
                                                   text_escape_name, tokenizer_fingerprint, unescape_text)
from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[2]

TEXTS = {
    "newlines and tabs": "line one\nline two\r\n\tindented\n\n",
    "quotes": 'she said "hi" and \'bye\'',
    "backslashes": "C:\\path\\to\\file and \\n is not a newline",
    "accents": "café, naïve, Ærøskøbing",
    "cjk": "漢字とかな",
    "emoji": "ok 😀👍🏽 done",
    "control characters": "a\x00b\x01c\x1fd\x7fe\u2028f\u2029g",
    "everything": 'x\n"\\\té漢😀\x00',
}


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_escape_round_trips_and_is_plain_ascii(name):
    text = TEXTS[name]
    escaped = json_escape(text)
    assert escaped == json.dumps(text)[1:-1]
    assert escaped.isascii() and all(" " <= c <= "~" for c in escaped)  # no raw newline, tab or control char
    assert json_unescape(escaped) == text
    assert escape_text(text, "json") == escaped and unescape_text(escaped, "json") == text


def test_escape_of_each_kind_of_character():
    assert json_escape('a\nb\t"c"\\') == 'a\\nb\\t\\"c\\"\\\\'
    assert json_escape("é漢") == "\\u00e9\\u6f22"
    assert json_escape("😀") == "\\ud83d\\ude00"  # a UTF-16 surrogate pair
    assert json_escape("\x00\x7f") == "\\u0000\\u007f"
    assert escape_text("a\nb", "none") == "a\nb" and unescape_text("a\\nb", "none") == "a\\nb"


@pytest.mark.parametrize("cut, expected", [
    ("abc\\u00", "abc"),  # a \uXXXX escape cut off at the end of a generation
    ("abc\\", "abc"),  # a lone trailing backslash
    ('line\\n say "hi', 'line\n say "hi'),  # a bare quote: json.loads fails, the fallback unescapes the rest
    ("x\\ny\\u12", "x\ny"),
])
def test_unescape_of_a_broken_escape_falls_back_without_raising(cut, expected):
    with pytest.raises(json.JSONDecodeError):
        json.loads(f'"{cut}"')
    assert json_unescape(cut) == expected


@pytest.mark.parametrize("cut, expected", [
    ("ok \\ud83d", "ok \ufffd"),  # an emoji cut after the first half of its surrogate pair
    ("\\ude00 z", "\ufffd z"),
    ("ok \\ud83d\\ude00 \\u00", "ok 😀 "),  # the fallback's pair is joined
])
def test_unescape_never_leaves_half_a_surrogate_pair(cut, expected):
    out = json_unescape(cut)
    assert out == expected
    out.encode("utf-8")  # writable as UTF-8 (a lone surrogate is not)


def test_mode_names_are_the_config_enum_and_bad_ones_name_the_key():
    assert tuple(m.value for m in TextEscape) == TEXT_ESCAPES == ("none", "json")
    assert text_escape_name(TextEscape.json) == "json" and text_escape_name("none") == "none"
    with pytest.raises(ValueError, match=r"data.text_escape='xml': expected one of none, json"):
        text_escape_name("xml", "data.text_escape")


# --------------------------------------------------------------------------- the converter and the reader


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    """Four small documents full of characters the escape changes, as .txt files."""
    d = tmp_path_factory.mktemp("escape_docs")
    rng = np.random.default_rng(0)
    words = ["the", "cat", '"quoted"', "a\nnew line", "tab\there", "back\\slash", "café", "漢字", "😀", "end."]
    paths = []
    for i in range(4):
        (d / f"doc{i}.txt").write_text(" ".join(rng.choice(words, size=400)), encoding="utf-8")
        paths.append(d / f"doc{i}.txt")
    return paths


def build(docs, out, text_escape):
    return prepare_corpus([str(p) for p in docs], out, vocab_size=300, doc_len=32, heldout_docs=1,
                          text_escape=text_escape, progress=False, _print_summary=False)


def test_json_build_tokenizes_the_escaped_text_and_records_the_mode(docs, tmp_path):
    meta = build(docs, tmp_path / "json", "json")
    saved = json.loads((tmp_path / "json" / "meta.json").read_text())
    assert meta["text_escape"] == saved["text_escape"] == "json" and saved["settings"]["text_escape"] == "json"
    assert saved["tokenizer_fingerprint"] == tokenizer_fingerprint(tmp_path / "json" / "tokenizer.json", "json")
    tok = Tokenizer.from_file(str(tmp_path / "json" / "tokenizer.json"))
    records = [json.loads(line) for line in (tmp_path / "json" / "documents.jsonl").read_text().splitlines()]
    held = next(r for r in records if r["split"] == "heldout")
    text = next(p for p in docs if Path(held["source"]).name == p.name).read_text(encoding="utf-8")
    ids = tok.encode(json_escape(text)).ids
    assert held["tokens"] == len(ids)  # the document's tokens are those of its escaped text
    _, labels = read_rows(tmp_path / "json" / "heldout.zarr", [0], 32, vocab_size=meta["vocab_size"],
                          bos_id=meta["bos_id"], text_escape="json")
    assert labels[0].tolist() == ids[:32]
    assert "\n" not in tok.decode(ids) and "\\n" in tok.decode(ids)  # BPE saw no raw newline
    # the plain build of the same documents differs: its ids are those of the text itself
    plain = build(docs, tmp_path / "none", "none")
    assert plain["text_escape"] == "none" and "text_escape" not in plain["settings"]
    assert plain["stats"]["train"]["tokens_total"] < meta["stats"]["train"]["tokens_total"]


def test_ensure_prepared_rebuilds_when_the_escape_changes_and_the_cli_flag_sets_it(docs, tmp_path, capsys):
    cli = load_script("prepare_corpus")
    out = tmp_path / "d"
    ensure_prepared(out, inputs=docs, vocab_size=300, doc_len=32, heldout_docs=1, progress=False)
    assert json.loads((out / "meta.json").read_text())["text_escape"] == "none"
    assert cli.main([*map(str, docs), "--out", str(out), "--vocab-size", "300", "--doc-len", "32",
                     "--heldout-docs", "1", "--text-escape", "json", "--quiet"]) == 0
    assert json.loads((out / "meta.json").read_text())["text_escape"] == "json"
    assert "text_escape=json)" in capsys.readouterr().out  # the summary's "use:" line


def test_ensure_data_builds_with_the_configs_escape(docs, tmp_path):
    cfg = {"data_dir": str(tmp_path / "d"), "text_escape": TextEscape.json,
           "prepare": {"inputs": [str(p) for p in docs], "vocab_size": 300, "doc_len": 32, "heldout_docs": 1}}
    out = ensure_data(cfg, progress=False)
    assert json.loads((out / "meta.json").read_text())["text_escape"] == "json"


def test_reader_refuses_another_escape_than_meta_json_records(docs, tmp_path):
    meta = build(docs, tmp_path / "json", "json")
    kw = dict(vocab_size=meta["vocab_size"], bos_id=meta["bos_id"])
    path = tmp_path / "json" / "train.zarr"
    for mode in ("json", TextEscape.json, None):  # None: the caller states no escape, nothing to check
        assert LongCrawl64Dataset(path, 16, 2, text_escape=mode, **kw).num_rows > 0
    wanted = r"meta.json says text_escape=json but the reader for .*train.zarr was given text_escape=none"
    with pytest.raises(ValueError, match=wanted + r"; set data.text_escape=json"):
        LongCrawl64Dataset(path, 16, 2, text_escape="none", **kw)
    with pytest.raises(ValueError, match=r"says text_escape=json .* given text_escape=none"):
        read_rows(tmp_path / "json" / "heldout.zarr", [0], 8, text_escape=TextEscape.none, **kw)
    # a data dir without meta.json (a LongCrawl64 download) is taken at the caller's word
    (tmp_path / "json" / "meta.json").unlink()
    assert LongCrawl64Dataset(path, 16, 2, text_escape="none", **kw).num_rows > 0


def test_fingerprint_counts_the_escape(docs, tmp_path):
    build(docs, tmp_path / "d", "none")
    f = tmp_path / "d" / "tokenizer.json"
    assert tokenizer_fingerprint(f) == tokenizer_fingerprint(f, "none") != tokenizer_fingerprint(f, "json")
