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
import functools
import json
from pathlib import Path

import torch

from eval.cli import positive_int

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


# datasets' builder names that read local files: a task config with one of them (or data_files) ran on local files
LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow", "pandas")


def local_sources(configs: dict) -> dict[str, str]:
    """``{task: "json: /data/piqa.jsonl"}`` for the tasks whose lm-eval config reads local files, not the Hub."""
    out = {}
    for task, cfg in (configs or {}).items():
        if not isinstance(cfg, dict):
            continue
        path, kwargs = str(cfg.get("dataset_path") or ""), cfg.get("dataset_kwargs") or {}
        files = kwargs.get("data_files") if isinstance(kwargs, dict) else None
        if path in LOCAL_BUILDERS or files or path.startswith(("/", "./", "../")):
            where = sorted({str(f) for f in (files.values() if isinstance(files, dict) else [files] if files
                                              else [])})
            out[task] = f"{path}: {', '.join(where)}" if where else path
    return out


def parse_limit(text: str | None, tasks: list[str]) -> dict[str, float | None]:
    """``--limit`` → each task's limit: ``100`` (every task), ``piqa=50,hellaswag=0.1`` (those tasks; the others
    whole) or ``100,piqa=50`` (a default and exceptions). A number below 1 is a fraction of the task's documents."""
    default, per_task = None, {}
    for part in [p.strip() for p in (text or "").split(",") if p.strip()]:
        key, _, value = part.rpartition("=")
        if key and key not in tasks:
            raise ValueError(f"--limit {key}={value}: {key!r} is not among --tasks ({', '.join(tasks)})")
        try:
            v = float(value)
        except ValueError:
            raise ValueError(f"--limit {part!r}: expected a number, or TASK=NUMBER") from None
        if v <= 0 or (v >= 1 and v != int(v)):
            raise ValueError(f"--limit {part!r}: a whole number of documents >= 1, or a fraction in (0, 1)")
        v = int(v) if v >= 1 else v
        if key:
            per_task[key] = v
        else:
            default = v
    return {t: per_task.get(t, default) for t in tasks}


def _evaluate_by_limit(lm, tasks: list[str], limits: dict, task_manager) -> dict:
    """One ``simple_evaluate`` per distinct limit (lm-eval takes one limit a call), merged per task."""
    import lm_eval

    merged: dict = {}
    groups: dict = {}
    for t in tasks:
        groups.setdefault(limits.get(t), []).append(t)
    for limit, group in groups.items():
        res = lm_eval.simple_evaluate(model=lm, tasks=group, num_fewshot=0, task_manager=task_manager, limit=limit,
                                      log_samples=False)
        for k in RECORD_KEYS:
            merged.setdefault(k, {}).update(res.get(k) or {})
    return merged


RECORD_KEYS = ("results", "n-samples", "configs", "versions", "higher_is_better")


def merge_into(out: Path, record: dict) -> dict:
    """``record`` joined with what an earlier invocation wrote to ``out`` for the same checkpoint: its tasks kept
    unless evaluated again. A file of another checkpoint is refused."""
    if not out.is_file():
        return record
    old = json.loads(out.read_text())
    if old.get("source") != record["source"]:
        raise ValueError(f"{out} holds results of {old.get('source')}, not of {record['source']}: pass another "
                         "--out, or remove the file")
    old_limit = old.get("limit")
    merged = dict(old, **{k: v for k, v in record.items() if k not in RECORD_KEYS + ("limit", "local_tasks")})
    merged["tasks"] = list(dict.fromkeys(old.get("tasks", []) + record["tasks"]))
    merged["limit"] = dict(old_limit if isinstance(old_limit, dict) else dict.fromkeys(old.get("tasks", []),
                                                                                       old_limit), **record["limit"])
    merged["local_tasks"] = {**old.get("local_tasks", {}), **record["local_tasks"]}
    for k in RECORD_KEYS:
        merged[k] = {**old.get(k, {}), **record.get(k, {})}
    merged["table"] = table_metrics(merged["results"])
    kept = [t for t in old.get("tasks", []) if t not in record["tasks"]]
    if kept:
        print(f"{out}: kept the earlier results of {', '.join(kept)}")
    return merged


@functools.lru_cache(maxsize=4)
def task_manager(include_path: str | None):
    """lm-eval's task index (with ``include_path``'s YAMLs, which override lm-eval's tasks of the same name), built
    once a process: indexing lm-eval's own task files takes seconds."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path) if include_path else TaskManager()


def check_tasks(tasks: list[str], include_path: str | None) -> None:
    """Refuse a task name that lm-eval (with ``include_path``'s YAMLs) does not know, naming it and the nearest
    known names, before any model loads. Glob patterns count as lm-eval matches them; a task YAML's path or a
    directory is lm-eval's to read."""
    import difflib

    manager = task_manager(include_path)
    for task in tasks:
        if task.endswith(".yaml") or Path(task).is_dir() or manager.match_tasks([task]):
            continue
        near = difflib.get_close_matches(task, manager.all_tasks, n=3)
        hint = f"nearest: {', '.join(near)}" if near else "lm-eval ls tasks lists the known ones"
        raise ValueError(f"--tasks: no lm-eval task named {task!r} ({hint})")


def evaluate_model(path, out_dir, *, tasks: list[str], batch_size: int = 8, max_length: int = 16384,
                   device: str | None = None, step: int | None = None, tokenizer: str | None = None,
                   include_path: str | None = None, limit: float | dict | None = None, name: str | None = None,
                   dtype: str = "auto") -> Path:
    """Evaluate one model on ``tasks`` (checked by name before the model loads) and write (or add to)
    ``<out_dir>/<model dir name>.json``. ``limit``: one for every task, or ``{task: limit}`` (tasks not named run
    whole)."""
    from eval.lm_eval_harness.model import FoXLM

    check_tasks(tasks, include_path)
    limits = limit if isinstance(limit, dict) else dict.fromkeys(tasks, limit)
    lm = FoXLM(path=str(path), step=step, tokenizer=tokenizer, device=device, batch_size=batch_size,
               max_length=max_length, dtype=dtype)
    res = _evaluate_by_limit(lm, tasks, limits, task_manager(include_path))
    name = name or f"{lm.info['name']} ({Path(path).name})"
    out = Path(out_dir) / f"{Path(path).name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"name": name, "path": str(path), "source": lm.info["source"], "train_len": lm.info["train_len"],
              "max_length": max_length, "limit": {t: limits.get(t) for t in tasks}, "tasks": tasks,
              "local_tasks": local_sources(res.get("configs", {})), "table": table_metrics(res["results"])}
    record.update({k: _jsonable(res[k]) for k in RECORD_KEYS if k in res})
    record = merge_into(out, record)
    out.write_text(json.dumps(record, indent=1))
    print(f"{name}: {json.dumps(record['table'])} → {out}")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", help="run directories (train.py) or Hugging Face dirs (export_hf.py)")
    p.add_argument("--out", required=True, help="output directory: one <name>.json per model")
    p.add_argument("--tasks", default=",".join(PAPER_TASKS), help="comma-separated lm-eval tasks (default: Table 1)")
    p.add_argument("--include-path", default=None, help="directory of extra (local) task YAMLs")
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--max-length", type=positive_int, default=16384, help="max tokens per forward (longer "
                   "inputs are left-truncated; wikitext documents are scored in windows of this size)")
    p.add_argument("--limit", default=None, help="documents per task (a fraction if < 1): N for every task, "
                   "TASK=N,... for some (the others whole), or N,TASK=M,...; for smoke runs")
    p.add_argument("--step", type=positive_int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json or HF tokenizer dir (default: the run's)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    limits = parse_limit(a.limit, tasks)
    for m in a.models:
        evaluate_model(m, a.out, tasks=tasks, batch_size=a.batch_size, max_length=a.max_length, device=a.device,
                       step=a.step, tokenizer=a.tokenizer, include_path=a.include_path, limit=limits, dtype=a.dtype)


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
