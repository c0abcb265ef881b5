"""LongBench (v1) predictions and scores for one model (Table 2 of the FoX paper).

    python -m eval.longbench.run outputs/fox_pro_run --out results/longbench/fox_pro --max-length 15500
    python -m eval.longbench.run hf/fox-pro --out results/lb/fox --data-dir data/longbench --datasets trec qasper

For each dataset: the prompt is ``config/dataset2prompt.json`` filled with the line's fields; prompts longer than
``--max-length`` tokens are cut in the middle (first ``max_length // 2`` and last ``max_length // 2`` tokens kept,
as LongBench's pred.py); greedy decoding of up to ``config/dataset2maxlen.json`` new tokens, in left-padded batches
of prompts of similar lengths (``--batch-size``, ``--dtype``, ...: docs/longbench.md), which gives the predictions
of decoding each prompt alone. Writes ``<out>/<dataset>.jsonl`` (one prediction per line, LongBench's fields, in
the data's order) and ``<out>/scores.json`` (re-scorable without the model by ``python -m eval.longbench.run
--rescore <out>``). Data: ``--data-dir`` holding ``<dataset>.jsonl`` files in the official schema (e.g. the
unzipped LongBench data.zip) or, without it, the ``THUDM/LongBench`` dataset through the ``datasets`` package
(online; datasets<4, which still runs loading scripts).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from eval.cli import add_generation_args, positive_int

if TYPE_CHECKING:  # (eval.common imports torch: loaded when a run starts)
    from eval.common import GenerationOptions

CONFIG_DIR = Path(__file__).resolve().parent / "config"

# Table 2 of the FoX paper: the 14 English LongBench tasks it reports, in its column order and groups. LongBench's
# passage_count and passage_retrieval_en (synthetic tasks) are left out of Table 2 by the paper's own scripts but can
# still be run with --datasets.
TABLE2_GROUPS = {
    "Single-Document QA": ["narrativeqa", "qasper", "multifieldqa_en"],
    "Multi-Document QA": ["hotpotqa", "2wikimqa", "musique"],
    "Summarization": ["gov_report", "qmsum", "multi_news"],
    "Few-shot Learning": ["trec", "triviaqa", "samsum"],
    "Code": ["lcc", "repobench-p"],
}
TABLE2_DATASETS = [d for ds in TABLE2_GROUPS.values() for d in ds]
SYNTHETIC_DATASETS = ["passage_count", "passage_retrieval_en"]
ENGLISH_DATASETS = TABLE2_DATASETS[:12] + SYNTHETIC_DATASETS + TABLE2_DATASETS[12:]  # LongBench's English tasks


def load_configs() -> tuple[dict, dict]:
    with open(CONFIG_DIR / "dataset2prompt.json", encoding="utf-8") as f:
        prompts = json.load(f)
    with open(CONFIG_DIR / "dataset2maxlen.json", encoding="utf-8") as f:
        maxlens = json.load(f)
    return prompts, maxlens


def build_prompt(template: str, example: dict) -> str:
    """LongBench's ``prompt_format.format(**json_obj)``."""
    return template.format(**example)


def truncate_middle(ids: list[int], max_length: int) -> list[int]:
    """Keep the first and the last ``max_length // 2`` tokens when ``len(ids) > max_length`` (LongBench's pred.py:
    the instructions sit at both ends of the prompt)."""
    if len(ids) <= max_length:
        return list(ids)
    half = int(max_length / 2)
    return list(ids[:half]) + list(ids[len(ids) - half:])


def encode_prompt(tokenizer, prompt: str, max_length: int, mode: str = "ids") -> list[int]:
    """Token ids of ``prompt`` (with the tokenizer's bos), cut in the middle to ``max_length``.

    ``mode="ids"`` keeps the token ids themselves (exactly ``2 * (max_length // 2)`` tokens when cut);
    ``mode="text"`` is LongBench's pred.py to the letter: decode both halves without special tokens, concatenate
    and re-tokenize (the count can drift by a few tokens at the seam)."""
    ids = tokenizer(prompt).input_ids
    if len(ids) <= max_length:
        return list(ids)
    if mode == "ids":
        return truncate_middle(ids, max_length)
    if mode == "text":
        half = int(max_length / 2)
        text = tokenizer.decode(ids[:half], skip_special_tokens=True) + \
            tokenizer.decode(ids[-half:], skip_special_tokens=True)
        return list(tokenizer(text).input_ids)
    raise ValueError(f"truncation mode {mode!r} not in ('ids', 'text')")


def load_data(dataset: str, data_dir: str | Path | None = None) -> list[dict]:
    """The test lines of ``dataset``: ``<data_dir>/<dataset>.jsonl`` or, without a data dir, ``THUDM/LongBench``
    through the ``datasets`` package."""
    if data_dir is not None:
        path = Path(data_dir) / f"{dataset}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: --data-dir must hold <dataset>.jsonl files (LongBench schema)")
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    try:
        from datasets import load_dataset
    except ImportError as e:
        raise RuntimeError("no --data-dir given and the `datasets` package is not installed: pip install "
                           "'datasets<4', or pass --data-dir with LongBench's <dataset>.jsonl files") from e
    try:
        try:
            data = load_dataset("THUDM/LongBench", dataset, split="test", trust_remote_code=True)
        except TypeError:  # versions without trust_remote_code
            data = load_dataset("THUDM/LongBench", dataset, split="test")
    except Exception as e:
        raise RuntimeError(f"could not load THUDM/LongBench/{dataset} with `datasets` ({type(e).__name__}: {e}). "
                           f"Offline, or datasets>=4 (no loading scripts)? Pass --data-dir with LongBench's "
                           f"<dataset>.jsonl files (the unzipped data.zip)") from e
    return [dict(x) for x in data]


def read_predictions(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def score_predictions(dataset: str, rows: list[dict], mode: str = "paper") -> float:
    from eval.longbench.metrics import dataset_score

    return dataset_score(dataset, [r["pred"] for r in rows], [r["answers"] for r in rows],
                         [r["all_classes"] for r in rows], mode=mode)


def predict_dataset(model, tokenizer, dataset: str, data: list[dict], out_file: Path, *, max_length: int,
                    max_new_tokens: int, template: str, generation: GenerationOptions, truncation: str = "ids",
                    progress: bool = True):
    """Predict every line of ``dataset`` and write ``out_file``: the prompts are encoded first, then decoded
    greedily in batches of similar lengths (``eval.common.generate_texts``), and the rows written in the data's
    order."""
    from eval.common import generate_texts

    ids = [encode_prompt(tokenizer, build_prompt(template, example), max_length, truncation) for example in data]
    preds = generate_texts(model, tokenizer, ids, max_new_tokens, generation, desc=f"LongBench {dataset}",
                           unit="example", progress=progress)
    tmp = out_file.with_suffix(".jsonl.partial")
    with open(tmp, "w", encoding="utf-8") as f:
        for example, prompt, pred in zip(data, ids, preds):
            row = {"pred": pred, "answers": example["answers"], "all_classes": example.get("all_classes"),
                   "length": example.get("length"), "_id": example.get("_id"), "prompt_tokens": len(prompt)}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, out_file)  # complete files only: a crash leaves a .partial that the next run redoes


def write_scores(out_dir: Path, meta: dict, mode: str) -> dict:
    """Score every ``<dataset>.jsonl`` under ``out_dir`` and write ``scores.json`` (``meta`` fields + scores)."""
    from eval.longbench.metrics import DATASET2METRIC

    scores, counts = {}, {}
    for path in sorted(out_dir.glob("*.jsonl")):
        if path.stem in DATASET2METRIC:
            rows = read_predictions(path)
            scores[path.stem], counts[path.stem] = score_predictions(path.stem, rows, mode), len(rows)
    result = dict(meta, postprocess=mode, scores=scores, n=counts)
    (out_dir / "scores.json").write_text(json.dumps(result, indent=2))
    return result


def evaluate(model_path, out_dir, *, datasets=None, data_dir=None, max_length: int = 15500, limit: int | None = None,
             device: str = "cpu", step: int | None = None, tokenizer: str | None = None, name: str | None = None,
             postprocess: str = "paper", truncation: str = "ids", overwrite: bool = False,
             max_new_tokens: int | None = None, progress: bool = True,
             generation: GenerationOptions | None = None) -> dict:
    """Predict and score ``datasets`` with one model; ``generation``: batch size, dtype, ... of the greedy
    decoding (``eval.common.GenerationOptions``)."""
    from eval.common import GenerationOptions, load_model_and_tokenizer, prepare_for_generation

    generation = generation or GenerationOptions()
    datasets = list(datasets or TABLE2_DATASETS)
    prompts, maxlens = load_configs()
    unknown = [d for d in datasets if d not in prompts or d not in maxlens]
    if unknown:
        raise ValueError(f"unknown LongBench datasets {unknown}; English ones: {ENGLISH_DATASETS}")
    data = {d: load_data(d, data_dir)[:limit] for d in datasets}  # fail on missing data before loading the model
    model, tok, info = load_model_and_tokenizer(model_path, step=step, tokenizer=tokenizer, device=device)
    model = prepare_for_generation(model, generation, device)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for d in datasets:
        out_file = out_dir / f"{d}.jsonl"
        if out_file.is_file() and not overwrite and len(read_predictions(out_file)) == len(data[d]):
            print(f"{d}: {out_file} already complete, kept (--overwrite to redo)")
            continue
        new_tokens = maxlens[d] if max_new_tokens is None else min(maxlens[d], max_new_tokens)
        predict_dataset(model, tok, d, data[d], out_file, max_length=max_length, max_new_tokens=new_tokens,
                        template=prompts[d], generation=generation, truncation=truncation, progress=progress)
    meta = {"name": name or f"{info['name']} ({Path(model_path).name})", "model": str(model_path),
            "source": info.get("source"), "train_len": info.get("train_len"), "max_length": max_length,
            "truncation": truncation, "limit": limit, "max_new_tokens_cap": max_new_tokens,
            "dtype": generation.dtype_name(device),
            "data": str(data_dir) if data_dir else "THUDM/LongBench"}
    result = write_scores(out_dir, meta, postprocess)
    for d in datasets:
        print(f"{d}: {result['scores'][d]:.2f} ({result['n'][d]} examples)")
    print(f"→ {out_dir / 'scores.json'}")
    return result


def rescore(out_dir, postprocess: str = "paper") -> dict:
    """Recompute ``scores.json`` from the saved predictions (no model), keeping its other fields."""
    out_dir = Path(out_dir)
    old = out_dir / "scores.json"
    meta = json.loads(old.read_text()) if old.is_file() else {"name": out_dir.name}
    meta = {k: v for k, v in meta.items() if k not in ("scores", "n", "postprocess")}
    return write_scores(out_dir, meta, postprocess)


def main(argv=None) -> None:
    from eval.longbench.metrics import POSTPROCESS_MODES

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="run directory written by train.py or Hugging Face directory")
    p.add_argument("--out", required=True, help="output directory: <dataset>.jsonl predictions + scores.json")
    p.add_argument("--datasets", nargs="+", default=None,
                   help=f"default: Table 2's {len(TABLE2_DATASETS)} tasks ({' '.join(TABLE2_DATASETS)})")
    p.add_argument("--data-dir", default=None, help="local dir of <dataset>.jsonl (default: THUDM/LongBench online)")
    p.add_argument("--max-length", type=positive_int, default=15500, help="prompt tokens kept by middle truncation "
                   "(FoX paper: 15500 for 16k-context models)")
    p.add_argument("--limit", type=positive_int, default=None, help="first K examples per dataset (smoke tests)")
    p.add_argument("--postprocess", choices=POSTPROCESS_MODES, default="paper",
                   help="paper: first line of every prediction (FoX's eval.py); official: only trec/triviaqa/samsum")
    p.add_argument("--truncation", choices=("ids", "text"), default="ids",
                   help="ids: cut the token ids; text: LongBench's decode-and-retokenize")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help="cap on dataset2maxlen's generation lengths (smoke tests only; not comparable to the paper)")
    p.add_argument("--name", default=None, help="row label in the table (default: model name (dir name))")
    p.add_argument("--step", type=positive_int, default=None, help="checkpoint step of a run dir (default: latest)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json / HF tokenizer dir (default: the run's)")
    p.add_argument("--overwrite", action="store_true", help="redo datasets whose predictions are complete")
    p.add_argument("--rescore", action="store_true", help="only recompute scores.json from --out's predictions")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--device", default=None, help="default: cuda if available")
    add_generation_args(p)
    a = p.parse_args(argv)
    if a.rescore:
        res = rescore(a.out, a.postprocess)
        print(json.dumps(res["scores"], indent=2))
        return
    if a.model is None:
        p.error("MODEL_OR_RUN_DIR is required (unless --rescore)")
    from eval.common import GenerationOptions

    if a.device is None:
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    evaluate(a.model, a.out, datasets=a.datasets, data_dir=a.data_dir, max_length=a.max_length, limit=a.limit,
             device=a.device, step=a.step, tokenizer=a.tokenizer, name=a.name, postprocess=a.postprocess,
             truncation=a.truncation, overwrite=a.overwrite, max_new_tokens=a.max_new_tokens,
             progress=not a.no_progress, generation=GenerationOptions.from_args(a))


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
