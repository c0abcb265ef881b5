"""eval.longbench: LongBench metrics (hand-computed and known values), prompts, middle truncation, run.py end to end
on a real (untrained) run, batched predictions against one prompt at a time, and the Table 2 layout."""

import json
from pathlib import Path

import pytest

from eval.longbench import metrics as M
from eval.longbench import run, table

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "longbench"


def _lines(name):
    return [json.loads(x) for x in (FIXTURES / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]


# ------------------------------------------------------------------------------------------------------- metrics


def test_qa_f1_and_normalize_answer():
    assert M.normalize_answer("The  Eiffel-Tower!  ") == "eiffeltower"
    assert M.normalize_answer("An apple, a pear and THE plum.") == "apple pear and plum"
    # "cat sat on mat" vs "cat on mat": 3 common, P = 3/4, R = 1 → F1 = 6/7
    assert M.qa_f1_score("The cat sat on the mat.", "a cat on a mat") == pytest.approx(6 / 7)
    assert M.qa_f1_score("Paris", "paris") == 1.0
    assert M.qa_f1_score("London", "Paris") == 0
    assert M.qa_f1_score("", "Paris") == 0
    # repeated tokens count with multiplicity: "a a b" vs "a b b" → common {a:1, b:1} = 2, P = R = 2/3
    assert M.qa_f1_score("x x y", "x y y") == pytest.approx(2 / 3)


def test_rouge_l_hand_computed_and_package_values():
    # one sentence each: LCS "a c d" = 3 of 4 unique words on each side → F ≈ 0.75
    assert M.rouge_score("a b c d", "a c d e") == pytest.approx(0.75, abs=1e-7)
    # hyp sentences "a b" | "c d", ref "a c d": union LCS {a} ∪ {c, d} = 3; R = 3/3, P = 3/4 → F = 6/7
    assert M.rouge_score("a b. c d", "a c d") == pytest.approx(6 / 7, abs=1e-7)
    # exclusive=True (the package default) counts unique words: "a a a" vs "a" → P = R = 1
    assert M.rouge_score("a a a", "a") == pytest.approx(1.0, abs=1e-7)
    # the package raises on an empty hypothesis; LongBench turns that into 0
    assert M.rouge_score("", "a b") == 0.0 and M.rouge_score("...", "a b") == 0.0
    # values of rouge==1.0.1 `Rouge().get_scores([p], [g], avg=True)["rouge-l"]["f"]` (computed with the package)
    assert M.rouge_score("The cat sat on the mat. It was happy.", "A cat was on the mat. The cat was happy.") == \
        pytest.approx(0.823529406782007, rel=1e-12)
    known = [0.4107744057812695, 0.3442622906745499, 0.2870813350344544]
    for row, value in zip(_lines("multi_news"), known):
        assert M.rouge_score(row["context"][:1500], row["answers"][0]) == pytest.approx(value, rel=1e-12)


def test_rouge_l_matches_the_rouge_package_when_installed():
    rouge = pytest.importorskip("rouge")
    import random

    rng = random.Random(0)
    words = "the a cat dog sat on mat . , big . ran".split()
    for _ in range(200):
        p = " ".join(rng.choice(words) for _ in range(rng.randint(0, 20)))
        g = " ".join(rng.choice(words) for _ in range(rng.randint(0, 20)))
        try:
            ref = rouge.Rouge().get_scores([p], [g], avg=True)["rouge-l"]["f"]
        except Exception:
            ref = 0.0
        assert M.rouge_score(p, g) == pytest.approx(ref, abs=1e-12), (p, g)


def test_fuzz_ratio_matches_fuzzywuzzy_when_installed():
    fuzzywuzzy = pytest.importorskip("fuzzywuzzy.fuzz")
    import random

    rng = random.Random(1)
    for _ in range(300):
        a = "".join(rng.choice("ab(x) =.") for _ in range(rng.randint(0, 300)))
        b = "".join(rng.choice("ab(x) =.") for _ in range(rng.randint(0, 300)))
        assert M.fuzz_ratio(a, b) == fuzzywuzzy.ratio(a, b), (a, b)


def test_classification_retrieval_count_code():
    classes = ["Description of something", "Definition of something", "City", "Country"]
    assert M.classification_score("City", "City", all_classes=classes) == 1.0
    assert M.classification_score("City or Country", "City", all_classes=classes) == 0.5
    assert M.classification_score("Country", "City", all_classes=classes) == 0.0
    # a class inside the gold label is dropped ...
    assert M.classification_score("other color", "other color", all_classes=["color", "other color"]) == 1.0
    # ... but LongBench removes while iterating, so the element after a removed one survives: 1/2, not 1
    assert M.classification_score("ab", "ab", all_classes=["a", "b", "ab"]) == 0.5
    assert M.retrieval_score("Paragraph 3", "Paragraph 3") == 1.0
    assert M.retrieval_score("Paragraph 3 or Paragraph 14", "Paragraph 3") == 0.5
    assert M.retrieval_score("I do not know", "Paragraph 3") == 0.0
    assert M.count_score("There are 12 unique paragraphs.", 12) == 1.0
    assert M.count_score("12 or 13", "12") == 0.5 and M.count_score("none", 12) == 0.0
    # code: first line without ` # // ; fuzzywuzzy ratio (values checked against fuzzywuzzy 0.18)
    assert M.code_sim_score("```python\n# comment\nx = 1\n", "x = 1") == 1.0
    assert M.code_sim_score("x = 1", "x = 10") == 0.91
    assert M.code_sim_score("return self.foo(bar)", "return self.foo(baz, 1)") == 0.88
    assert M.fuzz_ratio("abcd", "abce") == 75 and M.fuzz_ratio("", "") == 100 and M.fuzz_ratio("", "a") == 0


def test_postprocess_and_dataset_score():
    pred = "\n\nCity\nQuestion: next one"
    assert M.postprocess("trec", pred, "official") == "City" == M.postprocess("trec", pred, "paper")
    summary = "first line\nsecond line"
    assert M.postprocess("multi_news", summary, "official") == summary
    assert M.postprocess("multi_news", summary, "paper") == "first line"
    with pytest.raises(ValueError):
        M.postprocess("trec", pred, "bogus")
    # max over the answers, mean over examples, x100, rounded to 2 decimals
    assert M.sample_score("hotpotqa", "Gustave Eiffel\nblah", ["Paris", "Gustave Eiffel"]) == 1.0
    score = M.dataset_score("hotpotqa", ["Paris", "London", "the cat sat"], [["Paris"], ["Paris"], ["a cat"]])
    assert score == round(100 * (1 + 0 + 2 / 3) / 3, 2) == 55.56
    classes = ["City", "Country"]
    assert M.dataset_score("trec", ["City", "City or Country"], [["City"], ["City"]], [classes, classes]) == 75.0
    assert M.dataset_score("trec", ["City", "Country"], [["City"], ["City"]], classes) == 50.0
    assert set(run.TABLE2_DATASETS) | set(run.SYNTHETIC_DATASETS) == set(M.DATASET2METRIC)


# ------------------------------------------------------------------------------------------------------- prompts


def test_configs_and_prompt_formatting():
    prompts, maxlens = run.load_configs()
    assert all(d in prompts and d in maxlens for d in run.ENGLISH_DATASETS) and len(run.ENGLISH_DATASETS) == 16
    assert maxlens["multi_news"] == 512 and maxlens["trec"] == 64 and maxlens["hotpotqa"] == 32
    news = _lines("multi_news")[0]
    assert run.build_prompt(prompts["multi_news"], news) == (
        "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n" + news["context"]
        + "\n\nNow, write a one-page summary of all the news.\n\nSummary:")
    trec = _lines("trec")[0]
    assert run.build_prompt(prompts["trec"], trec).endswith(trec["context"] + "\n" + trec["input"])
    hp = _lines("hotpotqa")[0]
    assert run.build_prompt(prompts["hotpotqa"], hp).endswith("Question: " + hp["input"] + "\nAnswer:")
    assert run.build_prompt("{context}", {"context": "a {b} }", "input": ""}) == "a {b} }"  # braces in data are safe


def test_truncate_middle():
    ids = list(range(10))
    assert run.truncate_middle(ids, 10) == ids and run.truncate_middle(ids, 20) == ids
    assert run.truncate_middle(ids, 4) == [0, 1, 8, 9]
    assert run.truncate_middle(ids, 5) == [0, 1, 8, 9]  # int(max_length / 2) per side, as LongBench


@pytest.fixture(scope="module")
def tokenizer(tiny_text_run):
    from omegaconf import OmegaConf

    from eval.common import run_tokenizer

    return run_tokenizer(OmegaConf.load(tiny_text_run / "config.yaml"))[0]


def test_encode_prompt_cuts_the_middle_exactly(tokenizer):
    prompts, _ = run.load_configs()
    prompt = run.build_prompt(prompts["multi_news"], _lines("multi_news")[0])
    full = tokenizer(prompt).input_ids
    assert full[0] == tokenizer.bos_token_id and len(full) > 1000
    ids = run.encode_prompt(tokenizer, prompt, 512)
    assert len(ids) == 512 and ids[:256] == full[:256] and ids[256:] == full[-256:]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids[-30:]).endswith("of all the news.\n\nSummary:")  # the instruction at the end survives
    assert run.encode_prompt(tokenizer, prompt, len(full)) == full
    text = run.encode_prompt(tokenizer, prompt, 512, mode="text")  # LongBench's decode + re-tokenize
    assert text[0] == tokenizer.bos_token_id and abs(len(text) - 513) <= 8


# ------------------------------------------------------------------------------------------------------- run.py


def test_run_end_to_end_on_a_tiny_run(tiny_text_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "0")  # a progress line per example
    out = tmp_path / "lb"
    run.main([str(tiny_text_run), "--out", str(out), "--data-dir", str(FIXTURES), "--datasets", "multi_news",
              "hotpotqa", "trec", "--max-length", "512", "--limit", "2", "--max-new-tokens", "4", "--device", "cpu"])
    err = capsys.readouterr().err
    assert all(f"LongBench {d}: 2/2 example (100%) | " in err for d in ("multi_news", "hotpotqa", "trec"))
    res = json.loads((out / "scores.json").read_text())
    assert set(res["scores"]) == {"multi_news", "hotpotqa", "trec"} and res["n"] == dict.fromkeys(res["scores"], 2)
    assert res["max_length"] == 512 and res["limit"] == 2 and res["postprocess"] == "paper"
    assert res["train_len"] == 256 and "run" in res["name"] and res["max_new_tokens_cap"] == 4
    assert res["dtype"] == "float32"  # auto on the CPU
    for d in res["scores"]:
        rows = run.read_predictions(out / f"{d}.jsonl")
        data = _lines(d)[:2]
        assert [r["_id"] for r in rows] == [x["_id"] for x in data]
        assert [r["answers"] for r in rows] == [x["answers"] for x in data]
        assert all(isinstance(r["pred"], str) and 0 < r["prompt_tokens"] <= 512 for r in rows)
        # the saved score is the metric recomputed from the saved predictions
        expected = M.dataset_score(d, [r["pred"] for r in rows], [r["answers"] for r in rows],
                                   [r["all_classes"] for r in rows])
        assert res["scores"][d] == expected and 0 <= expected <= 100
    assert run.read_predictions(out / "multi_news.jsonl")[0]["prompt_tokens"] == 512  # cut in the middle
    assert not list(out.glob("*.partial"))
    # rescoring from the files alone (other post-processing) keeps the metadata
    again = run.rescore(out, "official")
    assert again["name"] == res["name"] and again["postprocess"] == "official"
    assert again["scores"]["trec"] == res["scores"]["trec"]  # first line in both modes
    # table from the scores file
    md = table.markdown(table.load_scores([out]))
    assert "MultiNews" in md and "HotpotQA" in md and "TREC" in md


def test_batched_predictions_equal_one_at_a_time(tiny_text_run, tmp_path):
    datasets = ["hotpotqa", "trec", "multi_news"]  # prompts of different lengths (multi_news cut to 512)
    outs = {}
    for bs in (1, 2):  # 2: groups of the two longest prompts, then the shortest
        outs[bs] = tmp_path / f"bs{bs}"
        run.main([str(tiny_text_run), "--out", str(outs[bs]), "--data-dir", str(FIXTURES), "--datasets", *datasets,
                  "--max-length", "512", "--max-new-tokens", "6", "--device", "cpu", "--no-progress",
                  "--batch-size", str(bs)])
    for d in datasets:
        files = {bs: (out / f"{d}.jsonl").read_text(encoding="utf-8") for bs, out in outs.items()}
        assert files[1] == files[2], d  # byte for byte, whatever the batch size
    assert len({(out / "scores.json").read_text() for out in outs.values()}) == 1
    for d in datasets:
        assert [r["_id"] for r in run.read_predictions(outs[2] / f"{d}.jsonl")] == [x["_id"] for x in _lines(d)]
    assert_predictions_are_greedy_alone(tiny_text_run, outs[2], datasets, max_length=512, max_new_tokens=6)


def assert_predictions_are_greedy_alone(run_dir, out, datasets, *, max_length, max_new_tokens):
    """Every prediction saved in ``out`` is transformers' own greedy generate() on that example's prompt alone."""
    import torch

    from eval.common import load_model_and_tokenizer

    model, tok, _ = load_model_and_tokenizer(run_dir)
    prompts, _ = run.load_configs()
    for d in datasets:
        for row, example in zip(run.read_predictions(out / f"{d}.jsonl"), _lines(d)):
            ids = run.encode_prompt(tok, run.build_prompt(prompts[d], example), max_length)
            x = torch.tensor([ids])
            with torch.no_grad():
                new = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                     do_sample=False, num_beams=1)[0, len(ids):]
            assert row["pred"] == tok.decode(new.tolist(), skip_special_tokens=True), (d, row["_id"])
            assert row["prompt_tokens"] == len(ids)


def test_bad_generation_flags_are_clear_errors(tmp_path, capsys):
    for flag, value in (("--batch-size", "0"), ("--batch-size", "-2"), ("--max-batch-tokens", "0"),
                        ("--prefill-chunk", "x"), ("--max-length", "0"), ("--limit", "0"), ("--max-new-tokens", "-1"),
                        ("--step", "-1")):
        with pytest.raises(SystemExit) as exit_info:
            run.main(["some_run", "--out", str(tmp_path), flag, value])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {flag}:" in err and "integer >= 1" in err and "Traceback" not in err


def test_missing_data_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="qasper.jsonl"):
        run.load_data("qasper", tmp_path)
    with pytest.raises(ValueError, match="unknown LongBench"):
        run.evaluate("nowhere", tmp_path, datasets=["not_a_task"])


# ------------------------------------------------------------------------------------------------------- table


def _scores(tmp_path, name, scores):
    d = tmp_path / name
    d.mkdir()
    (d / "scores.json").write_text(json.dumps({"name": name, "scores": scores}))
    return d


def test_table_markdown_and_latex(tmp_path):
    full_a = {d: 10.0 + i for i, d in enumerate(run.TABLE2_DATASETS)}
    full_b = {d: 20.0 - i for i, d in enumerate(run.TABLE2_DATASETS)}
    part = {"qasper": 50.0, "trec": 1.0}
    rows = table.load_scores([_scores(tmp_path, "FoX (Pro)", full_a), _scores(tmp_path, "Transformer", full_b),
                              _scores(tmp_path, "partial", part) / "scores.json"])
    md = table.markdown(rows).splitlines()
    head = [c.strip() for c in md[0].strip("|").split("|")]
    assert head == ["Model", "NarrativeQA", "Qasper", "MFQA", "HotpotQA", "2WikiMQA", "Musique", "GovReport",
                    "QMSum", "MultiNews", "TREC", "TriviaQA", "SamSum", "LCC", "RepoBench-P", "Avg"]
    fox = [c.strip() for c in md[2].strip("|").split("|")]
    tf = [c.strip() for c in md[3].strip("|").split("|")]
    partial = [c.strip() for c in md[4].strip("|").split("|")]
    assert fox[1] == "10.00" and tf[1] == "**20.00**" and fox[-1] == "**16.50**" and tf[-1] == "13.50"
    assert fox[-2] == "**23.00**" and partial[2] == "**50.00**" and partial[1] == "–" and partial[-1] == "–"
    assert "Single-Document QA: NarrativeQA, Qasper, MFQA" in md[-1]
    tex = table.latex(rows)
    assert r"\multicolumn{3}{c}{Single-Document QA}" in tex and r"\multicolumn{2}{c}{Code}" in tex
    assert r"\cmidrule(lr){2-4}" in tex and r"\cmidrule(lr){14-15}" in tex
    assert r"FoX (Pro) & 10.00 &" in tex and r"\textbf{16.50}" in tex and r"\textbf{20.00}" in tex
    # only some columns present → only those shown; CLI writes the file
    only = table.markdown(table.load_scores([_scores(tmp_path, "x", {"trec": 3.0, "passage_count": 4.0})]),
                          datasets=["trec", "passage_count"])
    assert only.splitlines()[0] == "| Model | TREC | PCount | Avg |"
    assert "| x | **3.00** | **4.00** | **3.50** |" in only
    table.main([str(tmp_path / "FoX (Pro)"), "--latex", "--out", str(tmp_path / "t.tex")])
    assert (tmp_path / "t.tex").read_text().startswith(r"\begin{tabular}")


def test_a_path_run_predicts_each_example_as_its_greedy_continuation(tiny_text_run, train_on_prepared_data,
                                                                      tmp_path):
    # PaTH (model.mixer=path) decodes through its own cache; each prediction is transformers' greedy generate() on
    # the prompt alone
    from tests.eval.test_niah import path_run_of

    path_run = path_run_of(tiny_text_run, train_on_prepared_data)
    out = tmp_path / "lb"
    run.main([str(path_run), "--out", str(out), "--data-dir", str(FIXTURES), "--datasets", "hotpotqa", "trec",
              "--max-length", "384", "--limit", "2", "--max-new-tokens", "4", "--device", "cpu", "--no-progress"])
    res = json.loads((out / "scores.json").read_text())
    assert res["name"].startswith("path_fox_pro") and res["n"] == {"hotpotqa": 2, "trec": 2}
    assert_predictions_are_greedy_alone(path_run, out, ["hotpotqa", "trec"], max_length=384, max_new_tokens=4)
