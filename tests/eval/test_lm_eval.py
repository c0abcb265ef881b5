"""lm-eval integration (eval/lm_eval_harness): the registered ``fox`` model on local tasks, fully offline."""

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

pytest.importorskip("lm_eval")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "lm_eval"


@pytest.fixture(scope="module")
def include_dir(tmp_path_factory):
    """The fixture task YAMLs with ``__FIXTURES__`` replaced by the absolute fixture dir."""
    d = tmp_path_factory.mktemp("lm_eval_tasks")
    for y in FIXTURES.glob("*.yaml"):
        (d / y.name).write_text(y.read_text().replace("__FIXTURES__", str(FIXTURES.resolve())))
    return d


@pytest.fixture(scope="module")
def fox_lm(tiny_text_run):
    from eval.lm_eval_harness.model import FoXLM

    return FoXLM(path=str(tiny_text_run), device="cpu", batch_size=8, max_length=512, max_gen_toks=24)


def reference_loglik(lm, context: str, continuation: str) -> float:
    """Independent: the tokenizer's own bos-prepending encode of context+continuation, one unpadded forward,
    sum of log-softmax of the continuation tokens."""
    tok = lm.tokenizer
    whole = tok(context + continuation).input_ids
    ctx = tok(context).input_ids
    assert whole[0] == ctx[0] == lm.bos_id
    n = len(whole) - len(ctx)
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([whole])).logits[0].float()  # (T, V)
    logp = F.log_softmax(logits[:-1], dim=-1)
    target = torch.tensor(whole[1:])
    return float(logp[-n:].gather(-1, target[-n:, None]).sum())


def _args(sample):
    a = sample["arguments"]
    if isinstance(a, dict):  # {"gen_args_0": {"arg_0": ctx, "arg_1": cont}, ...}
        return [(v["arg_0"], v["arg_1"]) for v in a.values()]
    return [tuple(x) for x in a]


def test_registered_and_simple_evaluate(fox_lm, include_dir):
    import lm_eval
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    assert get_model("fox") is type(fox_lm)
    res = lm_eval.simple_evaluate(model=fox_lm, tasks=["fox_test_mc", "fox_test_ppl"], num_fewshot=0,
                                  task_manager=TaskManager(include_path=str(include_dir), include_defaults=False),
                                  log_samples=True)
    mc = res["results"]["fox_test_mc"]
    samples = res["samples"]["fox_test_mc"]
    assert len(samples) == 6
    correct = []
    for s in samples:
        pairs = _args(s)
        assert len(pairs) == 4
        ours = [float(r[0][0]) for r in s["resps"]]
        ref = [reference_loglik(fox_lm, c, x) for c, x in pairs]
        assert ours == pytest.approx(ref, abs=1e-4)
        correct.append(float(max(range(4), key=lambda i: ref[i]) == int(s["target"])))
        assert s["acc"] == correct[-1]
    assert 0.0 <= mc["acc,none"] <= 1.0 and 0.0 <= mc["acc_norm,none"] <= 1.0
    assert mc["acc,none"] == pytest.approx(sum(correct) / len(correct))

    ppl = res["results"]["fox_test_ppl"]
    docs = [json.loads(line)["text"] for line in (FIXTURES / "ppl.jsonl").read_text().splitlines()]
    # word perplexity = exp(-sum loglik / sum words); loglik of a document = sum over its tokens given bos.
    total = 0.0
    for d in docs:
        ids = [fox_lm.bos_id] + fox_lm.tokenizer(d, add_special_tokens=False).input_ids
        with torch.no_grad():
            logits = fox_lm.model(input_ids=torch.tensor([ids])).logits[0].float()
        total += float(F.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None]).sum())
    words = sum(len(re.split(r"\s+", d)) for d in docs)
    assert ppl["word_perplexity,none"] == pytest.approx(float(torch.tensor(-total / words).exp()), rel=1e-4)


def test_rolling_windows_and_batching(fox_lm, capsys, monkeypatch):
    """A document longer than max_length is scored in disjoint windows; the batch size changes nothing; a
    progress line per batch where lm-eval asks for progress."""
    text = " ".join(json.loads(line)["text"] for line in (FIXTURES / "ppl.jsonl").read_text().splitlines()) * 3
    req = SimpleNamespace(args=(text,))
    full = fox_lm.loglikelihood_rolling([req], disable_tqdm=True)[0]
    ids = fox_lm.tok_encode(text, add_special_tokens=False)
    old = fox_lm.max_length
    try:
        fox_lm.max_length = max(8, len(ids) // 3)
        windowed = fox_lm.loglikelihood_rolling([req], disable_tqdm=True)[0]
    finally:
        fox_lm.max_length = old
    assert windowed < 0 and full < 0 and windowed != full  # less context per token, all tokens still scored
    reqs = [SimpleNamespace(args=(c, x)) for c, x in [("The cat", " sat"), ("A", " much longer continuation here"),
                                                     ("", "Hello world"), ("One two three four", " five")]]
    old_bs = fox_lm.batch_size
    try:
        fox_lm.batch_size = 1
        one = fox_lm.loglikelihood(reqs, disable_tqdm=True)
        fox_lm.batch_size = 4
        monkeypatch.setenv("FOX_PROGRESS_SECONDS", "0")
        capsys.readouterr()
        four = fox_lm.loglikelihood(reqs, disable_tqdm=False)
        assert "loglikelihood: 1/1 batch (100%) | " in capsys.readouterr().err
        fox_lm.max_logit_tokens = 6  # splits the batch of 4 by its scored positions
        assert [len(c) for c in fox_lm._batches([(0, [1], [1] * 5), (1, [1], [1]), (2, [1], [1] * 2)])] == [1, 2]
        capped = fox_lm.loglikelihood(reqs, disable_tqdm=True)
    finally:
        fox_lm.batch_size, fox_lm.max_logit_tokens = old_bs, 32768
    for other in (four, capped):
        assert [a for a, _ in one] == pytest.approx([a for a, _ in other], abs=1e-4)
        assert [b for _, b in one] == [b for _, b in other]


def test_generate_until_stops(fox_lm):
    prompts = ["It was the best of times,", "Call me"]
    free = fox_lm.generate_until([SimpleNamespace(args=(p, {"until": [], "max_gen_toks": 10})) for p in prompts],
                                 disable_tqdm=True)
    assert all(isinstance(t, str) for t in free)
    text = free[0]
    stop = next((text[k:k + 2] for k in range(3, len(text) - 1) if text[k:k + 2].strip()), None)
    if stop is None:
        pytest.skip(f"the tiny model generated nothing usable as a stop string: {text!r}")
    cut = fox_lm.generate_until([SimpleNamespace(args=(prompts[0], {"until": [stop], "max_gen_toks": 10}))],
                                disable_tqdm=True)[0]
    assert cut == text[:text.index(stop)]
    assert stop not in cut


def _result(name, wiki, lmb_ppl, accs):
    tasks = ["lambada_openai", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "copa", "openbookqa",
             "sciq", "boolq"]
    from eval.lm_eval_harness.run import TASK_METRICS

    results = {"wikitext": {"word_perplexity,none": wiki}, "lambada_openai": {"perplexity,none": lmb_ppl}}
    for t, a in zip(tasks, accs):
        results.setdefault(t, {})[f"{TASK_METRICS[t][-1] if t != 'lambada_openai' else 'acc'},none"] = a
    return {"name": name, "results": results}


def test_table_bold_underline_direction(tmp_path):
    from eval.lm_eval_harness.table import main, render

    a = _result("A", 20.0, 15.0, [0.40, 0.60, 0.30, 0.50, 0.50, 0.20, 0.60, 0.30, 0.80, 0.60])
    b = _result("B", 22.0, 12.0, [0.45, 0.62, 0.31, 0.52, 0.55, 0.25, 0.70, 0.28, 0.85, 0.55])
    c = _result("C", 25.0, 30.0, [0.30, 0.55, 0.29, 0.49, 0.40, 0.21, 0.50, 0.35, 0.70, 0.65])
    files = []
    for r in (a, b, c):
        f = tmp_path / f"{r['name']}.json"
        f.write_text(json.dumps(r))
        files.append(f)
    md = render(files)
    rows = {line.split("|")[1].strip(): [x.strip() for x in line.split("|")[2:-1]]
            for line in md.splitlines() if line.startswith("| ") and line.split("|")[1].strip() in "ABC"}
    assert rows["A"][0] == "**20.00**" and rows["B"][0] == "<u>22.00</u>" and rows["C"][0] == "25.00"  # ppl↓
    assert rows["B"][1] == "**12.00**" and rows["A"][1] == "<u>15.00</u>"
    assert rows["B"][2] == "**45.0**" and rows["A"][2] == "<u>40.0</u>"  # acc↑, in percent
    assert rows["C"][9] == "**35.0**"  # OBQA
    # Avg over the 10 accuracy columns: B best.
    assert rows["B"][-1].startswith("**")
    tex = render(files, latex=True)
    assert "\\textbf{20.00}" in tex and "\\underline{22.00}" in tex
    main([str(f) for f in files] + ["--latex"])


def test_model_args_pretrained_cli_device_and_unknown_keys(tiny_text_run, capsys):
    """lm-eval users write pretrained=; the CLI's default device cuda:0 runs on the CPU where no CUDA exists (and
    says so); model_args win over the generic settings; an unknown key is an error naming it."""
    from eval.lm_eval_harness.model import FoXLM

    lm = FoXLM.create_from_arg_string(f"pretrained={tiny_text_run},batch_size=4",
                                      {"device": "cuda:0", "batch_size": 16, "max_batch_size": None})
    assert lm.batch_size == 4 and lm.info["source"].startswith(str(tiny_text_run))
    if not torch.cuda.is_available():
        assert lm.device.type == "cpu" and "does not exist here (no CUDA): running on cpu" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"unknown key\(s\) bacth_size for model fox; known: .*batch_size"):
        FoXLM.create_from_arg_string(f"path={tiny_text_run},bacth_size=4")
    with pytest.raises(ValueError, match="path= or pretrained="):
        FoXLM.create_from_arg_string(f"path={tiny_text_run},pretrained={tiny_text_run}")


def test_cli_runs_local_tasks_on_the_cpu(tiny_text_run, include_dir, tmp_path):
    """python -m eval.lm_eval_harness.cli run, as the docs write it, with local task YAMLs and no --device."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-m", "eval.lm_eval_harness.cli", "run", "--model", "fox", "--model_args",
                          f"pretrained={tiny_text_run}", "--tasks", "fox_test_mc", "--include_path", str(include_dir),
                          "--limit", "2", "--output_path", str(tmp_path / "out")], cwd=root, capture_output=True,
                         text=True, timeout=600, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "fox_test_mc" in res.stdout and "running on cpu" in res.stdout


@pytest.fixture(scope="module")
def offline_dir(tmp_path_factory):
    """Local copies of lm-eval's piqa and sciq tasks (standard names, local files), ``__FIXTURES__`` filled in."""
    src = (FIXTURES / "offline").resolve()
    d = tmp_path_factory.mktemp("lm_eval_offline")
    for y in src.glob("*.yaml"):
        (d / y.name).write_text(y.read_text().replace("__FIXTURES__", str(src)))
    return d


def reference_acc(lm, task: str, n: int) -> float:
    """Accuracy on the first ``n`` documents of the local piqa/sciq file, from ``reference_loglik`` and the
    tasks' prompts written out here (context, " " + choice)."""
    name = {"piqa": "piqa_validation.jsonl", "sciq": "sciq_test.jsonl"}[task]
    docs = [json.loads(line) for line in (FIXTURES / "offline" / name).read_text().splitlines()][:n]
    right = 0
    for d in docs:
        if task == "piqa":
            ctx, choices, target = f"Question: {d['goal']}\nAnswer:", [d["sol1"], d["sol2"]], d["label"]
        else:
            ctx = f"{d['support'].lstrip()}\nQuestion: {d['question']}\nAnswer:"
            choices, target = [d["distractor1"], d["distractor2"], d["distractor3"], d["correct_answer"]], 3
        scores = [reference_loglik(lm, ctx, " " + c) for c in choices]
        right += max(range(len(choices)), key=scores.__getitem__) == target
    return right / len(docs)


def test_local_task_files_keep_standard_names_limits_per_task_and_one_row_per_model(
        tiny_text_run, fox_lm, offline_dir, tmp_path, capsys):
    """The documented offline recipe: task YAMLs named piqa/sciq that read local files replace lm-eval's own; a
    per-task --limit; invocations into one --out add to one file, files of several --out make one table row, and
    the table's note names the limited tasks and the local files."""
    from eval.lm_eval_harness import run, table

    common = [str(tiny_text_run), "--include-path", str(offline_dir), "--device", "cpu", "--max-length", "512"]
    run.main(common + ["--out", str(tmp_path / "a"), "--tasks", "piqa", "--limit", "piqa=3"])
    run.main(common + ["--out", str(tmp_path / "b"), "--tasks", "piqa,sciq", "--limit", "2,piqa=3"])
    a, b = tmp_path / "a" / "run.json", tmp_path / "b" / "run.json"
    rec = json.loads(b.read_text())
    assert rec["n-samples"]["piqa"] == {"original": 5, "effective": 3}
    assert rec["n-samples"]["sciq"] == {"original": 4, "effective": 2} and rec["limit"] == {"piqa": 3, "sciq": 2}
    assert rec["local_tasks"]["piqa"].endswith("piqa_validation.jsonl")
    assert rec["local_tasks"]["sciq"].endswith("sciq_test.jsonl")
    assert rec["results"]["piqa"]["acc,none"] == pytest.approx(reference_acc(fox_lm, "piqa", 3))
    assert rec["results"]["sciq"]["acc,none"] == pytest.approx(reference_acc(fox_lm, "sciq", 2))
    assert json.loads(a.read_text())["results"]["piqa"] == rec["results"]["piqa"]

    md = table.render([a, b])  # two files of one checkpoint: one row
    row = [line for line in md.splitlines() if line.startswith("| fox_pro")]
    assert len(row) == 1
    cells = [c.strip().strip("*").removeprefix("<u>").removesuffix("</u>") for c in row[0].split("|")[2:-1]]
    assert cells[3] == f"{100 * rec['results']['piqa']['acc,none']:.1f}" and cells[4] == "-"  # PIQA, Hella
    assert cells[10] == f"{100 * rec['results']['sciq']['acc,none']:.1f}"  # SciQA
    note = md.split("Note. ")[1]
    assert "limited to part of the documents: PIQA 3 of 5, SciQA 2 of 4" in note
    assert "local task files: PIQA (json: " in note and "piqa_validation.jsonl" in note and "SciQA (json: " in note

    run.main(common + ["--out", str(tmp_path / "a"), "--tasks", "sciq"])  # added to a's file, piqa kept
    assert "kept the earlier results of piqa" in capsys.readouterr().out
    rec = json.loads(a.read_text())
    assert rec["tasks"] == ["piqa", "sciq"] and rec["limit"] == {"piqa": 3, "sciq": None}
    assert rec["n-samples"]["sciq"] == {"original": 4, "effective": 4}
    assert rec["results"]["sciq"]["acc,none"] == pytest.approx(reference_acc(fox_lm, "sciq", 4))
    note = table.render([a]).split("Note. ")[1]
    assert "PIQA 3 of 5" in note and "SciQA" not in note.split("local task files")[0]

    other = dict(rec, results=dict(rec["results"], piqa={"acc,none": 0.123}))
    (tmp_path / "c.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match=r"both hold piqa for model fox_pro .*keep one"):
        table.render([a, tmp_path / "c.json"])


def test_run_refuses_an_unknown_task_or_a_bad_number_in_one_line_before_loading_a_model(offline_dir, capsys):
    """An unknown task name is named with the nearest known ones before any model loads (no/such/run is not
    read); a number that makes no sense is argparse's error. (offline_dir: the task index the test above built.)"""
    from eval.cli import run_cli
    from eval.lm_eval_harness.run import main

    common = ["no/such/run", "--out", "x", "--include-path", str(offline_dir)]
    with pytest.raises(SystemExit) as exit_:
        run_cli(main, common + ["--tasks", "piqa,sciqq"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert err.startswith("error: --tasks: no lm-eval task named 'sciqq' (nearest: sciq") and err.count("\n") == 1
    for flag in ("--batch-size", "--max-length", "--step"):
        with pytest.raises(SystemExit) as exit_:
            run_cli(main, common + [flag, "0"])
        assert exit_.value.code == 2 and f"argument {flag}: must be an integer >= 1; got 0" in capsys.readouterr().err


@pytest.mark.parametrize("args, line", [
    (["--model_args", "pth=x,batch_sise=16", "--tasks", "piqa"],
     "error: model_args: unknown key(s) batch_sise, pth for model fox; known: add_bos_token, batch_size, "),
    (["--model_args", "path=x", "--tasks", "sciqq"], "error: --tasks: no lm-eval task named 'sciqq' (nearest: sciq"),
], ids=["model_args", "task"])
def test_cli_refuses_an_unknown_model_args_key_or_task_in_one_line(offline_dir, monkeypatch, capsys, args, line):
    """lm-eval's own command line with fox: an unknown model_args key (before lm-eval starts) and an unknown task
    name (with the nearest names) are one error line, exit code 2, no traceback."""
    import sys

    from eval.cli import run_cli
    from eval.lm_eval_harness.cli import main

    monkeypatch.setattr(sys, "argv", ["eval.lm_eval_harness.cli"])
    monkeypatch.setattr("lm_eval.utils.setup_logging", lambda *a, **k: None)  # its handler would outlive capsys
    with pytest.raises(SystemExit) as exit_:
        run_cli(main, ["run", "--model", "fox", "--include_path", str(offline_dir), *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert err.splitlines()[-1].startswith(line), err[-2000:]


def test_limit_parsing_names_the_bad_part(capsys):
    from eval.cli import run_cli
    from eval.lm_eval_harness.run import main, parse_limit

    tasks = ["piqa", "sciq", "boolq"]
    assert parse_limit(None, tasks) == dict.fromkeys(tasks)
    assert parse_limit("100", tasks) == dict.fromkeys(tasks, 100)
    assert parse_limit("0.5,piqa=20", tasks) == {"piqa": 20, "sciq": 0.5, "boolq": 0.5}
    assert parse_limit("sciq=7", tasks) == {"piqa": None, "sciq": 7, "boolq": None}
    for bad, msg in (("hellaswag=5", "'hellaswag' is not among --tasks"), ("piqa=x", "expected a number"),
                     ("2.5", "a whole number"), ("0", "a whole number")):
        with pytest.raises(ValueError, match=msg):
            parse_limit(bad, tasks)
    with pytest.raises(SystemExit) as exit_:  # on the command line: the message alone
        run_cli(main, ["some/run", "--out", "x", "--tasks", "piqa", "--limit", "boolq=3"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: --limit boolq=3: 'boolq' is not among --tasks (piqa)")
    assert "Traceback" not in err
