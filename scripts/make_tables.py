#!/usr/bin/env python
"""The FoX paper's Tables 1, 2 and 3 as Markdown or LaTeX from result files; best value of each column in bold,
second best underlined.

    python scripts/make_tables.py --table 1 --inputs results/lm_eval/*.json --format md
    python scripts/make_tables.py --table 2 --inputs results/lb/fox results/lb/tf --format latex --out table2.tex
    python scripts/make_tables.py --table 3 --inputs outputs/fox_pro "- QK-norm=outputs/no_qknorm" results/ptl/*.json
    python scripts/make_tables.py --table all --inputs results/lm_eval/*.json results/lb/* outputs/* --out tables.md
    python scripts/make_tables.py --table books --inputs results/books    # the reproduction (docs/reproduction.md)

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
import sys
from pathlib import Path

from eval.ablations import load_ablation_row, render_table3, row_label  # noqa: F401  (row_label: tests)
from eval.lm_eval_harness import table as table1
from eval.longbench import table as table2

TITLES = {"1": "Table 1: LM-eval-harness (zero-shot)", "2": "Table 2: LongBench",
          "3": "Table 3: ablations (perplexity of held-out data)"}


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
    if table == "books":
        return render_books(inputs, latex=latex)
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


def render_books(inputs: list[str], *, latex: bool = False) -> str:
    """The reproduction's tables (docs/reproduction.md) from one results directory of scripts/reproduce.py."""
    from eval.reproduction import render_tables

    if latex:
        raise ValueError("--table books is Markdown only")
    if len(inputs) != 1 or not (Path(inputs[0]) / "runs").is_dir():
        raise ValueError(f"--table books takes one results directory of scripts/reproduce.py (holding runs/), "
                         f"got {inputs}")
    return "\n\n".join(f"### {name}\n\n{text}" for name, text in render_tables(inputs[0]).items())


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
    p.add_argument("--table", required=True, choices=["1", "2", "3", "all", "books"])
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
    from eval.cli import run_cli

    run_cli(main)
