"""eval.retrieval: the needle-gain and passkey prompts (exact length, control differing only in the needle span,
needle at its depth), both scorers against a plain full forward, the passkey draws and statistics on a fake
scorer, the command end to end on tiny randomly initialised models in Hugging Face directories, re-plotting, and
bad flags named in one line."""

import json
import math

import pytest
import torch

from eval.cli import run_cli
from eval.common import load_model_and_tokenizer
from eval.retrieval import plot, run

SENTENCES = [f"Sentence number {i} says that the {['red', 'green', 'blue'][i % 3]} fox jumps {i % 5} times."
             for i in range(300)]
TOP_KEYS = {"name", "model", "source", "train_len", "command", "seed", "trials", "lengths", "depths", "haystack",
            "dtype", "needle_gain", "passkey"}
NEEDLE_CELL_KEYS = {"length", "depth", "needle_depth", "answer_tokens", "trials", "mean_gain", "mean_gain_ci",
                    "fraction_positive", "fraction_positive_ci", "gains"}
PASSKEY_CELL_KEYS = {"length", "depth", "needle_depth", "trials", "accuracy", "accuracy_ci", "mrr", "mrr_ci", "ranks"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """({"fox": dir, "transformer": dir}, haystack file): Hugging Face dirs of a tiny FoX (Pro) whose forget gates
    keep ~100 tokens, and of a tiny Transformer, sharing a 400-token BPE trained on the haystack and the probes'
    templates (so that a prompt's fixed parts take few tokens)."""
    from forgetting_transformer.config import DecoderConfig
    from forgetting_transformer.data.tokenizer import train_bpe
    from forgetting_transformer.hf import FoXConfig, FoXForCausalLM
    from forgetting_transformer.hf.tokenizer import save_tokenizer

    d = tmp_path_factory.mktemp("retrieval")
    text = " ".join(SENTENCES)
    (d / "hay.txt").write_text(text)
    templates = [run.NEEDLE, run.QUERY, run.PASSKEY_HEAD, run.PASSKEY_NEEDLE, run.PASSKEY_QUERY, *run.KEY_WORDS]
    bpe = train_bpe([text, *templates], 400, progress=False)
    dirs = {}
    torch.manual_seed(0)
    for name, extra in (("fox", dict(fgate_init=[64.0, 256.0], output_gate=True, output_norm=True, kv_shift=True)),
                        ("transformer", dict(fgate="none"))):
        dirs[name] = d / f"tiny_{name}"
        save_tokenizer(bpe, dirs[name], bos_id=bpe.token_to_id("<|endoftext|>"), text_escape="none")
        cfg = DecoderConfig(name=f"tiny_{name}", arch="decoder", vocab_size=416, n_layers=2, d_model=32, head_dim=8,
                            n_kv_heads=2, init_std=0.1, qk_norm=True, **extra)
        model = FoXForCausalLM(FoXConfig.from_model_config(cfg))
        model.model.reset_parameters()  # DecoderLM's own initialisation: forget-gate biases from fgate_init
        model.save_pretrained(dirs[name])
    return dirs, d / "hay.txt"


@pytest.fixture(scope="module")
def loaded(tiny):
    """{name: (model, Contexts)} for both tiny models."""
    dirs, hay = tiny
    out = {}
    for name, path in dirs.items():
        model, tok, _ = load_model_and_tokenizer(path)
        out[name] = model, run.Contexts(tok, run.read_haystack(hay))
    return out


def full_forward_logprob(model, row, m):
    """log p of the last m tokens of ``row`` from one plain forward of the whole row (no cache, no batch)."""
    with torch.no_grad():
        logp = model(input_ids=torch.tensor([row])).logits[0].double().log_softmax(-1)  # (T, V)
    n = len(row)
    return sum(float(logp[t - 1, row[t]]) for t in range(n - m, n))


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", ["fox", "transformer"])
def test_needle_gain_equals_a_brute_force_reference(loaded, name):
    model, ctx = loaded[name]
    draws = [run.needle_draw(3, t) for t in range(3)]
    items = run.needle_cell(ctx, 150, 0.5, draws) + run.needle_cell(ctx, 120, 0, draws)  # two lengths: padding
    gains = run.score_needle(model, items, batch_size=4)  # batches straddle items and lengths
    assert run.score_needle(model, items, batch_size=1) == pytest.approx(gains, abs=1e-6)
    for it, gain in zip(items, gains):
        m = len(it["answer"])
        with_needle = full_forward_logprob(model, it["with"] + it["answer"], m)
        control = full_forward_logprob(model, it["without"] + it["answer"], m)
        assert run.answer_logprobs(model, [it["with"] + it["answer"]], [m])[0] == pytest.approx(with_needle, abs=1e-4)
        assert gain == pytest.approx((with_needle - control) / m, abs=1e-5)
    assert max(abs(g) for g in gains) > 1e-3  # the needle does move these models' predictions


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", ["fox", "transformer"])
def test_passkey_scores_equal_a_full_forward_per_candidate(loaded, name):
    model, ctx = loaded[name]
    draws = run.passkey_draws(ctx, seed=1, trials=3, digits=4, distractors=3)
    items = run.passkey_cell(ctx, 200, 0.25, draws)
    scores = run.score_passkey(model, items, batch_size=8)  # two prompts per prefill, then one
    assert len(scores) == 3 and all(len(s) == 4 for s in scores)
    for it, row in zip(items, scores):
        want = [full_forward_logprob(model, it["prompt"] + c, len(c)) for c in it["candidates"]]
        assert row == pytest.approx(want, abs=1e-4)
    assert len({round(s, 3) for row in scores for s in row}) > 6  # the candidates score differently
    # candidates of different lengths: the shorter rows are right-padded, their padding never scored
    prompts, candidates = [items[0]["prompt"], items[1]["prompt"]], [[[5, 6, 7], [8]], [[9], [10, 11, 12, 13]]]
    want = [[full_forward_logprob(model, p + c, len(c)) for c in cs] for p, cs in zip(prompts, candidates)]
    assert run.candidate_logprobs(model, prompts, candidates) == [pytest.approx(w, abs=1e-4) for w in want]


def find_all(seq, sub):
    return [i for i in range(len(seq) - len(sub) + 1) if seq[i:i + len(sub)] == sub]


def test_prompts_have_the_length_and_differ_only_in_the_needle_span(loaded):
    _, ctx = loaded["fox"]
    tok = ctx.niah.tok
    draws = [run.needle_draw(0, t) for t in range(2)]
    passkeys = run.passkey_draws(ctx, 0, 2, 5, 3)
    for length in (128, 200, 333):
        for depth in (0, 0.25, 0.5, 0.75, 1):
            for it, (key, value) in zip(run.needle_cell(ctx, length, depth, draws), draws):
                s, e = it["needle_start"], it["needle_end"]
                a, b = it["with"], it["without"]
                assert len(a) == len(b) == length and a[0] == b[0] == tok.bos_token_id
                assert a[:s] == b[:s] and a[e:] == b[e:] and a[s:e] != b[s:e]
                assert a[s:e] == ctx.encode_with(run.NEEDLE, "value", it["answer"], key=key)
                assert find_all(a[s:e], it["answer"]) == [e - s - len(it["answer"]) - len(ctx.encode(".\n"))]
                text = tok.decode(a, skip_special_tokens=True)
                assert text.count(f"The secret number for {key} is {value}.") == 1
                assert text.endswith(run.QUERY.format(key=key))
                assert str(value) not in tok.decode(b, skip_special_tokens=True)
            for it, keys in zip(run.passkey_cell(ctx, length, depth, passkeys), passkeys):
                p = it["prompt"]
                assert len(p) == length and len(find_all(p, it["candidates"][0])) == 2  # the key, twice
                assert tok.decode(p, skip_special_tokens=True).count(f"The pass key is {keys[0]}. Remember it.") == 1
    with pytest.raises(ValueError, match="--lengths: 60 is too short"):
        run.passkey_cell(ctx, 60, 0.5, passkeys)


def test_the_needle_lands_at_its_depth(loaded):
    _, ctx = loaded["fox"]
    head = ctx.encode(run.PASSKEY_HEAD)
    sentence_tokens = max(len(ctx.encode(" " + s)) for s in SENTENCES)
    draws = [run.needle_draw(0, 0)]
    for length in (160, 300, 500):
        for depth in (0, 0.1, 0.25, 0.5, 0.75, 0.9, 1):
            placed = [(it, 0) for it in run.needle_cell(ctx, length, depth, draws)]
            placed += [(it, len(head)) for it in run.passkey_cell(ctx, length, depth, [["12345", "54321"]])]
            for it, before in placed:
                n = it["haystack_tokens"]
                pos = it["needle_start"] - len(ctx.prefix) - before  # haystack tokens before the needle
                target = n if depth == 1 else int(n * depth)
                assert target - sentence_tokens <= pos <= target  # backed off by at most one sentence
                assert it["needle_depth"] == pos / n
                ids = it["with"] if "with" in it else it["prompt"]
                if 0 < pos < n:  # just after a sentence end
                    assert ctx.niah.tok.decode([ids[it["needle_start"] - 1]]).rstrip().endswith(".")


def test_passkey_draws_and_ranks_on_a_fake_scorer(loaded, monkeypatch):
    _, ctx = loaded["fox"]
    draws = run.passkey_draws(ctx, seed=7, trials=4, digits=5, distractors=3)
    assert draws == run.passkey_draws(ctx, seed=7, trials=4, digits=5, distractors=3)  # seeded
    assert draws != run.passkey_draws(ctx, seed=8, trials=4, digits=5, distractors=3)
    for keys in draws:
        assert len(keys) == 4 and len(set(keys)) == 4  # distinct: no distractor is the key
        assert all(len(k) == 5 and k.isdigit() and k[0] != "0" for k in keys)
        assert len({len(ctx.encode(f" {k}")) for k in keys}) == 1  # as many tokens as the key
    import numpy as np

    def parity(x):
        return int(x) % 2

    odd_or_even = run.draw_passkeys(np.random.default_rng(0), 1, 3, parity)
    assert len(set(map(parity, odd_or_even))) == 1 and all(len(k) == 1 for k in odd_or_even)
    with pytest.raises(ValueError, match="--distractors 6: only [34] other 1-digit numbers tokenize into"):
        run.draw_passkeys(np.random.default_rng(0), 1, 6, parity)

    # the fake scorer: per trial, the candidates' scores, the key's first; ranks 1, 2, 2 (a tie counts against the
    # key) and 4
    fake = {tuple(ctx.encode(f" {keys[0]}")): s for keys, s in zip(draws, (
        [0.0, -1.0, -2.0, -3.0], [-1.0, 0.0, -2.0, -3.0], [-1.0, -1.0, -2.0, -3.0], [-5.0, -1.0, -2.0, -3.0]))}
    calls = []

    def scorer(model, prompts, candidates):
        calls.append(len(prompts))
        return [fake[tuple(c[0])] for c in candidates]

    monkeypatch.setattr(run, "candidate_logprobs", scorer)
    monkeypatch.setattr(run, "answer_logprobs", lambda model, rows, tails: [0.0] * len(rows))
    needle = [run.needle_draw(0, t) for t in range(4)]
    needle_cells, passkey_cells = run.run_cells(None, ctx, [(200, 0.5)], needle, draws, batch_size=8, bar=None)
    assert calls == [2, 2]  # 8 rows // 4 candidates = 2 prompts per prefill
    (cell,) = passkey_cells
    assert cell["ranks"] == [1, 2, 2, 4]
    assert cell["accuracy"] == 0.25 and cell["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 2 + 1 / 4) / 4)
    lo, hi = cell["accuracy_ci"]  # Wilson, 1 of 4
    assert lo == pytest.approx(0.0456, abs=1e-4) and hi == pytest.approx(0.6994, abs=1e-4)
    rr = [1, 0.5, 0.5, 0.25]
    sd = math.sqrt(sum((x - 0.5625) ** 2 for x in rr) / 3)
    assert cell["mrr_ci"] == pytest.approx([0.5625 - 3.182 * sd / 2, 0.5625 + 3.182 * sd / 2])  # t, 3 df
    assert needle_cells[0]["gains"] == [0.0] * 4 and needle_cells[0]["fraction_positive"] == 0
    assert run.passkey_chance(4) == {"accuracy": 0.25, "mrr": pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 4) / 4)}


@pytest.mark.usefixtures("one_thread")
def test_command_end_to_end_json_and_heatmaps(tiny, tmp_path, capsys, monkeypatch):
    dirs, hay = tiny
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "0")  # a progress line per batch
    argv = ["--run", str(dirs["fox"]), "--haystack", str(hay), "--lengths", "160,256", "--depths", "0,0.5,1",
            "--trials", "3", "--seed", "5", "--distractors", "3", "--passkey-digits", "4", "--batch-size", "8",
            "--out", str(tmp_path), "--device", "cpu"]
    path = run_cli(run.main, argv)
    res = json.loads(path.read_text())
    assert path == tmp_path / "tiny_fox_retrieval.json" and set(res) == TOP_KEYS
    assert res["command"] == "python -m eval.retrieval.run " + " ".join(argv)
    assert (res["seed"], res["trials"], res["model"], res["dtype"]) == (5, 3, str(dirs["fox"]), "float32")
    assert res["name"] == "tiny_fox (tiny_fox)" and res["lengths"] == [160, 256] and res["depths"] == [0, 0.5, 1]
    grid = [(L, d) for L in (160, 256) for d in (0, 0.5, 1)]
    gain, passkey = res["needle_gain"], res["passkey"]
    assert [(c["length"], c["depth"]) for c in gain["cells"]] == grid
    assert [(c["length"], c["depth"]) for c in passkey["cells"]] == grid
    assert passkey["chance"] == {"accuracy": 0.25, "mrr": pytest.approx(25 / 48)}
    for c in gain["cells"]:
        assert set(c) == NEEDLE_CELL_KEYS and len(c["gains"]) == 3
        assert c["mean_gain"] == pytest.approx(sum(c["gains"]) / 3)
        assert c["fraction_positive"] == sum(g > 0 for g in c["gains"]) / 3
        lo, hi = c["mean_gain_ci"]
        assert lo <= c["mean_gain"] <= hi
    for c in passkey["cells"]:
        assert set(c) == PASSKEY_CELL_KEYS and all(1 <= r <= 4 for r in c["ranks"])
        assert c["accuracy"] == sum(r == 1 for r in c["ranks"]) / 3
    gains = [g for c in gain["cells"] for g in c["gains"]]
    assert gain["overall"] == {"trials": 18, "mean_gain": pytest.approx(sum(gains) / 18),
                               "fraction_positive": sum(g > 0 for g in gains) / 18}  # pooled, without intervals
    assert set(passkey["overall"]) == {"trials", "accuracy", "mrr"} and passkey["overall"]["trials"] == 18
    for probe in ("needle_gain", "passkey"):
        assert (tmp_path / f"tiny_fox_{probe}.png").stat().st_size > 10_000
    again = tmp_path / "two.png"
    plot.main([str(path), str(path), "--probe", "passkey", "--out", str(again)])
    assert again.stat().st_size > 10_000
    printed = capsys.readouterr()
    assert "needle gain" in printed.out and "passkey accuracy" in printed.out and "(chance 0.250)" in printed.out
    # a line per batch: a cell's 3 needle trials in one batch of 6 rows, then its passkeys 2 prompts and 1
    assert "retrieval tiny_fox: 3/36 trial (8%) | " in printed.err and "retrieval tiny_fox: 5/36 trial" in printed.err
    assert "retrieval tiny_fox: 4/36 trial" not in printed.err
    assert "retrieval tiny_fox: 36/36 trial (100%) | " in printed.err


@pytest.mark.parametrize("args, message", [
    (["--trials", "0"], "error: argument --trials: must be an integer >= 1; got 0"),
    (["--depths", "0,50"], "error: --depths: 50 is outside [0, 1] (fractions of the haystack: 0.5 is the middle)"),
    (["--depths", "0.5,0.5"], "error: --depths: 0.5 is listed twice"),
    (["--lengths", "1k,abc"], "error: --lengths: 'abc' is not a number"),
    (["--lengths", "0"], "error: --lengths: 0 is outside [1, inf)"),
    (["--passkey-digits", "1"], "error: --distractors: 9 is more than the 8 other 1-digit numbers"),
    (["--passkey-digits", "19"], "error: --passkey-digits: 19 is outside [1, 18]"),
    (["--haystack", "/nonexistent/hay"], "error: --haystack: /nonexistent/hay not found"),
    (["--run", "/nonexistent/run"], "error: --run: /nonexistent/run is not a directory"),
    (["--trials"], "error: argument --trials: expected one argument"),
    (["--lengths", "60"], "error: --lengths: 60 is too short: bos, instructions, needle and question alone take"),
])
def test_bad_flags_are_one_line_errors(tiny, tmp_path, capsys, args, message):
    dirs, hay = tiny
    argv = ["--run", str(dirs["fox"]), "--haystack", str(hay), "--out", str(tmp_path), "--device", "cpu", *args]
    with pytest.raises(SystemExit) as e:
        run_cli(run.main, argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line and "Loading weights" not in line]  # transformers' bar
    assert e.value.code == 2 and "Traceback" not in err and "usage:" not in err, err
    assert len(lines) == 1 and lines[0].startswith(message), err
    assert not list(tmp_path.iterdir())  # nothing written
