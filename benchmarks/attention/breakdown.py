"""Where the Forgetting Attention op's time goes (GPU; ``ncu --csv`` also on a CPU).

    python -m benchmarks.attention.breakdown heads      [--shapes S1,S3] [--profile]
    python -m benchmarks.attention.breakdown kernels    [--shapes S2,S3]
    python -m benchmarks.attention.breakdown ceiling    [--shapes S1,S2,S3,S4]
    python -m benchmarks.attention.breakdown spread N   [--shapes S2,S3]
    python -m benchmarks.attention.breakdown boundaries [--shapes S1,S2,S3,S4]
    python -m benchmarks.attention.breakdown host       [--functions N]
    python -m benchmarks.attention.breakdown stalls     [--shapes S1] [--calls 20]
    python -m benchmarks.attention.breakdown backward   [--shapes S1,S2] [--rounds 3]
    python -m benchmarks.attention.breakdown ncu --kernel fwd|fused|dq|dkdv --shape S1 [--acp [--heads H]]
    python -m benchmarks.attention.breakdown ncu --csv EXPORT.csv

heads: dense against ACP fwd / fwd+bwd per head mix (half the heads local, all local, all global), eager and
replayed from a CUDA graph. kernels: each Gluon kernel (forward, dq, dk/dv) alone per head mix, dense and with
ACP's tables, and the tables. ceiling: ACP's ceiling per shape, each Gluon kernel's dense time over its own tiles'
bound (``tile_bound``), the rest of the call unchanged, plus ACP's tables; and each kernel's ACP speedup against
its bound. spread: dense and ACP on N allocations of the inputs and the first again (which time moves between
runs, and whether it follows the addresses or how long the GPU has been busy). boundaries: eager against
CUDA-graph time, and inside one graph replay the kernels' count, the sum of their times, their span and the gaps
between them. host: host microseconds per eager call (backward on autograd's device thread and on the calling
thread), then per host-side stage and kernel launch (``stages.host_stages``), and with --functions N the N
Python functions with the most own time in S1's ACP fwd+bwd (cProfile). stalls: eager fwd+bwd calls as
``bench`` times them (L2 flushed before each), profiled: per kernel of a call, how long the GPU sat idle before it
and when the host launched it, i.e. where an eager call waits for the host. backward: ACP's fwd+bwd with
the one-kernel backward against the dq and dk/dv kernels (``fused_backward=False``), head dim 64. ncu: Nsight
Compute's sampled warp states of one Gluon kernel by SASS region (``ncu.py``; ncu from PATH or ``$NCU``), or of
an existing source-page export.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from benchmarks.attention import ncu as ncu_report
from benchmarks.attention.common import (HEAD_MIXES, SHAPES, acp_inputs, acp_op, bench, bench_graph, capture_graph,
                                         dense_op, graph_time, host_times, kernel_us, make_inputs, make_step,
                                         print_profile, replay_time, rounds_arg, shapes_arg)
from forgetting_transformer import markdown as md

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def heads(shapes, profile=False):
    for s in shapes:
        B, T, H, D = SHAPES[s]
        out = []
        for mix, local in HEAD_MIXES.items():
            inputs, w = acp_inputs(B, T, H, D, local_heads=local(H))
            dense, acp = dense_op(), acp_op(w)
            r = [bench(f, inputs, b) for f in (dense, acp) for b in (False, True)]
            g = [bench_graph(f, inputs, b) for f in (dense, acp) for b in (False, True)]
            if profile and mix == "mixed":
                print_profile(acp, inputs, f"{s} mixed heads, ACP fwd+bwd")
            out.append(f"{mix}: dense {r[0]:.3f}/{r[1]:.3f} acp {r[2]:.3f}/{r[3]:.3f} -> "
                       f"{r[0] / r[2]:.2f}x/{r[1] / r[3]:.2f}x (CUDA graph: dense {g[0]:.3f}/{g[1]:.3f} "
                       f"acp {g[2]:.3f}/{g[3]:.3f} -> {g[0] / g[2]:.2f}x/{g[1] / g[3]:.2f}x)")
        print(f"{s} " + " | ".join(out), flush=True)


def kernels(shapes):
    """Each Gluon kernel alone per head mix (CUDA graph, ms): dense, ACP, and dense over ACP."""
    import torch

    from forgetting_transformer.ops.forgetting_attention import stages as L

    print(md.header(["shape", "mix", "kernel", "dense ms", "ACP ms", "dense / ACP"], "lllrrr"))
    for s in shapes:
        B, T, H, D = SHAPES[s]
        for mix, local in HEAD_MIXES.items():
            (q, k, v, lf), w = acp_inputs(B, T, H, D, local_heads=local(H))
            tables = L.acp_tables(q, k, lf, qk_norm_weights=(w, w))[:2]  # acp_op's tables
            do = torch.randn_like(q)
            pk, pq = L.block_prefix(lf, T)
            res = {}
            for case, tb in (("dense", None), ("acp", tables)):
                o, lse = L.forward(q, k, v, lf, kernel="gluon", acp=tb)
                _, _, delta = L.backward_dq(do, q, k, v, lf, pk, o, lse, kernel="gluon", acp=tb)
                calls = {"fwd": lambda: L.forward(q, k, v, lf, kernel="gluon", acp=tb),
                         "dq": lambda: L.backward_dq(do, q, k, v, lf, pk, o, lse, kernel="gluon", acp=tb),
                         "dkdv": lambda: L.backward_dkdv(do, q, k, v, lf, pq, lse, delta, kernel="gluon", acp=tb)}
                for kind, call in calls.items():
                    res[(case, kind)] = graph_time(call)
            tables_ms = graph_time(lambda: L.acp_tables(q, k, lf, qk_norm_weights=(w, w)))
            for kind in ("fwd", "dq", "dkdv"):
                d, a = res[("dense", kind)], res[("acp", kind)]
                print(md.row([s, mix, kind, f"{d:.4f}", f"{a:.4f}", f"{d / a:.3f}x"]), flush=True)
            print(md.row([s, mix, "ACP tables", "", f"{tables_ms:.4f}", ""]), flush=True)


def tile_bound(lo, lf, T, bm, bn, grid):
    """Tiles of a (bm x bn) tiling of the causal (T x T) square, dense over those ACP's table ``lo`` (on ACP's
    ``grid``, (GM, GN)) leaves: the most that pruning can speed up a kernel with those tiles."""
    from forgetting_transformer.ops.forgetting_attention import acp

    st = acp.tile_stats(lf, None, T, bm, bn, lo=acp.lo_for_tiling(lo, T, *grid, bm, bn))
    return ((st["computed"] + st["pruned"]).sum() / st["computed"].sum()).item()


def gluon_tiles(D):
    """Profiler kernel name -> (query rows, keys) of one tile of each Gluon kernel ACP prunes, at head dim D."""
    from forgetting_transformer.ops.forgetting_attention import stages as L

    return {L.GLUON_KERNELS[kind]: L.GLUON_CONFIGS[kind][D][:2] for kind in L.GLUON_CONFIGS
            if D in L.GLUON_CONFIGS[kind]}


def ceiling(shapes):
    """ACP's ceiling per shape (half the heads local, fwd+bwd from a CUDA graph): every tiled Gluon kernel of the
    dense call (its time from torch.profiler) sped up by its own tiles' bound, everything else in the dense call
    (prefix sums, set-up, d log f, dq rounding) unchanged, plus ACP's tables:
    dense / (sum kernel / bound + (dense - sum kernel) + tables). Also each kernel's ACP time against its bound."""
    from forgetting_transformer.ops.forgetting_attention import stages as L

    print(md.header(["shape", "dense ms", "ACP ms", "ACP speedup", "kernel: dense us -> ACP us (speedup / tile bound)",
                     "rest us", "tables us", "ceiling", "share of the ceiling"], "lrrrlrrrr"))
    for s in shapes:
        B, T, H, D = SHAPES[s]
        inputs, w = acp_inputs(B, T, H, D, local_heads=HEAD_MIXES["mixed"](H))
        q, k, v, lf = inputs
        dense, acp = dense_op(), acp_op(w)
        lo = L.acp_tables(q, k, lf, qk_norm_weights=(w, w))[0]  # acp_op's tables
        dense_ms, acp_ms = (bench_graph(f, inputs, True) for f in (dense, acp))
        kd, ka = kernel_us(dense, inputs), kernel_us(acp, inputs)
        tiles = gluon_tiles(D)
        tiled = {n: t for n, t in kd.items() if n in tiles}
        if not tiled:
            raise SystemExit(f"{s}: no Gluon kernel ran (needs a Hopper GPU and head dim 64 or 128)")
        bounds = {n: tile_bound(lo, lf, T, *tiles[n], L.acp_grid(D)) for n in tiled}
        tables = sum(t for n, t in ka.items() if n.startswith("_acp_"))
        rest = dense_ms * 1e3 - sum(tiled.values())
        ceil = dense_ms * 1e3 / (sum(t / bounds[n] for n, t in tiled.items()) + rest + tables)
        cells = "; ".join(f"{n.replace('_sm90_kernel', '')}: {t:.0f} -> {ka[n]:.0f} "
                          f"({t / ka[n]:.2f}x / {bounds[n]:.2f}x)" for n, t in tiled.items())
        print(md.row([s, f"{dense_ms:.3f}", f"{acp_ms:.3f}", f"{dense_ms / acp_ms:.2f}x", cells, f"{rest:.0f}",
                      f"{tables:.0f}", f"{ceil:.2f}x", f"{dense_ms / acp_ms / ceil:.0%}"]), flush=True)


def spread(shapes, repeats):
    """Dense and ACP (half the heads local) fwd / fwd+bwd from CUDA graphs on ``repeats`` allocations of the same
    inputs in one process (each kept alive, so the addresses differ), then on the first allocation again: one line
    per timing, then each time's min-max."""
    import torch

    for s in shapes:
        B, T, H, D = SHAPES[s]
        allocs = [acp_inputs(B, T, H, D, local_heads=HEAD_MIXES["mixed"](H)) for _ in range(repeats)]
        times = {}
        for r, (inputs, w) in enumerate(allocs + allocs[:1]):
            t = {f"{name} {part}": bench_graph(fn, inputs, bwd) for name, fn in (("dense", dense_op()),
                                                                                  ("acp", acp_op(w)))
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
    """Dense and ACP fwd+bwd (half the heads local): eager and CUDA-graph time (ms), and per graph replay (medians
    of ``replays``, each profiled alone, L2 warm) the kernel count, the sum of their times, their span and the
    gaps between them (us)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    print(md.header(["shape", "case", "eager ms", "CUDA graph ms", "kernels", "sum of kernel times us", "span us",
                     "gaps us"], "llrrrrrr"))
    for s in shapes:
        B, T, H, D = SHAPES[s]
        inputs, w = acp_inputs(B, T, H, D, local_heads=HEAD_MIXES["mixed"](H))
        for case, fn in (("dense", dense_op()), ("ACP", acp_op(w))):
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
            n, tot, span = (statistics.median(r[i] for r in rows) for i in range(3))
            gaps = statistics.median(r[2] - r[1] for r in rows)
            print(md.row([s, case, f"{eager:.4f}", f"{graph_ms:.4f}", f"{n:.0f}", f"{tot:,.1f}", f"{span:,.1f}",
                          f"{gaps:.1f}"]), flush=True)
            del graph


def call_kernels(trace, flush_us=30.0):
    """Per call, its kernels as (name, GPU start, GPU end, host launch time) (us), from a chrome trace (dict) of
    calls each preceded by an L2 flush (a fill kernel longer than ``flush_us``, which starts a call)."""
    events = trace["traceEvents"]
    launch = {e["args"]["correlation"]: e["ts"] for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    calls = []
    for e in kernels:
        row = (e["name"], e["ts"], e["ts"] + e["dur"], launch.get(e["args"].get("correlation")))
        if "FillFunctor" in e["name"] and e["dur"] > flush_us:
            calls.append([("flush", *row[1:])])
        elif calls:
            calls[-1].append(row)
    return calls


def stalls(shapes, calls=20):
    """Eager fwd+bwd, dense and ACP (half the heads local), each call after an L2 flush as ``bench`` times it,
    under the profiler (CUDA activity only: kernels and launch API calls): per kernel in call order the median of
    its time, of the GPU's idle time before it (since the previous kernel, or the flush, ended) and of its launch
    time on the host after the flush's launch (us); then the call's span after the flush against the sum of its
    kernels. Idle time before a kernel that starts as soon as it is launched is time the GPU waited for the host."""
    import json
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")  # as triton's do_bench
    for s in shapes:
        B, T, H, D = SHAPES[s]
        inputs, w = acp_inputs(B, T, H, D, local_heads=HEAD_MIXES["mixed"](H))
        for case, fn in (("dense", dense_op()), ("ACP", acp_op(w))):
            q, k, v, lf = (t.detach().requires_grad_() for t in inputs)
            do = torch.randn_like(q)

            def run():
                flush.zero_()
                fn(q, k, v, lf).backward(do)
                q.grad = k.grad = v.grad = lf.grad = None

            for _ in range(10):
                run()
            torch.cuda.synchronize()
            with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    run()
                torch.cuda.synchronize()
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                prof.export_chrome_trace(f.name)
                with open(f.name) as trace:
                    got = call_kernels(json.load(trace))
            if len(got) != calls or len({len(c) for c in got}) != 1:
                raise SystemExit(f"stalls: expected {calls} calls of one kernel sequence, got {len(got)} calls "
                                 f"with {sorted({len(c) for c in got})} kernels")
            med = statistics.median
            print(f"{s} {case} fwd+bwd, {calls} eager calls: kernel | us | idle before | launched at")
            for i in range(1, len(got[0])):
                dur = med([c[i][2] - c[i][1] for c in got])
                idle = med([c[i][1] - c[i - 1][2] for c in got])
                at = [c[i][3] - c[0][3] for c in got if c[i][3] is not None and c[0][3] is not None]
                at = f"{med(at):8.1f}" if at else "       -"  # (- where the profiler recorded no launch)
                print(f"  {got[0][i][0][:60]:60s} {dur:8.1f} {idle:8.1f} {at}")
            span = med([c[-1][2] - c[0][2] for c in got])
            busy = med([sum(e - b for _, b, e, _ in c[1:]) for c in got])
            print(f"  span after the flush {span:.1f} us, kernels {busy:.1f} us, idle {span - busy:.1f} us "
                  f"(the flush itself {med([c[0][2] - c[0][1] for c in got]):.1f} us)", flush=True)


def backward(shapes, rounds):
    """ACP fwd+bwd from a CUDA graph, backward by the one kernel or by the dq and dk/dv kernels, alternating; ms and
    the speedup over the dense fwd+bwd (one kernel) of each round."""
    from forgetting_transformer.ops.forgetting_attention import use_options

    for r in range(rounds):
        out = []
        for s in shapes:
            B, T, H, D = SHAPES[s]
            if D != 64:
                raise SystemExit(f"backward: the one-kernel backward runs at head dim 64; shape {s} has {D}")
            inputs, w = acp_inputs(B, T, H, D, local_heads=HEAD_MIXES["mixed"](H))
            t = {}
            for fused in (False, True):
                with use_options(fused_backward=fused):
                    t[fused] = bench_graph(acp_op(w), inputs, True)
            dense = bench_graph(dense_op(), make_inputs(B, T, H, D), True)
            out.append(f"{s} dense {dense:.3f} ms, ACP two kernels {t[False]:.3f} ({dense / t[False]:.2f}x), "
                       f"one kernel {t[True]:.3f} ({dense / t[True]:.2f}x)")
        print(f"round {r + 1}: " + " | ".join(out), flush=True)


def host(n=10, reps=15, functions=0):
    """Host microseconds per call (the median of ``reps`` timings of ``n`` back-to-back calls, the GPU not waited
    for): dense / ACP fwd and fwd+bwd at B1 T256 H2 D64 (too small to keep the GPU busy) and at S1, the backward on
    autograd's device thread (the default for CUDA tensors) and on the calling thread
    (``torch.autograd.set_multithreading_enabled(False)``); then where an S1 call's host time goes."""
    import torch

    for name in ("B1 T256 H2 D64", "S1"):
        B, T, H, D = (1, 256, 2, 64) if name != "S1" else SHAPES["S1"]
        (q, k, v, lf), w = acp_inputs(B, T, H, D, local_heads=max(1, H // 2))
        q, k, v, lf = (t.detach().requires_grad_() for t in (q, k, v, lf))
        do = torch.randn_like(q)
        dense, acp = dense_op(), acp_op(w)
        calls = {"dense": lambda: dense(q, k, v, lf), "acp": lambda: acp(q, k, v, lf)}
        for cname, fn in calls.items():
            def fwd():
                with torch.no_grad():
                    fn()

            def fwd_bwd(threads):
                with torch.autograd.set_multithreading_enabled(threads):
                    torch.autograd.grad(fn(), (q, k, v, lf), do)

            t = [statistics.median(host_times(step, n, reps))
                 for step in (fwd, lambda: fwd_bwd(True), lambda: fwd_bwd(False))]
            print(f"host {name} {cname}: fwd {t[0]:.0f} us/call, fwd+bwd {t[1]:.0f} us/call (backward on autograd's "
                  f"device thread), {t[2]:.0f} us/call (on the calling thread)", flush=True)
    host_breakdown(calls, (q, k, v, lf), do)
    if functions:
        host_functions(acp, (q, k, v, lf), do, functions)


def host_functions(fn, inputs, do, top, n=200):
    """The ``top`` Python functions by own (exclusive) host time in ``n`` eager fwd+bwd calls of ``fn`` (the
    backward on the calling thread), from cProfile: which of the launch path's steps (argument binding, cache keys,
    knob and stream look-ups, the driver call, allocations) the host time goes to. cProfile's own overhead inflates
    every row, the cheap calls most."""
    import cProfile
    import pstats

    import torch

    def step():
        with torch.autograd.set_multithreading_enabled(False):
            torch.autograd.grad(fn(*inputs), inputs, do)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        step()
    prof.disable()
    torch.cuda.synchronize()
    print(f"host functions, ACP fwd+bwd (calling thread), {n} calls under cProfile; own and inclusive us per call:")
    stats = pstats.Stats(prof).stats  # {(file, line, name): (prim calls, calls, own s, inclusive s, callers)}
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (file, line, name), (_, calls, own, incl, _) in rows:
        where = f"{os.path.basename(file)}:{line}" if line else file
        print(f"  {own / n * 1e6:7.1f} {incl / n * 1e6:8.1f}  x{calls / n:<5.1f} {name} ({where})")


def host_breakdown(calls, inputs, do, n=50, reps=5):
    """Inclusive host microseconds per eager call in each of the op's host-side stages and kernel launches
    (``stages.host_stages``), the backward on the calling thread, per call of ``calls`` (fwd, fwd+bwd): the
    median over ``reps`` timings of ``n`` calls. Nested stages overlap, so the rows do not add up to the call."""
    import torch

    from forgetting_transformer.ops.forgetting_attention import stages as L

    q, k, v, lf = inputs
    with L.host_stages() as acc:
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
                    acc.clear()  # the stages' sums over this timing's n calls only
                    totals += host_times(step, n, reps=1, warmup=0)
                    for key, val in acc.items():
                        rows.setdefault(key, []).append(val / n * 1e6)
                print(f"host breakdown, {cname} {'fwd+bwd (calling thread)' if bwd else 'fwd'}: "
                      f"{statistics.median(totals):.0f} us/call; inclusive us/call per stage and launch:")
                for key, vals in sorted(rows.items(), key=lambda kv: -statistics.median(kv[1])):
                    print(f"  {key:42s} {statistics.median(vals):7.1f}")


def ncu_launch(kernel, shape, acp, mix="mixed"):
    """Run one Gluon kernel twice (ncu profiles the second launch) at a benchmark shape."""
    import torch

    from forgetting_transformer.ops.forgetting_attention import stages as L

    B, T, H, D = SHAPES[shape]
    tables = None
    if acp:
        (q, k, v, lf), w = acp_inputs(B, T, H, D, local_heads=HEAD_MIXES[mix](H))
        tables = L.acp_tables(q, k, lf, qk_norm_weights=(w, w))[:2]
    else:
        q, k, v, lf = make_inputs(B, T, H, D)
    o, lse = L.forward(q, k, v, lf, kernel="gluon", acp=tables)
    do = torch.randn_like(q)
    pk, pq = L.block_prefix(lf, T)
    for _ in range(2):
        if kernel == "fwd":
            L.forward(q, k, v, lf, kernel="gluon", acp=tables)
        elif kernel == "fused":
            L.backward_fused(do, q, k, v, lf, o, lse, acp=tables)
        elif kernel == "dq":
            L.backward_dq(do, q, k, v, lf, pk, o, lse, kernel="gluon", acp=tables)
        else:
            _, _, delta = L.backward_dq(do, q, k, v, lf, pk, o, lse, kernel="gluon", acp=tables)
            L.backward_dkdv(do, q, k, v, lf, pq, lse, delta, kernel="gluon", acp=tables)
    torch.cuda.synchronize()


def ncu(args, error):
    if args.launch:
        return ncu_launch(args.kernel, args.shape, args.acp, args.heads)
    if args.csv:
        return ncu_report.report(args.csv)
    if args.kernel is None:
        error("give --kernel (to profile) or --csv (to break down an export)")
    if args.heads != "mixed" and not args.acp:
        error(f"--heads {args.heads} needs --acp (the dense kernel has no head mix)")
    if args.kernel == "fused" and args.shape in ("S3", "S4"):
        error(f"--kernel fused runs at head dim 64 (S1, S2); --shape {args.shape} has head dim 128")
    exe = os.environ.get("NCU", "ncu")
    tag = os.path.join(os.path.abspath(args.out), f"{args.kernel}_{args.shape}" +
                       (f"_acp_{args.heads}" if args.acp else ""))
    me = [sys.executable, "-m", "benchmarks.attention.breakdown", "ncu", "--launch", "--kernel", args.kernel,
          "--shape", args.shape, "--heads", args.heads] + (["--acp"] if args.acp else [])
    subprocess.run([exe, "-f", "-k", f"regex:{ncu_report.KERNELS[args.kernel]}", "--launch-skip", "1",
                    "--launch-count", "1", "--section", "SourceCounters", "--section", "WarpStateStats", "-o", tag]
                   + me, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    with open(tag + ".csv", "w") as f:
        subprocess.run([exe, "-i", tag + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                       check=True, stdout=f)
    ncu_report.report(tag + ".csv")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)

    def add(name, shapes, help_):
        p = sub.add_parser(name, help=help_)
        if shapes:
            p.add_argument("--shapes", default=shapes, type=shapes_arg)
        return p

    add("heads", "S1,S3", "dense against ACP per head mix").add_argument(
        "--profile", action="store_true", help="print the kernels of one mixed-heads ACP call per shape")
    add("kernels", "S2,S3", "each Gluon kernel alone per head mix")
    add("ceiling", "S1,S2,S3,S4", "ACP's ceiling from each kernel's tile bound")
    add("spread", "S2,S3", "dense and ACP on N allocations, then the first again").add_argument(
        "repeats", type=rounds_arg, metavar="N")
    add("boundaries", "S1,S2,S3,S4", "eager against CUDA-graph time; the gaps between a call's kernels")
    add("host", None, "host time per eager call, and per stage and launch").add_argument(
        "--functions", type=int, default=0, metavar="N", help="also the N functions with the most own time")
    add("stalls", "S1", "where eager calls wait for the host").add_argument(
        "--calls", type=rounds_arg, default=20, help="profiled calls per case (>= 1)")
    add("backward", "S1,S2", "ACP with the one-kernel backward against the two kernels").add_argument(
        "--rounds", type=rounds_arg, default=3, help="rounds (>= 1)")
    p = add("ncu", None, "Nsight Compute's warp states of one Gluon kernel by SASS region")
    p.add_argument("--kernel", choices=sorted(ncu_report.KERNELS))
    p.add_argument("--shape", default="S1", choices=sorted(SHAPES))
    p.add_argument("--acp", action="store_true", help="with ACP's tables, not dense")
    p.add_argument("--heads", default="mixed", choices=sorted(HEAD_MIXES), help="with --acp: the head mix")
    p.add_argument("--csv", help="break down an existing source-page export instead")
    p.add_argument("--out", default=".", help="where the report and the CSV go")
    p.add_argument("--launch", action="store_true", help=argparse.SUPPRESS)  # (the process ncu profiles)
    args = ap.parse_args(argv)
    if args.what == "ncu":
        return ncu(args, p.error)
    {"heads": lambda: heads(args.shapes, args.profile), "kernels": lambda: kernels(args.shapes),
     "ceiling": lambda: ceiling(args.shapes), "spread": lambda: spread(args.shapes, args.repeats),
     "boundaries": lambda: boundaries(args.shapes),
     "stalls": lambda: stalls(args.shapes, args.calls), "host": lambda: host(functions=args.functions),
     "backward": lambda: backward(args.shapes, args.rounds)}[args.what]()


if __name__ == "__main__":
    main()
