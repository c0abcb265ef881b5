"""eval.eviction.frontier end to end on a tiny randomly initialised FoX in a Hugging Face directory: the JSON and
the plot, the full cache's loss against the model's own forward and its greedy tokens against generate(), every
point's budget, keeping everything reproducing the full cache; bad flags named in one line."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

from eval.cli import run_cli
from eval.eviction import frontier

SENTENCES = [f"Sentence {i} says that the {['red', 'green', 'blue'][i % 3]} fox jumps {i % 5} times."
             for i in range(80)]
POINT_KEYS = {"length", "policy", "kept_fraction", "kv_mib", "loss", "loss_diff", "greedy_agreement",
              "greedy_identical_prefix"}


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """(Hugging Face dir of a tiny FoX (Pro) with fast fixed gates, GQA and a 300-token BPE; a text file)."""
    from forgetting_transformer.config import DecoderConfig
    from forgetting_transformer.data.tokenizer import train_bpe
    from forgetting_transformer.hf import FoXConfig, FoXForCausalLM
    from forgetting_transformer.hf.tokenizer import save_tokenizer

    d = tmp_path_factory.mktemp("frontier")
    text = " ".join(SENTENCES)
    (d / "text.txt").write_text(text)
    bpe = train_bpe([text], 300, progress=False)
    save_tokenizer(bpe, d / "tiny_fox", bos_id=bpe.token_to_id("<|endoftext|>"), text_escape="none")
    torch.manual_seed(0)
    cfg = DecoderConfig(name="tiny_fox", arch="decoder", vocab_size=320, n_layers=2, d_model=32, head_dim=8,
                        n_kv_heads=2, init_std=0.1, qk_norm=True, output_gate=True, output_norm=True, kv_shift=True,
                        fgate="fixed", fgate_init=[1.0, 3.0])
    FoXForCausalLM(FoXConfig.from_model_config(cfg)).save_pretrained(d / "tiny_fox")
    return d / "tiny_fox", d / "text.txt"


def test_frontier_end_to_end(tiny_hf, tmp_path, capsys):
    from eval.common import load_model_and_tokenizer
    from forgetting_transformer.inference import generate

    model_dir, text = tiny_hf
    C, N, lengths = 12, 5, (40, 64)
    result = frontier.main(["--model", str(model_dir), "--text-file", str(text), "--lengths", "40,64",
                            "--fractions", "0.1,1", "--kv-mib", "0.002", "--acp-eps", "0.05", "--snapkv-window", "8",
                            "--continuation", str(C), "--new-tokens", str(N), "--chunk", "5", "--block-size", "16",
                            "--device", "cpu", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "tiny_fox.json").read_text()) == result
    assert (tmp_path / "tiny_fox.png").stat().st_size > 0 and "wrote" in capsys.readouterr().out
    assert result["dtype"] == "float32" and (result["continuation"], result["new_tokens"]) == (C, N)
    assert len(result["points"]) == len(lengths) * (3 * 3 + 1)  # 3 targeted x (2 fractions + 1 budget) + acp
    model, tok, _ = load_model_and_tokenizer(model_dir)
    ids = torch.tensor(tok(text.read_text())["input_ids"])[None]
    for P, full in zip(lengths, result["full"]):
        # the full cache against the model's own forward and against generate()
        own = model.model(ids[:, :P + C], labels=ids[:, 1:P + C + 1])[0, P:].detach()
        assert full["length"] == P and abs(full["loss"] - float(own.double().mean())) < 1e-5
        out = generate(model, ids[:, :P], max_new_tokens=N + 1)
        assert full["greedy_tokens"] == out.sequences[0, P + 1:].tolist()
        rows = 2 * 2  # layers x kv heads
        per_position = 2 * 8 * 4 + 2 * 8  # fp32 key and value, a float64 gate per query head of the kv head
        assert full["kv_mib"] == rows * P * per_position / 2 ** 20
        points = [p for p in result["points"] if p["length"] == P]
        for p in points:
            assert POINT_KEYS <= set(p) and 0 <= p["greedy_agreement"] <= 1
            assert p["kv_mib"] == pytest.approx(p["kept_fraction"] * full["kv_mib"], rel=1e-12)
            assert p["loss_diff"] == pytest.approx(p["loss"] - full["loss"], abs=1e-12)
            if p["policy"] == "acp":
                assert p["eps"] == 0.05 and 0 < p["kept_fraction"] < 1
            elif p["fraction"] == 1.0:  # keeping everything is the full cache
                assert p["kept_fraction"] == 1 and abs(p["loss"] - full["loss"]) <= 1e-6
                assert p["greedy_agreement"] == 1.0 and p["greedy_identical_prefix"] == N
            elif p["fraction"] == 0.1:
                assert p["kept_fraction"] == max(1, math.floor(0.1 * P + 0.5)) / P
            else:  # 0.002 MiB
                assert p["kv_bytes"] == round(0.002 * 2 ** 20) == 2097
                assert p["kept_fraction"] * P == 2097 // (rows * per_position)
        assert {p["policy"] for p in points} == {"acp", "streaming", "h2o", "snapkv"}
        assert any(p["greedy_agreement"] < 1 for p in points)  # a 10% cache changes some of the tokens


def test_windows_score_consecutive_stretches_of_the_text_and_average_with_an_interval(tiny_hf, tmp_path):
    from eval.common import load_model_and_tokenizer
    from eval.eviction.windows import mean_over_windows
    from eval.reproduction_results import paired_interval

    model_dir, text = tiny_hf
    P, C = 40, 10
    result = frontier.main(["--model", str(model_dir), "--text-file", str(text), "--lengths", str(P),
                            "--fractions", "0.1", "--policies", "streaming,snapkv", "--windows", "3", "--continuation",
                            str(C), "--new-tokens", "3", "--device", "cpu", "--out", str(tmp_path)])
    assert [f["text_window"] for f in result["full"]] == [0, 1, 2] and result["window_tokens"] == P + C + 1
    model, tok, _ = load_model_and_tokenizer(model_dir)
    ids = torch.tensor(tok(text.read_text())["input_ids"])[None]
    for w, full in enumerate(result["full"]):  # window w: the text's tokens from w * (P + C + 1) on
        x = ids[:, w * (P + C + 1):]
        own = model.model(x[:, :P + C], labels=x[:, 1:P + C + 1])[0, P:].detach()
        assert abs(full["loss"] - float(own.double().mean())) < 1e-5
    [full], [point, snapkv] = mean_over_windows(result)
    assert snapkv["policy"] == "snapkv" and snapkv["window"] == 32  # SnapKV's own window, not the text's
    diffs = [p["loss_diff"] for p in result["points"] if p["policy"] == "streaming"]
    assert full["windows"] == point["windows"] == 3
    assert full["loss"] == pytest.approx(sum(f["loss"] for f in result["full"]) / 3)
    assert point["loss_diff"] == pytest.approx(sum(diffs) / 3)
    assert point["loss_diff_ci"] == pytest.approx(list(paired_interval(diffs)[1:]))
    assert point["greedy_identical_prefix"] == min(p["greedy_identical_prefix"] for p in result["points"]
                                                   if p["policy"] == "streaming")


@pytest.mark.parametrize("args, message", [
    (["--policies", "acp,lru"], "--policies: unknown policy 'lru' (choose from acp, streaming, h2o, snapkv)"),
    (["--fractions", "0.1,1.5"], "--fractions: 1.5 is outside (0, 1]"),
    (["--fractions", "0"], "--fractions: 0 is outside (0, 1]"),
    (["--fractions", "half"], "--fractions: 'half' is not a number"),
    (["--lengths", "64,0"], "--lengths: 0 is outside [1, inf)"),
    (["--acp-eps", "1"], "--acp-eps: 1 is outside (0, 1)"),
    (["--text-file", "/nonexistent/book.txt"], "--text-file: /nonexistent/book.txt not found"),
    (["--lengths", "5000"], "+ --continuation (1024) + 1) need 6025"),
    (["--lengths", "64", "--continuation", "100", "--windows", "50"], "--windows (50) x (the longest of --lengths"),
    (["--lengths", "64", "--continuation", "8", "--new-tokens", "2", "--policies", "streaming", "--kv-mib", "0.000001"],
     "holds no position"),
])
def test_bad_input_is_one_line_naming_the_flag(tiny_hf, tmp_path, capsys, args, message):
    model_dir, text = tiny_hf
    base = {"--model": str(model_dir), "--text-file": str(text), "--out": str(tmp_path), "--device": "cpu"}
    base.update(dict(zip(args[::2], args[1::2])))
    with pytest.raises(SystemExit) as e:
        run_cli(frontier.main, [x for kv in base.items() for x in kv])
    err = capsys.readouterr().err  # (transformers' "Loading weights" bar when the model loads)
    assert e.value.code == 2 and "Traceback" not in err, err
    assert err.splitlines()[-1].startswith("error: ") and message in err.splitlines()[-1], err
    assert "--kv-mib" in err.splitlines()[-1] or "--kv-mib" not in args  # the flag named, not the policy's field


def test_acp_asks_for_a_gate_and_for_qk_norm_or_a_threshold():
    lists = {"policies": ["acp"], "eps": None, "thresholds": [], "fractions": [], "kv_mib": []}
    transformer = SimpleNamespace(fgate="none", qk_norm=True, acp_eps=1e-3)
    with pytest.raises(ValueError, match="--policies acp: T has no forget gate"):
        frontier.build_policies(None, lists, transformer, "T")
    llama = SimpleNamespace(fgate="data_dependent", qk_norm=False, acp_eps=1e-3)
    with pytest.raises(ValueError, match="--acp-eps: L has no QK-norm.*pass --acp-threshold"):
        frontier.build_policies(None, lists, llama, "L")
    [acp] = frontier.build_policies(None, dict(lists, thresholds=[-4.0]), llama, "L")
    assert (acp.eps, acp.threshold) == (None, -4.0)
    [acp] = frontier.build_policies(None, lists, SimpleNamespace(fgate="fixed", qk_norm=True, acp_eps=1e-3), "P")
    assert (acp.eps, acp.threshold) == (1e-3, None)


def test_help_explains_every_flag(capsys):
    parser = frontier.make_parser()
    flags = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert len(flags) > 20 and all(a.help and len(a.help) > 10 for a in flags)
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    out = capsys.readouterr().out
    assert all(a.option_strings[0] in out for a in flags) and "docs/eviction.md" in out
