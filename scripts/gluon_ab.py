"""A/B of two versions of the Gluon kernels (``ops/gluon_kernels.py``) through the op, in one process (GPU, Hopper).

    git show <rev>:forgetting_transformer/ops/gluon_kernels.py > /tmp/old_gluon.py
    python scripts/gluon_ab.py --old /tmp/old_gluon.py [--shapes S1,S2,S3,S4] [--rounds 3] [--profile]

"A" is the module at ``--old``, "B" the working tree's. For each benchmark shape (bench_attention.py's S1..S4)
and for dense calls and ACP calls (bench_attention.py's ACP inputs: half the heads local, QK-normed, "auto"), it
first compares the forward output and all four gradients of A and B (``--expect-equal``: exit 1 unless they are
bitwise equal, for a change that claims not to move a bit), then times fwd and fwd+bwd of each, replayed from a
CUDA graph (GPU time only), alternating A and B for ``--rounds`` rounds so that drift of the machine hits both;
it prints the median of the rounds and B's speed-up. ``--profile`` prints the kernels of one ACP fwd+bwd call of
B per shape (torch profiler). ``--kernels`` instead times the forward, dq and dk/dv kernels alone, A against B
(dense and with ACP's tables), and B's d log f and ACP-table kernels. ``--heads all_global`` / ``all_local``
gives the ACP case every head global (log f = -1e-4: nothing pruned, the ACP kernels' overhead over the dense
ones) or local instead of half and half.
"""

import argparse
import importlib.util
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# (bench_attention puts the repo root on sys.path)
from bench_attention import (HEAD_MIXES, SHAPES, acp_inputs, bench_graph, graph_time, make_inputs,  # noqa: E402
                             profile, rounds_arg)

import forgetting_transformer.ops as ops_pkg  # noqa: E402
from forgetting_transformer.ops import forgetting_attention  # noqa: E402
from forgetting_transformer.ops import gluon_kernels as new_module  # noqa: E402


def load(path):
    spec = importlib.util.spec_from_file_location("forgetting_transformer.ops._gluon_ab_old", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def use(module):
    """Make the op's launchers (``from . import gluon_kernels as gk`` at call time) take ``module``."""
    ops_pkg.gluon_kernels = module
    sys.modules["forgetting_transformer.ops.gluon_kernels"] = module


def outputs(fn, inputs):
    q, k, v, lf = (t.detach().requires_grad_() for t in inputs)
    o = fn(q, k, v, lf)
    do = torch.randn(o.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)).to(o.dtype)
    return (o.detach(), *torch.autograd.grad(o, (q, k, v, lf), do))


def kernels_ab(shapes, old, rounds, heads="mixed"):
    """Each Gluon kernel (forward, dq, dk/dv) alone, A against B, dense and with ACP (the op's tables), replayed from
    a CUDA graph, A and B alternating; plus d log f's kernel time (not a Gluon kernel: the working tree's)."""
    import math

    fa = importlib.import_module("forgetting_transformer.ops.forgetting_attention")
    print("\n| shape | case | kernel | A ms | B ms | B speed-up |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for s in shapes:
        B, T, H, D = SHAPES[s]
        sm = D ** -0.5
        (qa, ka, va, lfa), w = acp_inputs(B, T, H, D, local_heads=HEAD_MIXES[heads](H))
        for case, (q, k, v, lf) in (("dense", make_inputs(B, T, H, D)), ("acp", (qa, ka, va, lfa))):
            tables = None
            if case == "acp":
                tables = fa._acp_tables_for(q, k, lf, sm, "auto", math.exp(-10), (w, w))[:2]
            use(new_module)
            o, lse = fa._fwd_launch_sm90(q, k, v, lf, sm, acp_tables=tables)
            do = torch.randn_like(q)
            pk, pq = fa._block_prefix(lf, T)
            _, drow, delta = fa._bwd_dq_sm90(do, q, k, v, lf, pk, o, lse, sm, acp_tables=tables)
            dcol = fa._bwd_dkdv_sm90(do, q, k, v, lf, pq, lse, delta, sm, acp_tables=tables)[2]
            calls = {"fwd": lambda: fa._fwd_launch_sm90(q, k, v, lf, sm, acp_tables=tables),
                     "dq": lambda: fa._bwd_dq_sm90(do, q, k, v, lf, pk, o, lse, sm, acp_tables=tables),
                     "dkdv": lambda: fa._bwd_dkdv_sm90(do, q, k, v, lf, pq, lse, delta, sm, acp_tables=tables)}
            for kind, call in calls.items():
                t = {"A": [], "B": []}
                for _ in range(rounds):
                    for name, mod in (("A", old), ("B", new_module)):
                        use(mod)
                        t[name].append(graph_time(call))
                a, b = statistics.median(t["A"]), statistics.median(t["B"])
                print(f"| {s} | {case} | {kind} | {a:.3f} | {b:.3f} | {a / b:.3f}x |", flush=True)
            use(new_module)
            print(f"| {s} | {case} | dlogf (B only) | | {graph_time(lambda: fa._bwd_dlogf(drow, dcol)):.4f} | |",
                  flush=True)
            if tables is not None:
                ms = graph_time(lambda: fa._acp_tables_for(q, k, lf, sm, "auto", math.exp(-10), (w, w)))
                print(f"| {s} | {case} | ACP tables (B only) | | {ms:.4f} | |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="path of the A version of gluon_kernels.py")
    ap.add_argument("--shapes", default="S1,S2,S3,S4")
    ap.add_argument("--rounds", type=rounds_arg, default=3, help="A/B rounds (medians; >= 1)")
    ap.add_argument("--expect-equal", action="store_true", help="exit 1 unless A and B agree bit for bit")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--kernels", action="store_true", help="time each Gluon kernel alone instead of the op")
    ap.add_argument("--heads", default="mixed", choices=sorted(HEAD_MIXES),
                    help="the ACP case's heads: half local (mixed), all global or all local")
    args = ap.parse_args()
    old = load(args.old)
    print(f"A: {args.old}; B: {new_module.__file__}; {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {__import__('triton').__version__}", flush=True)
    if args.kernels:
        kernels_ab(args.shapes.split(","), old, args.rounds, args.heads)
        return
    differ = 0
    rows = []
    for s in args.shapes.split(","):
        B, T, H, D = SHAPES[s]
        (qa, ka, va, lfa), w = acp_inputs(B, T, H, D, local_heads=HEAD_MIXES[args.heads](H))
        cases = {
            "dense": (lambda q, k, v, lf: forgetting_attention(q, k, v, lf), make_inputs(B, T, H, D)),
            "acp": (lambda q, k, v, lf: forgetting_attention(q, k, v, lf, adaptive_threshold="auto",
                                                              qk_norm_weights=(w, w)), (qa, ka, va, lfa)),
        }
        for case, (fn, inputs) in cases.items():
            got = {}
            for name, mod in (("A", old), ("B", new_module)):
                use(mod)
                got[name] = outputs(fn, inputs)
            same = [torch.equal(a, b) for a, b in zip(got["A"], got["B"])]
            err = [((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
                   for a, b in zip(got["A"], got["B"])]
            differ += not all(same)
            print(f"{s} {case}: A vs B bitwise equal (o, dq, dk, dv, dlf): {same}; rel diff "
                  + " ".join(f"{e:.1e}" for e in err), flush=True)
            times = {(name, bwd): [] for name in "AB" for bwd in (False, True)}
            for _ in range(args.rounds):
                for name, mod in (("A", old), ("B", new_module)):
                    use(mod)
                    for bwd in (False, True):
                        times[(name, bwd)].append(bench_graph(fn, inputs, bwd))
            med = {key: statistics.median(v) for key, v in times.items()}
            rows.append((s, case, med))
            print(f"{s} {case}: fwd A {med[('A', False)]:.3f} B {med[('B', False)]:.3f} ms "
                  f"({med[('A', False)] / med[('B', False)]:.3f}x) | fwd+bwd A {med[('A', True)]:.3f} "
                  f"B {med[('B', True)]:.3f} ms ({med[('A', True)] / med[('B', True)]:.3f}x)", flush=True)
        if args.profile:
            use(new_module)
            profile(cases["acp"][0], cases["acp"][1], f"{s} ACP fwd+bwd (B)")
    dense = {s: m for s, c, m in rows if c == "dense"}
    print("\n| shape | case | fwd A ms | fwd B ms | B speed-up | fwd+bwd A ms | fwd+bwd B ms | B speed-up | "
          "ACP fwd+bwd speed-up over dense, A | B |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s, case, m in rows:
        acp = "- | -"
        if case == "acp":
            acp = (f"{dense[s][('A', True)] / m[('A', True)]:.2f}x | "
                   f"{dense[s][('B', True)] / m[('B', True)]:.2f}x")
        print(f"| {s} | {case} | {m[('A', False)]:.3f} | {m[('B', False)]:.3f} | "
              f"{m[('A', False)] / m[('B', False)]:.3f}x | {m[('A', True)]:.3f} | {m[('B', True)]:.3f} | "
              f"{m[('A', True)] / m[('B', True)]:.3f}x | {acp} |")
    if args.expect_equal and differ:
        raise SystemExit(f"A and B differ in {differ} case(s)")


if __name__ == "__main__":
    main()
