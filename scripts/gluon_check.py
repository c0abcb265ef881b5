"""The Gluon sm90 kernels against the Triton ones on a Hopper GPU: correctness and per-config timings.

    python scripts/gluon_check.py [--no-check] [--only fwd|bwd|dq|fused]

Forward (``_fwd_launch_sm90``): for awkward shapes (T not a multiple of the tiles, GQA / MQA, Tq < Tk, Tq = 1),
the relative L2 error of both forwards' o against the float64 reference and the largest log-sum-exp difference;
then the forward times of the Triton kernel (its heuristic config) and of the Gluon kernel for each (BLOCK_M per
warpgroup, BLOCK_N, stages, consumer warpgroups) at the benchmark shapes S1..S4 (docs/benchmarks.md, sessions 9
and 12; ``_SM90_CONFIGS`` holds the picks).
dk/dv backward (``_bwd_dkdv_sm90``): the same for dk, dv and d log f (from the Gluon kernel's column sums and the
dq kernel's row sums) against float64 autograd, then the dk/dv kernel times of both at S1..S4 (BLOCK_M, keys
per warpgroup, stages, consumer warpgroups; ``_SM90_BWD_CONFIGS`` holds the picks; TFLOP/s on the kernel's share, 2x the forward's FLOPs).
dq backward (``_bwd_dq_sm90``): the dq kernel times of both at S1..S4 per (rows per warpgroup, BLOCK_N, stages,
consumer warpgroups) and the relative difference of dq (``_SM90_DQ_CONFIGS`` holds the picks; 1.5x the forward's FLOPs); its
correctness is ``tests/ops/test_kernel_gpu.py::test_gluon_dq``.
One-kernel backward (``_bwd_fused_sm90``, head dim 64): the whole backward against the dq and dk/dv kernels per
(BLOCK_M, keys per warpgroup, stages, staging slots) (``_SM90_FUSED_CONFIGS`` holds the pick; its correctness is
``test_gluon_fused_bwd``).
"""
import argparse
import importlib
import itertools
import os
import sys
from unittest import mock

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from forgetting_transformer.ops.reference import forgetting_attention_ref  # noqa: E402

fa = importlib.import_module("forgetting_transformer.ops.forgetting_attention")


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def inputs(B, Tq, Tk, H, Hkv, D, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Tq, H, D, device="cuda", generator=g).to(dtype)
    k = torch.randn(B, Tk, Hkv, D, device="cuda", generator=g).to(dtype)
    v = torch.randn(B, Tk, Hkv, D, device="cuda", generator=g).to(dtype)
    lf = F.logsigmoid(torch.randn(B, Tk, H, device="cuda", generator=g) + 3)
    return q, k, v, lf


def check():
    print("correctness: rel L2 vs float64 reference (o), and vs the Triton forward (o, lse)")
    for (B, Tq, Tk, H, Hkv, D), cfg in itertools.product(
            [(2, 1000, 1000, 4, 4, 64), (2, 1000, 1000, 4, 2, 128), (1, 300, 1111, 4, 1, 128), (1, 1, 77, 2, 2, 64),
             (2, 2048, 2048, 2, 2, 128), (3, 129, 129, 2, 2, 64)],
            [None, (64, 64, 3, 2), (64, 64, 3, 3), (64, 128, 2, 3)]):
        q, k, v, lf = inputs(B, Tq, Tk, H, Hkv, D)
        sm = D ** -0.5
        o, lse = fa._fwd_launch_sm90(q, k, v, lf, sm, cfg)
        o_t, lse_t = fa._fwd_launch(q, k, v, lf, None, sm)
        ref = forgetting_attention_ref(q.double(), k.double(), v.double(), lf.double())
        ref_bf = forgetting_attention_ref(q.float(), k.float(), v.float(), lf).to(q.dtype)
        e, e_t, e_bf = rel(o, ref), rel(o_t, ref), rel(ref_bf, ref)
        dl = (lse - lse_t).abs().max().item()
        ok = e <= 2 * max(e_t, e_bf) and dl < 1e-3 and torch.isfinite(o).all().item()
        print(f"  {'ok ' if ok else 'BAD'} B{B} Tq{Tq} Tk{Tk} H{H}/{Hkv} D{D} cfg {cfg}: o {e:.2e} (triton {e_t:.2e}, "
              f"torch bf16 {e_bf:.2e}); max |lse - triton lse| {dl:.1e}", flush=True)


SHAPES = {"S1": (4, 4096, 16, 64), "S2": (1, 16384, 16, 64), "S3": (2, 8192, 8, 128), "S4": (1, 32768, 8, 128)}


def bench_kernel(what, flop_factor, configs, setup):
    """One Gluon kernel against its Triton counterpart at S1..S4: ``setup(q, k, v, lf, sm)`` gives the Triton
    call and the Gluon call for a config, each returning the outputs to compare (relative L2 difference, the
    largest); TFLOP/s on ``flop_factor`` x the forward's FLOPs."""
    print(f"{what} ms (median do_bench), triton {triton.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")
    for name, (B, T, H, D) in SHAPES.items():
        q, k, v, lf = inputs(B, T, T, H, H, D)
        triton_fn, gluon_fn = setup(q, k, v, lf, D ** -0.5)
        flops = flop_factor * 4 * B * H * T * T * D / 2
        ref = triton_fn()
        t_ref = triton.testing.do_bench(triton_fn, warmup=25, rep=200, return_mode="median")
        row = [f"{name}: triton {t_ref:.3f} ms ({flops / t_ref * 1e-9:.0f} TF/s)"]
        for cfg in configs[D]:
            try:
                out = gluon_fn(cfg)
                t = triton.testing.do_bench(lambda: gluon_fn(cfg), warmup=25, rep=200, return_mode="median")
                d = max(rel(a, b) for a, b in zip(out, ref))
                row.append(f"{cfg} {t:.3f} ({flops / t * 1e-9:.0f}, {t_ref / t:.2f}x, d {d:.0e})")
            except Exception as e:  # noqa: BLE001 (a config that does not fit is reported)
                row.append(f"{cfg} fails: {type(e).__name__} {str(e)[:80]}")
        print(" | ".join(row), flush=True)


def bench(configs):
    bench_kernel("forward", 1, configs, lambda q, k, v, lf, sm: (
        lambda: fa._fwd_launch(q, k, v, lf, None, sm)[:1],
        lambda cfg: fa._fwd_launch_sm90(q, k, v, lf, sm, cfg)[:1]))


def bwd_inputs(q, k, v, lf, sm):
    """What the dk/dv kernels read: the forward's lse, PQ and the dq kernel's delta (and its row sums)."""
    o, lse = fa._fwd_launch(q, k, v, lf, None, sm)
    do = torch.randn_like(q)
    pk, pq = fa._block_prefix(lf, q.shape[1])
    _, drow, delta = fa._bwd_dq(do, q, k, v, lf, pk, o, lse, None, sm)
    return do, pq, lse, delta, drow


def check_bwd():
    print("dk/dv correctness: rel L2 vs float64 autograd (dk, dv, d log f), Gluon (Triton)")
    for (B, Tq, Tk, H, Hkv, D), cfg in itertools.product(
            [(2, 1000, 1000, 4, 2, 128), (1, 300, 1111, 4, 1, 128), (1, 1, 77, 2, 2, 128), (3, 129, 129, 2, 2, 64),
             (2, 2048, 2048, 2, 2, 64), (1, 4096, 4096, 2, 2, 128)],
            [None, (64, 64, 3, 2), (64, 64, 2, 3)]):
        q, k, v, lf = inputs(B, Tq, Tk, H, Hkv, D)
        sm = D ** -0.5
        do, pq, lse, delta, drow = bwd_inputs(q, k, v, lf, sm)
        xs = [t.double().requires_grad_() for t in (q, k, v, lf)]
        _, dk_r, dv_r, dlf_r = torch.autograd.grad(forgetting_attention_ref(*xs), xs, do.double())
        res = []
        for name, fn in (("gluon", lambda: fa._bwd_dkdv_sm90(do, q, k, v, lf, pq, lse, delta, sm, cfg)),
                         ("triton", lambda: fa._bwd_dkdv(do, q, k, v, lf, pq, lse, delta, None, None, sm))):
            dk, dv, dcol = fn()
            dlf = fa._bwd_dlogf(drow, dcol)
            finite = all(torch.isfinite(t).all().item() for t in (dk, dv, dlf))
            res.append((rel(dk, dk_r), rel(dv, dv_r), rel(dlf, dlf_r), finite))
        (a, b, c, fin), (a_t, b_t, c_t, _) = res
        ok = fin and a <= 1.2 * a_t + 1e-4 and b <= 1.2 * b_t + 1e-4 and c <= 1.2 * c_t + 1e-4
        print(f"  {'ok ' if ok else 'BAD'} B{B} Tq{Tq} Tk{Tk} H{H}/{Hkv} D{D} cfg {cfg}: dk {a:.2e} ({a_t:.2e}) "
              f"dv {b:.2e} ({b_t:.2e}) dlf {c:.2e} ({c_t:.2e})", flush=True)


def bench_bwd(configs):
    def setup(q, k, v, lf, sm):
        do, pq, lse, delta, _ = bwd_inputs(q, k, v, lf, sm)
        return (lambda: fa._bwd_dkdv(do, q, k, v, lf, pq, lse, delta, None, None, sm)[:2],
                lambda cfg: fa._bwd_dkdv_sm90(do, q, k, v, lf, pq, lse, delta, sm, cfg)[:2])

    bench_kernel("dk/dv kernel", 2, configs, setup)  # 4 matmuls: 2x the forward's


def bench_dq(configs):
    def setup(q, k, v, lf, sm):
        o, lse = fa._fwd_launch(q, k, v, lf, None, sm)
        do = torch.randn_like(q)
        pk, _ = fa._block_prefix(lf, q.shape[1])
        return (lambda: fa._bwd_dq(do, q, k, v, lf, pk, o, lse, None, sm)[:1],
                lambda cfg: fa._bwd_dq_sm90(do, q, k, v, lf, pk, o, lse, sm, cfg)[:1])

    bench_kernel("dq kernel", 1.5, configs, setup)  # 3 matmuls: 1.5x the forward's 2


def bench_fused(configs, rounds=3):
    """The one-kernel backward (``_bwd_fused_sm90`` per config, with its set-up: delta, the zeroed fp32
    accumulators, dq's rounding, and d log f) against the dq and dk/dv kernels (``_bwd_launch`` with
    ``FOX_FUSED_BWD=0``), the whole backward at head dim 64: S1, S2 and the 760M model's attention (B1 T16384 H24),
    A and B alternating for ``rounds`` rounds (medians); TFLOP/s on 2.5x the forward's FLOPs; d: the largest
    relative L2 difference of dq, dk, dv and d log f from the two kernels'."""
    print(f"whole backward ms (median of {rounds} alternating rounds of do_bench), triton {triton.__version__}, "
          f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for name, (B, T, H, D) in {"S1": SHAPES["S1"], "S2": SHAPES["S2"], "760M": (1, 16384, 24, 64)}.items():
        q, k, v, lf = inputs(B, T, T, H, H, D)
        sm = D ** -0.5
        o, lse = fa._fwd_launch(q, k, v, lf, None, sm)
        do = torch.randn_like(q)
        flops = 2.5 * 4 * B * H * T * T * D / 2

        def two():
            with mock.patch.dict(os.environ, {"FOX_FUSED_BWD": "0"}):  # (restores the caller's setting)
                return fa._bwd_launch(do, q, k, v, lf, o, lse, None, None, sm)

        def one(cfg):
            dq, dk, dv, drow, dcol = fa._bwd_fused_sm90(do, q, k, v, lf, o, lse, sm, cfg)
            return dq, dk, dv, fa._bwd_dlogf(drow, dcol)

        ref = two()
        d = {cfg: max(rel(a, b) for a, b in zip(one(cfg), ref)) for cfg in configs}
        times = {cfg: [] for cfg in [None] + configs}
        for _ in range(rounds):
            for cfg in times:
                fn = two if cfg is None else (lambda c=cfg: one(c))
                times[cfg].append(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
        t_two = sorted(times[None])[rounds // 2]
        row = [f"{name}: two kernels {t_two:.3f} ms ({flops / t_two * 1e-9:.0f} TF/s)"]
        for cfg in configs:
            t = sorted(times[cfg])[rounds // 2]
            row.append(f"{cfg} {t:.3f} ({flops / t * 1e-9:.0f}, {t_two / t:.3f}x, d {d[cfg]:.0e})")
        print(" | ".join(row), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--only", choices=("fwd", "bwd", "dq", "fused"))
    args = ap.parse_args()
    if args.only in (None, "dq"):
        bench_dq({64: [(64, 64, 4, 3), (64, 64, 3, 3), (64, 128, 2, 3), (64, 64, 3, 2), (64, 128, 2, 2)],
                  128: [(64, 64, 2, 2), (64, 128, 2, 2), (64, 64, 2, 3)]})
    if args.only in (None, "fwd"):
        if not args.no_check:
            check()
        bench({64: [(64, 128, 3, 2), (64, 128, 3, 3), (64, 128, 2, 3), (64, 128, 4, 2), (64, 64, 4, 3)],
               128: [(64, 128, 2, 2), (64, 64, 4, 3), (64, 128, 2, 3)]})
    if args.only in (None, "bwd"):
        if not args.no_check:
            check_bwd()
        bench_bwd({64: [(128, 64, 2, 2), (64, 64, 2, 2), (64, 64, 3, 2), (64, 64, 3, 3), (32, 64, 4, 3)],
                   128: [(64, 64, 2, 2), (64, 64, 3, 2)]})
    if args.only in (None, "fused"):
        bench_fused([(64, 64, 3, 1), (64, 64, 2, 1), (64, 64, 2, 2), (64, 64, 3, 2)])
