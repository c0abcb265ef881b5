"""Zero-shot lm-eval tasks of the FoX paper's Table 1 on trained runs or Hugging Face exports, one JSON per model.

    python -m eval.lm_eval_harness.run outputs/run_a outputs/run_b --out results/lm_eval --batch-size 16
    python -m eval.lm_eval_harness.run outputs/run_a --out results/lm_eval --tasks piqa,hellaswag --limit 100
    python -m eval.lm_eval_harness.table results/lm_eval/*.json

Default tasks (metric in the table, as in the FoX paper / fla convention): wikitext (word_perplexity),
lambada_openai (perplexity, acc), piqa, winogrande, arc_easy, copa, sciq, boolq (acc), hellaswag, arc_challenge,
openbookqa (acc_norm). The datasets come from the Hugging Face Hub (or its cache: set HF_DATASETS_OFFLINE=1 to
run from a filled cache; --include-path DIR adds local task YAMLs). Each model gives ``<out>/<run dir name>.json``
with ``name``, ``path``, ``source``, the lm-eval ``results`` / ``n-samples`` / ``configs`` / ``versions``, and
``table`` (the Table 1 metrics, in the units table.py prints). See docs/lm_eval.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

# task → the lm-eval metrics (filter "none") that Table 1 reports; for lambada_openai both ppl and acc.
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "wikitext": ("word_perplexity",),
    "lambada_openai": ("perplexity", "acc"),
    "piqa": ("acc",),
    "hellaswag": ("acc_norm",),
    "winogrande": ("acc",),
    "arc_easy": ("acc",),
    "arc_challenge": ("acc_norm",),
    "copa": ("acc",),
    "openbookqa": ("acc_norm",),
    "sciq": ("acc",),
    "boolq": ("acc",),
}
PAPER_TASKS = list(TASK_METRICS)


def table_metrics(results: dict) -> dict[str, float]:
    """lm-eval ``results`` → ``{"task/metric": value}`` for the Table 1 metrics present."""
    out = {}
    for task, metrics in TASK_METRICS.items():
        for m in metrics:
            v = results.get(task, {}).get(f"{m},none")
            if isinstance(v, (int, float)):
                out[f"{task}/{m}"] = float(v)
    return out


def _jsonable(x):
    try:
        json.dumps(x)
        return x
    except TypeError:
        if isinstance(x, dict):
            return {str(k): _jsonable(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [_jsonable(v) for v in x]
        return str(x)


def evaluate_model(path, out_dir, *, tasks: list[str], batch_size: int = 8, max_length: int = 16384,
                   device: str | None = None, step: int | None = None, tokenizer: str | None = None,
                   include_path: str | None = None, limit: float | None = None, name: str | None = None,
                   dtype: str = "auto") -> Path:
    import lm_eval
    from lm_eval.tasks import TaskManager

    from eval.lm_eval_harness.model import FoXLM

    lm = FoXLM(path=str(path), step=step, tokenizer=tokenizer, device=device, batch_size=batch_size,
               max_length=max_length, dtype=dtype)
    tm = TaskManager(include_path=include_path) if include_path else TaskManager()
    res = lm_eval.simple_evaluate(model=lm, tasks=tasks, num_fewshot=0, task_manager=tm, limit=limit,
                                  log_samples=False)
    name = name or f"{lm.info['name']} ({Path(path).name})"
    out = Path(out_dir) / f"{Path(path).name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"name": name, "path": str(path), "source": lm.info["source"], "train_len": lm.info["train_len"],
              "max_length": max_length, "limit": limit, "tasks": tasks, "table": table_metrics(res["results"])}
    for k in ("results", "n-samples", "configs", "versions", "higher_is_better"):
        if k in res:
            record[k] = _jsonable(res[k])
    out.write_text(json.dumps(record, indent=1))
    print(f"{name}: {json.dumps(record['table'])} → {out}")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", help="run directories (train.py) or Hugging Face dirs (export_hf.py)")
    p.add_argument("--out", required=True, help="output directory: one <name>.json per model")
    p.add_argument("--tasks", default=",".join(PAPER_TASKS), help="comma-separated lm-eval tasks (default: Table 1)")
    p.add_argument("--include-path", default=None, help="directory of extra (local) task YAMLs")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=16384, help="max tokens per forward (longer inputs are "
                   "left-truncated; wikitext documents are scored in windows of this size)")
    p.add_argument("--limit", type=float, default=None, help="documents per task (a fraction if < 1), for smoke runs")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json or HF tokenizer dir (default: the run's)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    for m in a.models:
        evaluate_model(m, a.out, tasks=tasks, batch_size=a.batch_size, max_length=a.max_length, device=a.device,
                       step=a.step, tokenizer=a.tokenizer, include_path=a.include_path, limit=a.limit, dtype=a.dtype)


if __name__ == "__main__":
    main()
