"""What ACP eviction changes on a trained model: held-out loss, greedy generations, kept KV cache, decode speed.

    python -m eval.eviction.run outputs/fox_pro_run --rows 8 --length 16384 --prompt-len 16384 --new-tokens 64 \\
        --out results/eviction

For held-out rows of ``--length`` tokens, the per-token loss through the paged cache (``--chunk`` tokens per
forward, as a long prompt is prefilled) with every key kept and with ACP eviction after each chunk
(``inference.scoring.cached_loss``); then greedy generation of ``--new-tokens`` after the first ``--prompt-len``
tokens of each row, with and without eviction (``inference.generate``): whether the tokens are identical, the KV
cache in use at the end, and the steady-state time per decoding step. Prints a table; ``--out`` also writes
``<out>/<run name>.json``. The model needs a forget gate, and QK-norm unless ``--threshold`` is given.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from eval.cli import positive_int
from eval.common import check_same_tokenizer, load_run
from forgetting_transformer.data import read_rows
from forgetting_transformer.data.longcrawl64 import open_token_array
from forgetting_transformer.inference import generate
from forgetting_transformer.inference.scoring import cached_loss
from forgetting_transformer.markdown import table
from forgetting_transformer.training.evaluate import spread_rows


def score(model, inputs, labels, a) -> dict:
    """Loss with every key kept and with eviction, over all rows, a batch at a time."""
    full, evicted, kept, in_use, full_bytes = [], [], [], 0, 0
    last = time.monotonic()
    for s in range(0, inputs.shape[0], a.batch_size):
        x, y = inputs[s:s + a.batch_size].to(a.device), labels[s:s + a.batch_size].to(a.device)
        lf, sf = cached_loss(model, x, y, chunk=a.chunk)
        le, se = cached_loss(model, x, y, chunk=a.chunk, acp_eviction=True, eviction_threshold=a.threshold)
        full.append(lf.double().cpu())
        evicted.append(le.double().cpu())
        kept.append(se["kept"].double().sum(1) / se["tokens"].sum())  # (L, H)
        in_use, full_bytes = in_use + se["bytes_in_use"], full_bytes + sf["bytes_in_use"]
        if time.monotonic() - last > 10:
            print(f"  scored {min(s + a.batch_size, inputs.shape[0])}/{inputs.shape[0]} rows", flush=True)
            last = time.monotonic()
    full, evicted = torch.cat(full), torch.cat(evicted)  # (N, T)
    diff = evicted - full
    return {"loss_full": float(full.mean()), "loss_evicted": float(evicted.mean()),
            "loss_diff_mean": float(diff.mean()), "loss_diff_max_abs": float(diff.abs().max()),
            "kept_fraction": float(torch.stack(kept).mean()), "kv_bytes_full": full_bytes,
            "kv_bytes_evicted": in_use}


def generations(model, inputs, a) -> dict:
    """Greedy tokens after each row's first ``prompt_len`` tokens, with and without eviction (one warm-up call
    of each first, so the timed ones are the steady state)."""
    prompts = inputs[:, :a.prompt_len].to(a.device)
    runs = {}
    for name, evict in (("full", False), ("evicted", True)):
        kw = dict(max_new_tokens=a.new_tokens, acp_eviction=evict,
                  eviction_threshold=a.threshold if evict else None)
        generate(model, prompts[:1], **dict(kw, max_new_tokens=min(8, a.new_tokens)))
        runs[name] = [generate(model, prompts[s:s + a.batch_size], **kw)
                      for s in range(0, prompts.shape[0], a.batch_size)]
    same = [bool(torch.equal(f.sequences[i], e.sequences[i]))
            for f, e in zip(runs["full"], runs["evicted"]) for i in range(f.sequences.shape[0])]

    def per_step_ms(outs):
        steps = sum(o.timings["decode_steps"] for o in outs)
        return 1e3 * sum(o.timings["decode_s"] for o in outs) / max(steps, 1)

    return {"identical_generations": sum(same), "generations": len(same),
            "decode_ms_full": per_step_ms(runs["full"]), "decode_ms_evicted": per_step_ms(runs["evicted"]),
            "gen_kv_bytes_full": sum(o.stats["bytes_in_use"] for o in runs["full"]),
            "gen_kv_bytes_evicted": sum(o.stats["bytes_in_use"] for o in runs["evicted"])}


def evaluate_run(run_dir, a) -> dict:
    model, cfg, ckpt = load_run(run_dir, step=a.step, device=a.device)
    dtype = a.dtype or ("bfloat16" if torch.device(a.device).type == "cuda" else "float32")
    model = model.to(getattr(torch, dtype))
    data_dir = a.data_dir or cfg.data.data_dir
    check_same_tokenizer(run_dir, data_dir)  # data tokenized differently is refused
    heldout = Path(data_dir) / "heldout.zarr"
    rows = spread_rows(int(open_token_array(heldout).shape[0]), a.rows)
    if a.prompt_len + a.new_tokens > a.length:
        raise ValueError(f"--prompt-len {a.prompt_len} + --new-tokens {a.new_tokens} must be <= --length "
                         f"{a.length} (the prompts are the rows' first tokens)")
    inputs, labels = read_rows(heldout, rows, a.length, vocab_size=int(cfg.data.vocab_size),
                               bos_id=int(cfg.data.bos_id))  # (rows, length) each
    print(f"{cfg.model.name} ({Path(run_dir).name}, {ckpt.name}): {len(rows)} rows x {a.length} tokens", flush=True)
    with torch.no_grad():
        result = {"run": str(run_dir), "checkpoint": str(ckpt), "model": cfg.model.name, "rows": rows,
                  "length": a.length, "chunk": a.chunk, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
                  "threshold": a.threshold, "dtype": dtype,
                  "device": torch.cuda.get_device_name() if "cuda" in a.device else "cpu",
                  **score(model, inputs, labels, a), **generations(model, inputs, a)}
    return result


def results_table(results: list[dict]) -> str:
    cols = ["model", "loss_full", "loss_evicted", "loss_diff_max_abs", "kept_fraction", "kv_bytes_full",
            "kv_bytes_evicted", "identical_generations", "generations", "decode_ms_full", "decode_ms_evicted"]

    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return table(cols, [[fmt(r[c]) for c in cols] for r in results], "l" * len(cols))


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run directories written by train.py")
    p.add_argument("--rows", type=positive_int, default=8, help="held-out rows, spread evenly over the split")
    p.add_argument("--length", type=positive_int, default=16384, help="tokens per row scored")
    p.add_argument("--chunk", type=positive_int, default=1024, help="tokens per forward through the cache")
    p.add_argument("--prompt-len", type=positive_int, default=8192)
    p.add_argument("--new-tokens", type=positive_int, default=64)
    p.add_argument("--batch-size", type=positive_int, default=4)
    p.add_argument("--threshold", type=float, default=None,
                   help="an explicit eviction threshold delta < 0 (default: ACP's 'auto' rule from QK-norm)")
    p.add_argument("--data-dir", default=None, help="default: the run's data.data_dir")
    p.add_argument("--step", type=positive_int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                   help="weights and cache (default: bfloat16 on CUDA, float32 on the CPU)")
    p.add_argument("--out", type=Path, help="directory for <run name>.json")
    a = p.parse_args(argv)
    results = []
    for run in a.runs:
        results.append(evaluate_run(run, a))
        if a.out:
            a.out.mkdir(parents=True, exist_ok=True)
            (a.out / f"{Path(run).name}.json").write_text(json.dumps(results[-1], indent=1))
    print(results_table(results))
    return results


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
