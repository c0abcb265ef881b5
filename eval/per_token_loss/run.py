"""Per-token loss L(i) of trained runs on held-out rows, saved as JSON and plotted together.

    python -m eval.per_token_loss.run outputs/run_a outputs/run_b --length 2048 --rows 8 --out results/ptl

The evaluation length may exceed the training length (up to the data's row length). Each run gives
``<out>/<name>.json`` (re-plottable without the model by ``eval.per_token_loss.plot``) and all runs share
``<out>/per_token_loss.png``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eval.cli import positive_int
from eval.common import check_same_tokenizer, load_model_and_tokenizer, load_run
from eval.per_token_loss.plot import plot_per_token_loss
from forgetting_transformer.data import read_rows
from forgetting_transformer.data.longcrawl64 import open_token_array
from forgetting_transformer.training.evaluate import per_token_loss, spread_rows


def load_for_eval(path, step, device, data_dir):
    """(DecoderLM, name, train_len, step, source, data_dir, vocab_size, bos_id) of a run dir or an HF export."""
    if (Path(path) / "config.json").is_file() and not (Path(path) / "config.yaml").is_file():
        if data_dir is None:
            raise ValueError(f"{path} is a Hugging Face directory: pass --data-dir (it records no data)")
        hf, tok, info = load_model_and_tokenizer(path, device=device)
        return (hf.model, hf.config.name, None, None, info["source"], data_dir, hf.config.vocab_size,
                tok.bos_token_id)
    model, cfg, ckpt = load_run(path, step=step, device=device)
    return (model, cfg.model.name, int(cfg.data.seq_len), int(ckpt.name[5:]), str(ckpt),
            data_dir or cfg.data.data_dir, int(cfg.data.vocab_size), int(cfg.data.bos_id))


def evaluate_run(run_dir, out_dir, *, rows: int, length: int | None, batch_size: int, device: str,
                 data_dir: str | None = None, step: int | None = None, name: str | None = None) -> Path:
    loaded = load_for_eval(run_dir, step, device, data_dir)
    model, model_name, train_len, step, source, data_dir, vocab_size, bos_id = loaded
    fingerprint = check_same_tokenizer(run_dir, data_dir)  # data tokenized differently is refused
    heldout = Path(data_dir) / "heldout.zarr"
    row_ids = spread_rows(int(open_token_array(heldout).shape[0]), rows)
    if length is None and train_len is None:
        raise ValueError("pass --length for a Hugging Face directory (it records no training length)")
    inputs, labels = read_rows(heldout, row_ids, length or train_len, vocab_size=vocab_size,
                               bos_id=bos_id)  # (rows, length) each
    dev = torch.device(device)
    curve = per_token_loss(model, inputs, labels, batch_size=batch_size, device=dev,
                           mixed_precision=dev.type == "cuda")
    name = name or f"{model_name} ({Path(run_dir).name})"
    out = Path(out_dir) / f"{Path(run_dir).name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"name": name, "train_len": train_len, "step": step, "checkpoint": source,
                               "data": str(heldout), "tokenizer_fingerprint": fingerprint, "rows": row_ids,
                               "loss": curve.tolist()}))
    print(f"{name}: mean L = {curve.mean():.4f} over {len(row_ids)} rows x {len(curve)} tokens → {out}")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run directories written by train.py, or Hugging Face exports")
    p.add_argument("--out", required=True, help="output directory for JSON files and the plot")
    p.add_argument("--rows", type=positive_int, default=8,
                   help="held-out rows to average over, spread evenly over the split")
    p.add_argument("--length", type=positive_int, default=None, help="tokens per row (default: the training seq_len)")
    p.add_argument("--batch-size", type=positive_int, default=4)
    p.add_argument("--data-dir", default=None, help="default: the run's data.data_dir")
    p.add_argument("--step", type=positive_int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--window", type=int, default=101)
    p.add_argument("--logx", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    files = [evaluate_run(r, a.out, rows=a.rows, length=a.length, batch_size=a.batch_size, device=a.device,
                          data_dir=a.data_dir, step=a.step) for r in a.runs]
    print(plot_per_token_loss(files, Path(a.out) / "per_token_loss.png", window=a.window, logx=a.logx))


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
