"""Where the Forgetting Attention kernels' time goes (GPU only; a diagnostic, the ablated results are wrong).

    python scripts/kernel_ablation.py [--shapes S1,S2,S3,S4] [--variants base,nodecay,...] [--out FILE]

Each variant is the kernel source (`ops/triton_kernels.py`) with one piece of FoX-specific work removed by a
text substitution, launched with the heuristic configs (FOX_AUTOTUNE=0). Per-kernel GPU times come from the
torch profiler (mean over the timed fwd+bwd calls). A variant that is much faster than `base` names work worth
moving out of the inner loops; `plain` (no decay at all) bounds what any decay scheme can gain.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import tempfile

os.environ.setdefault("FOX_AUTOTUNE", "0")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from bench_attention import SHAPES, make_inputs  # noqa: E402

fa = importlib.import_module("forgetting_transformer.ops.forgetting_attention")  # the module, not the function

SRC = os.path.join(os.path.dirname(fa.__file__), "triton_kernels.py")

# The decay work left in the inner loops: per tile, a vector and a scalar load of the block-local log f prefix
# sums (fwd / dq: key side; dk/dv: query side) and the arithmetic on them.
_NODECAY = [("    ck = tl.load(PK_base + pos_k)", "    ck = offs_n.to(tl.float32) * 0.0"),
            ("    tot_k = tl.load(PK_base + tl.minimum(n0 + BLOCK_N, E) - 1)", "    tot_k = 0.0"),
            ("    cq = tl.load(PQ_base + rows)", "    cq = offs_m.to(tl.float32) * 0.0"),
            ("acc_c + tl.load(PQ_base + (m0 - off) + BLOCK_M - 1)", "acc_c")]
_NOROWSUM = [("    rowsum += tl.sum(ds, 1)\n", "")]  # the row sums of dS in the dq kernel (for d log f)
_NOCOLSUM = [("    colsum += tl.sum(dsT, 1)\n", "")]  # the column sums of dS in the dk/dv kernel

VARIANTS = {
    "base": [],
    "nodecay": _NODECAY,
    "norowsum": _NOROWSUM,
    "nocolsum": _NOCOLSUM,
    "plain": _NODECAY + _NOROWSUM + _NOCOLSUM,
}


def load_variant(name, tmpdir):
    src = open(SRC).read()
    for old, new in VARIANTS[name]:
        if old not in src:
            raise SystemExit(f"variant {name}: pattern not found in triton_kernels.py: {old!r}")
        src = src.replace(old, new)
    path = os.path.join(tmpdir, f"tk_{name}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(f"tk_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def kernel_times(fn, n=20):
    """Mean GPU ms per call of each kernel launched by ``fn`` (torch profiler)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        for short in ("fwd_kernel", "dq_kernel", "dkdv_kernel", "dlogf_kernel", "block_prefix_kernel"):
            if short in e.key:
                out[short.split("_")[0]] = e.device_time_total / 1e3 / n
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="S1,S2,S3,S4")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import triton

    tmp = tempfile.mkdtemp()
    mods = {v: load_variant(v, tmp) for v in args.variants.split(",")}
    real_raw = fa._raw_kernel
    lines = [f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; triton {triton.__version__}",
             "", "| shape | variant | fwd | dq | dkdv | dlogf | prefix | total | vs base |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    print("\n".join(lines), flush=True)
    for s in args.shapes.split(","):
        B, T, H, D = SHAPES[s]
        q, k, v, lf = (x.requires_grad_() for x in make_inputs(B, T, H, D))
        do = torch.randn_like(q)
        base_total = None
        for name, mod in mods.items():
            fa._raw_kernel = lambda kind, mod=mod: {"fwd": mod._attn_fwd_kernel, "dq": mod._attn_bwd_dq_kernel,
                                                    "dkdv": mod._attn_bwd_dkdv_kernel}[kind]

            def step():
                o = fa.forgetting_attention(q, k, v, lf)
                torch.autograd.grad(o, (q, k, v, lf), do)

            t = kernel_times(step)
            total = sum(t.values())
            base_total = base_total or total
            row = (f"| {s} | {name} | {t.get('fwd', 0):.3f} | {t.get('dq', 0):.3f} | {t.get('dkdv', 0):.3f} | "
                   f"{t.get('dlogf', 0):.3f} | {t.get('block', 0):.3f} | {total:.3f} | {base_total / total:.3f}x |")
            lines.append(row)
            print(row, flush=True)
    fa._raw_kernel = real_raw
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
