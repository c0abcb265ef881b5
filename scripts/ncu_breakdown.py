"""Where a Gluon kernel's warps spend their time (GPU, Nsight Compute): sampled warp states bucketed by SASS region.

    python scripts/ncu_breakdown.py --kernel fwd|fused|dq|dkdv --shape S1 [--acp [--heads all_global]] [--out DIR]
    python scripts/ncu_breakdown.py --csv SOURCE.csv

The first form profiles the second launch of one Gluon kernel at a bench_attention.py shape (``ncu --section
SourceCounters``, ncu from PATH or the ``NCU`` environment variable; about 15 s; ``fused`` at S1 / S2, head dim
64), exports its source page and breaks it down; the second breaks down an existing export (``ncu -i REPORT
--page source --csv --print-source sass``). The regions:
  * the kernel's start and the workers' dispatch (up to the first BRX); the warp-specialised partitions, the
    workers split at their branches back to the dispatch block (an unconditional BRA to an address before the
    BRX) and the default partition last (up to the last EXIT): those that issue wgmma are consumer warpgroups,
    the others the loader, the writer and the idle warps that pad the last warpgroup (their samples are mostly
    barrier waits and cost no issue slots: a quarter of all samples in a kernel of three consumer warpgroups and
    one loader warp);
  * in each consumer partition, every innermost loop that issues wgmma (a tile loop: its instruction count tells
    the inlined variant, e.g. 599 clean and 830 causal-masked in the forward at head dim 64; iterations = the
    executions of its back-branch, per warp) and the rest ("per item": prologue, epilogue, schedule, waits);
  * the mbarrier retry stubs after the last EXIT.
Prints each region's share of the samples (of all, and of the consumers'), executed warp instructions, samples
per iteration and the top stall reasons; a tile loop that branches inside gets a row per path (its instructions
grouped by how often they ran, with the samples per execution). docs/benchmarks.md (session 20) quotes it.
"""

from __future__ import annotations

import argparse
import collections
import csv
import os
import re
import subprocess
import sys

KERNELS = {"fwd": "fox_fwd_sm90", "fused": "fox_bwd_fused_sm90", "dq": "fox_bwd_dq_sm90", "dkdv": "fox_bwd_dkdv_sm90"}


def load(path):
    """[(offset, sass, samples, executed warp instructions, {stall: samples})] from a source-page CSV export."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[head], [r for r in rows[head + 1:] if r and r[0].startswith("0x")]
    if not data:
        raise SystemExit(f"ncu_breakdown: no SASS rows in {path}")
    col = {name: hdr.index(name) for name in ("Address", "Source", "Warp Stall Sampling (All Samples)",
                                              "Instructions Executed")}
    stalls = [(i, h[len("stall_"):]) for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    base = int(data[0][col["Address"]], 16)
    out = []
    for r in data:
        sass = re.sub(r"BRA (0x[0-9a-f]+)", lambda m: f"BRA {int(m.group(1), 16) - base:#x}",
                      " ".join(r[col["Source"]].split()))
        out.append((int(r[col["Address"]], 16) - base, sass, int(r[col["Warp Stall Sampling (All Samples)"]] or 0),
                    int(r[col["Instructions Executed"]] or 0), {n: int(r[i] or 0) for i, n in stalls}))
    return out


def _target(sass):
    m = re.search(r"BRA (0x[0-9a-f]+)", sass)
    return int(m.group(1), 16) if m else None


def regions(ins):
    """[(name, [instructions])]: start/dispatch, partition k (consumer or not), its tile loops, retry stubs."""
    brx = next((a for a, t, *_ in ins if t.startswith("BRX")), None)
    ends = [a for a, t, *_ in ins if brx is not None and t.startswith("BRA ") and _target(t) is not None
            and _target(t) <= brx]
    last_exit = max((a for a, t, *_ in ins if t.startswith("EXIT")), default=ins[-1][0])
    # the default partition's code comes last (the kernel's first warps branch to it); the workers follow the BRX
    cuts = [0] + ([brx + 16] if brx is not None else []) + [e + 16 for e in ends] + [last_exit + 16, ins[-1][0] + 16]
    back = [(_target(t), a) for a, t, *_ in ins if _target(t) is not None and _target(t) < a]
    out = []
    for k, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
        part = [x for x in ins if lo <= x[0] < hi]
        if not part:
            continue
        if k == 0:
            out.append(("start and dispatch", part))
            continue
        if k == len(cuts) - 2:
            out.append(("mbarrier retry stubs", part))
            continue
        if not any("HGMMA" in x[1] for x in part):
            out.append((f"partition {k} (no wgmma: loader, writer or idle warps)", part))
            continue
        loops = [(a, b) for a, b in back
                 if lo <= a and b < hi and any(a <= x[0] <= b and "HGMMA" in x[1] for x in part)]
        inner = [(a, b) for a, b in loops if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]
        rest = [x for x in part if not any(a <= x[0] <= b for a, b in inner)]
        for a, b in sorted(inner):
            body = [x for x in part if a <= x[0] <= b]
            iters = next(x[3] for x in body if x[0] == b)
            out.append((f"partition {k} tile loop of {len(body)} instructions ({iters} warp iterations)", body))
        out.append((f"partition {k} per item (outside the tile loops)", rest))
    return out


def report(path):
    ins = load(path)
    total = sum(x[2] for x in ins) or 1
    regs = regions(ins)
    consumer = sum(sum(x[2] for x in body) for name, body in regs if "tile loop" in name or "per item" in name) or 1
    lines = [f"{path}: {total} samples, {sum(x[3] for x in ins)} warp instructions executed",
             "| region | samples | of consumers' | warp instructions | samples per iteration | top stalls |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for name, body in regs:
        s = sum(x[2] for x in body)
        m = re.search(r"\((\d+) warp iterations\)", name)
        per = f"{s / (int(m.group(1)) / 4):.3f}" if m and int(m.group(1)) else ""  # 4 warps per warpgroup
        cons = f"{s / consumer:.1%}" if ("tile loop" in name or "per item" in name) else ""
        lines.append(f"| {name} | {s / total:.1%} | {cons} | {sum(x[3] for x in body)} | {per} | {top_stalls(body)} |")
        if m:
            lines += path_rows(body, total, consumer)
    print("\n".join(lines), flush=True)


def path_rows(body, total, consumer):
    """Rows for the paths through a tile loop that branches inside (e.g. ACP's forward: a head, then the masked
    or the clean variant): its instructions grouped by how often they ran, with the samples per execution of
    each group by a warpgroup (4 warps), in address order; none for a loop without inner branches."""
    groups = collections.defaultdict(list)
    for x in body:
        groups[x[3]].append(x)
    if len(groups) < 2:
        return []
    rows = []
    for execs, xs in sorted(groups.items(), key=lambda g: g[1][0][0]):
        s = sum(x[2] for x in xs)
        per = f"{s / (execs / 4):.3f}" if execs else ""
        rows.append(f"| ↳ {len(xs)} instructions run {execs} times | {s / total:.1%} | {s / consumer:.1%} | "
                    f"{execs * len(xs)} | {per} | {top_stalls(xs)} |")
    return rows


def top_stalls(xs):
    """The three largest stall reasons of instructions ``xs`` as shares of their samples."""
    st = collections.Counter()
    for x in xs:
        st.update(x[4])
    s = sum(x[2] for x in xs)
    return ", ".join(f"{k} {v / max(s, 1):.0%}" for k, v in st.most_common(3) if v)


def launch(kernel, shape, acp, heads="mixed"):
    """Run the kernel twice (ncu profiles the second launch) at a bench_attention.py shape."""
    import math

    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_attention import HEAD_MIXES, SHAPES, acp_inputs, make_inputs  # (puts the repo root on sys.path)

    import importlib

    fa = importlib.import_module("forgetting_transformer.ops.forgetting_attention")  # (the package exports the op)

    B, T, H, D = SHAPES[shape]
    sm = D ** -0.5
    tables = None
    if acp:  # bench_attention.py's ACP inputs and tables
        (q, k, v, lf), w = acp_inputs(B, T, H, D, local_heads=HEAD_MIXES[heads](H))
        tables = fa._acp_tables_for(q, k, lf, sm, "auto", math.exp(-10), (w, w))[:2]
    else:
        q, k, v, lf = make_inputs(B, T, H, D)
    o, lse = fa._fwd_launch_sm90(q, k, v, lf, sm, acp_tables=tables)
    do = torch.randn_like(q)
    pk, pq = fa._block_prefix(lf, T)
    for _ in range(2):
        if kernel == "fwd":
            fa._fwd_launch_sm90(q, k, v, lf, sm, acp_tables=tables)
        elif kernel == "fused":
            fa._bwd_fused_sm90(do, q, k, v, lf, o, lse, sm, acp_tables=tables)
        elif kernel == "dq":
            fa._bwd_dq_sm90(do, q, k, v, lf, pk, o, lse, sm, acp_tables=tables)
        else:
            _, _, delta = fa._bwd_dq_sm90(do, q, k, v, lf, pk, o, lse, sm, acp_tables=tables)
            fa._bwd_dkdv_sm90(do, q, k, v, lf, pq, lse, delta, sm, acp_tables=tables)
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", choices=sorted(KERNELS))
    ap.add_argument("--shape", default="S1", choices=["S1", "S2", "S3", "S4"], help="bench_attention.py's shapes")
    ap.add_argument("--acp", action="store_true", help="ACP's tables (half the heads local), not dense")
    ap.add_argument("--heads", default="mixed", choices=["mixed", "all_local", "all_global"],
                    help="with --acp: which heads are local (bench_attention.HEAD_MIXES; default half)")
    ap.add_argument("--csv", help="break down an existing source-page export instead")
    ap.add_argument("--out", default=".", help="where the report and the CSV go")
    ap.add_argument("--launch", action="store_true", help=argparse.SUPPRESS)  # (the process ncu profiles)
    args = ap.parse_args()
    if args.launch:
        return launch(args.kernel, args.shape, args.acp, args.heads)
    if args.csv:
        return report(args.csv)
    if args.kernel is None:
        ap.error("give --kernel (to profile) or --csv (to break down an export)")
    if args.heads != "mixed" and not args.acp:
        ap.error(f"--heads {args.heads} needs --acp (the dense kernel has no head mix)")
    if args.kernel == "fused" and args.shape in ("S3", "S4"):
        ap.error(f"--kernel fused runs at head dim 64 (S1, S2); --shape {args.shape} has head dim 128")
    ncu = os.environ.get("NCU", "ncu")
    tag = os.path.join(args.out, f"{args.kernel}_{args.shape}" + (f"_acp_{args.heads}" if args.acp else ""))
    me = [sys.executable, os.path.abspath(__file__), "--launch", "--kernel", args.kernel, "--shape", args.shape,
          "--heads", args.heads]
    subprocess.run([ncu, "-f", "-k", f"regex:{KERNELS[args.kernel]}", "--launch-skip", "1", "--launch-count", "1",
                    "--section", "SourceCounters", "--section", "WarpStateStats", "-o", tag]
                   + me + (["--acp"] if args.acp else []), check=True, stdout=subprocess.DEVNULL)
    with open(tag + ".csv", "w") as f:
        subprocess.run([ncu, "-i", tag + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                       check=True, stdout=f)
    report(tag + ".csv")


if __name__ == "__main__":
    main()
