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

from eval.common import load_run
from eval.per_token_loss.plot import plot_per_token_loss
from forgetting_transformer.data import read_rows
from forgetting_transformer.training.evaluate import per_token_loss


def evaluate_run(run_dir, out_dir, *, rows: int, length: int | None, batch_size: int, device: str,
                 data_dir: str | None = None, step: int | None = None, name: str | None = None) -> Path:
    model, cfg, ckpt = load_run(run_dir, step=step, device=device)
    heldout = Path(data_dir or cfg.data.data_dir) / "heldout.zarr"
    row_ids = list(range(rows))
    inputs, labels = read_rows(heldout, row_ids, length or cfg.data.seq_len, vocab_size=cfg.data.vocab_size,
                               bos_id=cfg.data.bos_id)  # (rows, length) each
    dev = torch.device(device)
    curve = per_token_loss(model, inputs, labels, batch_size=batch_size, device=dev,
                           mixed_precision=dev.type == "cuda")
    name = name or f"{cfg.model.name} ({Path(run_dir).name})"
    out = Path(out_dir) / f"{Path(run_dir).name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"name": name, "train_len": cfg.data.seq_len, "step": int(ckpt.name[5:]),
                               "checkpoint": str(ckpt), "rows": row_ids, "loss": curve.tolist()}))
    print(f"{name}: mean L = {curve.mean():.4f} over {len(row_ids)} rows x {len(curve)} tokens → {out}")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run directories written by train.py")
    p.add_argument("--out", required=True, help="output directory for JSON files and the plot")
    p.add_argument("--rows", type=int, default=8, help="held-out rows to average over")
    p.add_argument("--length", type=int, default=None, help="tokens per row (default: the training seq_len)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--data-dir", default=None, help="default: the run's data.data_dir")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--window", type=int, default=101)
    p.add_argument("--logx", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    files = [evaluate_run(r, a.out, rows=a.rows, length=a.length, batch_size=a.batch_size, device=a.device,
                          data_dir=a.data_dir, step=a.step) for r in a.runs]
    print(plot_per_token_loss(files, Path(a.out) / "per_token_loss.png", window=a.window, logx=a.logx))


if __name__ == "__main__":
    main()
