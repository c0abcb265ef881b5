"""The benchmark scripts' timing-round flags (the scripts themselves need a GPU: docs/benchmarks.md, session 15)."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.mark.parametrize("script,flag", [("bench_attention.py", "--acp-rounds"), ("gluon_ab.py", "--rounds"),
                                         ("acp_breakdown.py", "--rounds"), ("acp_breakdown.py", "--spread")])
def test_rounds_below_one_are_an_error_naming_the_flag(script, flag):
    """Medians over zero rounds would fail deep inside statistics; the flag is refused up front, by name."""
    args = [sys.executable, str(SCRIPTS / script), flag, "0"] + (["--old", "unused.py"] if script == "gluon_ab.py" else [])
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"argument {flag}: rounds must be >= 1; got 0" in r.stderr, r.stderr


def test_gluon_ab_heads_choices():
    """``gluon_ab.py --heads`` names the ACP case's head mixes; anything else is refused by name."""
    r = subprocess.run([sys.executable, str(SCRIPTS / "gluon_ab.py"), "--old", "unused.py", "--heads", "half"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "argument --heads: invalid choice: 'half'" in r.stderr, r.stderr
    for mix in ("all_global", "all_local", "mixed"):
        assert f"'{mix}'" in r.stderr


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


def _ncu_breakdown():
    sys.path.insert(0, str(SCRIPTS))
    import ncu_breakdown

    return ncu_breakdown


def test_ncu_breakdown_regions(ncu_export):
    """The Nsight Compute breakdown's regions on the synthetic kernel: start and dispatch up to the BRX, a worker
    partition with a wgmma tile loop (its iterations), a worker without wgmma, the default partition (last, up to
    EXIT) and the retry stubs; branch targets made relative to the kernel's start."""
    nb = _ncu_breakdown()
    ins = nb.load(ncu_export)
    assert ins[6][1] == "@P1 BRA 0x40" and ins[6][4] == {"barrier": 0, "wait": 10}
    regs = {name: sum(x[2] for x in body) for name, body in nb.regions(ins)}
    assert regs == {"start and dispatch": 4, "partition 1 tile loop of 3 instructions (40 warp iterations)": 32,
                    "partition 1 per item (outside the tile loops)": 5,
                    "partition 2 (no wgmma: loader, writer or idle warps)": 30,
                    "partition 3 per item (outside the tile loops)": 10, "mbarrier retry stubs": 4}, regs


def test_ncu_breakdown_report(ncu_export, capsys):
    """The report's rows carry the shares (85 samples, the consumers' 47) and the samples per warpgroup iteration
    (the loop's 32 over 40 / 4)."""
    _ncu_breakdown().report(str(ncu_export))
    out = capsys.readouterr().out
    assert "85 samples" in out
    assert "| partition 1 tile loop of 3 instructions (40 warp iterations) | 37.6% | 68.1% | 84 | 3.200 |" in out, out
    assert "| partition 2 (no wgmma: loader, writer or idle warps) | 35.3% |  | 2 |  | barrier 100% |" in out, out


@pytest.mark.parametrize("args,message", [
    ([], "give --kernel (to profile) or --csv"),
    (["--kernel", "fwd", "--shape", "S9"], "argument --shape: invalid choice: 'S9'"),
    (["--kernel", "fused", "--shape", "S3"], "--kernel fused runs at head dim 64 (S1, S2); --shape S3 has head dim"),
    (["--kernel", "fwd", "--heads", "all_global"], "--heads all_global needs --acp"),
    (["--kernel", "fwd", "--acp", "--heads", "half"], "argument --heads: invalid choice: 'half'"),
])
def test_ncu_breakdown_bad_arguments(args, message):
    """Bad arguments are refused up front, naming the value (not inside the process ncu profiles)."""
    r = subprocess.run([sys.executable, str(SCRIPTS / "ncu_breakdown.py"), *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def _ab(*args):
    return subprocess.run([sys.executable, str(SCRIPTS / "ab_attention.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def test_ab_attention_times_each_sides_own_package(tmp_path):
    """Side B is a copy of the package whose op sleeps 250 ms per call: the A/B table must put B above 250 ms and
    well above A, which it only does if each side's process times its own package (on the CPU: the PyTorch
    reference). The margin is far above the tiny op's own time, even on a loaded machine."""
    import shutil

    repo = SCRIPTS.parent
    slow = tmp_path / "slow"
    shutil.copytree(repo / "forgetting_transformer", slow / "forgetting_transformer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    init = slow / "forgetting_transformer" / "ops" / "__init__.py"
    init.write_text(init.read_text() + "\n\nimport functools as _ft\nimport time as _time\n\n_fa = forgetting_attention\n\n\n"
                    "@_ft.wraps(_fa)\ndef forgetting_attention(*a, **kw):\n    _time.sleep(0.25)\n"
                    "    return _fa(*a, **kw)\n")
    r = _ab(repo, slow, "--shapes", "tiny", "--cases", "dense", "--rounds", "2",
            "--out", tmp_path / "ab.md")
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
    written = (tmp_path / "ab.md").read_text()
    assert "ab_attention.py" in written and "| tiny dense fwd |" in written and "CPU (PyTorch reference)" in written


def test_ab_attention_sides_are_checked(tmp_path):
    r = _ab(tmp_path, SCRIPTS.parent, "--shapes", "tiny")
    assert r.returncode == 1 and "has no forgetting_transformer package" in r.stderr, r.stderr
    r = _ab("no-such-revision-xyz", SCRIPTS.parent, "--shapes", "tiny")
    assert r.returncode == 1 and "neither a directory nor a git revision" in r.stderr, r.stderr
    r = _ab(SCRIPTS.parent, SCRIPTS.parent, "--shapes", "S9")
    assert r.returncode == 1 and "--shapes: unknown shape 'S9'" in r.stderr, r.stderr


def test_ab_attention_exports_a_git_revision():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import ab_attention
    finally:
        sys.path.remove(str(SCRIPTS))
    if subprocess.run(["git", "-C", str(SCRIPTS.parent), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout: revisions cannot be exported")
    path, label = ab_attention.resolve_side("HEAD")
    assert (Path(path) / "forgetting_transformer" / "ops" / "forgetting_attention.py").is_file()
    assert label.startswith("HEAD (") and Path(path) != SCRIPTS.parent


def test_acp_breakdown_tile_bound(monkeypatch):
    """``acp_breakdown.tile_bound`` (the ceiling's per-kernel bound): a local head (log f = -1.3, threshold -34) keeps
    its diagonal 64 x 64 grid block and the one before it (the decay to the block's last key, -1.3, is above the
    threshold; two blocks back it is -84.5), so 16 query blocks keep 1 + 15 x 2 of their 136 causal tiles; with
    128-key tiles each 64-row block keeps the 128-key blocks that hold those; a global head keeps everything."""
    import math

    import torch

    sys.path.insert(0, str(SCRIPTS))
    import acp_breakdown as ab

    T, D, GM, GN = 1024, 64, 64, 64
    monkeypatch.setattr(ab.fa, "_ACP_GRID_OVERRIDE", (GM, GN))  # the GPU's grid (the CPU configs' is smaller)
    lf = torch.full((1, T, 2), -1e-4)
    lf[..., 0] = -1.3
    lo, _ = ab.fa._acp._tables_torch(lf, torch.tensor([[-34.0, -34.0]]), T, GM, GN)
    assert math.isclose(ab.tile_bound(lo, lf, T, D, 64, 64), 2 * 136 / (136 + 31), rel_tol=1e-6)
    kept_128 = sum(2 if (i % 2 == 0 and i > 0) else 1 for i in range(16))  # even rows straddle into the block below
    dense_128 = sum(i // 2 + 1 for i in range(16))
    assert math.isclose(ab.tile_bound(lo, lf, T, D, 64, 128), 2 * dense_128 / (dense_128 + kept_128), rel_tol=1e-6)
    assert ab.tile_bound(lo[1:], lf[..., 1:], T, D, 64, 64) == 1.0


def test_acp_breakdown_replay_gaps():
    """``acp_breakdown.replay_gaps`` (--boundaries): the kernels' own times and their span, in any order; the span
    less the sum is the time between kernels; no interval is an error, not a zero."""
    sys.path.insert(0, str(SCRIPTS))
    import acp_breakdown as ab

    assert ab.replay_gaps([(12.0, 20.0), (0.0, 10.0), (20.0, 25.5)]) == (23.5, 25.5)
    assert ab.replay_gaps([(3.0, 7.0)]) == (4.0, 4.0)
    with pytest.raises(ValueError, match="no kernel intervals"):
        ab.replay_gaps([])


def test_ncu_breakdown_paths_through_a_tile_loop():
    """A tile loop that branches inside (a head run every iteration, then one of two variants) gets a row per path:
    its instructions grouped by execution count, in address order, samples per warpgroup execution (4 warps)."""
    body = [(0x40, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ", 8, 40, {"wait": 8}),
            (0x50, "FADD R1, R2, R3", 6, 10, {"barrier": 6}),
            (0x60, "FMUL R1, R2, R3", 12, 30, {"wait": 9, "no_inst": 3}),
            (0x70, "@P1 BRA 0x40", 4, 40, {"wait": 4})]
    rows = _ncu_breakdown().path_rows(body, total=60, consumer=30)
    assert rows == ["| ↳ 2 instructions run 40 times | 20.0% | 40.0% | 80 | 1.200 | wait 100% |",
                    "| ↳ 1 instructions run 10 times | 10.0% | 20.0% | 10 | 2.400 | barrier 100% |",
                    "| ↳ 1 instructions run 30 times | 20.0% | 40.0% | 30 | 1.600 | wait 75%, no_inst 25% |"], rows
    assert _ncu_breakdown().path_rows(body[:1] + body[3:], total=60, consumer=30) == []
