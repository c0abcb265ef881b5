#!/usr/bin/env python
"""Wall time of the generation-based evaluations' decoding (NIAH, LongBench): the same prompts, greedy, two ways.

    python scripts/bench_eval_generation.py                                   # FoX (Pro) 125M, NIAH's grid to 8k
    python scripts/bench_eval_generation.py --lengths 1k,2k,4k,8k,16k,32k --depths 11 --batch-size 8 \\
        --out docs/eval_generation_bench.md
    python scripts/bench_eval_generation.py --checkpoint RUN_DIR              # a trained model
    python scripts/bench_eval_generation.py --lengths 1k,15500 --random-lengths 64   # LongBench-like lengths

``one at a time``: each prompt alone through transformers' ``generate()`` of ``FoXForCausalLM`` with its dynamic
cache (``FoXCache``, eager), as the runners decoded before they batched. ``batched``:
``eval.common.generate_batched`` with ``--batch-size`` prompts per call, grouped by length, through
``forgetting_transformer.inference.generate`` (paged static cache, decode kernel, CUDA graphs; the step compiled
with ``--compile-step``), as ``eval.niah.run`` and ``eval.longbench.run`` decode now. Prompts: one per (length,
depth) cell of a NIAH grid, of exactly that many random token ids (the time depends on the lengths, not on the
text; seed 0); with ``--random-lengths N``, N prompts of lengths drawn uniformly between the smallest and the
largest of ``--lengths`` instead, as LongBench's prompts spread over a range (its runner truncates them to
``--max-length``), so that groups mix lengths and left-pad.

The paths alternate over ``--passes`` passes (default 2), one at a time first. Pass 1 is what a fresh evaluation
process pays: the Triton autotuning of each new shape class (the one-at-a-time path, first, pays the prefill
kernel's for unpadded prompts; the batched path those of padded ones), CUDA graph captures, and with
``--compile-step`` the compilation of the decoding step (once per process, once more for a batch of one). Later
passes are warm. The batched path takes the runners' generation flags (``eval.cli.add_generation_args``: fixed
configs in the prefill unless ``--autotune``, ...); the one-at-a-time path runs the kernel's defaults (autotuned).
``speedup``: the one-at-a-time wall time of the same pass over the row's. ``same tokens`` counts prompts whose
continuations agree token for token with the first one-at-a-time pass (in bf16, a near-tie of random weights'
flat distributions may go either way between a batch and a single row; ``--dtype float32`` tells whether that is
all). The table is printed; ``--out`` also writes it with the command, device and versions.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from bench_generate import compose_config, table, write
from eval.cli import add_generation_args
from eval.common import (
    GenerationOptions, eos_and_pad, generate_batched, prepare_for_generation, to_hf, until_eos)
from eval.niah.run import parse_lengths
from forgetting_transformer.training.progress import Progress

COLUMNS = ("path", "pass", "prompts", "prompt tokens", "new tokens", "wall s", "prompts/s", "speedup", "same tokens")


def load(a):
    """(FoXForCausalLM, label): a training run's model, or random weights (seed 0) from the config tree."""
    if a.checkpoint:
        from eval.common import load_run

        model, cfg, _ = load_run(a.checkpoint)
        return to_hf(model, cfg), Path(a.checkpoint).name
    from forgetting_transformer.models import build_model

    cfg = compose_config(a.model, a.size, a.override)
    torch.manual_seed(0)
    return to_hf(build_model(cfg.model), cfg), f"{a.model} {a.size}"


def one_at_a_time(model, prompts: list[list[int]], max_new_tokens: int, on_prompt=None) -> list[list[int]]:
    """Greedy continuations through transformers' generate(), one prompt per call, cut after the first eos;
    ``on_prompt(1)`` after each (progress)."""
    eos, pad = eos_and_pad(model)
    out = []
    for p in prompts:
        ids = torch.tensor([p], device=model.device)
        seq = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                             pad_token_id=pad)
        out.append(until_eos(seq[0, len(p):].tolist(), set(eos or ())))
        if on_prompt is not None:
            on_prompt(1)
    return out


def batched(model, prompts: list[list[int]], max_new_tokens: int, options: GenerationOptions,
            on_group=None) -> list[list[int]]:
    eos, pad = eos_and_pad(model)
    return generate_batched(model, prompts, max_new_tokens, options, eos_token_id=eos, pad_token_id=pad,
                            on_group=on_group)


def timed(fn, device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - start


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="fox_pro", help="configs/model name (random weights)")
    p.add_argument("--size", default="125m", help="configs/model/size name")
    p.add_argument("--override", nargs="*", default=[], help="config overrides, e.g. model.n_layers=2")
    p.add_argument("--checkpoint", help="a training run directory (instead of --model/--size)")
    p.add_argument("--lengths", type=parse_lengths, default=parse_lengths("1k,2k,4k,8k"),
                   help="prompt lengths, comma-separated, 'k' = 1024 (default 1k,2k,4k,8k)")
    p.add_argument("--depths", type=int, default=11, help="prompts per length (NIAH's depths; default 11)")
    p.add_argument("--random-lengths", type=int, default=None, metavar="N",
                   help="instead of the grid: N prompts of lengths uniform between the smallest and largest "
                   "--lengths (LongBench-like)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--passes", type=int, default=2, help="timed passes of each path (default 2: cold, warm)")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--out", type=Path, help="also write the table (with command and device) to this file")
    add_generation_args(p)  # the batched path's (--batch-size, --dtype, --autotune, ...), as the runners take them
    a = p.parse_args(argv)
    if min(a.depths, a.max_new_tokens, a.passes) < 1 or min(a.lengths) < 2:
        p.error("--depths, --max-new-tokens and --passes must be >= 1, and every length >= 2")
    if a.random_lengths is not None and (a.random_lengths < 1 or len(set(a.lengths)) < 2):
        p.error(f"--random-lengths {a.random_lengths}: needs N >= 1 and two different --lengths (the range); "
                f"got --lengths {','.join(map(str, a.lengths))}")
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    options = GenerationOptions.from_args(a)
    model, label = load(a)
    try:
        model = prepare_for_generation(model.to(device), options, device).eval()  # (checks --acp-eviction)
    except ValueError as e:
        p.error(str(e))
    gen = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    if a.random_lengths is None:
        lengths = [L for L in a.lengths for _ in range(a.depths)]
    else:
        lengths = torch.randint(min(a.lengths), max(a.lengths) + 1, (a.random_lengths,), generator=gen).tolist()
    prompts = [torch.randint(1, V, (L,), generator=gen).tolist() for L in lengths]
    paths = {"one at a time": lambda bar: one_at_a_time(model, prompts, a.max_new_tokens, bar.update),
             f"batched ({a.batch_size})": lambda bar: batched(model, prompts, a.max_new_tokens, options, bar.update)}
    rows, ref = [], None
    print(f"{label}, {options.dtype_name(device)}: {len(prompts)} prompts, {a.passes} passes", flush=True)
    with torch.no_grad():
        for n in range(1, a.passes + 1):
            for path, fn in paths.items():
                with Progress(len(prompts), f"pass {n}, {path}", "prompt") as bar:  # a line every ~10 s
                    got, wall = timed(lambda: fn(bar), device)
                ref = got if ref is None else ref
                print(f"  pass {n}, {path}: {wall:.1f} s", flush=True)
                rows.append({"path": path, "pass": n, "wall s": wall, "new tokens": sum(map(len, got)),
                             "same tokens": f"{sum(x == y for x, y in zip(ref, got))}/{len(prompts)}"})
    n_tok = sum(len(x) for x in prompts)
    for r in rows:
        one = next(o for o in rows if o["pass"] == r["pass"] and o["path"] == "one at a time")
        r.update({"prompts": len(prompts), "prompt tokens": n_tok, "prompts/s": len(prompts) / r["wall s"],
                  "speedup": one["wall s"] / r["wall s"]})
    text = table(rows, COLUMNS)
    print(text)
    if a.out:
        write(a.out, text, sys.argv[1:] if argv is None else argv, device, title="Evaluation decoding benchmark",
              script="bench_eval_generation.py", what=f"{label}, {options.dtype_name(device)}. ")
    return rows


if __name__ == "__main__":
    main()
