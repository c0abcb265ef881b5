"""The kernels compiled through triton's real pipeline (down to ptxas) without a GPU, in subprocesses without
``TRITON_INTERPRET`` (``benchmarks.attention.compile_kernels``): what they compile to for sm90, and the shared
memory the op's config pruning assumes against what the compiler reports."""

import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
LIMITS = {90: 232448, 80: 166912}


def compile_kernels(*args, cache=None, timeout=1800):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if cache is not None:
        env["TRITON_CACHE_DIR"] = str(cache)
    r = subprocess.run([sys.executable, "-m", "benchmarks.attention.compile_kernels", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    return r


def test_kernels_compile_for_sm90(tmp_path):
    """The interpreter runs the kernels as Python; this compiles them through triton's real pipeline (down to
    ptxas) for sm90, specialised as at run time (ints equal to 1 as constants, aligned pointers and strides) and
    checked against the shared-memory limit: python -m benchmarks.attention.compile_kernels --quick --regs --sass, in
    a subprocess without TRITON_INTERPRET and with an empty cache."""
    r = compile_kernels("--arch", "90", "--quick", "--regs", "--sass", str(tmp_path / "sass"), cache=tmp_path,
                        timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # 13 Triton kernels (the block prefix sums with and without the key side, the one-kernel backward's set-up,
    # ACP's two table kernels) + 3 Gluon kernels (forward, dq, dk/dv) at D = 64 and 128 dense, and at 64 with
    # ACP, and the one-kernel backward at 64 (dense and with ACP)
    assert r.stdout.count(" ok (") == 24, r.stdout

    def consts(line, *keys):
        return (int(re.search(rf"'{key}': (\d+)", line).group(1)) for key in keys)

    for line in (ln for ln in r.stdout.splitlines() if "fox_fwd_sm90_kernel" in ln):
        # K and V stages plus every consumer warpgroup's Q rows, within sm90's limit (checked by the script)
        shared = int(re.search(r"ok \((\d+) bytes shared", line).group(1))
        d, bm, bn, wgs = consts(line, "HEAD_DIM", "BLOCK_M", "BLOCK_N", "NUM_WG")
        stages = int(re.search(r"stages (\d+)", line).group(1))
        assert shared >= stages * 2 * bn * d * 2 + wgs * bm * d * 2, line
    for line in (ln for ln in r.stdout.splitlines() if "fox_bwd_dkdv_sm90_kernel" in ln):
        # K and V of every consumer warpgroup's keys plus the stages of Q and dO tiles, within sm90's limit
        shared = int(re.search(r"ok \((\d+) bytes shared", line).group(1))
        d, bm, keys, wgs = consts(line, "HEAD_DIM", "BLOCK_M", "KEYS", "NUM_WG")
        stages = int(re.search(r"stages (\d+)", line).group(1))
        assert shared >= 2 * wgs * keys * d * 2 + stages * 2 * bm * d * 2, line
    for line in (ln for ln in r.stdout.splitlines() if "fox_bwd_fused_sm90_kernel" in ln):
        # the dk/dv kernel's tiles plus two buffers of both warpgroups' dS^T and a staging slot each for dq (fp32)
        shared = int(re.search(r"ok \((\d+) bytes shared", line).group(1))
        d, bm, keys, wgs = consts(line, "HEAD_DIM", "BLOCK_M", "KEYS", "NUM_WG")
        stages = int(re.search(r"stages (\d+)", line).group(1))
        assert shared >= 2 * wgs * keys * d * 2 + stages * 2 * bm * d * 2 + 2 * wgs * keys * bm * 2 + wgs * bm * d * 4
    for line in (ln for ln in r.stdout.splitlines() if "fox_bwd_dq_sm90_kernel" in ln):
        # every consumer warpgroup's Q and dO rows plus the K and V stages, within sm90's limit
        shared = int(re.search(r"ok \((\d+) bytes shared", line).group(1))
        d, bm, bn, wgs = consts(line, "HEAD_DIM", "BLOCK_M", "BLOCK_N", "NUM_WG")
        stages = int(re.search(r"stages (\d+)", line).group(1))
        assert shared >= 2 * wgs * bm * d * 2 + stages * 2 * bn * d * 2, line
    # the Gluon forward under ACP runs no more tile code per consumer warpgroup than the dense one: a third inlined
    # copy of the tile loop (its blocks that straddle ACP's bound) cost 4-6% at head dim 64 (docs/kernel.md,
    # design choices)
    loops = {}
    for line in (ln for ln in r.stdout.splitlines() if "fox_fwd_sm90_kernel" in ln and "'HEAD_DIM': 64" in ln):
        sizes = [int(x) for x in re.search(r"wgmma loops of \[([\d, ]+)\]", line).group(1).split(",")]
        loops["'HAS_ACP': True" in line] = sizes
    assert len(loops[False]) == 6 and sum(loops[True]) <= 1.1 * sum(loops[False]), loops
    assert len(list((tmp_path / "sass").glob("sm90_fox_fwd_sm90_kernel_*.sass"))) == 3  # 64 dense / ACP, 128 dense
    # and it scales the scores and adds the decay in one FFMA per score, as the dense one does: without the explicit
    # gl.fma, ptxas multiplied each score by qk_scale (a uniform register) and folded LOG2E into a second op, 28
    # more instructions per tile (docs/kernel.md, design choices)
    scale_muls = {acp: len(re.findall(r"FMUL R\d+, R\d+, UR\d+",
                                      (tmp_path / "sass" / f"sm90_fox_fwd_sm90_kernel_HEAD_DIM64_HAS_ACP{acp}.sass")
                                      .read_text())) for acp in (False, True)}
    assert scale_muls[True] <= scale_muls[False], scale_muls
    fwd = next(line for line in r.stdout.splitlines() if "_attn_fwd_kernel" in line and "'HAS_START': False" in line)
    shared, regs = (int(x) for x in re.search(r"ok \((\d+) bytes shared, (\d+) registers", fwd).groups())
    # the pipelined forward keeps 3 stages of K and V tiles (64 x 64 bf16 each) in shared memory; without the
    # run-time alignment attributes triton does not pipeline the loads and reports far less
    assert shared >= 2 * 3 * 64 * 64 * 2, fwd
    assert 0 < regs <= 255, fwd


def test_shared_memory_bound_holds_near_the_limit(tmp_path):
    """``tiles.shared_memory``, by which the op prunes configs before launching them, is never below what the
    compiler gives the kernel, for the configs of the tables (autotuned and fixed, 16-bit inputs; each head dim's
    own config also with fp32 inputs) at head dims 64, 128 and 256 whose estimate lies within 10% of sm90's or
    sm80's limit, where the estimate decides between keeping and pruning; and each kernel keeps a config that fits
    at each head dim. Runs ``compile_kernels --smem --near-limit 0.1`` with an empty cache; the whole table
    (``compile_kernels --smem``, ~130 compilations per architecture) runs in benchmarks/attention/gpu_tests.sh."""
    dims = ("64", "128", "256")
    r = compile_kernels("--smem", "--arch", "90", "80", "--head-dims", *dims, "--near-limit", "0.1",
                        "--jobs", str(os.cpu_count() or 1), cache=tmp_path)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("smem ")]
    assert r.returncode == 0 and "UNDERESTIMATE" not in r.stdout and "NO CONFIG FITS" not in r.stdout, \
        r.stdout[-6000:] + r.stderr[-3000:]
    assert len(lines) >= 5, r.stdout  # configs on both sides of each limit
    for ln in lines:
        arch = int(re.search(r"smem sm(\d+)", ln).group(1))
        true, est = (int(x) for x in re.search(r"compiled (\d+) estimate (\d+)", ln).groups())
        assert est >= true, ln
        assert abs(est - LIMITS[arch]) <= 0.1 * LIMITS[arch], ln
        assert ("kept" in ln) == (est <= LIMITS[arch]), ln
    assert any(ln.endswith("kept") for ln in lines) and any("pruned" in ln for ln in lines), r.stdout
