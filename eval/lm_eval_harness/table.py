"""Table 1 of the FoX paper from result files of eval.lm_eval_harness.run: rows = models, best per column in bold,
second underlined (direction per column: perplexities lower is better, accuracies higher).

    python -m eval.lm_eval_harness.table results/lm_eval/*.json            # Markdown (**best**, <u>second</u>)
    python -m eval.lm_eval_harness.table results/lm_eval/*.json --latex    # \\textbf / \\underline

Accuracies are printed in percent (one decimal), perplexities with two decimals. Avg is the mean of the ten
accuracy columns (LMB acc … BoolQ), over models that have all of them ("-" otherwise).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eval.tables import mark, rank_marks, tex_escape

# (header, task, metric, lower_is_better)
COLUMNS = [
    ("Wiki ppl↓", "wikitext", "word_perplexity", True),
    ("LMB ppl↓", "lambada_openai", "perplexity", True),
    ("LMB acc↑", "lambada_openai", "acc", False),
    ("PIQA", "piqa", "acc", False),
    ("Hella", "hellaswag", "acc_norm", False),
    ("Wino", "winogrande", "acc", False),
    ("ARC-e", "arc_easy", "acc", False),
    ("ARC-c", "arc_challenge", "acc_norm", False),
    ("COPA", "copa", "acc", False),
    ("OBQA", "openbookqa", "acc_norm", False),
    ("SciQA", "sciq", "acc", False),
    ("BoolQ", "boolq", "acc", False),
]


def load_row(path) -> tuple[str, list[float | None]]:
    """A result file → (model name, one value per COLUMNS entry + Avg; accuracies in percent)."""
    rec = json.loads(Path(path).read_text())
    results = rec.get("results", {})
    vals = []
    for _, task, metric, lower in COLUMNS:
        v = results.get(task, {}).get(f"{metric},none")
        vals.append(None if not isinstance(v, (int, float)) else float(v) * (1 if lower else 100))
    accs = [v for v, c in zip(vals, COLUMNS) if not c[3]]
    vals.append(sum(accs) / len(accs) if all(v is not None for v in accs) else None)
    return rec.get("name", Path(path).stem), vals


def render(files, *, latex: bool = False) -> str:
    rows = [load_row(f) for f in files]
    headers = [c[0] for c in COLUMNS] + ["Avg↑"]
    lowers = [c[3] for c in COLUMNS] + [False]
    cells = [[("-" if v is None else f"{v:.2f}" if lw else f"{v:.1f}") for v, lw in zip(vals, lowers)]
             for _, vals in rows]
    for j, lw in enumerate(lowers):
        for i, rank in enumerate(rank_marks([vals[j] for _, vals in rows], lw)):
            cells[i][j] = mark(cells[i][j], rank, latex)
    if latex:
        hdr = [h.replace("↓", "$\\downarrow$").replace("↑", "$\\uparrow$") for h in headers]
        lines = ["\\begin{tabular}{l" + "c" * len(headers) + "}", "\\toprule",
                 "Model & " + " & ".join(hdr) + " \\\\", "\\midrule"]
        lines += [f"{tex_escape(name)} & " + " & ".join(c) + " \\\\"
                  for (name, _), c in zip(rows, cells)]
        lines += ["\\bottomrule", "\\end{tabular}"]
        return "\n".join(lines)
    lines = ["| Model | " + " | ".join(headers) + " |", "|---|" + "---:|" * len(headers)]
    lines += [f"| {name} | " + " | ".join(c) + " |" for (name, _), c in zip(rows, cells)]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="result JSONs written by eval.lm_eval_harness.run")
    p.add_argument("--latex", action="store_true", help="LaTeX tabular instead of Markdown")
    a = p.parse_args(argv)
    print(render(a.files, latex=a.latex))


if __name__ == "__main__":
    main()
