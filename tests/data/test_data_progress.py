"""Progress lines of the data jobs: a line at least every interval (a patched clock or interval, never wall time),
the BPE training's start and end lines with its counts, and the lines of a whole corpus build."""

import io
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr

from forgetting_transformer.data import writer
from forgetting_transformer.data.prepare import prepare_corpus
from forgetting_transformer.data.progress import ProgressLine, heartbeat, progress_every, size_text
from forgetting_transformer.data.tokenizer import train_bpe
from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_a_line_each_interval_with_rate_and_eta():
    clock, out = Clock(), io.StringIO()
    with ProgressLine("tokenizing", "docs", 2000, every=10, stream=out, clock=clock) as bar:
        for _ in range(200):
            clock.t += 0.25  # 40 docs a second, in updates of 10
            bar.update(10)
    # t = 10, 20, ..., 50 (n = 400, 800, ..., 2000); close adds none: the last line is at the end
    assert out.getvalue().splitlines() == [
        f"tokenizing: {n:,}/2,000 docs ({n // 20}%) | 40 docs/s | elapsed 0:00:{n // 40:02d}"
        + (f" | ETA 0:00:{(2000 - n) // 40:02d}" if n < 2000 else "") for n in (400, 800, 1200, 1600, 2000)]


def test_quiet_before_the_interval_then_a_closing_line():
    clock, out = Clock(), io.StringIO()
    bar = ProgressLine("reading documents", "docs", every=10, stream=out, clock=clock, detail=lambda: "1.2M chars")
    clock.t = 9.9
    bar.update(50)
    assert out.getvalue() == ""  # before 10 s: quiet
    clock.t = 12
    bar.update(10)
    clock.t = 13
    bar.update(5)
    bar.close()
    bar.close()  # a second close prints nothing
    assert out.getvalue().splitlines() == ["reading documents: 60 docs | 5 docs/s | 1.2M chars | elapsed 0:00:12",
                                           "reading documents: 65 docs | 5 docs/s | 1.2M chars | elapsed 0:00:13"]


def test_short_job_is_silent_but_a_last_line_is_always_printed():
    out = io.StringIO()
    with ProgressLine("writing train.zarr", "rows", 3, every=10, stream=out) as bar:
        bar.update(3)
    assert out.getvalue() == ""
    bar = ProgressLine("training BPE", "docs", 3, every=10, stream=out, eta=False)
    bar.say("start")
    bar.update(1)
    bar.close("done")
    assert out.getvalue().splitlines() == ["start", "done"]


def test_disabled_prints_nothing_and_reads_no_interval(monkeypatch):
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "soon")  # not read when disabled
    out = io.StringIO()
    bar = ProgressLine("tokenizing", "docs", 3, enabled=False, stream=out)
    bar.say("start")
    bar.update(3)
    bar.close("end")
    assert out.getvalue() == "" and bar.n == 3


def test_interval_from_the_environment(monkeypatch):
    monkeypatch.delenv("FOX_PROGRESS_SECONDS", raising=False)
    assert progress_every() == 10.0
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "2.5")
    assert progress_every() == 2.5 and ProgressLine("x", "docs").every == 2.5
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "soon")
    with pytest.raises(ValueError, match="FOX_PROGRESS_SECONDS='soon': expected a number of seconds"):
        ProgressLine("x", "docs")
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "-1")
    with pytest.raises(ValueError, match="must be >= 0"):
        progress_every()


def test_heartbeat_prints_while_the_caller_makes_no_updates():
    """A call that makes no updates (BPE merges inside the tokenizers library) still shows lines: the heartbeat
    thread prints them; it stops with the block."""
    clock, printed = Clock(), threading.Event()

    class Out(io.StringIO):
        def write(self, s):
            n = super().write(s)
            printed.set()
            return n

    out = Out()
    bar = ProgressLine("training BPE", "docs", 4, every=10, stream=out, clock=clock, eta=False)
    bar.update(4)
    clock.t = 30  # the caller is blocked for 30 s without an update
    with heartbeat(bar, interval=0.001):
        assert printed.wait(10)
    lines = out.getvalue().splitlines()
    assert lines == ["training BPE: 4/4 docs (100%) | 0.133 docs/s | elapsed 0:00:30"]
    assert not [t for t in threading.enumerate() if t.name.startswith("progress:")]


def test_train_bpe_start_end_and_progress_lines(monkeypatch):
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "0")  # a line at every document fed
    texts = ["the cat sat on the mat " * 40, "a dog ran after the cat " * 30, "naïve café " * 20]
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    out = io.StringIO()
    tok = train_bpe(texts, 300, progress=True, stream=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"training byte-level BPE (vocab_size=300) on 3 train documents ({size_text(n_bytes)})"
    total = size_text(n_bytes)
    assert lines[1].startswith("training BPE: 1/3 docs (33%) | ")
    assert f" | {size_text(len(texts[0].encode('utf-8')))} of {total} | " in lines[1]
    fed = [line for line in lines if line.startswith("training BPE: 3/3 docs (100%)")]
    assert fed and f" | all {total} read; computing merges toward vocab_size=300 | " in fed[0]
    assert all("ETA" not in line for line in lines)  # the merges, not the documents, take the time
    assert lines[-1].startswith(f"trained byte-level BPE: {tok.get_vocab_size()} tokens from 3 documents "
                                f"({total}) in ") and lines[-1].endswith(" s")
    assert tok.get_vocab_size() <= 300 and tok.token_to_id("<|endoftext|>") is not None


def test_train_bpe_quiet_without_progress(monkeypatch):
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "0")
    out = io.StringIO()
    train_bpe(["some text to learn from " * 20, "more words here " * 20], 270, progress=False, stream=out)
    assert out.getvalue() == ""


def test_write_array_writes_in_blocks_with_progress(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(writer, "BLOCK_TOKENS", 3 * 8)  # 3 rows of 8 tokens per write
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "0")
    chunks = [np.arange(i * 100, i * 100 + 8 * n, dtype=np.uint16).reshape(n, 8) for i, n in enumerate((2, 1, 4))]
    writer.write_array(tmp_path / "train.zarr", chunks, 8, np.uint16)
    got = np.asarray(zarr.open_array(str(tmp_path / "train.zarr"), mode="r"))
    np.testing.assert_array_equal(got, np.concatenate(chunks))
    err = capsys.readouterr().err.splitlines()
    # rows 2 + 1 reach 3: one write; then 4 more in the last
    assert [l.split(" | ")[0] for l in err] == ["writing train.zarr: 3/7 rows (43%)",
                                                "writing train.zarr: 7/7 rows (100%)"]


def test_prepare_corpus_prints_progress_of_each_step(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "0")  # every update prints its line
    rng = np.random.default_rng(0)
    words = "the of and to in a is that it was he for on are as with his they at be".split()
    inp = tmp_path / "docs.jsonl"
    inp.write_text("".join(json.dumps({"text": " ".join(rng.choice(words, 400))}) + "\n" for _ in range(4)))
    meta = prepare_corpus([inp], tmp_path / "out", vocab_size=280, doc_len=64, heldout_docs=1)
    out, err = capsys.readouterr()
    assert out == ""  # progress and summary go to stderr
    for line in ("reading documents: 1 docs | ", "reading documents: 4 docs | ",
                 "training byte-level BPE (vocab_size=280) on 3 train documents (",
                 "training BPE: 3/3 docs (100%) | ", "trained byte-level BPE: 280 tokens from 3 documents (",
                 "tokenizing: 3/4 docs (75%) | ", "tokenizing: 4/4 docs (100%) | ",
                 f"writing train.zarr: {meta['num_train_rows']}/{meta['num_train_rows']} rows (100%) | ",
                 f"writing heldout.zarr: {meta['num_heldout_rows']}/{meta['num_heldout_rows']} rows (100%) | ",
                 f"prepared {tmp_path / 'out'}  (vocab_size=280"):
        assert line in err, line
    tokens = sum(meta["stats"][s]["tokens_total"] for s in ("train", "heldout"))
    last = next(line for line in err.splitlines() if line.startswith("tokenizing: 4/4 docs"))
    assert f" | {tokens / 1000:.3g}k tokens | " in last
    # the order of the steps
    order = [err.index(s) for s in ("reading documents", "training byte-level BPE", "trained byte-level BPE",
                                    "tokenizing", "writing train.zarr", "writing heldout.zarr", "prepared")]
    assert order == sorted(order)


def test_prepare_corpus_quiet_without_progress(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "0")
    inp = tmp_path / "a.txt"
    inp.write_text("words and more words " * 200)
    (tmp_path / "b.txt").write_text("other words again " * 200)
    prepare_corpus([inp, tmp_path / "b.txt"], tmp_path / "out", vocab_size=270, doc_len=32, heldout_docs=1,
                   progress=False)
    assert capsys.readouterr() == ("", "")


def test_prepare_cli_bad_interval_is_a_clear_error(tmp_path, monkeypatch, capsys):
    cli = load_script("prepare_corpus")
    (tmp_path / "a.txt").write_text("words " * 100)
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "soon")
    assert cli.main([str(tmp_path / "a.txt"), str(tmp_path / "a.txt"), "--out", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err == "error: FOX_PROGRESS_SECONDS='soon': expected a number of seconds\n"
    assert not (tmp_path / "o").exists()


def test_prepare_cli_prints_the_summary_once_on_stdout(tmp_path, monkeypatch, capsys):
    cli = load_script("prepare_corpus")
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "0")
    for name, words in (("a.txt", "words and more words "), ("b.txt", "other words again ")):
        (tmp_path / name).write_text(words * 200)
    args = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), "--out", str(tmp_path / "o"), "--vocab-size", "270",
            "--doc-len", "32", "--heldout-docs", "1"]
    for _ in range(2):  # built, then found up to date: the summary once on stdout each time, never on stderr
        assert cli.main(args) == 0
        out, err = capsys.readouterr()
        assert out.count(f"prepared {tmp_path / 'o'}") == 1 and "prepared " not in err, (out, err)
