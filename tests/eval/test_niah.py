"""eval.niah: prompt construction, scoring, judge hook, CLI end to end on a real (tiny) run, re-plotting."""

import json
import textwrap

import pytest
import torch
from omegaconf import OmegaConf

from eval.common import load_model_and_tokenizer, run_tokenizer
from eval.niah import plot, run

SENTENCES = [f"Sentence number {i} says that the {['red', 'green', 'blue'][i % 3]} fox jumps {i % 5} times."
             for i in range(400)]


@pytest.fixture(scope="module")
def tok(tiny_text_run):
    return run_tokenizer(OmegaConf.load(tiny_text_run / "config.yaml"))[0]


@pytest.fixture(scope="module")
def hay_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hay")
    # three essays read in sorted name order: a.txt, b.txt, c.txt (+ a non-.txt file that must be ignored)
    for name, part in (("b.txt", SENTENCES[130:260]), ("a.txt", SENTENCES[:130]), ("c.txt", SENTENCES[260:])):
        (d / name).write_text(" ".join(part) + " ")
    (d / "README.md").write_text("not part of the haystack.")
    return d


def find_all(seq, sub):
    return [i for i in range(len(seq) - len(sub) + 1) if seq[i:i + len(sub)] == sub]


def test_haystack_directory_is_read_in_sorted_order(hay_dir, tmp_path):
    assert run.read_haystack(hay_dir) == " ".join(SENTENCES[:130]) + " " + " ".join(SENTENCES[130:260]) + " " + \
        " ".join(SENTENCES[260:]) + " "
    (tmp_path / "one.txt").write_text("just this.")
    assert run.read_haystack(tmp_path / "one.txt") == "just this."
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .txt"):
        run.read_haystack(tmp_path / "empty")
    with pytest.raises(FileNotFoundError):
        run.read_haystack(tmp_path / "missing")
    default = run.read_haystack()  # the embedded Gutenberg corpus, boilerplate stripped
    assert len(default) > 1_000_000 and "*** START OF" not in default


@pytest.mark.parametrize("mode", ["standard", "easy"])
def test_prompt_exact_length_one_needle_at_depth(tok, hay_dir, mode):
    b = run.PromptBuilder(tok, run.read_haystack(hay_dir), mode)
    bos = tok(".")["input_ids"][0]
    assert b.prefix == [bos]
    period = b.encode(".")
    sentence_tokens = max(len(b.encode(" " + s)) for s in SENTENCES)
    for length in (300, 512, 1000):
        for depth in (0, 25, 50, 75, 100):
            p = b.build(length, depth)
            ids = p["input_ids"]
            assert len(ids) == length and ids[0] == bos
            assert find_all(ids, b.needle) == [p["needle_start"]]  # exactly once, where reported
            assert ids[-len(b.suffix):] == b.suffix
            n = p["haystack_tokens"]
            assert n == length - 1 - len(b.needle) - len(b.suffix)
            pos = p["needle_start"] - 1  # haystack tokens before the needle
            target = n if depth == 100 else int(n * depth / 100)
            assert target - sentence_tokens <= pos <= target  # backed off by at most one sentence
            if 0 < pos < n:
                assert ids[pos] in period or tok.decode([ids[pos]]).rstrip().endswith(".")  # sentence boundary
            text = tok.decode(ids, skip_special_tokens=True)
            assert text.count(run.NEEDLE_ANSWER) == 1
            assert text.endswith(run.RETRIEVAL_QUESTION)
            assert text.count(run.QUESTION) == (2 if mode == "easy" else 1)  # easy: the question is in the needle
            retok = tok(text)["input_ids"]
            assert abs(len(retok) - length) <= 3  # the prompt as text has the requested length too


def test_easy_needle_holds_the_question_and_short_lengths_fail(tok, hay_dir):
    assert run.NEEDLES["easy"].strip() == ("What is the best thing to do in San Francisco? Answer: The best thing to "
                                           "do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny "
                                           "day.")
    assert run.NEEDLES["standard"].strip() == run.NEEDLE_ANSWER
    b = run.PromptBuilder(tok, "Too short. Repeated.", "standard")
    ids = b.build(400, 50)["input_ids"]  # the haystack repeats when shorter than needed
    assert len(ids) == 400
    with pytest.raises(ValueError, match="too short"):
        b.build(b.overhead, 0)
    with pytest.raises(ValueError, match="mode"):
        run.PromptBuilder(tok, "x.", "hard")


def test_scoring():
    assert run.score_answer("eat a sandwich and sit in Dolores Park on a sunny day.") == 10
    assert run.score_answer("  EAT a Sandwich, and sit in dolores-park... on a SUNNY day!! ") == 10
    assert run.score_answer("to visit the Golden Gate bridge") == 1
    assert run.score_answer("") == 1
    partial = run.score_answer("eat a sandwich")  # 2 of the 7 key words
    assert partial == pytest.approx(1 + 9 * 2 / 7)
    assert 1 < partial < run.score_answer("eat a sandwich and sit in Dolores Park") < 10
    assert run.parse_lengths("1k, 2k,4096") == [1024, 2048, 4096]
    assert run.parse_depths("0,12.5,100") == [0, 12.5, 100]
    assert list(run.DEFAULT_DEPTHS) == list(range(0, 101, 10))


def test_judge_hook_replaces_scores(tiny_text_run, tmp_path, monkeypatch):
    (tmp_path / "my_judge.py").write_text(textwrap.dedent("""
        CALLS = []
        def judge(prediction, question, needle):
            CALLS.append((prediction, question, needle))
            return 7
        def bad(prediction, question, needle):
            return 11
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = run.evaluate_model(tiny_text_run, tmp_path / "res", lengths=[256], depths=[50], max_new_tokens=4,
                             judge="my_judge:judge", progress=False)
    res = json.loads(out.read_text())
    (e,) = res["results"]
    assert e["score"] == 7 and res["mean_score"] == 7 and res["judge"] == "my_judge:judge"
    assert 1 <= e["recall_score"] <= 10
    import my_judge

    assert my_judge.CALLS == [(e["prediction"], run.RETRIEVAL_QUESTION, run.NEEDLE_ANSWER)]
    with pytest.raises(ValueError, match=r"\[1, 10\]"):
        run.evaluate_model(tiny_text_run, tmp_path / "res2", lengths=[256], depths=[0], max_new_tokens=1,
                           judge="my_judge:bad", progress=False)
    with pytest.raises(ValueError, match="MODULE:FUNC"):
        run.load_judge("my_judge")


def test_cli_end_to_end_and_replot(tiny_text_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "0")  # a progress line per cell
    out = tmp_path / "niah"
    run.main([str(tiny_text_run), "--out", str(out), "--mode", "easy", "--lengths", "256,512", "--depths", "0,100",
              "--max-new-tokens", "8", "--device", "cpu"])
    res = json.loads((out / "run_easy.json").read_text())
    assert res["mode"] == "easy" and res["train_len"] == 256 and res["name"].startswith("fox_pro")
    cells = [(e["length"], e["depth"]) for e in res["results"]]
    assert cells == [(256, 0), (256, 100), (512, 0), (512, 100)]
    for e in res["results"]:
        assert e["prompt_tokens"] == e["length"]
        assert e["score"] == e["recall_score"] == pytest.approx(1 + 9 * run.recall(e["prediction"]))
        assert e["needle_depth"] == (0.0 if e["depth"] == 0 else 1.0)
    assert res["mean_score"] == pytest.approx(sum(e["score"] for e in res["results"]) / 4)
    # the prediction is the greedy continuation: check one cell with a plain argmax loop (no cache)
    model, tok, _ = load_model_and_tokenizer(tiny_text_run)
    b = run.PromptBuilder(tok, run.read_haystack(), "easy")
    ids = torch.tensor([b.build(512, 100)["input_ids"]])
    new = []
    with torch.no_grad():
        for _ in range(8):
            nxt = int(model(input_ids=ids).logits[0, -1].argmax())
            if nxt == tok.eos_token_id:
                break
            new.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
    assert res["results"][3]["prediction"] == tok.decode(new, skip_special_tokens=True).strip()
    assert (out / "niah_easy.png").stat().st_size > 10_000
    png = tmp_path / "again.png"
    plot.main([str(out / "run_easy.json"), str(out / "run_easy.json"), "--out", str(png)])
    assert png.stat().st_size > 10_000
    lengths, depths, grid = plot.score_grid(res)
    assert lengths == [256, 512] and depths == [0, 100] and grid.shape == (2, 2)
    printed = capsys.readouterr()
    assert "mean score" in printed.out
    assert "NIAH easy run: 1/4 cell (25%) | " in printed.err and "NIAH easy run: 4/4 cell (100%) | " in printed.err
