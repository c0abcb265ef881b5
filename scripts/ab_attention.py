"""A/B timing of the Forgetting Attention op between two versions of this repo, in alternating processes.

    python scripts/ab_attention.py A B [--shapes S1,S2] [--cases dense,acp] [--timer graph] [--rounds 3]
                                       [--out FILE]

A and B are each a directory holding a copy of this repo (its ``forgetting_transformer`` package is the one timed)
or a git revision of the repo this script sits in (``HEAD~1``, a commit, a branch: exported with ``git archive``
into a temporary directory). Each round starts one process per side (A then B, B then A in odd rounds), and each
process times every (shape, case, fwd / fwd+bwd) with *this* checkout's timers and inputs
(``bench_attention.py``), so that only the package differs. One timing per process and round: within one process
the same kernels time alike, while the dense time moves by a few percent between processes and machines
(docs/benchmarks.md, sessions 15 and 21), which is what the rounds sample.

Cases: ``dense`` (``make_inputs``) and ``acp`` (``acp_inputs``: half the heads local, QK-normed q / k, threshold
"auto" with the QK-norm weights), as in ``bench_attention.py``. Timers: ``graph`` (GPU time, the call replayed from
a CUDA graph: ``bench_graph``), ``eager`` (``bench``: kernels plus whatever host time they do not hide), ``host``
(host microseconds per call of 10 back-to-back calls, the GPU not waited for, median of 15). Shapes: S1..S4 and
``tiny`` (1, 128, 2, 16).

Prints, per row, each side's median and its min-max over the rounds and ``A/B`` = A's median / B's (> 1: B is
faster), and appends the table with the device, versions and command to ``--out`` when given. Without a CUDA
device the processes time the PyTorch reference on the CPU (fp32; ``tiny`` only is sensible), which checks the
plumbing (tests/ops/test_bench_scripts.py), not the kernels.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TIMERS = ("graph", "eager", "host")
CASES = ("dense", "acp")
TINY = (1, 128, 2, 16)


# ----------------------------------------------------------------------------------------------------------------
# orchestration (no torch needed)
# ----------------------------------------------------------------------------------------------------------------


def resolve_side(spec: str, repo: str = REPO) -> tuple[str, str]:
    """(directory, label) of one side: an existing directory with a ``forgetting_transformer`` package, or a git
    revision of ``repo`` exported into a temporary directory (removed at exit)."""
    if os.path.isdir(spec):
        if not os.path.isdir(os.path.join(spec, "forgetting_transformer")):
            raise ValueError(f"side {spec!r}: the directory has no forgetting_transformer package")
        return os.path.abspath(spec), spec
    rev = subprocess.run(["git", "-C", repo, "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}"],
                         capture_output=True, text=True)
    if rev.returncode != 0:
        raise ValueError(f"side {spec!r} is neither a directory nor a git revision of {repo}")
    sha = rev.stdout.strip()
    out = tempfile.mkdtemp(prefix=f"ab_{sha[:10]}_")
    atexit.register(shutil.rmtree, out, True)
    archive = subprocess.run(["git", "-C", repo, "archive", "--format=tar", sha], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", out], input=archive.stdout, check=True)
    return out, f"{spec} ({sha[:10]})"


def worker_command(root: str, args) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--worker", root, "--shapes", ",".join(args.shapes),
            "--cases", ",".join(args.cases), "--timer", args.timer]


def run_worker(cmd: list[str]) -> dict:
    """Run one timing process; its last stdout line is a JSON object {"package": path, "times": {row: ms|us}}."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(labels: tuple[str, str], runs: tuple[list[dict], list[dict]], unit: str) -> list[str]:
    """Markdown rows: per timed row, each side's median and min-max over the rounds, and A's median / B's."""
    rows = list(runs[0][0]["times"])
    head = [f"| row | {labels[0]} {unit} | {labels[1]} {unit} | A/B (> 1: B faster) |", "| --- | ---: | ---: | ---: |"]
    out = []
    for row in rows:
        meds, cells = [], []
        for side in runs:
            ts = [r["times"][row] for r in side]
            meds.append(statistics.median(ts))
            cells.append(f"{meds[-1]:.4g} ({min(ts):.4g}-{max(ts):.4g})")
        ratio = meds[0] / meds[1] if meds[1] > 0 else float("nan")
        out.append(f"| {row} | {cells[0]} | {cells[1]} | {ratio:.3f} |")
    return head + out


def main_ab(args) -> None:
    sides = [resolve_side(s) for s in (args.a, args.b)]
    runs = ([], [])
    for r in range(args.rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for i in order:
            res = run_worker(worker_command(sides[i][0], args))
            if not os.path.abspath(res["package"]).startswith(sides[i][0] + os.sep):
                raise RuntimeError(f"side {sides[i][1]} imported {res['package']}, not its own package")
            runs[i].append(res)
            print(f"round {r + 1} {sides[i][1]}: " + ", ".join(f"{k} {v:.4g}" for k, v in res["times"].items()),
                  flush=True)
    unit = "us (host)" if args.timer == "host" else "ms"
    table = summarize((sides[0][1], sides[1][1]), runs, unit)
    print("\n".join(table))
    if args.out:
        env = runs[0][0]["env"]
        with open(args.out, "a") as f:
            f.write(f"\n- A/B: `python scripts/ab_attention.py {' '.join(sys.argv[1:])}`; {args.rounds} rounds, "
                    f"timer {args.timer}; {env}\n\n" + "\n".join(table) + "\n")


# ----------------------------------------------------------------------------------------------------------------
# worker: one process timing one side's package
# ----------------------------------------------------------------------------------------------------------------


def cpu_time(step, reps=5):
    """Milliseconds per call of ``step()`` on the CPU (median of ``reps``): the plumbing check's timer."""
    step()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def main_worker(args) -> None:
    root = os.path.abspath(args.worker)
    sys.path.insert(0, root)  # the side's package, imported before bench_attention puts this checkout on sys.path
    import torch

    import forgetting_transformer
    from forgetting_transformer.ops import forgetting_attention

    sys.path.insert(1, HERE)
    import bench_attention as ba

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)

    def timer(fn, inputs, backward):
        if not cuda:
            return cpu_time(ba.make_step(fn, inputs, backward))
        if args.timer == "host":
            return statistics.median(ba.host_times(ba.make_step(fn, inputs, backward)))
        return (ba.bench_graph if args.timer == "graph" else ba.bench)(fn, inputs, backward)

    times = {}
    for sname in args.shapes:
        B, T, H, D = TINY if sname == "tiny" else ba.SHAPES[sname]
        for case in args.cases:
            if case == "dense":
                inputs = ba.make_inputs(B, T, H, D, dtype=dtype, device=device)
                fn = forgetting_attention
            else:
                inputs, w = ba.acp_inputs(B, T, H, D, ba.HEAD_MIXES["mixed"](H), dtype=dtype, device=device)

                def fn(q, k, v, lf, w=w):
                    return forgetting_attention(q, k, v, lf, adaptive_threshold="auto", qk_norm_weights=(w, w))

            for backward in (False, True):
                times[f"{sname} {case} {'fwd+bwd' if backward else 'fwd'}"] = timer(fn, inputs, backward)
    import triton

    env = (f"{torch.cuda.get_device_name() if cuda else 'CPU (PyTorch reference)'}, torch {torch.__version__}, "
           f"triton {triton.__version__}")
    print(json.dumps({"package": os.path.abspath(forgetting_transformer.__file__), "times": times, "env": env}))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", nargs="?", help="side A: a repo directory or a git revision")
    ap.add_argument("b", nargs="?", help="side B: a repo directory or a git revision")
    ap.add_argument("--shapes", default="S1,S2", type=lambda s: s.split(","))
    ap.add_argument("--cases", default="dense,acp", type=lambda s: s.split(","))
    ap.add_argument("--timer", default="graph", choices=TIMERS)
    ap.add_argument("--rounds", default=3, type=int)
    ap.add_argument("--out", default=None, help="append the table (markdown) to this file")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: time one side's package
    args = ap.parse_args(argv)
    for s in args.shapes:
        if s != "tiny" and s not in ("S1", "S2", "S3", "S4"):
            raise SystemExit(f"--shapes: unknown shape {s!r} (S1, S2, S3, S4, tiny)")
    for c in args.cases:
        if c not in CASES:
            raise SystemExit(f"--cases: unknown case {c!r} ({', '.join(CASES)})")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1; got {args.rounds}")
    if args.worker:
        main_worker(args)
        return
    if not (args.a and args.b):
        raise SystemExit("give two sides A and B (repo directories or git revisions)")
    try:
        main_ab(args)
    except ValueError as e:
        raise SystemExit(str(e))


if __name__ == "__main__":
    main()
