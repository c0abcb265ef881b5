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


def _best(matrix) -> list[float | None]:
    return [max((r[j] for r in matrix if r[j] is not None), default=None) for j in range(len(matrix[0]))] \
        if matrix else []


def _second(matrix) -> list[float | None]:
    """Per column the second-highest distinct value (None when a column has fewer than two)."""
    cols = [sorted({r[j] for r in matrix if r[j] is not None}, reverse=True) for j in range(len(matrix[0]))] \
        if matrix else []
    return [c[1] if len(c) > 1 else None for c in cols]


def _cell(v, best, bold, second=None, underline=None) -> str:
    if v is None:
        return "–"
    s = f"{v:.2f}"
    if best is not None and v == best:
        return bold(s)
    return underline(s) if underline is not None and second is not None and v == second else s


def markdown(rows, datasets=None, *, underline_second: bool = False) -> str:
    """``underline_second``: also underline each column's second-best value (as the paper's Table 2)."""
    groups, matrix = layout(rows, datasets)
    cols = [d for _, ds in groups for d in ds]
    best = _best(matrix)
    second = _second(matrix) if underline_second else [None] * len(best)
    head = ["Model"] + [LABELS.get(d, d) for d in cols] + [AVG]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for (name, _), vals in zip(rows, matrix):
        lines.append("| " + " | ".join([name] + [_cell(v, b, lambda s: f"**{s}**", s2, lambda s: f"<u>{s}</u>")
                                                 for v, b, s2 in zip(vals, best, second)]) + " |")
    legend = "; ".join(f"{g}: {', '.join(LABELS.get(d, d) for d in ds)}" for g, ds in groups)
    marks = "Best of each column in bold" + (", second underlined" if underline_second else "")
    return "\n".join(lines) + f"\n\nGroups — {legend}. {marks}.\n"


def _tex(s: str) -> str:
    return s.replace("\\", r"\textbackslash{}").replace("_", r"\_").replace("&", r"\&").replace("%", r"\%")


def latex(rows, datasets=None, *, underline_second: bool = False) -> str:
    groups, matrix = layout(rows, datasets)
    cols = [d for _, ds in groups for d in ds]
    best = _best(matrix)
    second = _second(matrix) if underline_second else [None] * len(best)
    out = [r"\begin{tabular}{l" + "r" * (len(cols) + 1) + "}", r"\toprule"]
    group_cells, rules, start = [], [], 2
    for g, ds in groups:
        group_cells.append(rf"\multicolumn{{{len(ds)}}}{{c}}{{{g}}}")
        rules.append(rf"\cmidrule(lr){{{start}-{start + len(ds) - 1}}}")
        start += len(ds)
    out.append(r"\multirow{2}{*}{Model} & " + " & ".join(group_cells) + r" & \multirow{2}{*}{" + AVG + r"} \\")
    out.append("".join(rules))
    out.append(" & " + " & ".join(LABELS.get(d, _tex(d)) for d in cols) + r" & \\")
    out.append(r"\midrule")
    for (name, _), vals in zip(rows, matrix):
        cells = [_cell(v, b, lambda s: rf"\textbf{{{s}}}", s2, lambda s: rf"\underline{{{s}}}")
                 for v, b, s2 in zip(vals, best, second)]
        out.append(" & ".join([_tex(name)] + cells) + r" \\")
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
    main()
