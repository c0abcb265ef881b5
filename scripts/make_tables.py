#!/usr/bin/env python
"""The FoX paper's Tables 1, 2 and 3 as Markdown or LaTeX from result files; best value of each column in bold,
second best underlined.

    python scripts/make_tables.py --table 1 --inputs results/lm_eval/*.json --format md
    python scripts/make_tables.py --table 2 --inputs results/lb/fox results/lb/tf --format latex --out table2.tex
    python scripts/make_tables.py --table 3 --inputs outputs/fox_pro "- QK-norm=outputs/no_qknorm" results/ptl/*.json
    python scripts/make_tables.py --table all --inputs results/lm_eval/*.json results/lb/* outputs/* --out tables.md

Table 1 (LM-eval-harness, zero-shot): JSON files of ``eval.lm_eval_harness.run``; rendered by
``eval.lm_eval_harness.table``.
Table 2 (LongBench): ``scores.json`` files of ``eval.longbench.run`` or directories holding one; rendered by
``eval.longbench.table``.
Table 3 (ablations): one row per run, in the order given; columns RoPE, Forget gate, QK-norm, Output gate, Output
norm, KV-shift (ticks from the run's model config) and Perplexity = exp(mean held-out loss per token). Each input is
a run directory written by train.py (the held-out loss that train.py logged last in ``metrics.jsonl``, at the
training length) or a per-token-loss JSON (of ``eval.per_token_loss.run``, or train.py's ``per_token_loss.json``:
exp of the mean of L(i) over its length); the model config is the run's ``config.yaml`` (found next to the JSON or
from its ``checkpoint`` entry) or a Hugging Face export's ``config.json``. Rows are named after the paper: a preset
(FoX (Pro), FoX (LLaMA), Transformer (Pro), Transformer (LLaMA), Transformer (LLaMA) w/o RoPE) when the switches
match one, else FoX (Pro) with the differences ("FoX (Pro) - QK-norm"); ``LABEL=PATH`` names a row explicitly.

``--table all`` sorts the inputs by kind (lm-eval JSON → 1, LongBench scores → 2, run directory or per-token-loss
JSON → 3) and writes each table that has inputs, under a heading. The result is printed and, with ``--out``,
written to a file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eval.lm_eval_harness import table as table1  # noqa: E402
from eval.longbench import table as table2  # noqa: E402
from eval.tables import mark, rank_marks, tex_escape  # noqa: E402

TITLES = {"1": "Table 1: LM-eval-harness (zero-shot)", "2": "Table 2: LongBench",
          "3": "Table 3: ablations (perplexity of held-out data)"}

# Table 3 columns: (header, model-config switch)
SWITCHES = [("RoPE", "rope"), ("Forget gate", "fgate"), ("QK-norm", "qk_norm"), ("Output gate", "output_gate"),
            ("Output norm", "output_norm"), ("KV-shift", "kv_shift")]
GATE_KINDS = {"data_dependent": "✓", "data_independent": "data-indep.", "fixed": "fixed", "none": ""}
DIFF_NAMES = {"rope": "RoPE", "qk_norm": "QK-norm", "output_gate": "output gate", "output_norm": "output norm",
              "kv_shift": "KV-shift"}  # as the paper's Table 3 writes them in "- QK-norm", "+ RoPE", ...
PRO = dict(qk_norm=True, output_gate=True, output_norm=True, kv_shift=True)
LLAMA = dict(qk_norm=False, output_gate=False, output_norm=False, kv_shift=False)
PRESETS = {  # the paper's names for these switch settings
    "FoX (Pro)": dict(rope=False, fgate="data_dependent", **PRO),
    "FoX (LLaMA)": dict(rope=False, fgate="data_dependent", **LLAMA),
    "Transformer (Pro)": dict(rope=True, fgate="none", **PRO),
    "Transformer (LLaMA)": dict(rope=True, fgate="none", **LLAMA),
    "Transformer (LLaMA) w/o RoPE": dict(rope=False, fgate="none", **LLAMA),
}


# ----------------------------------------------------------------------------------------------------- Table 3


def switches_of(model_cfg) -> dict:
    """The Table 3 switches of a model config (OmegaConf node or dict); a missing key is an error naming it."""
    out = {}
    for _, key in SWITCHES:
        if key not in model_cfg:
            raise ValueError(f"model config has no '{key}': not a config of this codebase's decoder")
        out[key] = str(model_cfg[key]) if key == "fgate" else bool(model_cfg[key])
    if out["fgate"] not in GATE_KINDS:
        raise ValueError(f"model.fgate={out['fgate']!r}: expected one of {sorted(GATE_KINDS)}")
    return out


def row_label(sw: dict) -> str:
    """A preset's name, else FoX (Pro) with the differences, e.g. 'FoX (Pro) - QK-norm + RoPE'."""
    for name, preset in PRESETS.items():
        if sw == preset:
            return name
    base = PRESETS["FoX (Pro)"]
    parts = []
    if sw["fgate"] == "none":
        parts.append("- forget gate")
    elif sw["fgate"] != base["fgate"]:
        parts.append(f"with {sw['fgate'].replace('_', '-')} forget gate")
    for key, name in DIFF_NAMES.items():
        if sw[key] != base[key]:
            parts.append(f"{'+' if sw[key] else '-'} {name}")
    return "FoX (Pro) " + " ".join(parts)


def _run_config(run_dir: Path):
    from omegaconf import OmegaConf

    return OmegaConf.load(run_dir / "config.yaml")


def _json_model_config(path: Path, res: dict):
    """The model config of a per-token-loss JSON: the run dir it sits in, the run its checkpoint belongs to, or the
    Hugging Face export it was computed from."""
    if (path.parent / "config.yaml").is_file():
        return _run_config(path.parent).model
    src = res.get("checkpoint")
    if src:
        src = Path(src)
        # a run's checkpoint: <run>/checkpoints/step_XXXXXXXX
        if src.parent.name == "checkpoints" and (src.parent.parent / "config.yaml").is_file():
            return _run_config(src.parent.parent).model
        if (src / "config.json").is_file():
            return json.loads((src / "config.json").read_text())
    raise FileNotFoundError(f"{path}: cannot find its model config (no config.yaml beside it, and its checkpoint "
                            f"entry {src!r} leads to no run or Hugging Face directory); pass the run directory")


def load_ablation_row(spec: str) -> dict:
    """``[LABEL=]PATH`` → ``{"label", "switches", "perplexity", "length", "source"}`` for Table 3."""
    label, path = None, Path(spec)
    if not path.exists() and "=" in spec:
        label, path = spec.split("=", 1)[0].strip(), Path(spec.split("=", 1)[1])
    if path.is_dir():
        if not (path / "config.yaml").is_file():
            raise FileNotFoundError(f"{path}: not a run directory (no config.yaml)")
        cfg = _run_config(path)
        metrics = path / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] \
            if metrics.is_file() else []
        losses = [r["heldout_loss"] for r in rows if "heldout_loss" in r]
        if not losses:
            raise ValueError(f"{metrics}: no heldout_loss row (did the run finish?); pass a per-token-loss JSON")
        model_cfg, loss, length = cfg.model, float(losses[-1]), int(cfg.data.seq_len)
    elif path.is_file():
        res = json.loads(path.read_text())
        if not isinstance(res.get("loss"), list) or not res["loss"]:
            raise ValueError(f"{path}: no 'loss' list; Table 3 takes per-token-loss JSONs or run directories")
        model_cfg, loss, length = _json_model_config(path, res), sum(res["loss"]) / len(res["loss"]), len(res["loss"])
    else:
        raise FileNotFoundError(f"Table 3 input {spec}: not found")
    sw = switches_of(model_cfg)
    return {"label": label or row_label(sw), "switches": sw, "perplexity": math.exp(loss), "length": length,
            "source": str(path)}


def render_table3(rows: list[dict], *, latex: bool = False) -> str:
    marks = rank_marks([r["perplexity"] for r in rows], lower=True)
    headers = ["Model"] + [h for h, _ in SWITCHES] + ["Perplexity↓"]
    body = []
    for r, rank in zip(rows, marks):
        ticks = [GATE_KINDS[r["switches"][k]] if k == "fgate" else ("✓" if r["switches"][k] else "")
                 for _, k in SWITCHES]
        ppl = f"{r['perplexity']:.2f}"
        if latex:
            ticks = [r"\checkmark" if t == "✓" else t for t in ticks]
            body.append(" & ".join([tex_escape(r["label"])] + ticks + [mark(ppl, rank, True)]) + r" \\")
        else:
            body.append("| " + " | ".join([r["label"]] + ticks + [mark(ppl, rank, False)]) + " |")
    if latex:
        head = " & ".join(headers).replace("↓", r"$\downarrow$") + r" \\"
        return "\n".join([r"\begin{tabular}{l" + "c" * (len(headers) - 1) + "}", r"\toprule", head, r"\midrule",
                          *body, r"\bottomrule", r"\end{tabular}"])
    lengths = sorted({r["length"] for r in rows})
    note = (f"Perplexity: exp of the mean held-out loss per token over sequences of "
            f"{' / '.join(f'{n:,}' for n in lengths)} tokens{' (differs between rows)' if len(lengths) > 1 else ''}"
            f"; best in bold, second underlined.")
    return "\n".join(["| " + " | ".join(headers) + " |", "|---|" + ":---:|" * len(SWITCHES) + "---:|", *body,
                      "", note])


# ----------------------------------------------------------------------------------------------------- dispatch


def kind_of(path: str) -> str:
    """'1', '2' or '3': which table a result file or directory feeds."""
    p = Path(path)
    if not p.exists() and "=" in path:
        return "3"  # LABEL=PATH is Table 3 syntax
    if p.is_dir():
        if (p / "scores.json").is_file():
            return "2"
        if (p / "config.yaml").is_file():
            return "3"
        raise ValueError(f"input {path}: a directory with neither scores.json (LongBench) nor config.yaml (a run)")
    if not p.is_file():
        raise FileNotFoundError(f"input {path}: not found")
    try:
        res = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"input {path}: not a JSON file ({e})") from None
    if isinstance(res, dict) and "results" in res:
        return "1"
    if isinstance(res, dict) and "scores" in res:
        return "2"
    if isinstance(res, dict) and "loss" in res:
        return "3"
    raise ValueError(f"input {path}: neither an lm-eval result ('results'), LongBench scores ('scores') nor a "
                     f"per-token-loss JSON ('loss')")


def render(table: str, inputs: list[str], *, latex: bool = False) -> str:
    """One table from its inputs."""
    if not inputs:
        raise ValueError(f"--table {table}: no inputs")
    for p in inputs:
        k = kind_of(p)
        if k != table:
            raise ValueError(f"input {p} is a Table {k} result, not a Table {table} one")
    if table == "1":
        return table1.render(inputs, latex=latex)
    if table == "2":
        rows = table2.load_scores(inputs)
        text = table2.latex(rows, underline_second=True) if latex else table2.markdown(rows, underline_second=True)
        return text.rstrip("\n")
    if table == "3":
        rows = [load_ablation_row(p) for p in inputs]
        if len({r["length"] for r in rows}) > 1:
            print(f"warning: Table 3 rows were evaluated at different lengths "
                  f"{sorted({r['length'] for r in rows})}; their perplexities are not comparable", file=sys.stderr)
        return render_table3(rows, latex=latex)
    raise ValueError(f"--table {table!r}: expected 1, 2, 3 or all")


def render_all(inputs: list[str], *, latex: bool = False) -> str:
    by_kind = {"1": [], "2": [], "3": []}
    for p in inputs:
        by_kind[kind_of(p)].append(p)
    parts = []
    for t, paths in by_kind.items():
        if paths:
            head = f"% {TITLES[t]}" if latex else f"### {TITLES[t]}"
            parts.append(f"{head}\n\n{render(t, paths, latex=latex)}")
    if not parts:
        raise ValueError("--table all: no inputs")
    return "\n\n".join(parts)


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", required=True, choices=["1", "2", "3", "all"])
    p.add_argument("--inputs", nargs="+", required=True, help="result files / directories (see above)")
    p.add_argument("--format", choices=["md", "latex"], default="md")
    p.add_argument("--out", default=None, help="also write the tables to this file")
    a = p.parse_args(argv)
    latex = a.format == "latex"
    text = (render_all(a.inputs, latex=latex) if a.table == "all" else render(a.table, a.inputs, latex=latex)) + "\n"
    print(text, end="")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
    return text


if __name__ == "__main__":
    main()
