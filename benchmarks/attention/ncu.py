"""Nsight Compute's sampled warp states of one Gluon kernel, bucketed by SASS region (used by ``breakdown ncu``).

``load`` reads a source-page export (``ncu -i REPORT --page source --csv --print-source sass``); ``regions``
splits the kernel into:
  * its start and the workers' dispatch (up to the first BRX); the warp-specialised partitions, the workers split
    at their branches back to the dispatch block (an unconditional BRA to an address before the BRX) and the
    default partition last (up to the last EXIT): those that issue wgmma are consumer warpgroups, the others the
    loader, the writer and the idle warps that pad the last warpgroup (their samples are mostly barrier waits and
    cost no issue slots);
  * in each consumer partition, every innermost loop that issues wgmma (a tile loop: its instruction count tells
    the inlined variant; iterations = the executions of its back-branch, per warp) and the rest ("per item":
    prologue, epilogue, schedule, waits);
  * the mbarrier retry stubs after the last EXIT.
``report`` prints each region's share of the samples (of all, and of the consumers'), executed warp
instructions, samples per iteration and the top stall reasons; a tile loop that branches inside gets a row per
path (``path_rows``: its instructions grouped by how often they ran, with the samples per execution).
"""

from __future__ import annotations

import collections
import csv
import re

from forgetting_transformer import markdown as md

KERNELS = {"fwd": "fox_fwd_sm90", "fused": "fox_bwd_fused_sm90", "dq": "fox_bwd_dq_sm90", "dkdv": "fox_bwd_dkdv_sm90"}


def load(path):
    """[(offset, sass, samples, executed warp instructions, {stall: samples})] from a source-page CSV export."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[head], [r for r in rows[head + 1:] if r and r[0].startswith("0x")]
    if not data:
        raise SystemExit(f"ncu: no SASS rows in {path}")
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
             md.header(["region", "samples", "of consumers'", "warp instructions", "samples per iteration",
                        "top stalls"], "lrrrrl")]
    for name, body in regs:
        s = sum(x[2] for x in body)
        m = re.search(r"\((\d+) warp iterations\)", name)
        per = f"{s / (int(m.group(1)) / 4):.3f}" if m and int(m.group(1)) else ""  # 4 warps per warpgroup
        cons = f"{s / consumer:.1%}" if ("tile loop" in name or "per item" in name) else ""
        lines.append(md.row([name, f"{s / total:.1%}", cons, sum(x[3] for x in body), per, top_stalls(body)]))
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
        rows.append(md.row([f"↳ {len(xs)} instructions run {execs} times", f"{s / total:.1%}", f"{s / consumer:.1%}",
                            execs * len(xs), per, top_stalls(xs)]))
    return rows


def top_stalls(xs):
    """The three largest stall reasons of instructions ``xs`` as shares of their samples."""
    st = collections.Counter()
    for x in xs:
        st.update(x[4])
    s = sum(x[2] for x in xs)
    return ", ".join(f"{k} {v / max(s, 1):.0%}" for k, v in st.most_common(3) if v)
