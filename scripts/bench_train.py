#!/usr/bin/env python
"""Training throughput: tokens/s, TFLOP/s and MFU of full training steps (forward, backward, AdamW) on GPUs.

    python scripts/bench_train.py                                   # one GPU
    torchrun --nproc_per_node=2 scripts/bench_train.py --strategy fsdp
    torchrun --nproc_per_node=2 scripts/bench_train.py --strategy fsdp --fsdp-precision autocast
    python scripts/bench_train.py --models fox_pro transformer_pro --sizes 125m 760m --seq-len 16384 \
        --write outputs/bench_train.md

Each configuration is the repo's config tree (``model=<m> model/size=<s>``) with random GPT-2-vocabulary tokens,
bf16, the given strategy, ``--micro-batch`` sequences per GPU per step; the first ``--warmup`` steps are not
timed. bf16 is autocast for single and ddp; FSDP's is ``strategy.fsdp_precision`` (``--fsdp-precision``; default:
configs/strategy/fsdp.yaml's), named in the table's heading. FLOPs per token follow train.py (PaLM's 6N +
12·L·H·Q·T); MFU uses the device's dense bf16 peak. PaTH models (``--models path_fox_pro fox_pro``) are counted
as softmax attention: the Householder products are not, so their MFU is a lower bound.
``--sdpa`` pins the backend of ``F.scaled_dot_product_attention`` (the Transformer models' attention; PyTorch's
default on Hopper is cuDNN for these shapes) by turning the others off for the whole process (an
``sdpa_kernel`` context around the steps does not reach the compiled graphs: they kept cuDNN); the table's
``attention`` column names the backend SDPA's dispatcher picks for the model's shape. ``vs Transformer``: a model's
tokens/s over the Transformer of its flavour (Pro, LLaMA) at the same size, when the table has it. ``--profile N``
adds one profiled step per model: its N costliest kernels and its GPU time per kernel group (Forgetting Attention,
SDPA, GEMM, Inductor's fused kernels, optimizer, eager elementwise, other; ``KERNEL_GROUPS``).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from hydra import compose, initialize_config_dir

from forgetting_transformer.config import register_configs, validate
from forgetting_transformer.markdown import table
from forgetting_transformer.models import build_model, resolve_heads
from forgetting_transformer.training.distributed import init_distributed, mean_across_ranks, shutdown
from forgetting_transformer.training.evaluate import autocast_context
from forgetting_transformer.training.metrics import (attention_context, flops_per_token, matmul_params, peak_flops,
                                                     peak_memory_gib)
from forgetting_transformer.training.optim import build_optimizer
from forgetting_transformer.training.parallel import autocast_needed, parallelize

ROOT = Path(__file__).resolve().parents[1]


def bench(model_name, size, a, dist):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={model_name}", f"model/size={size}", "data=longcrawl64",
                                           "data.data_dir=unused", f"data.seq_len={a.seq_len}",
                                           f"strategy={a.strategy}", "strategy.mixed_precision=bf16",
                                           f"strategy.activation_checkpointing={a.ac}",
                                           f"strategy.compile={str(a.compile).lower()}",
                                           *([f"strategy.fsdp_precision={a.fsdp_precision}"] if a.fsdp_precision
                                             else []), *a.override])
    validate(cfg)
    with torch.device("meta"):  # as in train.py: parallelize() allocates and initialises
        model = build_model(cfg.model)
    n_matmul = matmul_params(model)
    model = parallelize(model, cfg.strategy, dist.device, True, seed=0)
    opt = build_optimizer(model, cfg.optim)
    for g in opt.param_groups:
        g["lr"] = 1e-4
    x = torch.randint(0, cfg.model.vocab_size, (a.micro_batch, a.seq_len), device=dist.device)
    autocast = autocast_needed(cfg.strategy, True)
    head_dim, n_heads, _ = resolve_heads(cfg.model)
    attention = cfg.model.arch  # (the fla baselines: their own layers)
    if cfg.model.arch == "decoder" and cfg.model.mixer == "path":
        attention = "PaTH (fla parallel_path_attn)"
    elif cfg.model.arch == "decoder" and cfg.model.fgate != "none":
        attention = "forgetting_attention"
    elif cfg.model.arch == "decoder":
        attention = "SDPA " + _sdpa_choice(a.micro_batch, n_heads, a.seq_len, head_dim, dist.device)
    torch.cuda.reset_peak_memory_stats()
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        with autocast_context(dist.device, autocast):
            loss = model(x, x).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    dt = torch.tensor((time.perf_counter() - t0) / a.steps, device=dist.device)
    if a.profile and dist.is_main:  # one more step under the profiler: where the time goes
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            with autocast_context(dist.device, autocast):
                loss = model(x, x).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
        print(f"--- {model_name} {size}: CUDA kernels of one step, by total time ---")
        print(prof.key_averages().table(sort_by="device_time_total", row_limit=a.profile))
        print(group_table([(e.key, e.device_time_total) for e in prof.key_averages()]))
    dt = mean_across_ranks(dt).item()
    attn_layers, attn_keys = attention_context(cfg.model, a.seq_len)
    fpt = flops_per_token(n_matmul, attn_layers, n_heads, head_dim, attn_keys)
    tok_s_dev = a.micro_batch * a.seq_len / dt
    peak = peak_flops(dist.device)
    return dict(model=model_name, size=size, attention=attention, tok_s=tok_s_dev * dist.world_size,
                tok_s_dev=tok_s_dev, tflops=tok_s_dev * fpt / 1e12,
                mfu=tok_s_dev * fpt / peak if peak else float("nan"), mem=peak_memory_gib(dist.device),
                loss=loss.item(), precision="autocast" if autocast else "bf16_params")


# Kernel groups of a profiled step, matched by name in this order (our kernels first: they also say "sm90")
KERNEL_GROUPS = (("Forgetting Attention", ("attn_", "fox_", "dlogf", "acp_", "block_prefix", "bwd_fused_setup")),
                 ("SDPA attention", ("flash", "fmha", "cudnn", "sdpa")),
                 ("GEMM", ("gemm", "xmma", "nvjet", "cutlass", "cublas")),
                 ("Inductor fused (norms, gates, elementwise)", ("triton_",)),
                 ("optimizer", ("multi_tensor", "foreach", "adam")),
                 ("eager elementwise and reductions", ("elementwise", "vectorized", "reduce_kernel")))


def kernel_group(name: str) -> str:
    low = name.lower()
    return next((group for group, keys in KERNEL_GROUPS if any(k in low for k in keys)), "other")


def group_table(kernels: list[tuple[str, float]]) -> str:
    """(kernel name, GPU microseconds in the profiled step) → a table of the step's GPU time per kernel group,
    largest first, with each group's share and kernel count: where the time goes."""
    groups: dict[str, list[float]] = {}
    for name, us in kernels:
        groups.setdefault(kernel_group(name), []).append(us)
    total = sum(sum(v) for v in groups.values()) or 1.0
    rows = [[g, f"{sum(v) / 1e3:.2f}", f"{100 * sum(v) / total:.1f}%", str(len(v))]
            for g, v in sorted(groups.items(), key=lambda kv: -sum(kv[1]))]
    return table(["kernel group", "GPU ms per step", "share", "kernels"], rows, "lrrr")


def against_transformer(rows: list[dict]) -> list[str]:
    """Each row's tokens/s over the Transformer of its flavour (Pro or LLaMA) at the same size in the same table
    ("–" for the Transformers and rows without theirs)."""
    speed = {(r["model"], r["size"]): r["tok_s"] for r in rows}
    out = []
    for r in rows:
        flavour = "pro" if "pro" in r["model"] else "llama" if "llama" in r["model"] else None
        base = speed.get((f"transformer_{flavour}", r["size"]))
        out.append(f"{r['tok_s'] / base:.3f}×" if base and not r["model"].startswith("transformer") else "–")
    return out


def _pin_sdpa(name):
    """Leave only SDPA backend ``name`` ("flash" / "cudnn" / "efficient") on, process-wide (the dispatcher then
    fails loudly where it cannot run); "default" changes nothing."""
    if name not in ("default", "flash", "cudnn", "efficient"):
        raise ValueError(f"--sdpa={name!r}: must be one of default, flash, cudnn, efficient")
    if name != "default":
        for backend, enable in (("flash", torch.backends.cuda.enable_flash_sdp),
                                ("cudnn", torch.backends.cuda.enable_cudnn_sdp),
                                ("efficient", torch.backends.cuda.enable_mem_efficient_sdp)):
            enable(backend == name)
        torch.backends.cuda.enable_math_sdp(False)


def _sdpa_choice(batch, heads, seq_len, head_dim, device):
    """The backend that causal bf16 SDPA would run for (batch, heads, seq_len, head_dim) here, by name."""
    from torch.nn.attention import SDPBackend

    q = torch.empty(batch, heads, seq_len, head_dim, device=device, dtype=torch.bfloat16)
    choice = torch._fused_sdp_choice(q, q, q, is_causal=True)
    return next((n.lower() for n in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
                 if int(getattr(SDPBackend, n)) == choice), str(choice))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["fox_pro", "transformer_pro"])
    p.add_argument("--sizes", nargs="+", default=["125m", "760m"])
    p.add_argument("--seq-len", type=int, default=16384)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--strategy", default="single", choices=["single", "ddp", "fsdp"])
    p.add_argument("--ac", default="none", choices=["none", "full", "selective"])
    p.add_argument("--compile", action="store_true")
    p.add_argument("--fsdp-precision", choices=["bf16_params", "autocast"],
                   help="strategy.fsdp_precision with --strategy fsdp (default: configs/strategy/fsdp.yaml's)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides")
    p.add_argument("--sdpa", default="default", choices=["default", "flash", "cudnn", "efficient"],
                   help="SDPA backend of the Transformer models (default: PyTorch's pick)")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest CUDA kernels of a "
                   "step and the step's GPU time per kernel group")
    p.add_argument("--write", type=Path, help="append the table to this Markdown file")
    a = p.parse_args(argv)
    register_configs()
    _pin_sdpa(a.sdpa)
    dist = init_distributed(SimpleNamespace(name=a.strategy, device="cuda", deterministic=False))
    rows = [bench(m, s, a, dist) for s in a.sizes for m in a.models]
    if dist.is_main:
        head = (f"{torch.cuda.get_device_name()} x {dist.world_size}, torch {torch.__version__}, "
                f"Python {platform.python_version()}; strategy {a.strategy}, AC {a.ac}, compile {a.compile}, "
                f"seq_len {a.seq_len}, micro-batch {a.micro_batch}/GPU, bf16 ({rows[0]['precision']}), "
                f"{a.steps} timed steps")
        cells = [[r["model"], r["size"], r["attention"], f"{r['tok_s']:,.0f}", f"{r['tok_s_dev']:,.0f}", vs,
                  f"{r['tflops']:.0f}", f"{100 * r['mfu']:.1f}%", f"{r['mem']:.1f}"]
                 for r, vs in zip(rows, against_transformer(rows))]
        text = head + "\n\n" + table(["model", "size", "attention", "tokens/s", "tokens/s/GPU", "vs Transformer",
                                       "TFLOP/s/GPU", "MFU", "peak mem GiB"], cells, "lllrrrrrr")
        print(text)
        if a.write:
            with a.write.open("a") as f:
                f.write(f"\nCommand: `{' '.join(['python', 'scripts/bench_train.py', *sys.argv[1:]])}`\n\n{text}\n")
    shutdown()


if __name__ == "__main__":
    main()
