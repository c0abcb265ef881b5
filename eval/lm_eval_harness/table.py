"""Table 1 of the FoX paper from result files of eval.lm_eval_harness.run: rows = models, best per column in bold,
second underlined (direction per column: perplexities lower is better, accuracies higher).

    python -m eval.lm_eval_harness.table results/lm_eval/*.json            # Markdown (**best**, <u>second</u>)
    python -m eval.lm_eval_harness.table results/lm_eval/*.json --latex    # \\textbf / \\underline

Accuracies are printed in percent (one decimal), perplexities with two decimals. Avg is the mean of the ten
accuracy columns (LMB acc … BoolQ), over models that have all of them ("-" otherwise). Files of one model (the same
checkpoint) from several invocations make one row; a note under the table says which columns used part of a task's
documents (``--limit``) or local task files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eval.tables import mark, rank_marks, tex_escape
from forgetting_transformer.markdown import table as markdown_table

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


def _model_key(rec: dict, path: Path) -> tuple[str, str]:
    """(identity, display name) of the model a result file is about: the checkpoint it loaded (our run.py), or the
    model path in lm-eval's own ``config.model_args`` (files of ``eval.lm_eval_harness.cli``)."""
    args = str((rec.get("config") or {}).get("model_args") or "")
    given = dict(kv.split("=", 1) for kv in args.split(",") if "=" in kv)
    model = given.get("path") or given.get("pretrained")
    key = rec.get("source") or rec.get("path") or model or rec.get("name") or str(path)
    return str(key), rec.get("name") or (Path(model).name if model else path.stem)


def load_models(files) -> list[dict]:
    """Result files → one entry per model (files of one model, from several invocations, merged in the order
    given): ``name``, ``results``, ``n-samples``, ``configs``, ``files``. Two files of one model that disagree on a
    task's value are an error naming both."""
    models: dict[str, dict] = {}
    for f in map(Path, files):
        rec = json.loads(f.read_text())
        key, name = _model_key(rec, f)
        m = models.setdefault(key, {"name": name, "results": {}, "n-samples": {}, "configs": {}, "files": {},
                                    "limit": {}})
        for task, values in (rec.get("results") or {}).items():
            if task in m["results"] and m["results"][task] != values:
                raise ValueError(f"{m['files'][task]} and {f} both hold {task} for model {name} ({key}), with "
                                 "different values: keep one of them")
            m["results"][task], m["files"][task] = values, f
        for k in ("n-samples", "configs"):
            m[k].update(rec.get(k) or {})
        lim = rec.get("limit", (rec.get("config") or {}).get("limit"))
        m["limit"].update(lim if isinstance(lim, dict) else dict.fromkeys(rec.get("results") or {}, lim))
    return list(models.values())


def row_values(model: dict) -> list[float | None]:
    """One value per COLUMNS entry + Avg; accuracies in percent."""
    vals = []
    for _, task, metric, lower in COLUMNS:
        v = model["results"].get(task, {}).get(f"{metric},none")
        vals.append(None if not isinstance(v, (int, float)) else float(v) * (1 if lower else 100))
    accs = [v for v, c in zip(vals, COLUMNS) if not c[3]]
    vals.append(sum(accs) / len(accs) if all(v is not None for v in accs) else None)
    return vals


def load_row(path) -> tuple[str, list[float | None]]:
    """One result file → (model name, its row)."""
    model = load_models([path])[0]
    return model["name"], row_values(model)


def notes(models: list[dict]) -> list[str]:
    """One line per model whose columns used part of a task's documents or local task files."""
    from eval.lm_eval_harness.run import local_sources

    header = {task: h.rstrip("↑↓").replace(" ppl", "").replace(" acc", "") for h, task, _, _ in COLUMNS}
    lines = []
    for m in models:
        shown = [t for t in dict.fromkeys(task for _, task, _, _ in COLUMNS) if t in m["results"]]
        parts = []
        limited = []
        for t in shown:
            n = m["n-samples"].get(t) or {}
            if isinstance(n, dict) and n.get("effective", 0) < n.get("original", 0):
                limited.append(f"{header[t]} {n['effective']} of {n['original']}")
            elif m["limit"].get(t) is not None and not n:
                limited.append(f"{header[t]} limit {m['limit'][t]}")
        if limited:
            parts.append("limited to part of the documents: " + ", ".join(limited))
        local = local_sources({t: m["configs"][t] for t in shown if t in m["configs"]})
        if local:
            parts.append("local task files: " + "; ".join(f"{header[t]} ({src})" for t, src in local.items()))
        if parts:
            lines.append(f"{m['name']}: " + "; ".join(parts) + ".")
    return lines


def render(files, *, latex: bool = False) -> str:
    models = load_models(files)
    rows = [(m["name"], row_values(m)) for m in models]
    headers = [c[0] for c in COLUMNS] + ["Avg↑"]
    lowers = [c[3] for c in COLUMNS] + [False]
    cells = [[("-" if v is None else f"{v:.2f}" if lw else f"{v:.1f}") for v, lw in zip(vals, lowers)]
             for _, vals in rows]
    for j, lw in enumerate(lowers):
        for i, rank in enumerate(rank_marks([vals[j] for _, vals in rows], lw)):
            cells[i][j] = mark(cells[i][j], rank, latex)
    note = notes(models)
    if latex:
        hdr = [h.replace("↓", "$\\downarrow$").replace("↑", "$\\uparrow$") for h in headers]
        lines = ["\\begin{tabular}{l" + "c" * len(headers) + "}", "\\toprule",
                 "Model & " + " & ".join(hdr) + " \\\\", "\\midrule"]
        lines += [f"{tex_escape(name)} & " + " & ".join(c) + " \\\\"
                  for (name, _), c in zip(rows, cells)]
        lines += ["\\bottomrule", "\\end{tabular}"]
        lines += ["", "{\\footnotesize Note. " + tex_escape(" ".join(note)) + "}"] if note else []
        return "\n".join(lines)
    text = markdown_table(["Model", *headers], [[name, *c] for (name, _), c in zip(rows, cells)])
    return text + ("\n\nNote. " + " ".join(note) if note else "")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="result JSONs written by eval.lm_eval_harness.run")
    p.add_argument("--latex", action="store_true", help="LaTeX tabular instead of Markdown")
    a = p.parse_args(argv)
    print(render(a.files, latex=a.latex))


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
