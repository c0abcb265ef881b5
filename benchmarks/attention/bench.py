"""The Forgetting Attention op against its peers, and ACP's speedup (GPU).

    python -m benchmarks.attention.bench [--shapes S1,S2,S3,S4] [--no-flex] [--no-fla] [--no-acp]
                                         [--acp-rounds 3] [--out FILE]
    python -m benchmarks.attention.bench --acp-only [--acp-rounds 3] [--profile-acp]
    python -m benchmarks.attention.bench --profile-dense [--shapes S1]

For each shape: forward and forward+backward median ms and TFLOP/s (``common.py``'s convention), each as a ratio
to PyTorch SDPA flash (FlashAttention-2, no gate) in the same run, for: ``ours`` (the op, all four gradients),
``sdpa_flash`` and ``sdpa_cudnn`` (no gate), ``flex_fox`` (FlexAttention with a FoX score_mod, gradients to q, k,
v and log f) and ``fla_fox`` (flash-linear-attention's ``parallel_forgetting_attn``; needs fla). Then ACP with
half the heads local (``--no-acp`` skips it): dense and ACP alternately for ``--acp-rounds`` rounds (medians),
eager and replayed from a CUDA graph, the tile bound (the most pruning can give with the forward's tiles), and
ACP's threshold + tables per call. Prints Markdown; ``--out FILE`` also writes it (with the device, versions
and command) to FILE.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks.attention.common import (HEAD_MIXES, SHAPES, acp_inputs, acp_op, bench, bench_graph, dense_op,
                                         environment, flops_fwd, graph_time, make_inputs, print_profile,
                                         rounds_arg, shapes_arg, write_markdown)
from forgetting_transformer import markdown as md


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


def bench_peers(shapes, flex=True, fla=True):
    """The peer table's Markdown lines (one row per shape and method)."""
    methods = {"ours": dense_op, "sdpa_flash": lambda: method_sdpa("flash"), "sdpa_cudnn": lambda: method_sdpa("cudnn")}
    if flex:
        methods["flex_fox"] = method_flex
    if fla:
        methods["fla_fox"] = method_fla
    fns = {}
    for name, mk in methods.items():
        try:
            fns[name] = mk()
        except Exception as e:  # noqa: BLE001 (a peer that is not installed is skipped, by name)
            print(f"[skip] {name}: {type(e).__name__}: {e}", flush=True)
    lines = [md.header(["shape (B,T,H,D)", "method", "fwd ms", "fwd TFLOP/s", "fwd ratio", "fwd+bwd ms",
                        "fwd+bwd TFLOP/s", "fwd+bwd ratio"], "llrrrrrr")]
    for sname in shapes:
        B, T, H, D = SHAPES[sname]
        inputs = make_inputs(B, T, H, D)
        ff = flops_fwd(B, T, H, D)
        res = {}
        for name, fn in fns.items():
            for bwd in (False, True):
                t0 = time.time()
                try:
                    ms = bench(fn, inputs, bwd)
                except Exception as e:  # noqa: BLE001 (a failing peer is reported in its row)
                    print(f"[fail] {sname} {name} bwd={bwd}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    ms = float("nan")
                res[(name, bwd)] = ms
                print(f"{sname} {name:11s} {'fwd+bwd' if bwd else 'fwd':7s} {ms:9.3f} ms "
                      f"{(3.5 if bwd else 1.0) * ff / ms / 1e9:7.1f} TFLOP/s  ({time.time() - t0:.0f}s)", flush=True)
        ref = {bwd: res.get(("sdpa_flash", bwd), float("nan")) for bwd in (False, True)}
        for name in fns:
            f_ms, b_ms = res[(name, False)], res[(name, True)]
            lines.append(md.row([f"{sname} {(B, T, H, D)}", name, f"{f_ms:.3f}", f"{ff / f_ms / 1e9:.1f}",
                                 f"{ref[False] / f_ms:.2f}", f"{b_ms:.3f}", f"{3.5 * ff / b_ms / 1e9:.1f}",
                                 f"{ref[True] / b_ms:.2f}"]))
        torch.cuda.empty_cache()
    return lines


def bench_acp(shapes, profile_acp=False, rounds=3):
    """ACP's table (Markdown lines): half the heads local (log f = -1.3), half global (-1e-4), QK-normed q / k,
    threshold "auto" with eps = e^-10, over our own dense time. Dense and ACP are timed alternately for ``rounds``
    rounds, each time the median of its rounds: the dense time alone moves by a few percent between timings with
    the GPU's clocks (``breakdown spread``), which one timing of each would put into the ratio."""
    import triton

    from forgetting_transformer.ops.forgetting_attention import stages as launchers

    rows, prep_lines = [], []
    for sname in shapes:
        B, T, H, D = SHAPES[sname]
        (q, k, v, lf), w = acp_inputs(B, T, H, D, local_heads=HEAD_MIXES["mixed"](H))
        dense, acp = dense_op(), acp_op(w)
        _, st = acp_op(w, return_stats=True)(q, k, v, lf)
        tiles = (st["computed"] + st["pruned"]).sum().item() / st["computed"].sum().item()
        runs = [([bench(f, (q, k, v, lf), bwd) for f in (dense, acp) for bwd in (False, True)],
                 [bench_graph(f, (q, k, v, lf), bwd) for f in (dense, acp) for bwd in (False, True)])
                for _ in range(rounds)]
        res, gr = ([statistics.median(r[i][j] for r in runs) for j in range(4)] for i in (0, 1))
        tables = [lambda ws=ws: launchers.acp_tables(q, k, lf, qk_norm_weights=ws) for ws in ((w, w), None)]
        prep = [triton.testing.do_bench(t, warmup=25, rep=100, return_mode="median") for t in tables]
        prep_graph = [graph_time(t) * 1e3 for t in tables]
        prep_lines.append(md.row([sname, f"{prep[0]:.3f}", f"{prep[1]:.3f}", f"{prep_graph[0]:.1f}",
                                  f"{prep_graph[1]:.1f}"]))
        if profile_acp:
            print_profile(acp, (q, k, v, lf), f"{sname} ACP fwd+bwd")
        rows.append(md.row([f"{sname} {(B, T, H, D)}", *(f"{x:.3f}" for x in res), f"{res[0] / res[2]:.2f}x",
                            f"{res[1] / res[3]:.2f}x", f"{gr[0] / gr[2]:.2f}x", f"{gr[1] / gr[3]:.2f}x",
                            f"{tiles:.2f}x"]))
        print(rows[-1], flush=True)
    return [
        "", f"ACP, half the heads local: eager ms (medians of {rounds} rounds alternating dense and ACP), and the "
        "speedups eager and replayed from a CUDA graph (GPU time).", "",
        md.header(["shape (B,T,H,D)", "dense fwd ms", "dense fwd+bwd ms", "ACP fwd ms", "ACP fwd+bwd ms", "fwd speedup",
                   "fwd+bwd speedup", "CUDA graph fwd speedup", "CUDA graph fwd+bwd speedup", "tile bound"]), *rows,
        "", "ACP's threshold + tables per call:", "",
        md.header(["shape", "eager ms, from QK-norm weights", "eager ms, from the q / k norms",
                   "CUDA graph us, weights", "CUDA graph us, norms"]), *prep_lines,
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="S1,S2,S3,S4", type=shapes_arg)
    ap.add_argument("--no-flex", action="store_true", help="without FlexAttention")
    ap.add_argument("--no-fla", action="store_true", help="without fla's FoX kernel")
    ap.add_argument("--no-acp", action="store_true", help="without the ACP table")
    ap.add_argument("--acp-only", action="store_true", help="only the ACP table")
    ap.add_argument("--acp-rounds", type=rounds_arg, default=3,
                    help="rounds of alternating dense / ACP timings (medians; >= 1)")
    ap.add_argument("--profile-acp", action="store_true", help="print the kernels of one ACP call per shape")
    ap.add_argument("--profile-dense", action="store_true",
                    help="only print the kernels of one dense fwd+bwd call per shape")
    ap.add_argument("--out", default=None, help="also write the tables (Markdown) to this file")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench: needs a CUDA GPU")
    if args.profile_dense:
        for s in args.shapes:
            print_profile(dense_op(), make_inputs(*SHAPES[s]), f"{s} {SHAPES[s]}, dense fwd+bwd")
        return
    header = environment()
    print(header, flush=True)
    lines = [] if args.acp_only else bench_peers(args.shapes, not args.no_flex, not args.no_fla)
    if not args.no_acp:
        lines += bench_acp(args.shapes, args.profile_acp, args.acp_rounds)
    command = f"python -m benchmarks.attention.bench {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip()
    text = "\n".join([f"- {header}", f"- command: `{command}`", ""] + lines) + "\n"
    print("\n" + text)
    if args.out:
        write_markdown(args.out, text)


if __name__ == "__main__":
    main()
