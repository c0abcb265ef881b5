"""Where ACP's time goes (GPU): dense vs ACP forward and forward+backward with half the heads local (log f = -1.3,
"mixed"), every head local and every head global (log f = -1e-4), on bench_attention.py's ACP inputs
(QK-normed q/k, threshold "auto"); then the same with extra tile configs offered to the autotuner
(--extra-configs), and the configs it picked.

    python scripts/acp_breakdown.py [--shapes S1,S3] [--extra-configs] [--profile] [--host] [--kernels]
    python scripts/acp_breakdown.py --backward-ab [--shapes S1,S2] [--rounds 3]
    python scripts/acp_breakdown.py --ceiling [--shapes S1,S2,S3,S4]
    python scripts/acp_breakdown.py --spread 4 [--shapes S2,S3]
    python scripts/acp_breakdown.py --boundaries [--shapes S1,S2,S3,S4]

Prints one line per shape and head mix: "dense fwd/fwd+bwd ms, ACP fwd/fwd+bwd ms -> speedups", eager and
replayed from a CUDA graph (GPU time only); --host first prints the host-side cost per call and where it goes
(per launcher function and per kernel launch, at S1). --kernels instead
times the Gluon forward, dq and dk/dv kernels alone (CUDA graph) per head mix, dense and ACP (all_local shows the
cost of short programs: a local head's program computes a few tiles). --backward-ab times ACP's fwd+bwd (half the
heads local) with the one-kernel backward and with the dq and dk/dv kernels (``FOX_FUSED_BWD=0``), alternating
(head dim 64 shapes; the dense fwd+bwd, one kernel, for the ratios). --ceiling prints ACP's ceiling per shape:
each Gluon kernel's dense time over its own tiles' bound (the forward's 64 x 128 tiles, the backward's 64 x 64),
the rest of the call unchanged, plus the tables; and each kernel's ACP speedup against its bound. --spread N
times dense and ACP on N allocations of the inputs and the first again, to see which of the two moves and why.
--boundaries: dense and ACP (half the heads local) fwd+bwd eager (``bench``) and from a CUDA graph, and inside one
graph replay (torch.profiler) the kernels' count, the sum of their times and the span from the first one's start to
the last one's end: the gaps are what the kernel boundaries cost (what programmatic dependent launch could hide).
docs/kernel.md quotes a run (made at commit 2e5f7e4, before this script shared bench_attention.py's inputs and timer).
"""

import argparse
import importlib
import os
import sys

import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# (bench_attention also puts the repo root on sys.path)
from bench_attention import (HEAD_MIXES, SHAPES, acp_inputs, acp_op, bench, bench_graph,  # noqa: E402
                             capture_graph, graph_time, host_times, make_step, profile, profiled, replay_time,
                             rounds_arg)

fa = importlib.import_module("forgetting_transformer.ops.forgetting_attention")
from forgetting_transformer.ops import forgetting_attention  # noqa: E402

EXTRA = {"fwd": [(64, 64, 4, 2), (64, 32, 4, 3), (64, 64, 8, 3), (128, 64, 8, 2)],
         "dq": [(64, 32, 4, 3), (64, 64, 8, 3), (32, 64, 4, 3)],
         "dkdv": [(32, 128, 4, 3), (64, 128, 4, 3), (32, 64, 4, 4)]}


def run(tag, shapes, profile_mixed=False):
    for s in shapes:
        B, T, H, D = SHAPES[s]
        out = []
        for mix, local in HEAD_MIXES.items():
            inputs, w = acp_inputs(B, T, H, D, local_heads=local(H))

            acp = acp_op(w)

            r = [bench(f, inputs, b) for f in (forgetting_attention, acp) for b in (False, True)]
            g = [bench_graph(f, inputs, b) for f in (forgetting_attention, acp) for b in (False, True)]
            if profile_mixed and mix == "mixed":
                profile(acp, inputs, f"{s} mixed heads, ACP fwd+bwd")
            out.append(f"{mix}: dense {r[0]:.3f}/{r[1]:.3f} acp {r[2]:.3f}/{r[3]:.3f} -> "
                       f"{r[0] / r[2]:.2f}x/{r[1] / r[3]:.2f}x (CUDA graph: dense {g[0]:.3f}/{g[1]:.3f} "
                       f"acp {g[2]:.3f}/{g[3]:.3f} -> {g[0] / g[2]:.2f}x/{g[1] / g[3]:.2f}x)")
        print(f"[{tag}] {s} " + " | ".join(out), flush=True)


def kernel_times(shapes):
    """Each Gluon kernel alone per head mix (CUDA graph, ms): dense, ACP, and ACP's share of dense."""
    import torch

    print("| shape | mix | kernel | dense ms | ACP ms | dense / ACP |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for s in shapes:
        B, T, H, D = SHAPES[s]
        sm = D ** -0.5
        for mix, local in HEAD_MIXES.items():
            (q, k, v, lf), w = acp_inputs(B, T, H, D, local_heads=local(H))
            tables = fa._acp_tables_for(q, k, lf, sm, "auto", fa._acp.DEFAULT_EPS, (w, w))[:2]  # acp_op's tables
            do = torch.randn_like(q)
            pk, pq = fa._block_prefix(lf, T)
            res = {}
            for case, tb in (("dense", None), ("acp", tables)):
                o, lse = fa._fwd_launch_sm90(q, k, v, lf, sm, acp_tables=tb)
                _, _, delta = fa._bwd_dq_sm90(do, q, k, v, lf, pk, o, lse, sm, acp_tables=tb)
                calls = {"fwd": lambda: fa._fwd_launch_sm90(q, k, v, lf, sm, acp_tables=tb),
                         "dq": lambda: fa._bwd_dq_sm90(do, q, k, v, lf, pk, o, lse, sm, acp_tables=tb),
                         "dkdv": lambda: fa._bwd_dkdv_sm90(do, q, k, v, lf, pq, lse, delta, sm, acp_tables=tb)}
                for kind, call in calls.items():
                    res[(case, kind)] = graph_time(call)
            res[("acp", "tables")] = graph_time(lambda: fa._acp_tables_for(q, k, lf, sm, "auto", fa._acp.DEFAULT_EPS,
                                                                           (w, w)))
            for kind in ("fwd", "dq", "dkdv"):
                d, a = res[("dense", kind)], res[("acp", kind)]
                print(f"| {s} | {mix} | {kind} | {d:.4f} | {a:.4f} | {d / a:.3f}x |", flush=True)
            print(f"| {s} | {mix} | ACP tables | | {res[('acp', 'tables')]:.4f} | |", flush=True)


# the Gluon kernels whose work ACP prunes -> the (query rows, keys) of one of their tiles at head dim D
TILED = {"fox_fwd_sm90_kernel": lambda D: fa._SM90_CONFIGS[D][:2],
         "fox_bwd_fused_sm90_kernel": lambda D: fa._SM90_BWD_CONFIGS[D][:2],
         "fox_bwd_dq_sm90_kernel": lambda D: fa._SM90_DQ_CONFIGS[D][:2],
         "fox_bwd_dkdv_sm90_kernel": lambda D: fa._SM90_BWD_CONFIGS[D][:2]}


def tile_bound(lo, lf, T, D, bm, bn):
    """Tiles of a (bm x bn) tiling, dense over ACP: the most that pruning can speed up a kernel with those tiles."""
    GM, GN = fa._acp_grid(max(16, D))
    st = fa._acp.tile_stats(lf, None, T, bm, bn, lo=fa._acp.lo_for_tiling(lo, T, GM, GN, bm, bn))
    return ((st["computed"] + st["pruned"]).sum() / st["computed"].sum()).item()


def kernel_us(fn, inputs):
    """GPU microseconds per kernel name (summed) of one fwd+bwd call of ``fn`` (torch.profiler)."""
    import torch

    prof = profiled(fn, inputs, cpu=False)
    out = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.name] = out.get(e.name, 0.0) + e.time_range.elapsed_us()
    return out


def ceiling(shapes):
    """ACP's ceiling per shape (half the heads local, fwd+bwd from a CUDA graph): every tiled Gluon kernel of the
    dense call (``TILED``, its time from torch.profiler) sped up by its own tiles' bound, everything else in the
    dense call (prefix sums, set-up, d log f, dq rounding) unchanged, plus ACP's tables:
    dense / (sum kernel / bound + (dense - sum kernel) + tables). Also each kernel's ACP time against its bound."""
    print("| shape | dense ms | ACP ms | ACP speedup | kernel: dense us -> ACP us (speedup / tile bound) | rest us | "
          "tables us | ceiling | share of the ceiling |")
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for s in shapes:
        B, T, H, D = SHAPES[s]
        inputs, w = acp_inputs(B, T, H, D, local_heads=HEAD_MIXES["mixed"](H))
        q, k, v, lf = inputs

        acp = acp_op(w)

        lo = fa._acp_tables_for(q, k, lf, D ** -0.5, "auto", fa._acp.DEFAULT_EPS, (w, w))[0]  # acp_op's tables
        dense_ms, acp_ms = (bench_graph(f, inputs, True) for f in (forgetting_attention, acp))
        kd, ka = kernel_us(forgetting_attention, inputs), kernel_us(acp, inputs)
        tiled = {n: t for n, t in kd.items() if n in TILED}
        if not tiled:
            raise SystemExit(f"{s}: no Gluon kernel ran (needs a Hopper GPU and head dim 64 or 128)")
        bounds = {n: tile_bound(lo, lf, T, D, *TILED[n](D)) for n in tiled}
        tables = sum(t for n, t in ka.items() if n.startswith("_acp_"))
        rest = dense_ms * 1e3 - sum(tiled.values())
        ceil = dense_ms * 1e3 / (sum(t / bounds[n] for n, t in tiled.items()) + rest + tables)
        cells = "; ".join(f"{n.replace('_sm90_kernel', '')}: {t:.0f} -> {ka[n]:.0f} "
                          f"({t / ka[n]:.2f}x / {bounds[n]:.2f}x)" for n, t in tiled.items())
        print(f"| {s} | {dense_ms:.3f} | {acp_ms:.3f} | {dense_ms / acp_ms:.2f}x | {cells} | {rest:.0f} | "
              f"{tables:.0f} | {ceil:.2f}x | {dense_ms / acp_ms / ceil:.0%} |", flush=True)


def spread(shapes, repeats):
    """Dense and ACP (half the heads local) fwd / fwd+bwd from CUDA graphs on ``repeats`` allocations of the same
    inputs in one process (each kept alive, so the addresses differ), then on the first allocation again: one line
    per timing, then each time's min-max. Shows whether a moving ratio is ACP's time or the dense time's, and (the
    last line against the first) whether it follows the inputs' addresses or the time the GPU has been busy."""
    import torch

    for s in shapes:
        B, T, H, D = SHAPES[s]
        allocs = [acp_inputs(B, T, H, D, local_heads=HEAD_MIXES["mixed"](H)) for _ in range(repeats)]
        times = {}
        for r, (inputs, w) in enumerate(allocs + allocs[:1]):
            acp = acp_op(w)

            t = {f"{name} {part}": bench_graph(fn, inputs, bwd) for name, fn in (("dense", forgetting_attention),
                                                                                  ("acp", acp))
                 for part, bwd in (("fwd", False), ("fwd+bwd", True))}
            for key, val in t.items():
                times.setdefault(key, []).append(val)
            label = f"{r + 1}" if r < repeats else "1 again"
            print(f"{s} {label}: " + ", ".join(f"{key} {val:.4f} ms" for key, val in t.items()) + " -> ACP "
                  f"{t['dense fwd'] / t['acp fwd']:.3f}x / {t['dense fwd+bwd'] / t['acp fwd+bwd']:.3f}x "
                  f"(q at {inputs[0].data_ptr():#x})", flush=True)
        print(f"{s} min-max: " + ", ".join(f"{key} {min(v):.4f}-{max(v):.4f} ms ({max(v) / min(v) - 1:.1%})"
                                           for key, v in times.items()), flush=True)
        del allocs
        torch.cuda.empty_cache()


def replay_gaps(intervals):
    """(sum of the kernels' own times, span from the first start to the last end) of one call's kernel
    ``intervals`` [(start, end), ...] (any unit, any order); span - sum is the time between kernels."""
    if not intervals:
        raise ValueError("replay_gaps: no kernel intervals (did the profiler record the CUDA activity?)")
    return sum(e - s for s, e in intervals), max(e for _, e in intervals) - min(s for s, _ in intervals)


def boundaries(shapes, replays=10):
    """Dense and ACP fwd+bwd (half the heads local): eager and CUDA-graph time (ms, ``bench`` / ``bench_graph``,
    which flush L2 before each call), and per graph replay (medians of ``replays``, each profiled alone, L2 warm)
    the kernel count, the sum of the kernels' times, their span and the gaps between them (us)."""
    import statistics

    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    print("| shape | case | eager ms | CUDA graph ms | kernels | sum of kernel times us | span us | gaps us |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s in shapes:
        B, T, H, D = SHAPES[s]
        inputs, w = acp_inputs(B, T, H, D, local_heads=HEAD_MIXES["mixed"](H))
        for case, fn in (("dense", forgetting_attention), ("ACP", acp_op(w))):
            eager = bench(fn, inputs, True)
            graph = capture_graph(make_step(fn, inputs, True))
            graph_ms = replay_time(graph)  # the one graph that is profiled below
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
            rows = []
            for _ in range(replays):
                with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
                    graph.replay()
                    torch.cuda.synchronize()
                ks = [(e.time_range.start, e.time_range.end) for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA]
                rows.append((len(ks),) + replay_gaps(ks))
            n = statistics.median(r[0] for r in rows)
            tot = statistics.median(r[1] for r in rows)
            span = statistics.median(r[2] for r in rows)
            gaps = statistics.median(r[2] - r[1] for r in rows)
            print(f"| {s} | {case} | {eager:.4f} | {graph_ms:.4f} | {n:.0f} | {tot:,.1f} | {span:,.1f} | {gaps:.1f} |",
                  flush=True)
            del graph


def backward_ab(shapes, rounds):
    """ACP fwd+bwd from a CUDA graph, backward by the one kernel or by the dq and dk/dv kernels, alternating; ms and
    the speed-up over the dense fwd+bwd (one kernel) of each round."""
    from bench_attention import make_inputs

    saved = os.environ.get("FOX_FUSED_BWD")
    try:
        for r in range(rounds):
            out = []
            for s in shapes:
                B, T, H, D = SHAPES[s]
                if D != 64:
                    raise SystemExit(f"--backward-ab: the one-kernel backward runs at head dim 64; shape {s} has {D}")
                inputs, w = acp_inputs(B, T, H, D, local_heads=HEAD_MIXES["mixed"](H))

                acp = acp_op(w)

                t = {}
                for flag in ("0", "1"):
                    os.environ["FOX_FUSED_BWD"] = flag
                    t[flag] = bench_graph(acp, inputs, True)
                dense = bench_graph(forgetting_attention, make_inputs(B, T, H, D), True)
                out.append(f"{s} dense {dense:.3f} ms, ACP two kernels {t['0']:.3f} ({dense / t['0']:.2f}x), "
                           f"one kernel {t['1']:.3f} ({dense / t['1']:.2f}x)")
            print(f"round {r + 1}: " + " | ".join(out), flush=True)
    finally:
        if saved is None:
            os.environ.pop("FOX_FUSED_BWD", None)
        else:
            os.environ["FOX_FUSED_BWD"] = saved


def host_cost(n=10, reps=15):
    """Host-side cost of one call (wall time per call of ``n`` back-to-back calls, the median of ``reps`` timings;
    the GPU is not waited for within them): dense / ACP fwd and fwd+bwd at B1 T256 H2 D64 (too small to keep the
    GPU busy) and at S1, fwd+bwd with autograd's default multithreaded backward (a CUDA backward runs on autograd's
    device thread) and single-threaded (``torch.autograd.set_multithreading_enabled(False)``: it runs on the
    calling thread); then where an eager call's host time goes (``host_breakdown``)."""
    import statistics

    import torch

    def per_call(step):
        return statistics.median(host_times(step, n, reps))

    for shape in ("B1 T256 H2 D64", "S1"):
        B, T, H, D = (1, 256, 2, 64) if shape != "S1" else SHAPES["S1"]
        (q, k, v, lf), w = acp_inputs(B, T, H, D, local_heads=max(1, H // 2))
        q, k, v, lf = (t.detach().requires_grad_() for t in (q, k, v, lf))
        do = torch.randn_like(q)
        acp = acp_op(w)
        calls = {"dense": lambda: forgetting_attention(q, k, v, lf), "acp": lambda: acp(q, k, v, lf)}
        for name, fn in calls.items():
            def fwd():
                with torch.no_grad():
                    fn()

            def fwd_bwd(threads):
                with torch.autograd.set_multithreading_enabled(threads):
                    torch.autograd.grad(fn(), (q, k, v, lf), do)

            t = [per_call(fwd), per_call(lambda: fwd_bwd(True)), per_call(lambda: fwd_bwd(False))]
            print(f"host {shape} {name}: fwd {t[0]:.0f} us/call, fwd+bwd {t[1]:.0f} us/call (backward on autograd's "
                  f"device thread), {t[2]:.0f} us/call (on the calling thread)", flush=True)
    host_breakdown(calls, (q, k, v, lf), do)


# the op's launchers and checks whose inclusive host time host_breakdown reports (functions of forgetting_attention.py)
LAUNCHERS = ("_forgetting_attention_triton", "check_inputs", "_check_kernel_inputs", "_row_bounds", "_acp_tables_for",
             "_acp_launch", "_fwd_impl", "_fwd_launch_sm90", "_block_prefix", "_bwd_impl", "_bwd_launch",
             "_use_fused_bwd", "_use_sm90", "_bwd_fused_sm90", "_bwd_fused_setup", "_bwd_dlogf", "_tma_desc",
             "_tma_vec", "_query_vec")


def host_breakdown(calls, inputs, do, n=50, reps=5):
    """Inclusive host microseconds per eager call spent in each of the op's launchers (``LAUNCHERS``) and in each
    kernel's launch (``JITFunction.run``: triton's argument binding and specialisation, the TMA descriptors'
    encoding, the driver call), with the backward on the calling thread, for each of ``calls`` (fwd, fwd+bwd):
    the median over ``reps`` timings of ``n`` calls. Timers wrap the module's functions (~0.3 us each), so nested
    rows overlap and the rows do not add up to the call."""
    import statistics
    import time

    import torch
    from triton.runtime.jit import JITFunction

    acc = {}

    def timed(name, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                acc[name] = acc.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    run = JITFunction.run

    def timed_run(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return run(self, *a, **kw)
        finally:
            key = f"launch {self.fn.__name__}"
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0

    saved = {name: getattr(fa, name) for name in LAUNCHERS}
    q, k, v, lf = inputs
    try:
        JITFunction.run = timed_run
        for name in LAUNCHERS:
            setattr(fa, name, timed(name, saved[name]))
        for cname, fn in calls.items():
            for bwd in (False, True):
                def step():
                    if bwd:
                        with torch.autograd.set_multithreading_enabled(False):
                            torch.autograd.grad(fn(), (q, k, v, lf), do)
                    else:
                        with torch.no_grad():
                            fn()
                for _ in range(3):
                    step()
                totals, rows = [], {}
                for _ in range(reps):
                    acc.clear()  # the timers' sums over this timing's n calls only
                    totals += host_times(step, n, reps=1, warmup=0)
                    for key, val in acc.items():
                        rows.setdefault(key, []).append(val / n * 1e6)
                print(f"host breakdown, {cname} {'fwd+bwd (calling thread)' if bwd else 'fwd'}: "
                      f"{statistics.median(totals):.0f} us/call; inclusive us/call per function and launch:")
                for key, vals in sorted(rows.items(), key=lambda kv: -statistics.median(kv[1])):
                    print(f"  {key:42s} {statistics.median(vals):7.1f}")
    finally:
        JITFunction.run = run
        for name, fn in saved.items():
            setattr(fa, name, fn)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="S1,S3")
    ap.add_argument("--extra-configs", action="store_true")
    ap.add_argument("--profile", action="store_true", help="print the kernels of one mixed-heads ACP call per shape")
    ap.add_argument("--host", action="store_true", help="first measure the host-side cost per call and where it goes")
    ap.add_argument("--kernels", action="store_true", help="time each Gluon kernel alone per head mix instead")
    ap.add_argument("--backward-ab", action="store_true",
                    help="ACP fwd+bwd with the one-kernel backward against the dq and dk/dv kernels instead")
    ap.add_argument("--ceiling", action="store_true",
                    help="ACP's ceiling from each Gluon kernel's own tile bound, and each kernel against it, instead")
    ap.add_argument("--spread", type=rounds_arg, default=0, metavar="N",
                    help="time dense and ACP on N allocations of the inputs, then the first again, instead (>= 1)")
    ap.add_argument("--boundaries", action="store_true",
                    help="eager against CUDA-graph time, and the gaps between a call's kernels, instead")
    ap.add_argument("--rounds", type=rounds_arg, default=3, help="rounds of --backward-ab")
    args = ap.parse_args()
    shapes = args.shapes.split(",")
    if args.boundaries:
        boundaries(shapes)
        return
    if args.backward_ab:
        backward_ab(shapes, args.rounds)
        return
    if args.kernels:
        kernel_times(shapes)
        return
    if args.ceiling:
        ceiling(shapes)
        return
    if args.spread:
        spread(shapes, args.spread)
        return
    if args.host:
        host_cost()
    run("default configs", shapes, args.profile)
    if args.extra_configs:
        orig = fa._gpu_configs

        def more(kind):
            return orig(kind) + [triton.Config(dict(BLOCK_M=m, BLOCK_N=n), num_warps=nw, num_stages=st)
                                 for m, n, nw, st in EXTRA[kind]]

        fa._gpu_configs = more
        fa._KERNELS.clear()
        fa._TUNED.clear()
        run("extended configs", shapes)
    for (kind, _), kern in fa._KERNELS.items():  # the autotuner's picks (key: ..., argument dtypes)
        for key, cfg in getattr(kern, "cache", {}).items():
            print(kind, key[-8:], cfg, flush=True)


if __name__ == "__main__":
    main()
