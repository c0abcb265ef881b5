"""Each Forgetting Attention kernel's time per tile config (GPU).

    python -m benchmarks.attention.sweep triton [--shapes S1,S3]
    python -m benchmarks.attention.sweep fwd|dq|dkdv [--shapes S1,S2,S3,S4]     (Gluon, Hopper)
    python -m benchmarks.attention.sweep fused [--rounds 3]                      (Gluon, Hopper, head dim 64)

``triton``: the Triton forward, dq and dk/dv kernels alone under each config of ``TRITON_SWEEP`` (BLOCK_M,
BLOCK_N, warps, stages; a superset of the autotuned lists, ``stages.TRITON_AUTOTUNE_CONFIGS``), plus d log f and
the whole (autotuned) backward. ``fwd`` / ``dq`` / ``dkdv``: the Gluon kernel under each config of
``GLUON_SWEEP`` (the layout of ``stages.GLUON_CONFIGS``, whose entry is the op's pick) against the Triton
kernel with its autotuned config: ms, TFLOP/s on the kernel's share of the FLOPs (forward 1x, dq 1.5x, dk/dv 2x
the forward's), the speedup and ``d``, the largest relative L2 difference of the outputs from the Triton
kernel's. ``fused``: the whole backward by the one-kernel Gluon backward per config (BLOCK_M, keys per
warpgroup, stages, staging slots; with its set-up and d log f) against the dq and dk/dv kernels, at S1, T1 (the
125M model's training step), S2 and the 760M model's attention (1, 16384, 24, 64), alternating for ``--rounds``
rounds (medians). Correctness of every config the op runs is tested by ``tests/ops/test_kernel_gpu.py``.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.attention.common import SHAPES, environment, flops_fwd, make_inputs, rounds_arg, shapes_arg

TRITON_SWEEP = {  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
    "fwd": [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 4, 4),
            (128, 32, 4, 3), (256, 64, 8, 3), (128, 128, 8, 4), (64, 128, 4, 3), (256, 32, 8, 3), (64, 64, 4, 2)],
    "dq": [(64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 4), (128, 32, 4, 3), (64, 32, 4, 2),
           (32, 64, 4, 3), (64, 128, 8, 3), (128, 128, 8, 2), (128, 32, 8, 3), (128, 64, 8, 4), (64, 64, 8, 3)],
    "dkdv": [(64, 64, 4, 3), (64, 128, 8, 3), (32, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 4), (32, 64, 4, 2),
             (64, 64, 4, 2), (64, 64, 4, 5), (64, 32, 4, 3), (128, 128, 8, 3), (32, 128, 8, 3), (128, 64, 8, 3),
             (64, 128, 8, 2), (64, 64, 8, 3), (32, 128, 4, 3), (64, 128, 8, 4)],
}

GLUON_SWEEP = {  # per kind, per head dim
    "fwd": {64: [(64, 128, 3, 2), (64, 128, 3, 3), (64, 128, 2, 3), (64, 128, 4, 2), (64, 64, 4, 3)],
            128: [(64, 128, 2, 2), (64, 64, 4, 3), (64, 128, 2, 3)]},
    "dq": {64: [(64, 64, 4, 3), (64, 64, 3, 3), (64, 128, 2, 3), (64, 64, 3, 2), (64, 128, 2, 2)],
           128: [(64, 64, 2, 2), (64, 128, 2, 2), (64, 64, 2, 3)]},
    "dkdv": {64: [(128, 64, 2, 2), (64, 64, 2, 2), (64, 64, 3, 2), (64, 64, 3, 3), (32, 64, 4, 3)],
             128: [(64, 64, 2, 2), (64, 64, 3, 2)]},
    "fused": [(64, 64, 3, 1), (64, 64, 2, 1), (64, 64, 2, 2), (64, 64, 3, 2)],
}


def do_bench(fn, rep=200):
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def sweep_triton(shapes):
    """Time each Triton kernel alone under each config in TRITON_SWEEP (one line per config)."""
    from forgetting_transformer.ops.forgetting_attention import stages as L

    for sname in shapes:
        B, T, H, D = SHAPES[sname]
        q, k, v, lf = make_inputs(B, T, H, D)
        ff = flops_fwd(B, T, H, D)
        o, lse = L.forward(q, k, v, lf)
        do = torch.randn_like(q)
        pk, pq = L.block_prefix(lf, T)
        dq, drow, delta = L.backward_dq(do, q, k, v, lf, pk, o, lse)
        dk, dv, dcol = L.backward_dkdv(do, q, k, v, lf, pq, lse, delta)
        print(f"{sname} dlogf {do_bench(lambda: L.dlogf(drow, dcol), 100):.3f} ms; whole backward (autotuned) "
              f"{do_bench(lambda: L.backward(do, q, k, v, lf, o, lse), 100):.3f} ms", flush=True)
        calls = {"fwd": (lambda cfg: L.forward(q, k, v, lf, config=cfg), 1.0),
                 "dq": (lambda cfg: L.backward_dq(do, q, k, v, lf, pk, o, lse, config=cfg), 1.5),
                 "dkdv": (lambda cfg: L.backward_dkdv(do, q, k, v, lf, pq, lse, delta, config=cfg), 2.0)}
        for kind, (call, mult) in calls.items():
            for cfg in TRITON_SWEEP[kind]:
                m, n, w, st = cfg
                if D >= 128 and m * n > 128 * 64 and kind != "fwd":
                    continue
                tag = f"{sname} {kind:5s} M{m:<4d}N{n:<4d}w{w} s{st}"
                try:
                    ms = do_bench(lambda: call(cfg), 100)
                    print(f"{tag}: {ms:8.3f} ms {mult * ff / ms / 1e9:6.1f} TFLOP/s", flush=True)
                except Exception as e:  # noqa: BLE001 (a config that does not fit is reported)
                    print(f"{tag}: failed {type(e).__name__} {str(e)[:100]}", flush=True)


def gluon_calls(kind, q, k, v, lf):
    """(Triton call, Gluon call for a config, FLOPs factor) of a Gluon kernel kind, each returning the outputs."""
    from forgetting_transformer.ops.forgetting_attention import stages as L

    T = q.shape[1]
    o, lse = L.forward(q, k, v, lf)
    do = torch.randn_like(q)
    pk, pq = L.block_prefix(lf, T)
    if kind == "fwd":
        return (lambda: L.forward(q, k, v, lf)[:1], lambda cfg: L.forward(q, k, v, lf, kernel="gluon", config=cfg)[:1],
                1.0)
    if kind == "dq":
        return (lambda: L.backward_dq(do, q, k, v, lf, pk, o, lse)[:1],
                lambda cfg: L.backward_dq(do, q, k, v, lf, pk, o, lse, kernel="gluon", config=cfg)[:1], 1.5)
    _, _, delta = L.backward_dq(do, q, k, v, lf, pk, o, lse)
    return (lambda: L.backward_dkdv(do, q, k, v, lf, pq, lse, delta)[:2],
            lambda cfg: L.backward_dkdv(do, q, k, v, lf, pq, lse, delta, kernel="gluon", config=cfg)[:2], 2.0)


def sweep_gluon(kind, shapes):
    """One Gluon kernel per config against its Triton counterpart: ms, TFLOP/s, speedup and difference."""
    from forgetting_transformer.ops.forgetting_attention import stages as L

    print(f"{kind} kernel ms (median do_bench); the op's pick: {L.GLUON_CONFIGS[kind]}; {environment()}")
    for name in shapes:
        B, T, H, D = SHAPES[name]
        q, k, v, lf = make_inputs(B, T, H, D)
        triton_fn, gluon_fn, factor = gluon_calls(kind, q, k, v, lf)
        flops = factor * flops_fwd(B, T, H, D)
        ref = triton_fn()
        t_ref = do_bench(triton_fn)
        row = [f"{name}: triton {t_ref:.3f} ms ({flops / t_ref * 1e-9:.0f} TF/s)"]
        for cfg in GLUON_SWEEP[kind][D]:
            try:
                out = gluon_fn(cfg)
                t = do_bench(lambda: gluon_fn(cfg))
                d = max(rel(a, b) for a, b in zip(out, ref))
                row.append(f"{cfg} {t:.3f} ({flops / t * 1e-9:.0f}, {t_ref / t:.2f}x, d {d:.0e})")
            except Exception as e:  # noqa: BLE001 (a config that does not fit is reported)
                row.append(f"{cfg} fails: {type(e).__name__} {str(e)[:80]}")
        print(" | ".join(row), flush=True)


def sweep_fused(rounds):
    """The one-kernel backward per config (with its set-up and d log f) against the dq and dk/dv kernels, the
    whole backward at head dim 64, alternating for ``rounds`` rounds (medians); d: the largest relative L2
    difference of dq, dk, dv and d log f from the two kernels'."""
    from forgetting_transformer.ops.forgetting_attention import stages as L
    from forgetting_transformer.ops.forgetting_attention import use_options

    configs = GLUON_SWEEP["fused"]
    print(f"whole backward ms (median of {rounds} alternating rounds of do_bench); the op's pick: "
          f"{L.GLUON_CONFIGS['fused']}; {environment()}")
    shapes = {"S1": SHAPES["S1"], "T1": SHAPES["T1"], "S2": SHAPES["S2"], "760M": (1, 16384, 24, 64)}
    for name, (B, T, H, D) in shapes.items():
        q, k, v, lf = make_inputs(B, T, H, D)
        o, lse = L.forward(q, k, v, lf)
        do = torch.randn_like(q)
        flops = 2.5 * flops_fwd(B, T, H, D)

        def two():
            with use_options(fused_backward=False):
                return L.backward(do, q, k, v, lf, o, lse)

        def one(cfg):
            dq, dk, dv, drow, dcol = L.backward_fused(do, q, k, v, lf, o, lse, config=cfg)
            return dq, dk, dv, L.dlogf(drow, dcol)

        ref = two()
        d = {cfg: max(rel(a, b) for a, b in zip(one(cfg), ref)) for cfg in configs}
        times = {cfg: [] for cfg in [None] + configs}
        for _ in range(rounds):
            for cfg in times:
                times[cfg].append(do_bench(two if cfg is None else (lambda c=cfg: one(c))))
        t_two = sorted(times[None])[rounds // 2]
        row = [f"{name}: two kernels {t_two:.3f} ms ({flops / t_two * 1e-9:.0f} TF/s)"]
        for cfg in configs:
            t = sorted(times[cfg])[rounds // 2]
            row.append(f"{cfg} {t:.3f} ({flops / t * 1e-9:.0f}, {t_two / t:.3f}x, d {d[cfg]:.0e})")
        print(" | ".join(row), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=("triton", "fwd", "dq", "dkdv", "fused"))
    ap.add_argument("--shapes", default=None, type=shapes_arg, help="default: S1,S3 (triton), S1..S4 (Gluon)")
    ap.add_argument("--rounds", type=rounds_arg, default=3, help="fused: alternating rounds (>= 1)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("sweep: needs a CUDA GPU")
    if args.kind == "triton":
        sweep_triton(args.shapes or ["S1", "S3"])
    elif args.kind == "fused":
        sweep_fused(args.rounds)
    else:
        sweep_gluon(args.kind, args.shapes or list(SHAPES))


if __name__ == "__main__":
    main()
