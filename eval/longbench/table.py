"""Table 2 of the FoX paper (LongBench) from the ``scores.json`` files written by ``eval.longbench.run``.

    python -m eval.longbench.table results/longbench/*/scores.json            # Markdown
    python -m eval.longbench.table results/longbench/fox results/longbench/tf --latex

Rows are models (in the order given), columns the datasets grouped as in the paper (Single-Document QA,
Multi-Document QA, Summarization, Few-shot Learning, Code) plus their average; the best value of each column is
bold. Columns without any score are left out; the average is over the shown columns and only for models that have
all of them ("–" otherwise).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eval.longbench.run import SYNTHETIC_DATASETS, TABLE2_GROUPS
from eval.tables import mark, rank_marks, tex_escape
from forgetting_transformer.markdown import table

LABELS = {
    "narrativeqa": "NarrativeQA", "qasper": "Qasper", "multifieldqa_en": "MFQA", "hotpotqa": "HotpotQA",
    "2wikimqa": "2WikiMQA", "musique": "Musique", "gov_report": "GovReport", "qmsum": "QMSum",
    "multi_news": "MultiNews", "trec": "TREC", "triviaqa": "TriviaQA", "samsum": "SamSum", "lcc": "LCC",
    "repobench-p": "RepoBench-P", "passage_count": "PCount", "passage_retrieval_en": "PRe",
}
GROUPS = dict(TABLE2_GROUPS, **{"Synthetic": SYNTHETIC_DATASETS})
AVG = "Avg"


def load_scores(paths) -> list[tuple[str, dict]]:
    """``[(name, {dataset: score})]`` from scores.json files or directories holding one."""
    out = []
    for p in paths:
        p = Path(p)
        f = p / "scores.json" if p.is_dir() else p
        if not f.is_file():
            raise FileNotFoundError(f"{f} not found: pass scores.json files written by eval.longbench.run")
        res = json.loads(f.read_text())
        out.append((res.get("name") or f.parent.name, dict(res["scores"])))
    return out


def layout(rows, datasets=None) -> tuple[list[tuple[str, list[str]]], list[list[float | None]]]:
    """The shown groups ``[(group, [datasets])]`` and the value matrix (one row per model, last column the average)."""
    wanted = list(datasets) if datasets else [d for ds in TABLE2_GROUPS.values() for d in ds]
    present = {d for _, s in rows for d in s}
    groups = []
    for g, ds in GROUPS.items():
        shown = [d for d in ds if d in wanted and d in present]
        if shown:
            groups.append((g, shown))
    other = [d for d in wanted if d in present and not any(d in ds for _, ds in groups)]
    if other:
        groups.append(("Other", other))
    cols = [d for _, ds in groups for d in ds]
    matrix = []
    for _, scores in rows:
        vals = [scores.get(d) for d in cols]
        avg = round(sum(vals) / len(vals), 2) if cols and all(v is not None for v in vals) else None
        matrix.append(vals + [avg])
    return groups, matrix


def _marked(matrix, underline_second: bool, latex: bool) -> list[list[str]]:
    """The matrix as cells: "–" for missing, 2 decimals, each column's best in bold (and second underlined)."""
    col_ranks = [rank_marks(list(col), lower=False) for col in zip(*matrix)]  # [column][row]
    return [["–" if v is None else mark(f"{v:.2f}", rank if rank == 1 or underline_second else 0, latex)
             for v, rank in zip(vals, (ranks[i] for ranks in col_ranks))] for i, vals in enumerate(matrix)]


def markdown(rows, datasets=None, *, underline_second: bool = False) -> str:
    """``underline_second``: also underline each column's second-best value (as the paper's Table 2)."""
    groups, matrix = layout(rows, datasets)
    cols = [d for _, ds in groups for d in ds]
    head = ["Model"] + [LABELS.get(d, d) for d in cols] + [AVG]
    text = table(head, [[name] + cells for (name, _), cells in zip(rows, _marked(matrix, underline_second,
                                                                                latex=False))])
    legend = "; ".join(f"{g}: {', '.join(LABELS.get(d, d) for d in ds)}" for g, ds in groups)
    marks = "Best of each column in bold" + (", second underlined" if underline_second else "")
    return text + f"\n\nGroups — {legend}. {marks}.\n"


def latex(rows, datasets=None, *, underline_second: bool = False) -> str:
    groups, matrix = layout(rows, datasets)
    cols = [d for _, ds in groups for d in ds]
    out = [r"\begin{tabular}{l" + "r" * (len(cols) + 1) + "}", r"\toprule"]
    group_cells, rules, start = [], [], 2
    for g, ds in groups:
        group_cells.append(rf"\multicolumn{{{len(ds)}}}{{c}}{{{g}}}")
        rules.append(rf"\cmidrule(lr){{{start}-{start + len(ds) - 1}}}")
        start += len(ds)
    out.append(r"\multirow{2}{*}{Model} & " + " & ".join(group_cells) + r" & \multirow{2}{*}{" + AVG + r"} \\")
    out.append("".join(rules))
    out.append(" & " + " & ".join(LABELS.get(d, tex_escape(d)) for d in cols) + r" & \\")
    out.append(r"\midrule")
    for (name, _), cells in zip(rows, _marked(matrix, underline_second, latex=True)):
        out.append(" & ".join([tex_escape(name)] + cells) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scores", nargs="+", help="scores.json files (or directories holding one), one per model")
    p.add_argument("--datasets", nargs="+", default=None, help="columns (default: Table 2's 14 tasks)")
    p.add_argument("--latex", action="store_true", help="LaTeX (booktabs, multirow) instead of Markdown")
    p.add_argument("--out", default=None, help="also write the table to this file")
    a = p.parse_args(argv)
    rows = load_scores(a.scores)
    text = latex(rows, a.datasets) if a.latex else markdown(rows, a.datasets)
    print(text, end="")
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
