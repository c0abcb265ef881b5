"""eval.niah: prompt construction, scoring, judge hook, CLI end to end on a real (tiny) run, re-plotting; the batched
greedy generation both NIAH and LongBench use (eval.common) against decoding each prompt alone."""

import json
import re
import textwrap
import time

import pytest
import torch
from omegaconf import OmegaConf

from eval.common import (GenerationOptions, generate_batched, generate_texts, generation_groups,
                         load_model_and_tokenizer, prepare_for_generation, run_tokenizer)
from eval.niah import plot, run
from tests.inference.inference_models import LOCAL, PRO, VARIANTS, tiny

SENTENCES = [f"Sentence number {i} says that the {['red', 'green', 'blue'][i % 3]} fox jumps {i % 5} times."
             for i in range(400)]


def path_run_of(tiny_text_run, train):
    """A PaTH-FoX (Pro) run (model.mixer=path) trained by train.py 4 steps on ``tiny_text_run``'s data, at its
    size; trained once, beside it, for every test module that asks."""
    run_dir = tiny_text_run.parent / "path_fox_pro_run"
    if not (run_dir / "checkpoints").is_dir():
        data = OmegaConf.load(tiny_text_run / "config.yaml").data
        train(run_dir, data.data_dir, {"vocab_size": data.vocab_size, "bos_id": data.bos_id}, "model=path_fox_pro",
              "data.seq_len=256", "model.n_layers=2", "model.d_model=64", "model.head_dim=32", "train.max_steps=4")
    return run_dir


@pytest.fixture(scope="module")
def tiny_path_run(tiny_text_run, train_on_prepared_data):
    return path_run_of(tiny_text_run, train_on_prepared_data)


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
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "0")  # a progress line per batch of cells
    out = tmp_path / "niah"
    run.main([str(tiny_text_run), "--out", str(out), "--mode", "easy", "--lengths", "256,512", "--depths", "0,100",
              "--max-new-tokens", "8", "--device", "cpu", "--batch-size", "3"])
    res = json.loads((out / "run_easy.json").read_text())
    assert res["mode"] == "easy" and res["train_len"] == 256 and res["name"].startswith("fox_pro")
    assert res["dtype"] == "float32"  # auto on the CPU
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
    # the progress counts prompts: the two 512-token prompts as one batch, then the two of 256 (half: not joined)
    assert "NIAH easy run: 2/4 cell (50%) | " in printed.err and "NIAH easy run: 4/4 cell (100%) | " in printed.err
    assert "1/4 cell" not in printed.err


def one_at_a_time(model, ids, max_new_tokens):
    """transformers' own generate() (FoXCache, no padding) on one prompt: a reference independent of the static
    cache."""
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                             do_sample=False, num_beams=1)
    return out[0, len(ids):].tolist()


def test_batched_cells_equal_one_at_a_time(tiny_text_run, tmp_path, hay_dir):
    lengths, depths = [200, 256, 300], [0, 100]
    kw = dict(lengths=lengths, depths=depths, haystack=str(hay_dir), max_new_tokens=8, progress=False)
    files = {bs: run.evaluate_model(tiny_text_run, tmp_path / f"bs{bs}", generation=GenerationOptions(batch_size=bs),
                                    **kw) for bs in (1, 4, 16)}
    texts = {bs: f.read_text() for bs, f in files.items()}
    assert texts[1] == texts[4] == texts[16]  # the whole result file, whatever the batch size
    res = json.loads(texts[4])
    assert [(e["length"], e["depth"]) for e in res["results"]] == [(L, d) for L in lengths for d in depths]
    # each cell's prediction is the greedy continuation of its own prompt, decoded alone without padding
    model, tok, _ = load_model_and_tokenizer(tiny_text_run)
    b = run.PromptBuilder(tok, run.read_haystack(hay_dir), "standard")
    for e in res["results"]:
        new = one_at_a_time(model, b.build(e["length"], e["depth"])["input_ids"], 8)
        assert e["prediction"] == tok.decode(new, skip_special_tokens=True).strip(), (e["length"], e["depth"])
    # (this barely trained model answers every cell alike; test_generate_batched_equals_greedy_decoding_alone
    # checks on prompts with distinct answers that each lands at its own index)


def test_a_path_run_evaluates_each_cell_as_its_greedy_continuation(tiny_path_run, tmp_path, hay_dir):
    # PaTH has no static-cache path: generate_batched decodes its left-padded batches through its own cache
    gen = GenerationOptions(batch_size=4)
    out = run.evaluate_model(tiny_path_run, tmp_path / "niah", lengths=[200, 300], depths=[0, 100],
                             haystack=str(hay_dir), max_new_tokens=6, generation=gen, progress=False)
    res = json.loads(out.read_text())
    assert res["name"].startswith("path_fox_pro") and len(res["results"]) == 4
    model, tok, _ = load_model_and_tokenizer(tiny_path_run)
    assert model.config.mixer == "path"
    b = run.PromptBuilder(tok, run.read_haystack(hay_dir), "standard")
    for e in res["results"]:
        new = one_at_a_time(model, b.build(e["length"], e["depth"])["input_ids"], 6)
        assert e["prediction"] == tok.decode(new, skip_special_tokens=True).strip(), (e["length"], e["depth"])
    with pytest.raises(ValueError, match="--acp-eviction .*model.mixer=path"):
        prepare_for_generation(model, GenerationOptions(acp_eviction=True), "cpu")


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_bad_batch_size_is_a_clear_error(value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run.main(["some_run", "--out", str(tmp_path), "--batch-size", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --batch-size:" in err and "integer >= 1" in err and "Traceback" not in err
    with pytest.raises(ValueError, match=r"batch_size \(--batch-size\) must be an integer >= 1; got 0"):
        GenerationOptions(batch_size=0)
    with pytest.raises(ValueError, match="--prefill-chunk"):
        GenerationOptions(prefill_chunk=-1)


# --------------------------------------------------------------------------- batched generation (eval.common)


def test_generation_groups_cover_every_prompt_longest_first():
    lengths = [5, 9, 2, 9, 7, 1, 9, 3]
    groups = generation_groups(lengths, batch_size=3)
    # by length, ties in input order; 3 does not join 7 (a group pads a row to less than twice its length)
    assert groups == [[1, 3, 6], [4, 0], [7, 2], [5]]
    assert generation_groups(lengths, batch_size=1) == [[i] for i in (1, 3, 6, 4, 0, 7, 2, 5)]
    # at most 20 padded prompt tokens: 9 + 9 (a third 9 would make 27), 9 + 7 (padded to 18), 5 + 3 (10)
    capped = generation_groups(lengths, batch_size=8, max_batch_tokens=20)
    assert capped == [[1, 3], [6, 4], [0, 7], [2], [5]]
    assert all(len(g) * lengths[g[0]] <= 20 for g in capped)
    assert generation_groups([30, 4], batch_size=8, max_batch_tokens=20) == [[0], [1]]  # too long: alone
    assert generation_groups([], batch_size=8) == []


def test_generation_groups_keep_niah_lengths_apart():
    lengths = [L for L in (1024, 2048, 4096) for _ in range(11)]  # NIAH: 11 depths per length, doubling lengths
    groups = generation_groups(lengths, batch_size=8)
    assert [len(g) for g in groups] == [8, 3] * 3
    assert all(len({lengths[i] for i in g}) == 1 for g in groups)  # no group pads
    assert sorted(i for g in groups for i in g) == list(range(33))
    mixed = generation_groups([100, 99, 51, 50, 26], batch_size=8)  # just over half the longest joins
    assert mixed == [[0, 1, 2], [3, 4]]


# PaTH decodes through its own cache (eval.common._greedy_path), not the static path the other variants take
PATH_VARIANTS = {"path_fox_pro": dict(mixer="path", **PRO), "path_gqa": dict(mixer="path", fgate="none", n_kv_heads=2)}


def tiny_lm(variant: str):
    """A tiny DecoderLM of tests/inference in float32 (peaked next-token distributions: no greedy choice is a near
    tie that rounding could flip)."""
    return tiny({**VARIANTS, **PATH_VARIANTS}[variant], dtype=torch.float32)


def greedy_alone(model, prompt, steps, eos):
    """Full forward (no cache, no padding) on the growing sequence, argmax, up to and including eos."""
    ids, new = torch.tensor([prompt]), []
    with torch.no_grad():
        for _ in range(steps):
            nxt = int(model(ids)[0, -1].argmax())
            new.append(nxt)
            if nxt == eos:
                break
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return new


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("variant, options", [
    ("fox_pro", dict(batch_size=3)),
    ("fox_llama", dict(batch_size=8, max_batch_tokens=40)),
    # prefill_chunk 4 < the left padding of the short rows: whole chunks of padding
    ("transformer_pro_gqa", dict(batch_size=4, prefill_chunk=4)),
    ("transformer_llama", dict(batch_size=1)),
    ("path_fox_pro", dict(batch_size=3)),
    ("path_gqa", dict(batch_size=8, max_batch_tokens=40)),
])
def test_generate_batched_equals_greedy_decoding_alone(variant, options):
    model = tiny_lm(variant)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (3, 17, 9, 12, 5, 17, 2, 11)]
    eos = greedy_alone(model, prompts[2], 3, None)[2]  # a row ends by its third new token, others run on
    want = [greedy_alone(model, p, 12, eos) for p in prompts]
    assert len(want[2]) <= 3 and max(len(w) for w in want) == 12 and len({tuple(w) for w in want}) == len(prompts)
    got = generate_batched(model, prompts, 12, GenerationOptions(**options), eos_token_id=[eos], pad_token_id=0)
    assert got == want


@pytest.mark.usefixtures("one_thread")
def test_generate_batched_passes_acp_eviction_on(monkeypatch):
    import forgetting_transformer.inference as inference

    stats, generate = [], inference.generate

    def spy(*args, **kwargs):
        out = generate(*args, **kwargs)
        stats.append(out.stats)
        return out

    monkeypatch.setattr(inference, "generate", spy)
    model = tiny(LOCAL, dtype=torch.float32)  # forget gates that decay within a few tokens
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (80, 45, 70, 30, 60)]
    got = generate_batched(model, prompts, 40, GenerationOptions(batch_size=3, acp_eviction=True))
    # dropping keys that carry at most acp_eps of any row's attention mass leaves these greedy choices unchanged
    assert got == [greedy_alone(model, p, 40, None) for p in prompts]
    assert len(stats) == 2 and all(s["acp_eviction"] and (s["kept_fraction"] < 1).all() for s in stats)  # dropped


@pytest.mark.usefixtures("one_thread")
def test_generation_names_each_batch_and_its_steps_for_the_progress_line(monkeypatch, capsys):
    """NIAH and LongBench (generate_texts) print a line every FOX_PROGRESS_SECONDS also while one batch runs,
    naming the batch and its prefill or decoding step, as a forward hook on the embedding sees them."""
    stages = []
    prompts = [list(range(1, 21)), list(range(5, 17)), [7, 8, 9]]
    generate_batched(tiny_lm("fox_pro"), prompts, 3, GenerationOptions(batch_size=2, prefill_chunk=8),
                     on_stage=lambda batch, step: stages.append((batch, step)))
    first, second = "batch 1 of 2 (2 prompts of up to 20 tokens)", "batch 2 of 2 (1 prompts of up to 3 tokens)"
    assert stages == [(first, None), (first, "prefill of 20 tokens (tokens 1-8)"),
                      (first, "prefill of 20 tokens (tokens 9-16)"), (first, "prefill of 20 tokens (tokens 17-20)"),
                      (first, "decoding token 2 of at most 3"), (first, "decoding token 3 of at most 3"),
                      (second, None), (second, "prefill of 3 tokens"), (second, "decoding token 2 of at most 3"),
                      (second, "decoding token 3 of at most 3")]

    from forgetting_transformer.hf import FoXConfig, FoXForCausalLM

    lm = tiny_lm("fox_pro")
    model = FoXForCausalLM(FoXConfig.from_model_config(lm.cfg)).eval()
    model.model.load_state_dict(lm.state_dict())
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = 0
    model.model.blocks[0].register_forward_pre_hook(lambda module, args: time.sleep(0.3))  # a slow CPU

    class Tokenizer:
        def decode(self, ids, skip_special_tokens):
            return " ".join(map(str, ids))

    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "0.1")
    texts = generate_texts(model, Tokenizer(), prompts[:2], 3, GenerationOptions(), desc="LongBench trec",
                           unit="example")
    assert len(texts) == 2
    err = capsys.readouterr().err
    head = (r"^LongBench trec: 0/2 example \(0%\) \| -- example/s \| batch 1 of 1 \(2 prompts of up to 20 tokens\) "
            r"for 0:00:0\d: ")
    for step in ("prefill of 20 tokens", "decoding token 2 of at most 3", "decoding token 3 of at most 3"):
        assert re.search(head + step + r" \| elapsed 0:00:0\d \| ETA --$", err, re.M), (step, err)
    assert err.splitlines()[-1].startswith("LongBench trec: 2/2 example (100%) | ")


@pytest.mark.parametrize("argv, want", [([], (False, False)), (["--compile-step"], (True, False)),
                                        (["--autotune"], (False, True)),
                                        (["--no-compile-step", "--no-autotune"], (False, False))])
def test_compile_step_and_autotune_flags_reach_generate(monkeypatch, argv, want):
    import argparse

    import forgetting_transformer.inference as inference
    from eval.cli import add_generation_args
    from forgetting_transformer.ops.forgetting_attention import default_options

    parser = argparse.ArgumentParser()
    add_generation_args(parser)
    options = GenerationOptions.from_args(parser.parse_args(argv))
    seen = []

    def spy(*args, **kwargs):  # records what the call sees; compiling is not what this test is about
        seen.append((kwargs["compile_step"], default_options().autotune))
        return generate(*args, **{**kwargs, "compile_step": False})

    generate = inference.generate
    monkeypatch.setattr(inference, "generate", spy)
    before = default_options()
    prompts = [[5, 6, 7], [8, 9]]
    got = generate_batched(tiny_lm("fox_pro"), prompts, 3, options)
    assert seen == [want] and len(got) == 2 and all(len(g) == 3 for g in got)
    assert default_options() is before  # the prefill's options end with the call
    with pytest.raises(ValueError, match="--compile-step"):
        GenerationOptions(compile_step="yes")
    with pytest.raises(ValueError, match="--autotune"):
        GenerationOptions(autotune=1)


def test_options_dtype_chunk_and_eviction_checks():
    fox, transformer, llama = tiny_lm("fox_pro"), tiny_lm("transformer_llama"), tiny_lm("fox_llama")
    auto = GenerationOptions()
    assert auto.torch_dtype("cuda") == torch.bfloat16 and auto.torch_dtype("cpu") == torch.float32
    assert GenerationOptions(dtype="float32").torch_dtype("cuda") == torch.float32
    assert GenerationOptions(dtype="bfloat16").dtype_name("cpu") == "bfloat16"
    with pytest.raises(ValueError, match="--dtype"):
        GenerationOptions(dtype="float64")
    assert auto.chunk_for(transformer) == 4096 and auto.chunk_for(fox) is None
    assert GenerationOptions(prefill_chunk=512).chunk_for(fox) == 512
    evicting = GenerationOptions(acp_eviction=True)
    evicting.check_model(fox)
    with pytest.raises(ValueError, match="--acp-eviction needs a forget gate"):
        evicting.check_model(transformer)
    with pytest.raises(ValueError, match="--acp-eviction .* no QK-norm"):
        evicting.check_model(llama)
    auto.check_model(llama)


def test_the_score_scale_is_printed_recorded_and_on_the_plot(tiny_text_run, tmp_path, capsys, monkeypatch):
    """A mean score of 1.00 is the floor of the scale: every score line, the JSON and the plot say so."""
    out = run.evaluate_model(tiny_text_run, tmp_path, lengths=[256], depths=[50], max_new_tokens=2, progress=False)
    res = json.loads(out.read_text())
    scale = "1–10 (1: none of the answer's 7 key words, 10: all of them)"
    assert res["scale"] == scale
    assert f"mean score {res['mean_score']:.2f} on the scale {scale} over 1 cells" in capsys.readouterr().out
    figures = []
    monkeypatch.setattr(plot, "save_figure", lambda fig, png, **kw: figures.append(fig) or png)
    old = tmp_path / "old.json"  # a file written before the scale was recorded
    old.write_text(json.dumps({k: v for k, v in res.items() if k != "scale"}))
    plot.plot_niah([out], tmp_path / "a.png")
    plot.plot_niah([old], tmp_path / "b.png")
    new_fig, old_fig = figures
    assert new_fig.axes[0].get_title().endswith(f"average score {res['mean_score']:.2f} of 1–10")
    assert new_fig.axes[-1].get_ylabel() == "score 1–10\n(1: none of the answer's 7 key words, 10: all of them)"
    assert old_fig.axes[-1].get_ylabel() == "score 1–10\n(1: none of the answer's key words, 10: all of them)"
    assert run.score_scale("my_judge:judge") == "1–10 (scored by the judge my_judge:judge; 1: worst, 10: best)"
