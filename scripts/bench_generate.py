#!/usr/bin/env python
"""Generation speed and kept KV cache: prefill time, time per decoding step, tokens/s, with and without ACP eviction.

    python scripts/bench_generate.py                                        # FoX (Pro) 125M, 8k prompt, batch 1 and 8
    python scripts/bench_generate.py --models fox_pro transformer_pro --size 760m --prompt-len 32768 --batch 8 \\
        --eviction --sdpa-baseline --out docs/generation_bench.md
    python scripts/bench_generate.py --checkpoint RUN_DIR --eviction         # a trained model: its gates evict

Each row is ``forgetting_transformer.inference.generate`` (paged static cache, decode kernel, one CUDA graph per
step on a GPU, compiled with torch.compile unless ``--no-compile``; greedy) on random prompt tokens, after one
untimed warm-up call of the same shape. ``ms/token`` is the steady-state time of one decoding step (every
sequence of the batch gets a token), from the first replay of the captured graph to the end, cache maintenance
included; ``tokens/s`` counts the tokens of all sequences. Modes:
``full`` keeps every key; ``evict`` drops keys below ACP's threshold (FoX with QK-norm); ``sdpa`` (Transformers,
``--sdpa-baseline``) attends with ``F.scaled_dot_product_attention`` over a contiguous static cache instead of the
decode kernel. ``kept`` is the fraction of (layer, sequence, head) keys attended to at the end, ``KV MiB`` the
cache blocks in use / the pools allocated. Models are built from the config tree (``model=<m> model/size=<s>``,
random weights) unless ``--checkpoint`` names a training run. The table is printed; ``--out`` also writes it
with the command, device and versions.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from forgetting_transformer.inference import PagedKVCache, Sampler, generate
from forgetting_transformer.inference.cache import DecodeLayer
from forgetting_transformer.inference.generate import Decoder
from forgetting_transformer.markdown import table as markdown_table

ROOT = Path(__file__).resolve().parents[1]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
COLUMNS = ("model", "batch", "prompt", "new", "mode", "prefill ms", "ms/token", "tokens/s", "kept", "KV MiB")


def compose_config(name: str, size: str, overrides: list[str]):
    """The config tree of ``model=<name> model/size=<size>`` plus ``overrides`` (no data needed)."""
    from hydra import compose, initialize_config_dir

    from forgetting_transformer.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("config", overrides=[f"model={name}", f"model/size={size}", "data=longcrawl64",
                                            "data.data_dir=unused", *overrides])


def build(name: str, size: str, overrides: list[str]):
    """A DecoderLM from the config tree, random weights (seed 0)."""
    from forgetting_transformer.models import build_model

    cfg = compose_config(name, size, overrides)
    torch.manual_seed(0)
    return build_model(cfg.model), f"{name} {size}"


class SdpaLayer(DecodeLayer):
    """A layer of ``SdpaCache``: SDPA over its rows' blocks, one contiguous (B, Hkv, max_len, D) tensor."""

    def attend(self, q, k, v, log_fgate):
        c, i = self.cache, self.index
        B, T, H, _ = q.shape
        rows = c.batch_size * c.n_kv_heads
        keys = c.k_pool[i * rows:(i + 1) * rows].view(B, c.n_kv_heads, c.block_size, -1)
        values = c.v_pool[i * rows:(i + 1) * rows].view(B, c.n_kv_heads, c.block_size, -1)
        pos = torch.arange(c.block_size, device=q.device)
        pos_q = c.lengths[:, None] + torch.arange(T, device=q.device)  # (B, T)
        mask = (pos <= pos_q[..., None]) & (pos >= c.seq_start[:, None, None])  # (B, T, S)
        o = F.scaled_dot_product_attention(q.transpose(1, 2).to(c.dtype), keys, values, attn_mask=mask[:, None],
                                           enable_gqa=H != c.n_kv_heads)  # (B, H, T, D)
        return o.transpose(1, 2).to(q.dtype)


class SdpaCache(PagedKVCache):
    """The Transformer baseline's static cache: one block of max_len positions per (layer, sequence, kv head),
    handed out in that order by the first ``reserve``, so that each layer's keys are one contiguous tensor."""

    decode_layer = SdpaLayer

    def __init__(self, **kwargs):
        kwargs["block_size"] = -(-kwargs["max_len"] // 16) * 16
        super().__init__(**kwargs)

    @staticmethod
    def check_block_size(block_size) -> None:
        pass  # no kernel tiles the blocks


def run(model, batch: int, prompt_len: int, new_tokens: int, mode: str, block_size: int, compile_step: bool):
    """One untimed call of the shape, then the timed one; returns its ``GenerationOutput``."""
    ids = torch.randint(0, model.cfg.vocab_size, (batch, prompt_len), device=model.embed.weight.device)
    cuda = ids.is_cuda

    def once(n):
        if mode != "sdpa":
            return generate(model, ids, max_new_tokens=n, block_size=block_size, acp_eviction=mode == "evict",
                            compile_step=compile_step)
        cache = SdpaCache.for_model(model, batch, prompt_len + n)
        dec = Decoder(model, cache, Sampler(), None, 0, n, False, None, compile_step and cuda)
        return dec.generate(ids, torch.zeros(batch, dtype=torch.long, device=ids.device), None, cuda)

    # The warm-up call of a new shape compiles the step and autotunes the prefill's kernels (about 100 s at 760M
    # and 32k on an H100), so each phase says when it ends.
    start = time.monotonic()
    print(f"  {mode}, batch {batch}: warm-up call ...", flush=True)
    once(min(new_tokens, 8))
    print(f"  {mode}, batch {batch}: warm-up done in {time.monotonic() - start:.0f} s; timed call ...", flush=True)
    return once(new_tokens)


def row(out, batch: int) -> dict:
    """The table's numbers from a ``GenerationOutput``: kept = keys attended to over all (layer, head) pairs."""
    t, s = out.timings, out.stats
    step_s = t["decode_s"] / max(t["decode_steps"], 1)
    kept = s["kept"].sum() / (s["tokens"].sum() * s["kept"].shape[0] * s["kept"].shape[2])
    mib = f"{s['bytes_in_use'] / 2**20:.1f} / {s['pool_bytes'] / 2**20:.1f}"
    return {"prefill ms": 1e3 * t["prefill_s"], "ms/token": 1e3 * step_s, "tokens/s": batch / step_s,
            "kept": float(kept), "KV MiB": mib}


def modes(model, a) -> list[str]:
    gated = model.cfg.fgate != "none"
    out = ["full"]
    if a.eviction and gated and model.cfg.qk_norm:
        out.append("evict")
    if a.sdpa_baseline and not gated:
        out.append("sdpa")
    return out


def table(rows: list[dict], columns: tuple[str, ...] = COLUMNS) -> str:
    """A markdown table of ``rows``' ``columns``, floats to 3 significant digits."""
    def fmt(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    return markdown_table(list(columns), [[fmt(r[c]) for c in columns] for r in rows], "l" * len(columns))


def write(path: Path, text: str, argv: list[str], device: torch.device, title: str = "Generation benchmark",
          script: str = "bench_generate.py", what: str = "") -> None:
    """``text`` under ``# title``, the command (``python scripts/<script> <argv>``), ``what`` was measured, the
    device, torch version and date."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {title}\n\n`python scripts/{script} {' '.join(argv)}`\n\n{what}"
                    f"Device: {name}; torch {torch.__version__}; {datetime.date.today().isoformat()}.\n\n"
                    f"{text}\n")


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["fox_pro"], help="configs/model names")
    p.add_argument("--size", default="125m", help="configs/model/size name")
    p.add_argument("--checkpoint", help="a training run directory (instead of --models/--size)")
    p.add_argument("--prompt-len", type=int, default=8192)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--eviction", action="store_true", help="also with ACP eviction (FoX with QK-norm)")
    p.add_argument("--sdpa-baseline", action="store_true", help="also Transformers on SDPA over a static cache")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--no-compile", action="store_true", help="run the decoding step uncompiled (eager kernels)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on CUDA, fp32 on the CPU")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--override", nargs="*", default=[], help="config overrides, e.g. model.n_layers=2")
    p.add_argument("--out", type=Path, help="also write the table (with command and device) to this file")
    a = p.parse_args(argv)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[a.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    if a.checkpoint:
        from eval.common import load_run

        built = [(load_run(a.checkpoint)[0], Path(a.checkpoint).name)]
    else:
        built = [build(m, a.size, a.override) for m in a.models]
    rows = []
    with torch.no_grad():
        for model, name in built:
            model = model.to(device=device, dtype=dtype).eval()
            for batch in a.batch:
                for mode in modes(model, a):
                    out = run(model, batch, a.prompt_len, a.new_tokens, mode, a.block_size, not a.no_compile)
                    rows.append({"model": name, "batch": batch, "prompt": a.prompt_len, "new": a.new_tokens,
                                 "mode": mode, **row(out, batch)})
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    print(text)
    if a.out:
        write(a.out, text, sys.argv[1:] if argv is None else argv, device)
    return rows


if __name__ == "__main__":
    main()
