"""scripts/make_tables.py: Tables 1-3 from fixture result files, compared with the exact expected Markdown / LaTeX."""

import json
import math
from pathlib import Path

import pytest

from tests.script_modules import load_script

ROOT = Path(__file__).resolve().parents[2]
mt = load_script("make_tables")

TABLE1_TASKS = [("lambada_openai", "acc"), ("piqa", "acc"), ("hellaswag", "acc_norm"), ("winogrande", "acc"),
                ("arc_easy", "acc"), ("arc_challenge", "acc_norm"), ("copa", "acc"), ("openbookqa", "acc_norm"),
                ("sciq", "acc"), ("boolq", "acc")]
FOX_PRO = dict(rope=False, fgate="data_dependent", qk_norm=True, output_gate=True, output_norm=True, kv_shift=True)
LLAMA = dict(qk_norm=False, output_gate=False, output_norm=False, kv_shift=False)


def lm_eval_file(d: Path, name: str, wiki: float, lmb_ppl: float, acc: float) -> str:
    results = {"wikitext": {"word_perplexity,none": wiki}, "lambada_openai": {"perplexity,none": lmb_ppl}}
    for task, metric in TABLE1_TASKS:
        results.setdefault(task, {})[f"{metric},none"] = acc
    f = d / f"{name}.json"
    f.write_text(json.dumps({"name": name, "results": results}))
    return str(f)


def scores_dir(d: Path, name: str, scores: dict) -> str:
    (d / name).mkdir()
    (d / name / "scores.json").write_text(json.dumps({"name": name, "scores": scores}))
    return str(d / name)


def run_dir(d: Path, name: str, switches: dict, heldout_loss: float | None, seq_len: int = 4) -> Path:
    """A directory shaped like train.py's output: config.yaml (model switches, data.seq_len) and metrics.jsonl."""
    r = d / name
    r.mkdir()
    model = "\n".join(f"  {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in switches.items())
    (r / "config.yaml").write_text(f"model:\n  name: {name}\n{model}\ndata:\n  seq_len: {seq_len}\n")
    rows = [{"step": 1, "loss": 9.0}] + ([{"step": 2, "heldout_loss": heldout_loss}] if heldout_loss else [])
    (r / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    return r


def test_table1_markdown_and_latex_exact(tmp_path):
    files = [lm_eval_file(tmp_path, "A", 20.0, 15.0, 0.40), lm_eval_file(tmp_path, "B", 22.0, 12.0, 0.50),
             lm_eval_file(tmp_path, "C_x", 25.0, 30.0, 0.30)]
    md = mt.main(["--table", "1", "--inputs", *files, "--format", "md"])
    assert md == "\n".join([
        "| Model | Wiki ppl↓ | LMB ppl↓ | LMB acc↑ | PIQA | Hella | Wino | ARC-e | ARC-c | COPA | OBQA | SciQA | BoolQ "
        "| Avg↑ |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| A | **20.00** | <u>15.00</u> | " + " | ".join(["<u>40.0</u>"] * 11) + " |",
        "| B | <u>22.00</u> | **12.00** | " + " | ".join(["**50.0**"] * 11) + " |",
        "| C_x | 25.00 | 30.00 | " + " | ".join(["30.0"] * 11) + " |",
    ]) + "\n"
    out = tmp_path / "t1.tex"
    tex = mt.main(["--table", "1", "--inputs", *files, "--format", "latex", "--out", str(out)])
    assert tex == "\n".join([
        r"\begin{tabular}{lccccccccccccc}", r"\toprule",
        r"Model & Wiki ppl$\downarrow$ & LMB ppl$\downarrow$ & LMB acc$\uparrow$ & PIQA & Hella & Wino & ARC-e & "
        r"ARC-c & COPA & OBQA & SciQA & BoolQ & Avg$\uparrow$ \\", r"\midrule",
        r"A & \textbf{20.00} & \underline{15.00} & " + " & ".join([r"\underline{40.0}"] * 11) + r" \\",
        r"B & \underline{22.00} & \textbf{12.00} & " + " & ".join([r"\textbf{50.0}"] * 11) + r" \\",
        r"C\_x & 25.00 & 30.00 & " + " & ".join(["30.0"] * 11) + r" \\",
        r"\bottomrule", r"\end{tabular}",
    ]) + "\n"
    assert out.read_text() == tex


def test_table2_markdown_and_latex_exact(tmp_path):
    dirs = [scores_dir(tmp_path, "A", {"qasper": 10.0, "trec": 60.0}),
            scores_dir(tmp_path, "B", {"qasper": 20.0, "trec": 50.0}),
            scores_dir(tmp_path, "C", {"qasper": 5.0, "trec": 55.0})]
    md = mt.main(["--table", "2", "--inputs", dirs[0], dirs[1] + "/scores.json", dirs[2]])
    assert md == "\n".join([
        "| Model | Qasper | TREC | Avg |",
        "|---|---:|---:|---:|",
        "| A | <u>10.00</u> | **60.00** | **35.00** |",  # Avg: a tie for best, both bold
        "| B | **20.00** | 50.00 | **35.00** |",
        "| C | 5.00 | <u>55.00</u> | <u>30.00</u> |",
        "",
        "Groups — Single-Document QA: Qasper; Few-shot Learning: TREC. Best of each column in bold, second "
        "underlined.",
    ]) + "\n"
    tex = mt.main(["--table", "2", "--inputs", *dirs, "--format", "latex"])
    assert tex == "\n".join([
        r"\begin{tabular}{lrrr}", r"\toprule",
        r"\multirow{2}{*}{Model} & \multicolumn{1}{c}{Single-Document QA} & \multicolumn{1}{c}{Few-shot Learning} & "
        r"\multirow{2}{*}{Avg} \\",
        r"\cmidrule(lr){2-2}\cmidrule(lr){3-3}",
        r" & Qasper & TREC & \\", r"\midrule",
        r"A & \underline{10.00} & \textbf{60.00} & \textbf{35.00} \\",
        r"B & \textbf{20.00} & 50.00 & \textbf{35.00} \\",
        r"C & 5.00 & \underline{55.00} & \underline{30.00} \\",
        r"\bottomrule", r"\end{tabular}",
    ]) + "\n"


@pytest.fixture
def ablation_inputs(tmp_path):
    """Five Table 3 inputs of every accepted kind, all evaluated over 4 tokens."""
    pro = run_dir(tmp_path, "pro", FOX_PRO, math.log(6.62))
    noqk = run_dir(tmp_path, "noqk", dict(FOX_PRO, qk_norm=False), math.log(6.79))
    # eval.per_token_loss.run output for a Transformer (LLaMA) run: the config is found through 'checkpoint'
    tf = run_dir(tmp_path, "tf", dict(rope=True, fgate="none", **LLAMA), None)
    ptl = tmp_path / "ptl_tf.json"
    ptl.write_text(json.dumps({"name": "transformer_llama (tf)",
                               "checkpoint": str(tf / "checkpoints" / "step_00000004"),
                               "loss": [math.log(7.49) - 0.1, math.log(7.49) + 0.1, math.log(7.49) - 0.2,
                                        math.log(7.49) + 0.2]}))
    # train.py's per_token_loss.json inside a run dir, with an explicit row label
    rope = run_dir(tmp_path, "rope", dict(FOX_PRO, rope=True), None)
    (rope / "per_token_loss.json").write_text(json.dumps({"name": "fox_pro_rope", "loss": [math.log(6.63)] * 4}))
    # a per-token-loss JSON of a Hugging Face export (fixed gates)
    hf = tmp_path / "hf_fixed"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "fox", "n_layers": 2, **dict(FOX_PRO, fgate="fixed")}))
    ptl_hf = tmp_path / "ptl_hf.json"
    ptl_hf.write_text(json.dumps({"name": "x", "checkpoint": str(hf), "loss": [math.log(7.0)] * 4}))
    return [str(pro), str(noqk), str(ptl), f"My FoX & co={rope / 'per_token_loss.json'}", str(ptl_hf)]


def test_table3_markdown_and_latex_exact(ablation_inputs, capsys):
    md = mt.main(["--table", "3", "--inputs", *ablation_inputs])
    assert md == "\n".join([
        "| Model | RoPE | Forget gate | QK-norm | Output gate | Output norm | KV-shift | Perplexity↓ |",
        "|---|:---:|:---:|:---:|:---:|:---:|:---:|---:|",
        "| FoX (Pro) |  | ✓ | ✓ | ✓ | ✓ | ✓ | **6.62** |",
        "| FoX (Pro) - QK-norm |  | ✓ |  | ✓ | ✓ | ✓ | 6.79 |",
        "| Transformer (LLaMA) | ✓ |  |  |  |  |  | 7.49 |",
        "| My FoX & co | ✓ | ✓ | ✓ | ✓ | ✓ | ✓ | <u>6.63</u> |",
        "| FoX (Pro) with fixed forget gate |  | fixed | ✓ | ✓ | ✓ | ✓ | 7.00 |",
        "",
        "Perplexity: exp of the mean held-out loss per token over sequences of 4 tokens; best in bold, second "
        "underlined.",
    ]) + "\n"
    assert "warning" not in capsys.readouterr().err
    tex = mt.main(["--table", "3", "--inputs", *ablation_inputs, "--format", "latex"])
    assert tex == "\n".join([
        r"\begin{tabular}{lccccccc}", r"\toprule",
        r"Model & RoPE & Forget gate & QK-norm & Output gate & Output norm & KV-shift & Perplexity$\downarrow$ \\",
        r"\midrule",
        r"FoX (Pro) &  & \checkmark & \checkmark & \checkmark & \checkmark & \checkmark & \textbf{6.62} \\",
        r"FoX (Pro) - QK-norm &  & \checkmark &  & \checkmark & \checkmark & \checkmark & 6.79 \\",
        r"Transformer (LLaMA) & \checkmark &  &  &  &  &  & 7.49 \\",
        r"My FoX \& co & \checkmark & \checkmark & \checkmark & \checkmark & \checkmark & \checkmark & "
        r"\underline{6.63} \\",
        r"FoX (Pro) with fixed forget gate &  & fixed & \checkmark & \checkmark & \checkmark & \checkmark & 7.00 \\",
        r"\bottomrule", r"\end{tabular}",
    ]) + "\n"


def test_row_labels_follow_the_paper():
    assert mt.row_label(dict(rope=False, fgate="none", **LLAMA)) == "Transformer (LLaMA) w/o RoPE"
    assert mt.row_label(dict(rope=True, fgate="none", qk_norm=True, output_gate=True, output_norm=True,
                             kv_shift=True)) == "Transformer (Pro)"
    assert mt.row_label(dict(FOX_PRO, fgate="none")) == "FoX (Pro) - forget gate"
    assert mt.row_label(dict(FOX_PRO, rope=True, output_gate=False, kv_shift=False)) == \
        "FoX (Pro) + RoPE - output gate - KV-shift"
    assert mt.row_label(dict(FOX_PRO, fgate="data_independent")) == "FoX (Pro) with data-independent forget gate"


def test_all_sorts_inputs_and_errors_name_the_input(tmp_path, ablation_inputs, capsys):
    t1 = lm_eval_file(tmp_path, "A", 20.0, 15.0, 0.40)
    t2 = scores_dir(tmp_path, "S", {"trec": 50.0})
    text = mt.main(["--table", "all", "--inputs", ablation_inputs[0], t2, t1])
    heads = [line for line in text.splitlines() if line.startswith("### ")]
    assert heads == ["### Table 1: LM-eval-harness (zero-shot)", "### Table 2: LongBench",
                     "### Table 3: ablations (perplexity of held-out data)"]
    assert "| A | **20.00** |" in text and "| S | **50.00** | **50.00** |" in text and "| FoX (Pro) |" in text
    tex = mt.main(["--table", "all", "--inputs", t2, "--format", "latex"])
    assert tex.startswith("% Table 2: LongBench\n\n\\begin{tabular}") and "Table 1" not in tex
    with pytest.raises(ValueError, match=r"input .*S is a Table 2 result, not a Table 1 one"):
        mt.main(["--table", "1", "--inputs", t1, t2])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"foo": 1}))
    with pytest.raises(ValueError, match=r"bad.json: neither an lm-eval result"):
        mt.main(["--table", "all", "--inputs", str(bad)])
    unfinished = run_dir(tmp_path, "unfinished", FOX_PRO, None)
    with pytest.raises(ValueError, match=r"unfinished/metrics.jsonl: no heldout_loss row"):
        mt.main(["--table", "3", "--inputs", str(unfinished)])
    orphan = tmp_path / "orphan" / "ptl.json"
    orphan.parent.mkdir()
    orphan.write_text(json.dumps({"name": "x", "loss": [1.0]}))
    with pytest.raises(FileNotFoundError, match=r"ptl.json: cannot find its model config"):
        mt.main(["--table", "3", "--inputs", str(orphan)])
    with pytest.raises(FileNotFoundError, match=r"input .*missing: not found"):
        mt.main(["--table", "3", "--inputs", str(tmp_path / "missing")])
    # rows evaluated at different lengths are flagged
    longer = run_dir(tmp_path, "longer", FOX_PRO, math.log(6.0), seq_len=16)
    text = mt.main(["--table", "3", "--inputs", ablation_inputs[0], str(longer)])
    assert "over sequences of 4 / 16 tokens (differs between rows)" in text
    assert "different lengths [4, 16]" in capsys.readouterr().err
