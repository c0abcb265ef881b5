"""Where ACP's time goes (GPU): dense vs ACP forward and forward+backward with half the heads local (log f = -1.3,
"mixed"), every head local and every head global (log f = -1e-4), QK-normed q/k, threshold "auto"; then the same
with extra tile configs offered to the autotuner (--extra-configs), and the configs it picked.

    python scripts/acp_breakdown.py [--shapes S1,S3] [--extra-configs]

Prints one line per shape and head mix: "dense fwd/fwd+bwd ms, ACP fwd/fwd+bwd ms -> speedups". docs/kernel.md
quotes a run.
"""

import argparse
import importlib
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
fa = importlib.import_module("forgetting_transformer.ops.forgetting_attention")
from forgetting_transformer.ops import forgetting_attention  # noqa: E402

SHAPES = {"S1": (4, 4096, 16, 64), "S2": (1, 16384, 16, 64), "S3": (2, 8192, 8, 128), "S4": (1, 32768, 8, 128)}
EXTRA = {"fwd": [(64, 64, 4, 2), (64, 32, 4, 3), (64, 64, 8, 3), (128, 64, 8, 2)],
         "dq": [(64, 32, 4, 3), (64, 64, 8, 3), (32, 64, 4, 3)],
         "dkdv": [(32, 128, 4, 3), (64, 128, 4, 3), (32, 64, 4, 4)]}


def bench(fn, inp, bwd):
    xs = [t.detach().requires_grad_(bwd) for t in inp]
    do = torch.randn_like(xs[0])
    f = (lambda: fn(*xs).backward(do)) if bwd else (lambda: fn(*xs))
    return triton.testing.do_bench(f, warmup=25, rep=200, return_mode="median")


def run(tag, shapes):
    for s in shapes:
        B, T, H, D = SHAPES[s]
        g = torch.Generator(device="cuda").manual_seed(0)
        q = (F.normalize(torch.randn(B, T, H, D, device="cuda", generator=g), dim=-1) * D ** .5).bfloat16()
        k = (F.normalize(torch.randn(B, T, H, D, device="cuda", generator=g), dim=-1) * D ** .5).bfloat16()
        v = torch.randn(B, T, H, D, device="cuda", generator=g).bfloat16()
        w = torch.ones(D, device="cuda")

        def acp(q, k, v, lf):
            return forgetting_attention(q, k, v, lf, adaptive_threshold="auto", qk_norm_weights=(w, w))

        out = []
        for mix in ("mixed", "all_local", "all_global"):
            lf = torch.full((B, T, H), -1e-4, device="cuda")
            if mix == "mixed":
                lf[..., : H // 2] = -1.3
            if mix == "all_local":
                lf[:] = -1.3
            r = [bench(f, (q, k, v, lf), b) for f in (forgetting_attention, acp) for b in (False, True)]
            out.append(f"{mix}: dense {r[0]:.3f}/{r[1]:.3f} acp {r[2]:.3f}/{r[3]:.3f} -> "
                       f"{r[0] / r[2]:.2f}x/{r[1] / r[3]:.2f}x")
        print(f"[{tag}] {s} " + " | ".join(out), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="S1,S3")
    ap.add_argument("--extra-configs", action="store_true")
    args = ap.parse_args()
    shapes = args.shapes.split(",")
    run("default configs", shapes)
    if args.extra_configs:
        orig = fa._gpu_configs

        def more(kind):
            return orig(kind) + [triton.Config(dict(BLOCK_M=m, BLOCK_N=n), num_warps=nw, num_stages=st)
                                 for m, n, nw, st in EXTRA[kind]]

        fa._gpu_configs = more
        fa._KERNELS.clear()
        run("extended configs", shapes)
    for (kind, _), kern in fa._KERNELS.items():  # the autotuner's picks (key: ..., argument dtypes)
        for key, cfg in getattr(kern, "cache", {}).items():
            print(kind, key[-8:], cfg, flush=True)


if __name__ == "__main__":
    main()
