"""Benchmark Forgetting Attention kernels against peers (GPU only).

    python scripts/bench_attention.py [--out docs/benchmarks.md] [--shapes S1,S2,S3,S4] [--no-flex] [--no-fla]

For each shape prints forward and forward+backward median ms and TFLOP/s (FlashAttention's convention:
fwd = 4*B*H*T^2*D/2 causal, bwd = 2.5x fwd), each as a ratio to PyTorch SDPA flash (no gate) measured in the
same run, for: ours (Triton FoX kernel, all four gradients), SDPA flash (no gate), SDPA cuDNN (no gate),
FlexAttention with a FoX score_mod (gradients to q, k, v and log f), fla's parallel_forgetting_attn.
Writes a markdown table (device, torch / triton versions, command) to --out.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHAPES = {  # name: (B, T, H, D)
    "S1": (4, 4096, 16, 64),
    "S2": (1, 16384, 16, 64),
    "S3": (2, 8192, 8, 128),
    "S4": (1, 32768, 8, 128),
}


def flops_fwd(B, T, H, D):
    return 4 * B * H * T * T * D / 2


def make_inputs(B, T, H, D, dtype=torch.bfloat16, seed=0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, T, H, D, device=device, dtype=dtype, generator=g)
    k = torch.randn(B, T, H, D, device=device, dtype=dtype, generator=g)
    v = torch.randn(B, T, H, D, device=device, dtype=dtype, generator=g)
    lf = F.logsigmoid(torch.randn(B, T, H, device=device, generator=g) + 4.0).float()
    return q, k, v, lf


def method_ours():
    from forgetting_transformer.ops import forgetting_attention

    def fn(q, k, v, lf):
        return forgetting_attention(q, k, v, lf)

    return fn


def method_sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def fn(q, k, v, lf):
        with sdpa_kernel([be]):
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return o.transpose(1, 2)

    return fn


def method_flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    masks = {}

    def fn(q, k, v, lf):
        B, T, H, D = q.shape
        if T not in masks:
            masks[T] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, T, T, device="cuda")
        c = torch.cumsum(lf, dim=1).transpose(1, 2)  # (B, H, T), differentiable
        # Flex allows one indexing op per grad-requiring captured tensor: index two copies.
        cq, ck = c.contiguous(), c.clone(memory_format=torch.contiguous_format)

        def score_mod(score, b, h, qi, ki):
            return score + cq[b, h, qi] - ck[b, h, ki]

        o = flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), score_mod=score_mod, block_mask=masks[T])
        return o.transpose(1, 2)

    return fn


def method_fla():
    from fla.ops.forgetting_attn.parallel import parallel_forgetting_attn

    def fn(q, k, v, lf):
        return parallel_forgetting_attn(q, k, v, lf)

    return fn


def bench(fn, inputs, backward):
    import triton

    q, k, v, lf = inputs
    if backward:
        q, k, v, lf = (t.detach().requires_grad_() for t in (q, k, v, lf))
        do = torch.randn_like(q)

        def run():
            o = fn(q, k, v, lf)
            o.backward(do)
            q.grad = k.grad = v.grad = lf.grad = None
    else:

        def run():
            with torch.no_grad():
                fn(q, k, v, lf)

    run()
    torch.cuda.synchronize()
    return triton.testing.do_bench(run, warmup=100, rep=400, return_mode="median")


def make_step(fn, inputs, backward):
    """A closure making one call of ``fn`` on detached copies of ``inputs`` (q, k, v, lf): the forward under
    ``no_grad``, or (``backward``) the forward and the four gradients."""
    q, k, v, lf = (t.detach().requires_grad_(backward) for t in inputs)
    do = torch.randn_like(q)

    def step():
        if backward:
            torch.autograd.grad(fn(q, k, v, lf), (q, k, v, lf), do)
        else:
            with torch.no_grad():
                fn(q, k, v, lf)

    return step


def bench_graph(fn, inputs, backward):
    """GPU time of one call of ``fn`` (fwd, or fwd + the four gradients) replayed from a CUDA graph: the same
    kernels as ``bench`` without the host-side launch cost (Python, autotuner dispatch, autograd)."""
    return graph_time(make_step(fn, inputs, backward))


def host_times(step, n=10, reps=15, warmup=3):
    """Host microseconds per call of ``step()``, one value per timing of ``n`` back-to-back calls (the GPU not
    waited for within a timing; synchronised before and after it), ``reps`` timings after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        ts.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return ts


def capture_graph(step):
    """``step()`` captured in a CUDA graph; the first calls (autotuning, compiles) run before, outside the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def replay_time(graph):
    """GPU time (ms) of one replay of a captured CUDA ``graph`` (median of do_bench, which flushes L2 before each)."""
    import triton

    return triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median")


def graph_time(step):
    """GPU time of ``step()`` replayed from a CUDA graph (``capture_graph``, ``replay_time``)."""
    return replay_time(capture_graph(step))


SWEEP = {  # (BLOCK_M, BLOCK_N, num_warps, num_stages): the autotuned lists (ops/forgetting_attention.py) and more
    "fwd": [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 4, 4),
            (128, 32, 4, 3), (256, 64, 8, 3), (128, 128, 8, 4), (64, 128, 4, 3), (256, 32, 8, 3)],
    "dq": [(64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 4), (128, 32, 4, 3), (64, 32, 4, 2),
           (32, 64, 4, 3), (64, 128, 8, 3), (128, 128, 8, 2), (128, 32, 8, 3), (128, 64, 8, 4), (64, 64, 8, 3)],
    "dkdv": [(64, 64, 4, 3), (64, 128, 8, 3), (32, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 4), (32, 64, 4, 2),
             (64, 64, 4, 2), (64, 64, 4, 5), (64, 32, 4, 3), (128, 128, 8, 3), (32, 128, 8, 3), (128, 64, 8, 3),
             (64, 128, 8, 2), (64, 64, 8, 3), (32, 128, 4, 3), (64, 128, 8, 4)],
}


def sweep(shapes):
    """Time each kernel of ours alone under each config in SWEEP (one line per config)."""
    import triton

    import importlib

    fa = importlib.import_module("forgetting_transformer.ops.forgetting_attention")

    for sname in shapes:
        B, T, H, D = SHAPES[sname]
        q, k, v, lf = make_inputs(B, T, H, D)
        sm = D ** -0.5
        ff = flops_fwd(B, T, H, D)
        o, lse = fa._fwd_launch(q, k, v, lf, None, sm)
        do = torch.randn_like(q)
        pk, pq = fa._block_prefix(lf, T)
        dq, drow, delta = fa._bwd_dq(do, q, k, v, lf, pk, o, lse, None, sm)
        dk, dv, dcol = fa._bwd_dkdv(do, q, k, v, lf, pq, lse, delta, None, None, sm)
        bench_ = lambda f: triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median")  # noqa: E731
        print(f"{sname} dlogf {bench_(lambda: fa._bwd_dlogf(drow, dcol)):.3f} ms; whole bwd (autotuned) "
              f"{bench_(lambda: fa._bwd_launch(do, q, k, v, lf, o, lse, None, None, sm)):.3f} ms", flush=True)
        calls = {
            "fwd": (lambda: fa._fwd_launch(q, k, v, lf, None, sm), 1.0),
            "dq": (lambda: fa._bwd_dq(do, q, k, v, lf, pk, o, lse, None, sm), 1.5),
            "dkdv": (lambda: fa._bwd_dkdv(do, q, k, v, lf, pq, lse, delta, None, None, sm), 2.0),
        }
        for kind, (call, mult) in calls.items():
            for m, n, w, st in SWEEP[kind]:
                if D >= 128 and m * n > 128 * 64 and kind != "fwd":
                    continue
                fa._FORCE_CONFIGS[kind] = (dict(BLOCK_M=m, BLOCK_N=n), w, st)
                try:
                    ms = bench_(call)
                    print(f"{sname} {kind:5s} M{m:<4d}N{n:<4d}w{w} s{st}: {ms:8.3f} ms "
                          f"{mult * ff / ms / 1e9:6.1f} TFLOP/s", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"{sname} {kind:5s} M{m:<4d}N{n:<4d}w{w} s{st}: failed {type(e).__name__} {str(e)[:100]}",
                          flush=True)
                fa._FORCE_CONFIGS.pop(kind)


def profiled(fn, inputs, cpu=True):
    """torch.profiler's record of one forward+backward call of ``fn`` on ``inputs``, after three unrecorded calls
    (compiles, autotuning); ``cpu``: record the host-side ops too."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    q, k, v, lf = (t.detach().requires_grad_() for t in inputs)
    do = torch.randn_like(q)
    for _ in range(3):
        fn(q, k, v, lf).backward(do)
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CPU] * cpu + [ProfilerActivity.CUDA]) as prof:
        fn(q, k, v, lf).backward(do)
        torch.cuda.synchronize()
    return prof


def profile(fn, inputs, title):
    """Print the GPU kernels of one forward+backward call of ``fn`` (torch.profiler), largest first."""
    prof = profiled(fn, inputs)
    print(f"--- profile: {title}", flush=True)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60), flush=True)
    # the GPU kernels in launch order, with their times (the gaps between them are not shown)
    gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print("kernels in order: " + " | ".join(f"{e.name[:28]} {e.time_range.elapsed_us():.0f}us" for e in gpu),
          flush=True)


# ACP's head mixes: the number of local heads among H (the benchmark's is "mixed")
HEAD_MIXES = {"mixed": lambda H: H // 2, "all_local": lambda H: H, "all_global": lambda H: 0}


def acp_inputs(B, T, H, D, local_heads, dtype=torch.bfloat16, device="cuda"):
    """ACP's benchmark inputs: q / k QK-normed (RMSNorm with unit weights, returned as ``w``), log f = -1.3 for the
    first ``local_heads`` heads (local) and -1e-4 for the others (global). Returns (q, k, v, lf), w."""
    q, k, v, _ = make_inputs(B, T, H, D, dtype=dtype, device=device)
    q = (F.normalize(q.float(), dim=-1) * D ** 0.5).to(dtype)
    k = (F.normalize(k.float(), dim=-1) * D ** 0.5).to(dtype)
    lf = torch.full((B, T, H), -1e-4, device=device)
    lf[..., :local_heads] = -1.3
    return (q, k, v, lf), torch.ones(D, device=device)


def acp_op(w, **kwargs):
    """The op with ACP as the benchmark calls it: threshold "auto" (eps = e^-10) from the QK-norm weights ``w``
    that ``acp_inputs`` returns, plus ``kwargs`` (e.g. ``return_stats=True``); ``fn(q, k, v, lf)``."""
    from forgetting_transformer.ops import forgetting_attention

    return lambda q, k, v, lf: forgetting_attention(q, k, v, lf, adaptive_threshold="auto", qk_norm_weights=(w, w),
                                                    **kwargs)


def bench_acp(shapes, profile_acp=False, rounds=3):
    """ACP speedup over our own dense time: half the heads local (log f = -1.3), half global (-1e-4), QK-normed
    q / k (RMSNorm, unit weights), threshold 'auto' with eps = e^-10. Dense and ACP are timed alternately for
    ``rounds`` rounds and each time is the median of its rounds: the dense time alone moves by a few percent
    between timings on the H200 (docs/benchmarks.md, session 15), which one timing of each put into the ratio."""
    from forgetting_transformer.ops import forgetting_attention

    rows = []
    for sname in shapes:
        B, T, H, D = SHAPES[sname]
        (q, k, v, lf), w = acp_inputs(B, T, H, D, local_heads=HEAD_MIXES["mixed"](H))
        dense = lambda q, k, v, lf: forgetting_attention(q, k, v, lf)  # noqa: E731
        acp = acp_op(w)
        _, st = acp_op(w, return_stats=True)(q, k, v, lf)
        tiles = (st["computed"] + st["pruned"]).sum().item() / st["computed"].sum().item()
        runs = [([bench(f, (q, k, v, lf), bwd) for f in (dense, acp) for bwd in (False, True)],
                 [bench_graph(f, (q, k, v, lf), bwd) for f in (dense, acp) for bwd in (False, True)])
                for _ in range(rounds)]
        res, gr = ([statistics.median(r[i][j] for r in runs) for j in range(4)] for i in (0, 1))
        import importlib

        import triton

        fa = importlib.import_module("forgetting_transformer.ops.forgetting_attention")
        tables = [lambda ws=ws: fa._acp_tables_for(q, k, lf, D ** -0.5, "auto", math.exp(-10), ws)
                  for ws in ((w, w), None)]
        prep = [triton.testing.do_bench(t, warmup=25, rep=100, return_mode="median") for t in tables]
        prep_graph = [graph_time(t) for t in tables]
        print(f"{sname} ACP threshold + boundary tables: {prep[0]:.3f} ms from QK-norm weights, {prep[1]:.3f} ms "
              f"from the q / k norms (eager calls); from a CUDA graph {prep_graph[0] * 1e3:.1f} / "
              f"{prep_graph[1] * 1e3:.1f} us", flush=True)
        if profile_acp:
            profile(acp, (q, k, v, lf), f"{sname} ACP fwd+bwd")
        rows.append((sname, (B, T, H, D), *res, res[0] / res[2], res[1] / res[3], gr[0] / gr[2], gr[1] / gr[3], tiles))
        print(f"{sname} ACP: dense fwd {res[0]:.3f} ms fwd+bwd {res[1]:.3f} ms | ACP fwd {res[2]:.3f} ms "
              f"fwd+bwd {res[3]:.3f} ms | speedup fwd {res[0] / res[2]:.2f}x fwd+bwd {res[1] / res[3]:.2f}x "
              f"(tile bound {tiles:.2f}x) | CUDA graph: dense {gr[0]:.3f}/{gr[1]:.3f} ms ACP {gr[2]:.3f}/{gr[3]:.3f} ms "
              f"-> {gr[0] / gr[2]:.2f}x/{gr[1] / gr[3]:.2f}x", flush=True)
    lines = [
        "",
        "## ACP (ours, 'auto' threshold, eps = e^-10): half the heads local (log f = -1.3), half global (-1e-4), "
        "QK-normed q/k",
        "",
        "Eager calls (as the table above), and the same calls replayed from a CUDA graph (GPU time only: no Python, "
        f"autotuner or autograd host cost between the kernels); each time the median of {rounds} rounds that alternate "
        "dense and ACP.",
        "",
        "| shape (B,T,H,D) | dense fwd ms | dense fwd+bwd ms | ACP fwd ms | ACP fwd+bwd ms | fwd speedup | "
        "fwd+bwd speedup | CUDA graph fwd speedup | CUDA graph fwd+bwd speedup | tile bound |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for sname, shp, df, db, af, ab, sf, sb, gf, gb, tb in rows:
        lines.append(f"| {sname} {shp} | {df:.3f} | {db:.3f} | {af:.3f} | {ab:.3f} | {sf:.2f}x | {sb:.2f}x | "
                     f"{gf:.2f}x | {gb:.2f}x | {tb:.2f}x |")
    return lines


def rounds_arg(text):
    """A number of timing rounds (argparse type): an int >= 1, else an error naming the value."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"rounds must be >= 1; got {n}")
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-acp", action="store_true")
    ap.add_argument("--acp-only", action="store_true", help="only the ACP table (prints, writes nothing)")
    ap.add_argument("--profile-acp", action="store_true", help="print the kernels of one ACP call per shape")
    ap.add_argument("--profile-dense", action="store_true",
                    help="only print the kernels of one dense fwd+bwd call of ours per shape, then exit")
    ap.add_argument("--acp-rounds", type=rounds_arg, default=3,
                    help="rounds of alternating dense / ACP timings (medians; >= 1)")
    ap.add_argument("--sweep", default="", help="comma list of shapes: time each kernel per config, then exit")
    ap.add_argument("--out", default="docs/benchmarks.md")
    ap.add_argument("--shapes", default="S1,S2,S3,S4")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--no-fla", action="store_true")
    args = ap.parse_args()
    import triton

    if args.sweep:
        sweep(args.sweep.split(","))
        return
    if args.profile_dense:
        for s in args.shapes.split(","):
            profile(method_ours(), make_inputs(*SHAPES[s]), f"{s} {SHAPES[s]}, dense fwd+bwd")
        return
    if args.acp_only:
        print("\n".join(bench_acp(args.shapes.split(","), args.profile_acp, args.acp_rounds)))
        return

    methods = {"ours": method_ours, "sdpa_flash": lambda: method_sdpa("flash"),
               "sdpa_cudnn": lambda: method_sdpa("cudnn")}
    if not args.no_flex:
        methods["flex_fox"] = method_flex
    if not args.no_fla:
        methods["fla_fox"] = method_fla
    fns = {}
    for name, mk in methods.items():
        try:
            fns[name] = mk()
        except Exception as e:  # noqa: BLE001
            print(f"[skip] {name}: {type(e).__name__}: {e}", flush=True)

    dev = torch.cuda.get_device_name()
    header = f"device: {dev}; torch {torch.__version__}; triton {triton.__version__}; python {sys.version.split()[0]}"
    print(header, flush=True)
    rows = []
    for sname in args.shapes.split(","):
        B, T, H, D = SHAPES[sname]
        inputs = make_inputs(B, T, H, D)
        ff = flops_fwd(B, T, H, D)
        res = {}
        for name, fn in fns.items():
            for bwd in (False, True):
                t0 = time.time()
                try:
                    ms = bench(fn, inputs, bwd)
                except Exception as e:  # noqa: BLE001
                    print(f"[fail] {sname} {name} bwd={bwd}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    ms = float("nan")
                res[(name, bwd)] = ms
                print(f"{sname} {name:11s} {'fwd+bwd' if bwd else 'fwd':7s} {ms:9.3f} ms "
                      f"{(3.5 if bwd else 1.0) * ff / ms / 1e9:7.1f} TFLOP/s  ({time.time() - t0:.0f}s)", flush=True)
        for name in fns:
            f_ms, b_ms = res[(name, False)], res[(name, True)]
            ref_f, ref_b = res.get(("sdpa_flash", False), float("nan")), res.get(("sdpa_flash", True), float("nan"))
            rows.append((sname, (B, T, H, D), name, f_ms, ff / f_ms / 1e9, ref_f / f_ms, b_ms, 3.5 * ff / b_ms / 1e9,
                         ref_b / b_ms))
        torch.cuda.empty_cache()

    lines = [
        "# Forgetting Attention benchmark",
        "",
        f"- {header}",
        f"- command: `python scripts/bench_attention.py {' '.join(sys.argv[1:])}`".rstrip(),
        "- bf16 q/k/v, fp32 log f, causal, median of `triton.testing.do_bench`; FLOPs: fwd = 4·B·H·T²·D/2, "
        "fwd+bwd = 3.5× fwd. `ratio` = SDPA-flash time / method time in the same run (>1 is faster than FA2 "
        "without a gate). SDPA flash / cuDNN compute no gate; flex_fox / fla_fox / ours compute FoX with gradients "
        "to q, k, v and log f.",
        "",
        "| shape (B,T,H,D) | method | fwd ms | fwd TFLOP/s | fwd ratio | fwd+bwd ms | fwd+bwd TFLOP/s | fwd+bwd ratio |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for sname, shp, name, fms, ftf, fr, bms, btf, br in rows:
        lines.append(f"| {sname} {shp} | {name} | {fms:.3f} | {ftf:.1f} | {fr:.2f} | {bms:.3f} | {btf:.1f} | {br:.2f} |")
    if not args.no_acp:
        lines += bench_acp(args.shapes.split(","), args.profile_acp, args.acp_rounds)
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
