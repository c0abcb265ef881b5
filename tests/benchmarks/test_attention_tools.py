"""The kernel tools of ``benchmarks/attention`` (``python -m benchmarks.attention.<tool>``) on the CPU: their argument
checks, the A/B tool end to end on the PyTorch reference, and the pure functions of the breakdown (the timings
themselves need a GPU)."""

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def tool(name, *args, timeout=120):
    """``python -m benchmarks.attention.<name> args`` from the repo root."""
    return subprocess.run([sys.executable, "-m", f"benchmarks.attention.{name}", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name,args,flag", [("bench", ["--acp-rounds", "0"], "--acp-rounds"),
                                            ("breakdown", ["backward", "--rounds", "0"], "--rounds"),
                                            ("breakdown", ["spread", "0"], "N"),
                                            ("sweep", ["fused", "--rounds", "0"], "--rounds")])
def test_rounds_below_one_are_an_error_naming_the_flag(name, args, flag):
    """Medians over zero rounds would fail deep inside statistics; the flag is refused up front, by name."""
    r = tool(name, *args)
    assert r.returncode == 2 and f"argument {flag}: rounds must be >= 1; got 0" in r.stderr, r.stderr


@pytest.mark.parametrize("name,args", [("bench", ["--shapes", "S1,S9"]), ("breakdown", ["kernels", "--shapes", "S9"]),
                                       ("sweep", ["fwd", "--shapes", "S9"])])
def test_unknown_shapes_are_refused_by_name(name, args):
    r = tool(name, *args)
    assert r.returncode == 2 and "unknown shape 'S9'" in r.stderr, r.stderr


def test_tools_import_without_sys_path_edits():
    """Every tool module imports from the repo root as a package, and none edits sys.path."""
    for path in sorted((ROOT / "benchmarks" / "attention").glob("*.py")):
        assert "sys.path" not in path.read_text(), path
    code = ("import sys; before = list(sys.path); import importlib; "
            "[importlib.import_module(f'benchmarks.attention.{m}') for m in "
            "('common', 'bench', 'ab', 'breakdown', 'ncu', 'sweep', 'compile_kernels')]; assert sys.path == before")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.fixture
def ncu_export(tmp_path):
    """A synthetic source-page export as ``ncu --page source --csv --print-source sass`` writes it (absolute
    addresses and branch targets): warps 0-3 branch to the default partition (last); the others pass the dispatch
    loop up to the BRX into worker 1 (a tile loop of 3 instructions with wgmma) or worker 2 (the loader); the
    default partition ends at EXIT, then an mbarrier retry stub. Rows: (offset, sass, samples, executed, barrier
    samples; the rest of the samples are "wait")."""
    import csv

    T = 0x7F0000000000
    rows = [(0x00, f"@!P0 BRA {T + 0xa0:#x}", 1, 12, 0),
            (0x10, "NOP", 1, 8, 0), (0x20, f"@P0 BRA {T + 0x10:#x}", 1, 8, 0), (0x30, "BRX R2, -0x40", 1, 8, 0),
            (0x40, "MOV R0, R1", 2, 4, 0),
            (0x50, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ", 20, 40, 5),
            (0x60, f"@P1 BRA {T + 0x40:#x}", 10, 40, 0),
            (0x70, f"BRA {T + 0x10:#x}", 5, 4, 5),
            (0x80, "SYNCS.ARRIVE.TRANS64 RZ, [UR4]", 30, 1, 30),
            (0x90, f"BRA {T + 0x10:#x}", 0, 1, 0),
            (0xa0, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ", 4, 4, 0),
            (0xb0, "EXIT", 6, 4, 6),
            (0xc0, "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R2], R3", 3, 9, 0), (0xd0, f"BRA {T + 0xc0:#x}", 1, 9, 0)]
    path = tmp_path / "src.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["Kernel Name", "k", ""])
        w.writerow(["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
                    "stall_barrier", "stall_wait", "stall_barrier (Not Issued)"])
        for off, sass, samples, executed, barrier in rows:
            w.writerow([hex(T + off), "      " + sass, samples, executed, barrier, samples - barrier, 0])
    return path


def test_ncu_regions(ncu_export):
    """The Nsight Compute breakdown's regions on the synthetic kernel: start and dispatch up to the BRX, a worker
    partition with a wgmma tile loop (its iterations), a worker without wgmma, the default partition (last, up to
    EXIT) and the retry stubs; branch targets made relative to the kernel's start."""
    from benchmarks.attention import ncu

    ins = ncu.load(ncu_export)
    assert ins[6][1] == "@P1 BRA 0x40" and ins[6][4] == {"barrier": 0, "wait": 10}
    regs = {name: sum(x[2] for x in body) for name, body in ncu.regions(ins)}
    assert regs == {"start and dispatch": 4, "partition 1 tile loop of 3 instructions (40 warp iterations)": 32,
                    "partition 1 per item (outside the tile loops)": 5,
                    "partition 2 (no wgmma: loader, writer or idle warps)": 30,
                    "partition 3 per item (outside the tile loops)": 10, "mbarrier retry stubs": 4}, regs


def test_ncu_report_from_an_export(ncu_export):
    """``breakdown ncu --csv`` reports an existing export (no GPU): the shares (85 samples, the consumers' 47) and the
    samples per warpgroup iteration (the loop's 32 over 40 / 4)."""
    r = tool("breakdown", "ncu", "--csv", ncu_export)
    assert r.returncode == 0, r.stderr
    assert "85 samples" in r.stdout
    assert "| partition 1 tile loop of 3 instructions (40 warp iterations) | 37.6% | 68.1% | 84 | 3.200 |" in r.stdout
    assert "| partition 2 (no wgmma: loader, writer or idle warps) | 35.3% |  | 2 |  | barrier 100% |" in r.stdout


@pytest.mark.parametrize("args,message", [
    ([], "give --kernel (to profile) or --csv"),
    (["--kernel", "fwd", "--shape", "S9"], "argument --shape: invalid choice: 'S9'"),
    (["--kernel", "fused", "--shape", "S3"], "--kernel fused runs at head dim 64 (S1, S2); --shape S3 has head dim"),
    (["--kernel", "fwd", "--heads", "all_global"], "--heads all_global needs --acp"),
    (["--kernel", "fwd", "--acp", "--heads", "half"], "argument --heads: invalid choice: 'half'"),
])
def test_ncu_bad_arguments(args, message):
    """Bad arguments are refused up front, naming the value (not inside the process ncu profiles)."""
    r = tool("breakdown", "ncu", *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_ncu_paths_through_a_tile_loop():
    """A tile loop that branches inside (a head run every iteration, then one of two variants) gets a row per path:
    its instructions grouped by execution count, in address order, samples per warpgroup execution (4 warps)."""
    from benchmarks.attention import ncu

    body = [(0x40, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ", 8, 40, {"wait": 8}),
            (0x50, "FADD R1, R2, R3", 6, 10, {"barrier": 6}),
            (0x60, "FMUL R1, R2, R3", 12, 30, {"wait": 9, "no_inst": 3}),
            (0x70, "@P1 BRA 0x40", 4, 40, {"wait": 4})]
    rows = ncu.path_rows(body, total=60, consumer=30)
    assert rows == ["| ↳ 2 instructions run 40 times | 20.0% | 40.0% | 80 | 1.200 | wait 100% |",
                    "| ↳ 1 instructions run 10 times | 10.0% | 20.0% | 10 | 2.400 | barrier 100% |",
                    "| ↳ 1 instructions run 30 times | 20.0% | 40.0% | 30 | 1.600 | wait 75%, no_inst 25% |"], rows
    assert ncu.path_rows(body[:1] + body[3:], total=60, consumer=30) == []


def test_ab_times_each_sides_own_package(tmp_path):
    """Side B is a copy of the package whose op sleeps 250 ms per call: the A/B table must put B above 250 ms and
    well above A, which it only does if each side's process times its own package (on the CPU: the PyTorch
    reference; on a GPU the eager timer, which counts the host's sleep that a CUDA graph would not replay). The
    margin is far above the tiny op's own time, even on a loaded machine. The outputs of the two sides are the same
    computation, so they compare bitwise equal (on a GPU: fixed configs, deterministic backward). The table names
    the device it ran on."""
    slow = tmp_path / "slow"
    shutil.copytree(ROOT / "forgetting_transformer", slow / "forgetting_transformer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    init = slow / "forgetting_transformer" / "ops" / "forgetting_attention" / "__init__.py"
    init.write_text(init.read_text() + "\n\nimport functools as _ft\nimport time as _time\n\n"
                    "_fa = forgetting_attention\n\n\n"
                    "@_ft.wraps(_fa)\ndef forgetting_attention(*a, **kw):\n    _time.sleep(0.25)\n"
                    "    return _fa(*a, **kw)\n")
    r = tool("ab", ROOT, slow, "--shapes", "tiny", "--cases", "dense", "--rounds", "2", "--timer", "eager",
             "--expect-equal", "--out", tmp_path / "ab.md", timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {line.split("|")[1].strip(): line for line in r.stdout.splitlines() if line.startswith("| tiny")}
    assert set(rows) == {"tiny dense fwd", "tiny dense fwd+bwd"}
    for line in rows.values():
        a_med, b_med, ratio = (c.strip() for c in line.split("|")[2:5])
        # the sleep bounds B from below; A is only compared with B (no bound on A's own time: a loaded machine)
        a, b = float(a_med.split()[0]), float(b_med.split()[0])
        assert b > 250.0 and b - a > 125.0, line
        assert float(ratio) < 1.0, line
    assert r.stdout.count("round ") == 4  # two rounds, one process per side each
    assert "tiny dense: bitwise equal (o, dq, dk, dv, dlf): [True, True, True, True, True]" in r.stdout
    written = (tmp_path / "ab.md").read_text()
    assert "benchmarks.attention.ab" in written and "| tiny dense fwd |" in written
    from benchmarks.attention.common import environment

    assert environment().split(";")[0] in written  # the device the sides ran on (a GPU's name, or the CPU)


def test_ab_expect_equal_fails_on_different_outputs(tmp_path):
    """Side B's op scales its output: ``--expect-equal`` names the difference and exits 1."""
    other = tmp_path / "other"
    shutil.copytree(ROOT / "forgetting_transformer", other / "forgetting_transformer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    init = other / "forgetting_transformer" / "ops" / "forgetting_attention" / "__init__.py"
    init.write_text(init.read_text() + "\n\n_fa = forgetting_attention\n\n\n"
                    "def forgetting_attention(*a, **kw):\n    return 2 * _fa(*a, **kw)\n")
    r = tool("ab", ROOT, other, "--shapes", "tiny", "--cases", "acp", "--rounds", "1", "--expect-equal", timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "tiny acp: bitwise equal (o, dq, dk, dv, dlf): [False" in r.stdout
    assert "outputs differ in 1 case(s)" in r.stderr


def test_ab_saves_outputs_with_fixed_configs_and_times_with_autotuning(monkeypatch):
    """The outputs' process runs FOX_AUTOTUNE=0 (autotuning picks by timing: two processes may differ); the timing
    processes keep the caller's environment, the default path autotuned."""
    import argparse

    from benchmarks.attention import ab

    monkeypatch.delenv("FOX_AUTOTUNE", raising=False)
    args = argparse.Namespace(shapes=["tiny"], cases=["dense"], heads="mixed", timer="graph")
    cmd, env = ab.worker_command(str(ROOT), args, "/tmp/out.pt")
    assert cmd[-2:] == ["--dump", "/tmp/out.pt"] and env["FOX_AUTOTUNE"] == "0" and env["PYTHONPATH"] == str(ROOT)
    cmd, env = ab.worker_command(str(ROOT), args)
    assert "--dump" not in cmd and "FOX_AUTOTUNE" not in env


def test_ab_sides_are_checked(tmp_path):
    r = tool("ab", tmp_path, ROOT, "--shapes", "tiny")
    assert r.returncode == 1 and "has no forgetting_transformer package" in r.stderr, r.stderr
    r = tool("ab", "no-such-revision-xyz", ROOT, "--shapes", "tiny")
    assert r.returncode == 1 and "neither a directory nor a git revision" in r.stderr, r.stderr
    r = tool("ab", ROOT, ROOT, "--shapes", "S9")
    assert r.returncode == 1 and "--shapes: unknown shape 'S9'" in r.stderr, r.stderr


def test_ab_exports_a_git_revision():
    from benchmarks.attention import ab

    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout: revisions cannot be exported")
    path, label = ab.resolve_side("HEAD")
    assert (Path(path) / "forgetting_transformer" / "ops" / "forgetting_attention" / "__init__.py").is_file()
    assert label.startswith("HEAD (") and Path(path) != ROOT


def test_ab_summary_with_rows_one_side_lacks():
    """Kernel rows differ between versions (a kernel only one launches): such a row shows "-" for the other side."""
    from benchmarks.attention import ab

    runs = ([{"times": {"k1": 2.0, "k2": 1.0}}, {"times": {"k1": 4.0, "k2": 1.0}}], [{"times": {"k1": 1.0}}])
    rows = ab.summarize(("A", "B"), runs, "us")
    assert rows[2] == "| k1 | 3 (2-4) | 1 (1-1) | 3.000 |" and rows[3] == "| k2 | 1 (1-1) | - | - |", rows


def test_tile_bound():
    """``breakdown.tile_bound`` (the ceiling's per-kernel bound): a local head (log f = -1.3, threshold -34) keeps
    its diagonal 64 x 64 grid block and the one before it (the decay to the block's last key, -1.3, is above the
    threshold; two blocks back it is -84.5), so 16 query blocks keep 1 + 15 x 2 of their 136 causal tiles; with
    128-key tiles each 64-row block keeps the 128-key blocks that hold those; a global head keeps everything."""
    from benchmarks.attention.breakdown import tile_bound
    from forgetting_transformer.ops.forgetting_attention import acp

    T, GM, GN = 1024, 64, 64
    lf = torch.full((1, T, 2), -1e-4)
    lf[..., 0] = -1.3
    lo = acp.lo_table(lf, torch.tensor([[-34.0, -34.0]]), T, GM, GN)
    assert math.isclose(tile_bound(lo, lf, T, 64, 64, (GM, GN)), 2 * 136 / (136 + 31), rel_tol=1e-6)
    kept_128 = sum(2 if (i % 2 == 0 and i > 0) else 1 for i in range(16))  # even rows straddle into the block below
    dense_128 = sum(i // 2 + 1 for i in range(16))
    assert math.isclose(tile_bound(lo, lf, T, 64, 128, (GM, GN)), 2 * dense_128 / (dense_128 + kept_128),
                        rel_tol=1e-6)
    assert tile_bound(lo[1:], lf[..., 1:], T, 64, 64, (GM, GN)) == 1.0


def test_replay_gaps():
    """``breakdown.replay_gaps`` (boundaries): the kernels' own times and their span, in any order; the span less
    the sum is the time between kernels; no interval is an error, not a zero."""
    from benchmarks.attention.breakdown import replay_gaps

    assert replay_gaps([(12.0, 20.0), (0.0, 10.0), (20.0, 25.5)]) == (23.5, 25.5)
    assert replay_gaps([(3.0, 7.0)]) == (4.0, 4.0)
    with pytest.raises(ValueError, match="no kernel intervals"):
        replay_gaps([])


def test_call_kernels_splits_a_trace_at_the_flushes():
    """``breakdown.call_kernels`` (stalls): the kernels of a profiled trace grouped into calls, each starting at an L2
    flush (a fill kernel longer than 30 us; a short fill inside a call is one of its kernels), each kernel with its
    GPU start, end and the host time of its launch (by correlation id); kernels before the first flush dropped."""
    from benchmarks.attention.breakdown import call_kernels

    def kernel(name, ts, dur, corr):
        return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}

    def launch(ts, corr):
        return {"cat": "cuda_driver", "name": "cuLaunchKernelEx", "ts": ts, "args": {"correlation": corr}}

    fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>"
    events = [kernel("stray", 0, 5, 1), launch(-3, 1),
              kernel(fill, 10, 80, 2), launch(1, 2), kernel("fwd", 95, 300, 3), launch(40, 3),
              kernel(fill, 400, 4, 4), launch(60, 4), kernel("bwd", 410, 500, 5), launch(90, 5),
              kernel(fill, 1000, 81, 6), launch(900, 6), kernel("fwd", 1090, 290, 7)]  # (7: no launch recorded)
    calls = call_kernels({"traceEvents": events})
    assert calls == [[("flush", 10, 90, 1), ("fwd", 95, 395, 40), (fill, 400, 404, 60), ("bwd", 410, 910, 90)],
                     [("flush", 1000, 1081, 900), ("fwd", 1090, 1380, None)]]
    assert call_kernels({"traceEvents": []}) == []


def test_gpu_tools_refuse_a_cpu_machine():
    """The timing tools name what they need instead of failing inside CUDA calls."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    for name, args in (("bench", []), ("sweep", ["fwd"])):
        r = tool(name, *args)
        assert r.returncode == 1 and "needs a CUDA GPU" in r.stderr, (name, r.stderr)


def test_the_triton_sweep_covers_the_autotuned_configs():
    """``sweep triton`` times every config the autotuner may pick, so its table shows each pick's rivals."""
    import dataclasses

    from benchmarks.attention.sweep import TRITON_SWEEP
    from forgetting_transformer.ops.forgetting_attention import stages as L

    for kind, configs in L.TRITON_AUTOTUNE_CONFIGS.items():
        assert {dataclasses.astuple(c) for c in configs} <= set(TRITON_SWEEP[kind]), kind


def test_ab_knows_every_benchmark_shape():
    """A/B takes the shapes the other tools take: common.SHAPES and tiny."""
    from benchmarks.attention import ab, common

    assert set(ab.SHAPE_NAMES) == {*common.SHAPES, "tiny"}
