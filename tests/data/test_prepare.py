"""Tests for the text -> LongCrawl64-format converter (tiny inputs in tmp_path)."""

import gzip
import sys
import json
import lzma
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from tokenizers import Tokenizer

from forgetting_transformer.data import prepare as prep
from forgetting_transformer.data.longcrawl64 import LongCrawl64Dataset, read_rows
from forgetting_transformer.data.prepare import (
    EMBEDDED_CORPUS,
    ensure_prepared,
    prepare_corpus,
    strip_gutenberg_boilerplate,
    unigram_entropy,
)
from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[2]
WORDS = ("the of and to in a is that it was he for on are as with his they at be this from "
         "have or by one had not but what all were when we there can an your which their said "
         "if do will each about how up out them then she many some so these would other into "
         "has more her two like him see time could no make than first been its who now people "
         "my made over did down only way find use may water long little very after words called "
         "just where most know café naïve über").split()

HEADER = "The Project Gutenberg EBook of Test\n\nTitle: Test\n\n*** START OF THIS PROJECT GUTENBERG EBOOK TEST ***\n"
FOOTER = "\n*** END OF THIS PROJECT GUTENBERG EBOOK TEST ***\n\nlicense text here\n"


def words(rng, n):
    w = rng.choice(WORDS, size=n)
    lines = [" ".join(w[i:i + 12]).capitalize() + "." for i in range(0, n, 12)]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """8 documents over .txt / .jsonl / .jsonl.xz / .jsonl.gz / a directory, one tiny doc."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    texts = {}  # source -> expected (stripped) text
    body_a = words(rng, 400)
    (root / "a.txt").write_text(HEADER + body_a + FOOTER, encoding="utf-8")
    texts[str(root / "a.txt")] = body_a
    jl = [{"id": i, "text": words(rng, 150 + 100 * i)} for i in range(2)]
    jl.append({"id": 2, "text": "tiny"})  # far shorter than doc_len: dropped
    (root / "b.jsonl").write_text("\n".join(json.dumps(d) for d in jl) + "\n\n", encoding="utf-8")
    for i, d in enumerate(jl):
        texts[f"{root / 'b.jsonl'}:{i + 1}"] = d["text"]
    xz = [{"text": words(rng, 300)}, {"text": words(rng, 222)}]
    with lzma.open(root / "c.jsonl.xz", "wt", encoding="utf-8") as f:
        for d in xz:
            f.write(json.dumps(d) + "\n")
    for i, d in enumerate(xz):
        texts[f"{root / 'c.jsonl.xz'}:{i + 1}"] = d["text"]
    sub = root / "sub" / "deeper"
    sub.mkdir(parents=True)
    gz = [{"text": words(rng, 280)}]
    with gzip.open(sub / "d.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps(gz[0]) + "\n")
    texts[f"{sub / 'd.jsonl.gz'}:1"] = gz[0]["text"]
    (sub / "e.txt").write_text(words(rng, 333), encoding="utf-8")
    texts[str(sub / "e.txt")] = (sub / "e.txt").read_text(encoding="utf-8")
    (sub / "ignored.csv").write_text("not,a,doc\n")
    inputs = [root / "a.txt", root / "b.jsonl", root / "c.jsonl.xz", root / "sub"]
    return {"root": root, "inputs": inputs, "texts": texts}


KW = dict(vocab_size=300, doc_len=64, heldout_docs=2, progress=False)


@pytest.fixture(scope="module")
def built(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("built") / "data"
    meta = prepare_corpus(corpus["inputs"], out, **KW)
    return out, meta


def read_docs(out):
    return [json.loads(l) for l in (out / "documents.jsonl").read_text(encoding="utf-8").splitlines()]


def test_rows_reproduce_token_stream(corpus, built):
    out, meta = built
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert meta["bos_id"] == tok.token_to_id("<|endoftext|>")
    assert meta["vocab_size"] == tok.get_vocab_size() <= 300
    assert meta["doc_len"] == 64 and meta["tokenizer"] == "tokenizer.json"
    arrays = {s: np.asarray(zarr.open_array(str(out / f"{s}.zarr"), mode="r")) for s in ("train", "heldout")}
    assert arrays["train"].dtype == np.uint16 and arrays["train"].shape[1] == 64
    assert meta["num_train_rows"] == arrays["train"].shape[0]
    assert meta["num_heldout_rows"] == arrays["heldout"].shape[0]
    docs = read_docs(out)
    assert sorted(d["source"] for d in docs) == sorted(corpus["texts"])  # csv ignored
    assert sum(d["split"] == "heldout" for d in docs) == 2
    covered = {"train": 0, "heldout": 0}
    for d in docs:
        text = corpus["texts"][d["source"]]
        ids = tok.encode(text).ids
        assert tok.decode(ids) == text  # byte-level BPE round-trips exactly
        assert d["tokens"] == len(ids)
        n_rows = len(ids) // 64 if len(ids) >= 64 else 0
        assert d["rows"] == n_rows
        got = arrays[d["split"]][d["first_row"]: d["first_row"] + n_rows].reshape(-1)
        assert got.tolist() == ids[: n_rows * 64], d["source"]
        covered[d["split"]] += n_rows
    assert covered["train"] == meta["num_train_rows"]
    assert covered["heldout"] == meta["num_heldout_rows"]


def test_dropped_counts(corpus, built):
    out, meta = built
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    docs = read_docs(out)
    for split in ("train", "heldout"):
        lens = [len(tok.encode(corpus["texts"][d["source"]]).ids) for d in docs if d["split"] == split]
        st = meta["stats"][split]
        short = [n for n in lens if n < 64]
        assert st["docs"] == len(lens)
        assert st["docs_dropped_short"] == len(short)
        assert st["tokens_dropped_short_docs"] == sum(short)
        assert st["tokens_dropped_remainder"] == sum(n % 64 for n in lens if n >= 64)
        assert st["tokens_kept"] == st["rows"] * 64
        assert st["tokens_total"] == sum(lens)
    tiny = [d for d in docs if corpus["texts"][d["source"]] == "tiny"]
    assert len(tiny) == 1 and tiny[0]["rows"] == 0 and "min_doc_tokens=64" in tiny[0]["dropped"]
    total_short = sum(meta["stats"][s]["docs_dropped_short"] for s in ("train", "heldout"))
    assert total_short >= 1


def test_min_doc_tokens_drops_longer_docs(corpus, tmp_path, built):
    _, meta0 = built
    lens = sorted(d["tokens"] for d in read_docs(built[0]))
    cut = lens[len(lens) // 2]  # about half the documents fall below
    meta = prepare_corpus(corpus["inputs"], tmp_path / "o", min_doc_tokens=cut, **KW)
    docs = read_docs(tmp_path / "o")
    assert all((d["rows"] == 0) == (d["tokens"] < cut) for d in docs)
    assert meta["settings"]["min_doc_tokens"] == cut
    dropped = sum(meta["stats"][s]["docs_dropped_short"] for s in ("train", "heldout"))
    assert dropped == sum(d["tokens"] < cut for d in docs)


def test_split_is_seeded_and_heldout_docs_count(corpus, tmp_path, built):
    def heldout(out):
        return sorted(d["source"] for d in read_docs(out) if d["split"] == "heldout")

    prepare_corpus(corpus["inputs"], tmp_path / "s0", **KW)
    assert heldout(tmp_path / "s0") == heldout(built[0])  # same seed -> same split
    prepare_corpus(corpus["inputs"], tmp_path / "h3", **{**KW, "heldout_docs": 3, "seed": 1})
    assert len(heldout(tmp_path / "h3")) == 3


def test_bpe_trained_on_train_split_only(tmp_path):
    rng = np.random.default_rng(4)
    files = [tmp_path / "n0.txt", tmp_path / "n1.txt", tmp_path / "odd.txt"]
    files[0].write_text(words(rng, 300))
    files[1].write_text(words(rng, 300))
    files[2].write_text("zqxjv " * 400)

    def n_pieces(seed):
        out = tmp_path / f"o{seed}"
        prepare_corpus(files, out, **{**KW, "heldout_docs": 1, "doc_len": 32, "seed": seed})
        assert {d["source"]: d["split"] for d in read_docs(out)}[str(files[2])] == (
            "heldout" if np.random.default_rng(seed).permutation(3)[-1] == 2 else "train")
        return len(Tokenizer.from_file(str(out / "tokenizer.json")).encode(" zqxjv").ids)

    held = next(s for s in range(100) if np.random.default_rng(s).permutation(3)[-1] == 2)
    train = next(s for s in range(100) if np.random.default_rng(s).permutation(3)[-1] != 2)
    assert n_pieces(train) == 1  # merged when the odd document is in train ...
    assert n_pieces(held) >= 4  # ... but not learnt from heldout text


def test_gutenberg_stripping():
    text = ("hdr\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n\nBody line.\nMore.\n"
            "*** END OF THIS PROJECT GUTENBERG EBOOK X ***\nfooter")
    assert strip_gutenberg_boilerplate(text) == "Body line.\nMore."
    wrapped = ("hdr\n***START OF THE PROJECT GUTENBERG EBOOK A LONG\nTITLE***\nBody.\n"
               "***END OF THE PROJECT GUTENBERG EBOOK A LONG TITLE***\n")
    assert strip_gutenberg_boilerplate(wrapped) == "Body."
    only_start = "hdr\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\nBody"
    assert strip_gutenberg_boilerplate(only_start) == only_start
    assert strip_gutenberg_boilerplate("no markers") == "no markers"


def test_no_strip_keeps_header(corpus, tmp_path):
    src = corpus["root"] / "a.txt"
    prepare_corpus([src, corpus["root"] / "c.jsonl.xz"], tmp_path / "o", strip_gutenberg=False,
                   **{**KW, "heldout_docs": 1, "seed": 3})
    tok = Tokenizer.from_file(str(tmp_path / "o" / "tokenizer.json"))
    doc = [d for d in read_docs(tmp_path / "o") if d["source"] == str(src)][0]
    ids = tok.encode(src.read_text(encoding="utf-8")).ids
    arr = zarr.open_array(str(tmp_path / "o" / f"{doc['split']}.zarr"), mode="r")
    got = np.asarray(arr[doc["first_row"]: doc["first_row"] + doc["rows"]]).reshape(-1)
    assert got.tolist() == ids[: doc["rows"] * 64]
    assert tok.decode(got.tolist()).startswith("The Project Gutenberg EBook of Test")


def test_idempotent_and_rebuild_on_change(corpus, tmp_path):
    out = tmp_path / "cache" / "data"
    kw = {**KW, "inputs": corpus["inputs"]}
    assert ensure_prepared(out, **kw) == out
    sentinel = out / "sentinel"
    sentinel.write_text("x")
    mtime = (out / "meta.json").stat().st_mtime_ns
    ensure_prepared(out, **kw)  # same settings: nothing rebuilt
    assert sentinel.exists() and (out / "meta.json").stat().st_mtime_ns == mtime
    ensure_prepared(out, **{**kw, "doc_len": 32})  # changed setting: rebuilt
    assert not sentinel.exists()
    assert json.loads((out / "meta.json").read_text())["doc_len"] == 32
    assert zarr.open_array(str(out / "train.zarr"), mode="r").shape[1] == 32
    # only out_dir, its lock file, nothing half-written beside it
    assert sorted(p.name for p in out.parent.iterdir()) == [".data.lock", "data"]


def test_rebuild_when_input_file_changes(tmp_path):
    rng = np.random.default_rng(1)
    files = []
    for i in range(3):
        files.append(tmp_path / f"{i}.txt")
        files[-1].write_text(words(rng, 200))
    out = tmp_path / "out"
    ensure_prepared(out, inputs=files, **{**KW, "heldout_docs": 1})
    (out / "sentinel").write_text("x")
    files[0].write_text(words(rng, 250))
    ensure_prepared(out, inputs=files, **{**KW, "heldout_docs": 1})
    assert not (out / "sentinel").exists()


def test_crash_leaves_nothing(corpus, tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(prep, "train_bpe", boom)
    out = tmp_path / "data"
    with pytest.raises(RuntimeError, match="simulated crash"):
        ensure_prepared(out, inputs=corpus["inputs"], **KW)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == [".data.lock"]


def test_refuses_to_replace_foreign_dir(corpus, tmp_path):
    out = tmp_path / "longcrawl64"
    out.mkdir()
    (out / "train.zarr").mkdir()
    (out / "README").write_text("a real download")
    with pytest.raises(FileExistsError, match="not written by prepare_corpus"):
        ensure_prepared(out, inputs=corpus["inputs"], **KW)
    assert (out / "README").exists()


def test_loaded_tokenizer_path(corpus, built, tmp_path):
    out0, meta0 = built
    meta = prepare_corpus(corpus["inputs"], tmp_path / "o", tokenizer=str(out0), **KW)
    assert meta["vocab_size"] == meta0["vocab_size"] and meta["bos_id"] == meta0["bos_id"]
    assert (tmp_path / "o" / "tokenizer.json").read_text() == (out0 / "tokenizer.json").read_text()
    a = np.asarray(zarr.open_array(str(tmp_path / "o" / "train.zarr"), mode="r"))
    b = np.asarray(zarr.open_array(str(out0 / "train.zarr"), mode="r"))
    assert np.array_equal(a, b)
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        prepare_corpus(corpus["inputs"], tmp_path / "o2", tokenizer=str(tmp_path / "none.json"), **KW)


def test_errors(corpus, tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        prepare_corpus([tmp_path / "missing.txt"], tmp_path / "o", **KW)
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(ValueError, match="unsupported file type"):
        prepare_corpus([tmp_path / "x.csv"], tmp_path / "o", **KW)
    (tmp_path / "k.jsonl").write_text(json.dumps({"body": "hi"}) + "\n")
    with pytest.raises(ValueError, match=r"k\.jsonl:1: no 'text' field"):
        prepare_corpus([tmp_path / "k.jsonl"], tmp_path / "o", **KW)
    with pytest.raises(ValueError, match="found 3 documents but need at least heldout_docs\\+1=4"):
        prepare_corpus([corpus["root"] / "b.jsonl"], tmp_path / "o", **{**KW, "heldout_docs": 3})
    with pytest.raises(ValueError, match="train split has 0 rows.*smaller doc_len"):
        prepare_corpus(corpus["inputs"], tmp_path / "o2", **{**KW, "doc_len": 4096})
    # a heldout split made only of a too-short document
    rng = np.random.default_rng(2)
    files = [tmp_path / "long0.txt", tmp_path / "long1.txt", tmp_path / "short.txt"]
    files[0].write_text(words(rng, 300))
    files[1].write_text(words(rng, 300))
    files[2].write_text("short")
    seed = next(s for s in range(100) if np.random.default_rng(s).permutation(3)[-1] == 2)
    with pytest.raises(ValueError, match="heldout split has 0 rows.*more heldout_docs"):
        prepare_corpus(files, tmp_path / "o4", **{**KW, "heldout_docs": 1, "seed": seed})
    with pytest.raises(ValueError, match="vocab_size=100 is too small"):
        prepare_corpus(corpus["inputs"], tmp_path / "o3", **{**KW, "vocab_size": 100})


def test_hf_dataset_needs_datasets(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed (None makes `import datasets` fail)
    with pytest.raises(ImportError, match="pip install datasets"):
        prepare_corpus([], tmp_path / "o", hf_dataset="some/dataset", **KW)


def test_unigram_entropy(tmp_path):
    data = np.array([[0, 0, 1, 2], [2, 2, 2, 2]], dtype=np.uint16)
    arr = zarr.create_array(store=str(tmp_path / "train.zarr"), shape=data.shape, dtype=data.dtype)
    arr[...] = data
    p = np.array([2, 1, 5]) / 8
    assert unigram_entropy(tmp_path) == pytest.approx(float(-(p * np.log(p)).sum()))


def test_reader_on_prepared_dir(built):
    out, meta = built
    v, b = meta["vocab_size"], meta["bos_id"]
    d = LongCrawl64Dataset(out / "train.zarr", 16, 2, vocab_size=v, bos_id=b)
    x, y = d.next_batch()
    assert x.shape == (2, 16) and int(y.max()) < v
    x, y = read_rows(out / "heldout.zarr", [0], 64, vocab_size=v, bos_id=b)
    assert x[0, 0].item() == b and torch.equal(x[0, 1:], y[0, :-1])
    with pytest.raises(ValueError, match="meta.json says vocab_size"):
        LongCrawl64Dataset(out / "train.zarr", 16, 2)  # GPT-2 defaults disagree


def test_embedded_corpus_quick(tmp_path):
    assert EMBEDDED_CORPUS.is_file() and "/work/shared" not in str(EMBEDDED_CORPUS)
    out = ensure_prepared(tmp_path / "emb", inputs=[EMBEDDED_CORPUS], vocab_size=512, doc_len=1024,
                          heldout_docs=1, max_docs=2, progress=False)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["num_docs"] == 2 and meta["settings"]["inputs"] == ["embedded:gutenberg_sample.jsonl.xz"]
    assert meta["num_train_rows"] > 50 and meta["num_heldout_rows"] > 50
    h = unigram_entropy(out)
    assert 3.0 < h < math.log(512)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    text = tok.decode(np.asarray(zarr.open_array(str(out / "train.zarr"), mode="r")[0]).tolist())
    assert "Project Gutenberg" not in text[:200]  # header stripped


def test_cli(corpus, tmp_path, capsys):
    cli = load_script("prepare_corpus")
    out = tmp_path / "cli"
    args = [str(p) for p in corpus["inputs"]] + ["--out", str(out), "--vocab-size", "300",
                                                  "--doc-len", "64", "--quiet"]
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    assert f"data.data_dir={out.resolve()}" in printed
    assert f"{meta['num_train_rows']} rows" in printed and "unigram entropy" in printed
    assert cli.main([str(tmp_path / "nope.txt"), "--out", str(tmp_path / "x"), "--quiet"]) == 1
    assert "input not found" in capsys.readouterr().err


def test_ensure_data(corpus, tmp_path):
    OmegaConf = pytest.importorskip("omegaconf").OmegaConf

    from forgetting_transformer.data import ensure_data

    with pytest.raises(FileNotFoundError, match=r"lacks train\.zarr and heldout\.zarr.*prepare_corpus"):
        ensure_data({"data_dir": str(tmp_path / "nothing"), "prepare": None})
    cfg = OmegaConf.create({"data_dir": str(tmp_path / "d"), "prepare": {
        "inputs": [str(p) for p in corpus["inputs"]], "tokenizer": "train-bpe", "vocab_size": 300,
        "doc_len": 64, "min_doc_tokens": None, "heldout_docs": 2}})
    out = ensure_data(cfg, cache_dir=tmp_path, progress=False)
    assert out == tmp_path / "d" and (out / "train.zarr").exists()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["settings"]["doc_len"] == 64 and meta["settings"]["min_doc_tokens"] == 64
    mtime = (out / "meta.json").stat().st_mtime_ns
    assert ensure_data({"data_dir": str(out), "prepare": None}) == out  # plain directory use
    ensure_data(cfg, progress=False)
    assert (out / "meta.json").stat().st_mtime_ns == mtime


def test_heldout_inputs_fix_the_split_and_the_tokenizer_sees_train_only(corpus, tmp_path):
    """--heldout FILE: that file's documents are heldout.zarr, every other input is train (no shuffle), and
    the BPE is trained on train text alone: a word only the held-out file has never becomes one token."""
    rng = np.random.default_rng(5)
    held = tmp_path / "held.jsonl"
    only_heldout = "zyzzyva"
    held.write_text("\n".join(json.dumps({"text": words(rng, 300) + f" {only_heldout}" * 50}) for _ in range(2)) + "\n")
    out = tmp_path / "split"
    meta = ensure_prepared(out, inputs=[corpus["root"] / "b.jsonl", corpus["root"] / "c.jsonl.xz"],
                           heldout_inputs=[held], **KW)
    meta = json.loads((out / "meta.json").read_text())
    docs = read_docs(out)
    assert [d["split"] for d in docs] == ["train"] * 5 + ["heldout"] * 2
    assert all(d["source"].startswith(str(held)) for d in docs if d["split"] == "heldout")
    assert meta["stats"]["heldout"]["docs"] == 2 and meta["stats"]["train"]["docs"] == 5
    assert meta["settings"]["heldout_inputs"] == [str(held.resolve())]
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.token_to_id("Ġ" + only_heldout) is None and tok.token_to_id(only_heldout) is None
    held_rows = np.asarray(zarr.open_array(str(out / "heldout.zarr"), mode="r"))
    first = next(d for d in docs if d["split"] == "heldout")
    ids = tok.encode(json.loads(held.read_text().splitlines()[0])["text"]).ids
    np.testing.assert_array_equal(held_rows[0], ids[:64])
    assert first["first_row"] == 0
    # the same call is up to date; a changed held-out file rebuilds
    mtime = (out / "meta.json").stat().st_mtime_ns
    inputs = [corpus["root"] / "b.jsonl", corpus["root"] / "c.jsonl.xz"]
    ensure_prepared(out, inputs=inputs, heldout_inputs=[held], **KW)
    assert (out / "meta.json").stat().st_mtime_ns == mtime
    held.write_text(held.read_text() + json.dumps({"text": words(rng, 200)}) + "\n")
    ensure_prepared(out, inputs=inputs, heldout_inputs=[held], **KW)
    assert json.loads((out / "meta.json").read_text())["stats"]["heldout"]["docs"] == 3


def test_heldout_inputs_without_documents_is_an_error(corpus, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="heldout_inputs hold no documents"):
        prepare_corpus([corpus["root"] / "b.jsonl"], tmp_path / "o", heldout_inputs=[empty], **KW)


def test_the_same_tokenizer_at_another_path_needs_no_rebuild(corpus, built, tmp_path):
    """A build records a loaded tokenizer by its file's bytes: a copy elsewhere is up to date, an edited one
    rebuilds."""
    out0, _ = built
    first, second = tmp_path / "a" / "tokenizer.json", tmp_path / "b" / "tokenizer.json"
    for f in (first, second):
        f.parent.mkdir()
        shutil.copyfile(out0 / "tokenizer.json", f)
    out = tmp_path / "data"
    ensure_prepared(out, inputs=corpus["inputs"], **{**KW, "tokenizer": str(first)})
    (out / "sentinel").write_text("x")
    ensure_prepared(out, inputs=corpus["inputs"], **{**KW, "tokenizer": str(second.parent)})  # a dir holding it
    assert (out / "sentinel").exists()
    second.write_text(json.dumps(json.loads(second.read_text()), indent=1))  # an edited file: not known the same
    ensure_prepared(out, inputs=corpus["inputs"], **{**KW, "tokenizer": str(second)})
    assert not (out / "sentinel").exists()
