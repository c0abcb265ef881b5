"""A/B of the Forgetting Attention op between two versions of this repo, each timed in its own processes.

    python -m benchmarks.attention.ab A B [--shapes S1,S2] [--cases dense,acp] [--heads mixed]
                                          [--timer graph|eager|host|kernels] [--rounds 3] [--expect-equal]
                                          [--out FILE]

A and B are each a directory holding a copy of this repo (its ``forgetting_transformer`` package is the one
timed) or a git revision of this checkout (``HEAD~1``, a commit, a branch: exported with ``git archive`` into a
temporary directory). Each round starts one process per side (A then B, B then A in odd rounds); each process
imports its side's package (``PYTHONPATH`` = the side, Python's ``-P``: neither the working directory nor a
script's is on the path) and times every (shape, case, fwd / fwd+bwd) with *this* checkout's inputs and timers
(``common.py``, loaded from its file), so that only the package differs. One timing per process and round: within
a process the same kernels time alike, while the time moves by a few percent between processes and with the GPU's
clocks, which is what the rounds sample.

Cases: ``dense`` and ``acp`` (``common.case_inputs``; ``--heads``: ACP's head mix, half local by default).
Timers: ``graph`` (GPU time, the call replayed from a CUDA graph; default), ``eager`` (kernels plus the host time
they do not hide), ``host`` (host microseconds per call of 10 back-to-back calls, the GPU not waited for),
``kernels`` (each kernel's GPU microseconds in one fwd+bwd call, torch.profiler). Shapes: S1..S4, T1 and ``tiny``.

One more process per side saves its outputs (o, dq, dk, dv, d log f for a fixed do), and the two sides' are
compared: bitwise equal or the relative L2 difference; ``--expect-equal`` exits 1 unless all are bitwise equal (a
change that claims not to move a bit). That process runs each side's fixed kernel configs (``FOX_AUTOTUNE=0``) and
its deterministic backward (``torch.use_deterministic_algorithms``): autotuning picks configs by timing, and the
fused backward accumulates dq with atomics, so the default path's bits may differ between two processes of one
version.
Prints, per row, each side's median and its min-max over the rounds and ``A/B`` = A's median / B's
(> 1: B is faster); ``--out FILE`` appends the table with the device, versions and command to FILE. Without a
CUDA device the processes time the PyTorch reference on the CPU (fp32; ``tiny`` is the sensible shape), which
checks the tool, not the kernels.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TIMERS = ("graph", "eager", "host", "kernels")
CASES = ("dense", "acp")
HEADS = ("mixed", "all_local", "all_global")
SHAPE_NAMES = ("S1", "S2", "S3", "S4", "T1", "tiny")  # common.SHAPES and TINY
OUTPUTS = ("o", "dq", "dk", "dv", "dlf")


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


def worker_command(root: str, args, dump: str | None = None) -> tuple[list[str], dict]:
    """(argv, environment) of one timing process for the side at ``root``; with ``dump``, of the process that saves
    the side's outputs there instead (fixed configs, deterministic backward)."""
    cmd = [sys.executable, "-P", os.path.abspath(__file__), "--worker", root, "--shapes", ",".join(args.shapes),
           "--cases", ",".join(args.cases), "--heads", args.heads, "--timer", args.timer]
    env = dict(os.environ, PYTHONPATH=root)
    if dump:
        cmd += ["--dump", dump]
        env["FOX_AUTOTUNE"] = "0"
    return cmd, env


def run_worker(cmd: list[str], env: dict) -> dict:
    """Run one timing process; its last stdout line is a JSON object {"package": path, "times": {row: ms|us}}."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(labels: tuple[str, str], runs: tuple[list[dict], list[dict]], unit: str) -> list[str]:
    """Markdown rows: per timed row (of either side), each side's median and min-max over the rounds, and A's
    median / B's ("-" for a row one side did not time, e.g. a kernel only one version launches)."""
    from forgetting_transformer import markdown as md  # (here: a worker imports its own side's package)

    rows = list(dict.fromkeys(row for side in runs for r in side for row in r["times"]))
    head = md.header(["row", f"{labels[0]} {unit}", f"{labels[1]} {unit}", "A/B (> 1: B faster)"]).split("\n")
    out = []
    for row in rows:
        meds, cells = [], []
        for side in runs:
            ts = [r["times"][row] for r in side if row in r["times"]]
            meds.append(statistics.median(ts) if ts else None)
            cells.append(f"{meds[-1]:.4g} ({min(ts):.4g}-{max(ts):.4g})" if ts else "-")
        ratio = f"{meds[0] / meds[1]:.3f}" if None not in meds and meds[1] > 0 else "-"
        out.append(md.row([row, *cells, ratio]))
    return head + out


def compare_outputs(path_a: str, path_b: str) -> tuple[list[str], int]:
    """(lines, number of rows that differ) comparing the two sides' dumped outputs bit for bit."""
    import torch

    a, b = torch.load(path_a), torch.load(path_b)
    lines, differ = [], 0
    for row in a:
        same = [torch.equal(x, y) for x, y in zip(a[row], b[row])]
        err = [((x.double() - y.double()).norm() / y.double().norm().clamp_min(1e-30)).item()
               for x, y in zip(a[row], b[row])]
        differ += not all(same)
        lines.append(f"{row}: bitwise equal ({', '.join(OUTPUTS)}): {same}; relative difference "
                     + " ".join(f"{e:.1e}" for e in err))
    return lines, differ


def own_package(res: dict, side: tuple[str, str]) -> dict:
    """The worker's result, after checking that it imported its side's package."""
    if not os.path.abspath(res["package"]).startswith(side[0] + os.sep):
        raise RuntimeError(f"side {side[1]} imported {res['package']}, not its own package")
    return res


def main_ab(args) -> int:
    sides = [resolve_side(s) for s in (args.a, args.b)]
    runs = ([], [])
    dumps = tempfile.mkdtemp(prefix="ab_outputs_")
    atexit.register(shutil.rmtree, dumps, True)
    for i in (0, 1):
        own_package(run_worker(*worker_command(sides[i][0], args, os.path.join(dumps, f"{i}.pt"))), sides[i])
    for r in range(args.rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for i in order:
            res = own_package(run_worker(*worker_command(sides[i][0], args)), sides[i])
            runs[i].append(res)
            print(f"round {r + 1} {sides[i][1]}: " + ", ".join(f"{k} {v:.4g}" for k, v in res["times"].items()),
                  flush=True)
    lines, differ = compare_outputs(os.path.join(dumps, "0.pt"), os.path.join(dumps, "1.pt"))
    print("\n".join(lines))
    unit = {"host": "us (host)", "kernels": "us (GPU)"}.get(args.timer, "ms")
    table = summarize((sides[0][1], sides[1][1]), runs, unit)
    print("\n".join(table))
    if args.out:
        env = runs[0][0]["env"]
        with open(args.out, "a") as f:
            f.write(f"\n- A/B: `python -m benchmarks.attention.ab {' '.join(args.argv)}`; {args.rounds} rounds, "
                    f"timer {args.timer}; {env}\n\n" + "\n".join(table) + "\n")
    if args.expect_equal and differ:
        print(f"A and B outputs differ in {differ} case(s)", file=sys.stderr)
        return 1
    return 0


# ----------------------------------------------------------------------------------------------------------------
# worker: one process timing one side's package
# ----------------------------------------------------------------------------------------------------------------


def load_common():
    """This checkout's ``common.py``, loaded from its file (the worker's path holds the side's repo only)."""
    spec = importlib.util.spec_from_file_location("ab_common", os.path.join(HERE, "common.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main_worker(args) -> None:
    import torch

    import forgetting_transformer

    c = load_common()
    cuda = torch.cuda.is_available()
    if args.timer == "kernels" and not cuda:
        raise SystemExit("--timer kernels needs a CUDA GPU (torch.profiler's kernel times)")
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)

    times, dump = {}, {}
    if args.dump:  # the outputs alone, bitwise reproducible (main_ab sets FOX_AUTOTUNE=0 for this process)
        torch.use_deterministic_algorithms(True, warn_only=True)
    for sname in args.shapes:
        B, T, H, D = c.shape(sname)
        for case in args.cases:
            fn, inputs = c.case_inputs(case, B, T, H, D, heads=args.heads, dtype=dtype, device=device)
            if args.dump:
                dump[f"{sname} {case}"] = [t.cpu() for t in c.outputs(fn, inputs)]
                continue
            if args.timer == "kernels":
                for name, us in c.kernel_us(fn, inputs).items():
                    times[f"{sname} {case} {name}"] = us
                continue
            for backward in (False, True):
                row = f"{sname} {case} {'fwd+bwd' if backward else 'fwd'}"
                step = c.make_step(fn, inputs, backward)
                if not cuda:
                    times[row] = c.cpu_time(step)
                elif args.timer == "host":
                    times[row] = statistics.median(c.host_times(step))
                elif args.timer == "graph":
                    times[row] = c.graph_time(step)
                else:
                    times[row] = c.bench(fn, inputs, backward)
    if args.dump:
        torch.save(dump, args.dump)
    print(json.dumps({"package": os.path.abspath(forgetting_transformer.__file__), "times": times,
                      "env": c.environment()}))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", nargs="?", help="side A: a repo directory or a git revision")
    ap.add_argument("b", nargs="?", help="side B: a repo directory or a git revision")
    ap.add_argument("--shapes", default="S1,S2", type=lambda s: s.split(","))
    ap.add_argument("--cases", default="dense,acp", type=lambda s: s.split(","))
    ap.add_argument("--heads", default="mixed", choices=HEADS, help="the ACP case's head mix")
    ap.add_argument("--timer", default="graph", choices=TIMERS)
    ap.add_argument("--rounds", default=3, type=int)
    ap.add_argument("--expect-equal", action="store_true", help="exit 1 unless A's and B's outputs are bitwise equal")
    ap.add_argument("--out", default=None, help="append the table (Markdown) to this file")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: time one side's package
    ap.add_argument("--dump", default=None, help=argparse.SUPPRESS)  # internal: where the worker saves outputs
    args = ap.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    for s in args.shapes:
        if s not in SHAPE_NAMES:
            raise SystemExit(f"--shapes: unknown shape {s!r} ({', '.join(SHAPE_NAMES)})")
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
        code = main_ab(args)
    except ValueError as e:
        raise SystemExit(str(e))
    raise SystemExit(code)


if __name__ == "__main__":
    main()
