"""ACP's pruned share over many held-out rows: the share of the forward tiles ACP prunes, row by row.

    python -m eval.gates.pruning --run outputs/fox_acp --rows 64 --length 4096 --out results/acp

A row's share counts the causal BLOCK_M x BLOCK_N tiles of every layer and head that ACP's rule prunes
(``eval.gates.analysis.acp_layer_stats``: the kernel's rule, its threshold ``delta = -2U - log T + log eps``). The
model need not have trained with ACP: the share is what ACP would prune from its gates. ``<out>/acp_rows.json`` holds
every row's id and share, their mean and its 95% t interval over rows. ``eval.gates.run`` measures one text in
depth (per layer and head, with plots) instead.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from eval.cli import positive_int
from eval.common import check_same_tokenizer
from eval.gates import analysis
from eval.gates.run import parse_block
from eval.per_token_loss.run import load_for_eval
from eval.reproduction_results import paired_interval
from forgetting_transformer.data import read_rows
from forgetting_transformer.data.longcrawl64 import open_token_array
from forgetting_transformer.ops.forgetting_attention import acp
from forgetting_transformer.training.evaluate import spread_rows


def row_share(model, input_ids: torch.Tensor, *, block=(64, 64), eps: float = acp.DEFAULT_EPS) -> float:
    """The share of the causal forward tiles ACP prunes over every layer and head of ``model`` (a ``DecoderLM`` in
    eval mode) on one row ``input_ids`` (1, T)."""
    mods = analysis.attention_modules(model)
    if not analysis.has_forget_gate(model):
        raise ValueError(f"model {getattr(model.cfg, 'name', 'model')!r} has no forget gate (a Transformer): ACP "
                         "has nothing to prune")
    captured = analysis.capture(model, input_ids, range(len(mods)))
    pruned = total = 0
    for layer, attn in enumerate(mods):
        q, k, _, log_f = analysis.project(attn, captured.pop(layer)[0])
        stats = analysis.acp_layer_stats(attn, q, k, log_f, block=block, eps=eps)
        pruned, total = pruned + sum(stats["tiles_pruned"]), total + sum(stats["tiles_total"])
    return pruned / total


def measure(run_dir, out_dir, *, rows: int, length: int | None, device: str, data_dir: str | None = None,
            step: int | None = None, block=(64, 64), eps: float = acp.DEFAULT_EPS, every: float = 10.0) -> Path:
    """ACP's pruned tile share on ``rows`` held-out rows spread over the split (``length`` tokens each, default the
    training length) → ``out_dir/acp_rows.json``."""
    model, name, train_len, step, source, data_dir, vocab_size, bos_id = load_for_eval(run_dir, step, device, data_dir)
    if length is None and train_len is None:
        raise ValueError("pass --length for a Hugging Face directory (it records no training length)")
    check_same_tokenizer(run_dir, data_dir)  # data tokenized differently is refused
    heldout = Path(data_dir) / "heldout.zarr"
    row_ids = spread_rows(int(open_token_array(heldout).shape[0]), rows)
    inputs, _ = read_rows(heldout, row_ids, length or train_len, vocab_size=vocab_size, bos_id=bos_id)  # (R, T)
    shares, last = [], time.time()
    for i, row in enumerate(inputs):
        shares.append(row_share(model, row[None].to(device), block=block, eps=eps))
        if time.time() - last >= every or i + 1 == len(inputs):
            last = time.time()
            print(f"ACP pruning: {i + 1}/{len(inputs)} rows, mean share {sum(shares) / len(shares):.3f}", flush=True)
    ci = paired_interval(shares)
    record = {"name": name, "checkpoint": source, "step": step, "data": str(heldout), "tokens": inputs.shape[1],
              "block": list(block), "eps": eps, "rows": row_ids, "tile_fraction": shares,
              "mean": sum(shares) / len(shares), "ci": None if ci is None else [ci[1], ci[2]]}
    out = Path(out_dir) / "acp_rows.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    span = "" if ci is None else f" [{100 * ci[1]:.1f}, {100 * ci[2]:.1f}]"
    print(f"{name}: ACP prunes {100 * record['mean']:.1f}%{span} of the forward tiles ({block[0]}x{block[1]}) over "
          f"{len(shares)} rows x {inputs.shape[1]} tokens → {out}")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="run directory (train.py) or Hugging Face dir (export_hf.py)")
    p.add_argument("--out", required=True, help="output directory for acp_rows.json")
    p.add_argument("--rows", type=positive_int, default=64, help="held-out rows, spread evenly over the split "
                   "(default 64; all rows when the split has fewer)")
    p.add_argument("--length", type=positive_int, default=None, help="tokens per row (default: the training seq_len)")
    p.add_argument("--data-dir", default=None, help="default: the run's data.data_dir")
    p.add_argument("--block", default="64x64", help="ACP tile size BLOCK_MxBLOCK_N (default 64x64)")
    p.add_argument("--eps", type=float, default=acp.DEFAULT_EPS, help="ACP's bound on the pruned attention weight "
                   "of a row (default e^-10)")
    p.add_argument("--step", type=positive_int, default=None, help="checkpoint step of a run dir (default: latest)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    if not 0.0 < a.eps < 1.0:
        raise ValueError(f"--eps {a.eps}: must be in (0, 1)")
    measure(a.run, a.out, rows=a.rows, length=a.length, device=a.device, data_dir=a.data_dir, step=a.step,
            block=parse_block(a.block), eps=a.eps)


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
