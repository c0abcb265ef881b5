"""Compile the Forgetting Attention Triton kernels for a GPU architecture without a GPU (ahead of time).

    python -m benchmarks.attention.compile_kernels [--arch 90 80] [--quick] [--regs] [--sass DIR]
    python -m benchmarks.attention.compile_kernels --smem [--arch 90 80] [--head-dims 16 32 64 128 256] [--jobs N]
                                                   [--near-limit FRACTION]

Each kernel is compiled through triton's full pipeline (TTIR, TTGIR, LLVM IR, PTX, ptxas) for the given compute
capabilities, over the constexpr combinations that matter: dense / padding / ACP / documents, head dims 64, 80
(padded) and 128, GQA, and the integer arguments triton turns into constants when they equal 1 (H = GROUP =
HKV = 1), and checks each kernel's static shared memory against the architecture's per-block limit. Catches
what the CPU interpreter cannot (the compiler's type errors, constant specialisation, ptxas failures, tiles
too large for the part). Arguments are specialised as at run time on contiguous inputs of a typical shape
(aligned pointers, 16-divisible strides: ``compile_one``), so the loads are pipelined and the shared memory
checked is that of the multi-buffered kernel. ``--quick``: head dim 64 only (what CI runs, ~20 s; the full set
takes ~3 min on 2 cores). ``--regs``: also registers per thread and spill bytes (``ptxas -v``), the limit on how
much a kernel can keep in flight (docs/kernel.md). ``--sass DIR``: also write each kernel's SASS
(``cuobjdump``) to DIR and print its instruction count and the sizes of its innermost loops that issue wgmma
(one per inlined copy of a tile loop: how much code each consumer warpgroup runs per tile). ``--smem``: instead,
every tile config of the Triton kernels' tables at every padded head dim, the shared memory the op estimates
(``stages.shared_memory``, by which it prunes configs) against what the compiler reports. Must run with
TRITON_INTERPRET unset (``tests/ops/test_compile.py`` runs it in subprocesses). Exits 1 and names the failing
kernel and constants when one does not compile or does not fit (``--smem``: when the bound is below the compiler's
figure, or no config of a kernel fits at a head dim).
"""

from __future__ import annotations

import argparse
import os

from forgetting_transformer.ops.forgetting_attention import stages as L

F32, BF16, I32 = "*fp32", "*bf16", "*i32"
POINTERS = dict(
    Q=BF16, K=BF16, V=BF16, O=BF16, DO=BF16, DQ=BF16, DK=BF16, DV=BF16, LF=F32, PK=F32, PQ=F32, LSE=F32,
    DELTA=F32, DQ32=F32, RS8=F32, Z=F32, DROW=F32, DCOL=F32, DLF=F32, KSTART=I32, KEND=I32, LO_BLK=I32, HI_BLK=I32,
    S="*fp64", C="*fp64", TOT="*fp64", DELTA_IN=F32, LO=I32, HI=I32, GQ=F32, GK=F32, NORMS=F32,
)
FLOATS = {"sm_scale", "thr_value", "sqrt_d", "log_tk", "log_eps"}  # fp32 scalar arguments


SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}  # bytes per block (opt-in maximum)


def cases(quick=False):
    """(kernel name, constexprs, num_warps, num_stages): the GPU configs' tiles at three head dims."""
    out = []
    for D, (fm, fn), (qm, qn), (km, kn), w in [(64, (128, 64), (64, 64), (64, 64), 4),
                                               (128, (128, 128), (128, 64), (64, 128), 8),
                                               (80, (64, 64), (64, 32), (32, 64), 4)][:1 if quick else 3]:
        common = dict(HEAD_DIM=D, BLOCK_D=max(16, 1 << (D - 1).bit_length()), IEEE=False)
        ones = dict(H=1, GROUP=1, HKV=1) if D == 64 else {}  # int arguments of 1 become constants (D = 64 only)
        for flags in (dict(HAS_START=False, HAS_LO=False), dict(HAS_START=True, HAS_LO=True)):
            out.append(("_attn_fwd_kernel", dict(common, BLOCK_M=fm, BLOCK_N=fn, **flags, **ones), w, 3))
            out.append(("_attn_bwd_dq_kernel", dict(common, BLOCK_M=qm, BLOCK_N=qn, **flags, **ones), w, 3))
        for flags in (dict(HAS_START=False, HAS_END=False, HAS_HI=False),
                      dict(HAS_START=True, HAS_END=True, HAS_HI=True)):
            out.append(("_attn_bwd_dkdv_kernel", dict(common, BLOCK_M=km, BLOCK_N=kn, **flags,
                                                      **(ones or dict(GROUP=2))), w, 3))  # GROUP: constexpr here
    out += [("_block_prefix_kernel", dict(CHUNK=128, QUERY_SIDE=True, KEY_SIDE=True, H=1), 4, 3),
            ("_block_prefix_kernel", dict(CHUNK=128, QUERY_SIDE=True, KEY_SIDE=False, H=1), 4, 3),
            ("_bwd_fused_setup_kernel", dict(HEAD_DIM=64, BLOCK_D=64, ROWS=64), 4, 3),
            ("_dlogf_sums_kernel", dict(CHUNK=1024), 4, 3),
            ("_dlogf_kernel", dict(CHUNK=1024, VEC=128, ROUND_DQ=True, HEAD_DIM=64, BLOCK_D=64, ROWS=128), 4, 3),
            # ACP's tables (float64 scans, tl.gather), as _acp_launch launches them at 16 heads
            ("_acp_cumsum_kernel", dict(SUB=256, HP=16), 4, 3),
            ("_acp_tables_kernel", dict(GM=64, GN=64, VEC=32, NCHP=128, MODE=2, BLOCK_D=64), 4, 3)]
    return out


# Integer arguments of the compiled kernels that are not multiples of 16 for typical shapes (head counts, the
# GQA group, the query offset) or that equal 1 (the unit strides of log f over heads and of the kstart / kend
# rows, which triton turns into the constant 1 at run time).
NOT_ALIGNED = {"H", "HKV", "GROUP", "off"}
ONES = {"slh", "sst", "set"}


def compile_one(fn, consts, arch, num_warps, num_stages, elem=BF16):
    """Compile ``fn`` as triton would launch it on contiguous tensors of a typical shape (T and H * D multiples
    of 16): 16-byte aligned pointers and 16-divisible integer arguments (``tt.divisibility``), which is what
    lets the pipeliner turn the K / V / Q / dO loads into multi-buffered asynchronous copies; without them the
    shared memory and registers reported are those of an unpipelined kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    consts = {k: v for k, v in consts.items() if k in fn.arg_names}
    consts.update({k: 1 for k in ONES if k in fn.arg_names and k not in consts})
    pointers = {n: elem if t == BF16 else t for n, t in POINTERS.items()}  # (``elem``: q / k / v / o's type)
    sig = {n: "constexpr" if n in consts else pointers.get(n, "fp32" if n in FLOATS else "i32")
           for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n] != "constexpr" and n not in NOT_ALIGNED and sig[n] != "fp32"}
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages))


def ptxas_usage(kernel, arch):
    """(registers per thread, spill store bytes, spill load bytes) of a compiled kernel: ``ptxas -v`` on its PTX
    (the CUDA-free way to see register pressure; a GPU run reports the same through ``n_regs`` / ``n_spills``)."""
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia import compiler as nv

    ptxas = nv.get_ptxas(arch).path
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(kernel.asm["ptx"])
        out = subprocess.run([ptxas, f"-arch=sm_{arch}{'a' if arch >= 90 else ''}", "-v", src, "-o",
                              os.path.join(d, "k.cubin")], capture_output=True, text=True, check=True).stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    st, ld = (int(x) for x in re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out).groups())
    return regs, st, ld


def sass_loops(kernel, path):
    """Write ``kernel``'s SASS to ``path``; returns (instructions, [instructions of each innermost loop that issues
    wgmma]) -- a loop being a backward branch's range, innermost when it holds no other such range."""
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia import compiler as nv

    cuobjdump = os.path.join(os.path.dirname(nv.get_ptxas(90).path), "cuobjdump")
    if not os.path.exists(cuobjdump):  # (slim_triton.sh removes it)
        raise FileNotFoundError(f"--sass needs cuobjdump beside triton's ptxas; not found: {cuobjdump}")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    with open(path, "w") as f:
        f.write(sass)
    ins = [(int(a, 16), t) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    ranges = [(int(m.group(1), 16), a) for a, t in ins if (m := re.search(r"BRA (0x[0-9a-f]+)", t))
              and int(m.group(1), 16) < a]
    inner = [(lo, hi) for lo, hi in ranges
             if not any(lo <= l2 and h2 <= hi and (l2, h2) != (lo, hi) for l2, h2 in ranges)]
    loops = [[t for a, t in ins if lo <= a <= hi] for lo, hi in inner]
    return len(ins), sorted(len(body) for body in loops if any("HGMMA" in t for t in body))


def compile_gluon(fn, consts, types, aligned, arch=90, consumers=2):
    """A Gluon sm90 kernel as the op's launchers (``stages.forward`` etc. with ``kernel="gluon"``) launch it:
    bf16 TMA descriptors with the default NVMMA shared layouts (``types``: argument -> type string),
    16-divisible ``aligned`` pointers and strides, 4 warps per partition, and the launch register limit that
    leaves room for the loader's warpgroup besides ``consumers`` consumer warpgroups."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental import gluon


    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n in aligned}
    src = gluon._runtime.GluonASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()},
                                        attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=4, maxnreg=L.gluon_maxnreg(4 * consumers)))


def _desc(rows, head_dim):
    from triton.experimental.gluon import language as gl

    layout = gl.NVMMASharedLayout.get_default_for([rows, head_dim], gl.bfloat16)
    return f"tensordesc<bf16[{rows},{head_dim}],{layout!r}>"


def _vec(block):
    from triton.experimental.gluon import language as gl

    return f"tensordesc<fp32[{block}],{gl.NVMMASharedLayout.get_default_for([block], gl.float32)!r}>"


def compile_gluon_fwd(head_dim, block_m, block_n, num_stages, consumers, has_acp, arch=90):
    """The Gluon sm90 forward (``gluon.kernels.fox_fwd_sm90_kernel``), dense or with ACP."""

    types = dict(q_desc=_desc(block_m, head_dim), k_desc=_desc(block_n, head_dim),
                 v_desc=_desc(block_n, head_dim), ck_desc=_vec(block_n), LF=F32, PK=F32, O=BF16, LSE=F32,
                 LO=I32 if has_acp else F32,
                 sm_scale="fp32")
    consts = dict(BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, NUM_STAGES=num_stages, NUM_WG=consumers)
    return compile_gluon(L.jit_kernel("fox_fwd_sm90_kernel"), consts, types,
                         ("LF", "PK", "O", "LSE", "LO", "slb", "sob", "sot", "soh", "spp", "spr"), arch, consumers)


def compile_gluon_dq(head_dim, block_m, block_n, num_stages, consumers, has_acp, arch=90):
    """The Gluon sm90 dq backward (``gluon.kernels.fox_bwd_dq_sm90_kernel``), dense or with ACP."""

    types = dict(q_desc=_desc(block_m, head_dim), do_desc=_desc(block_m, head_dim),
                 k_desc=_desc(block_n, head_dim), v_desc=_desc(block_n, head_dim), ck_desc=_vec(block_n), LF=F32,
                 PK=F32, O=BF16, LSE=F32,
                 DELTA=F32, DQ=BF16, DROW=F32, LO=I32 if has_acp else F32, sm_scale="fp32")
    return compile_gluon(L.jit_kernel("fox_bwd_dq_sm90_kernel"), dict(NUM_STAGES=num_stages, NUM_WG=consumers), types,
                         ("LF", "PK", "O", "LSE", "DELTA", "DQ", "DROW", "LO", "slb", "sqb", "sqt", "sqh", "spp",
                          "spr"), arch, consumers)


def compile_gluon_bwd(head_dim, block_m, keys, num_stages, consumers, has_acp, arch=90):
    """The Gluon sm90 dk/dv backward (``gluon.kernels.fox_bwd_dkdv_sm90_kernel``), dense or with ACP: ``consumers``
    warpgroups of ``keys`` keys each."""

    vec = _vec(block_m)
    types = dict(q_desc=_desc(block_m, head_dim), do_desc=_desc(block_m, head_dim), k_desc=_desc(keys, head_dim),
                 v_desc=_desc(keys, head_dim), cq_desc=vec, lse_desc=vec, dl_desc=vec, LF=F32, PQ=F32, DK=BF16,
                 DV=BF16, DCOL=F32, HI=I32 if has_acp else F32, sm_scale="fp32")
    return compile_gluon(L.jit_kernel("fox_bwd_dkdv_sm90_kernel"), dict(NUM_STAGES=num_stages, NUM_WG=consumers), types,
                         ("LF", "PQ", "DK", "DV", "DCOL", "slb", "sdkb", "sdkt", "sdkh", "spp", "spr", "svr"),
                         arch, consumers)


def compile_gluon_fused(head_dim, block_m, keys, num_stages, consumers, has_acp, arch=90, slots=None):
    """The one-kernel Gluon sm90 backward (``gluon.kernels.fox_bwd_fused_sm90_kernel``), dense or with ACP: two
    consumer warpgroups of ``keys`` keys each, ``slots`` staging slots each (default: the op's config)."""
    from triton.experimental.gluon import language as gl


    assert consumers == 2
    slots = slots or L.GLUON_CONFIGS["fused"][head_dim][3]
    vec = _vec(block_m)

    def acc(cols):  # an fp32 reduce-add accumulator's descriptor, blocks [block_m, cols]
        layout = gl.NVMMASharedLayout.get_default_for([block_m, cols], gl.float32)
        return f"tensordesc<fp32[{block_m},{cols}],{layout!r}>"

    types = dict(q_desc=_desc(block_m, head_dim), do_desc=_desc(block_m, head_dim), k_desc=_desc(keys, head_dim),
                 v_desc=_desc(keys, head_dim), cq_desc=vec, lse_desc=vec, dl_desc=vec, dq_desc=acc(head_dim),
                 rs_desc=acc(8), LF=F32, PQ=F32, DK=BF16, DV=BF16, DCOL=F32, HI=I32 if has_acp else F32,
                 sm_scale="fp32")
    return compile_gluon(L.jit_kernel("fox_bwd_fused_sm90_kernel"), dict(NUM_STAGES=num_stages, DQ_SLOTS=slots), types,
                         ("LF", "PQ", "DK", "DV", "DCOL", "HI", "slb", "sdkb", "sdkt", "sdkh", "spp", "spr", "svr"),
                         arch, consumers)


SMEM_HEAD_DIMS = (16, 32, 64, 128, 256)  # the Triton kernels' padded head dims (BLOCK_D)


def smem_cases(archs, head_dims):
    """(arch, kind, TileConfig, head dim, bytes per element): every config of the Triton kernels' tables (autotuned
    and per head dim) at each head dim with 16-bit inputs, and each head dim's own config with fp32 inputs (which
    run only where asked for: ``backend="triton"``), for each architecture."""
    out = []
    for arch in archs:
        for kind in L.TRITON_KERNELS:
            table = list(L.TRITON_AUTOTUNE_CONFIGS[kind]) + [c for _, c in L.TRITON_HEAD_DIM_CONFIGS[kind]]
            for D in head_dims:
                out += [(arch, kind, cfg, D, 2) for cfg in dict.fromkeys(table)]
                out.append((arch, kind, next(c for d, c in L.TRITON_HEAD_DIM_CONFIGS[kind] if D <= d), D, 4))
    return out


def compiled_shared(arch, kind, cfg, head_dim, elem_bytes=2, group=1):
    """The shared memory triton's compiler gives the Triton kernel ``kind`` with ``cfg`` at ``head_dim`` (bf16 or,
    with ``elem_bytes=4``, fp32 inputs; every mask on: documents, padding and ACP, which the largest variant
    holds). The dk/dv kernel's GROUP (query heads per kv head, unrolled) repeats its loop and not its buffers, so
    GROUP = 1 stands for all."""
    flags = (dict(HAS_START=True, HAS_END=True, HAS_HI=True, GROUP=group) if kind == "dkdv"
             else dict(HAS_START=True, HAS_LO=True))
    consts = dict(HEAD_DIM=head_dim, BLOCK_D=max(16, 1 << (head_dim - 1).bit_length()), IEEE=elem_bytes == 4,
                  BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **flags)
    kernel = compile_one(L.jit_kernel(L.TRITON_KERNELS[kind]), consts, arch, cfg.num_warps, cfg.num_stages,
                         elem=BF16 if elem_bytes == 2 else F32)
    return kernel.metadata.shared


def _compiled_shared_case(case):
    return compiled_shared(*case)


def check_smem(archs, head_dims, jobs, near_limit=None):
    """Compile every case of ``smem_cases`` (``jobs`` processes) and compare ``stages.shared_memory``, the bound
    the op prunes configs by, with the compiler's figure: one line per case, and a failure for an estimate below
    it or for a kernel at a head dim with no config that fits. ``near_limit`` (a fraction): compile only the cases
    whose estimate lies within that fraction of the architecture's limit, where the estimate decides between
    keeping and pruning (the no-config-fits check still covers every case). Returns the number of failures."""
    import concurrent.futures

    def limit_of(arch):
        return SHARED_LIMIT.get(arch, SHARED_LIMIT[80])

    every = smem_cases(archs, head_dims)
    fitting = {}
    for arch, kind, cfg, D, elem in every:
        if elem == 2:
            fitting.setdefault((arch, kind, D), []).append(L.shared_memory(kind, cfg, D, elem, arch) <= limit_of(arch))
    cases = [c for c in every if near_limit is None
             or abs(L.shared_memory(c[1], c[2], c[3], c[4], c[0]) - limit_of(c[0])) <= near_limit * limit_of(c[0])]
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
        shared = list(pool.map(_compiled_shared_case, cases))
    failed = 0
    for (arch, kind, cfg, D, elem), true in zip(cases, shared):
        limit = limit_of(arch)
        est = L.shared_memory(kind, cfg, D, elem, arch)
        verdict = "kept" if est <= limit else "pruned" + (f", fits by {limit - true}" if true <= limit else "")
        bad = est < true
        failed += bad
        print(f"smem sm{arch} {kind} D={D} {'bf16' if elem == 2 else 'fp32'} {tuple(vars(cfg).values())} compiled "
              f"{true} estimate {est} ({est - true:+d}) {verdict}{' UNDERESTIMATE' if bad else ''}", flush=True)
    for (arch, kind, D), fits in fitting.items():
        if not any(fits):
            failed += 1
            print(f"smem sm{arch} {kind} D={D}: NO CONFIG FITS", flush=True)
    return failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, nargs="+", default=[90, 80])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--regs", action="store_true", help="also print registers and spill bytes (ptxas -v)")
    ap.add_argument("--sass", metavar="DIR", help="also write each kernel's SASS to DIR and print its loop sizes")
    ap.add_argument("--smem", action="store_true",
                    help="instead: every Triton tile config of the tables at every padded head dim, the shared "
                         "memory the op estimates against the compiler's")
    ap.add_argument("--head-dims", type=int, nargs="+", default=list(SMEM_HEAD_DIMS), help="(--smem)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="(--smem) compiling processes")
    ap.add_argument("--near-limit", type=float, metavar="FRACTION",
                    help="(--smem) only the configs whose estimate is within FRACTION of the limit")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("compile_kernels: unset TRITON_INTERPRET (the interpreter's kernels cannot be compiled)")
    if args.smem:
        if check_smem(args.arch, args.head_dims, args.jobs, args.near_limit):
            raise SystemExit(1)
        return

    failed = 0
    for arch in args.arch:
        todo = [(name, consts, w, s, lambda n=name, c=consts, w=w, s=s: compile_one(L.jit_kernel(n), c, arch, w, s))
                for name, consts, w, s in cases(args.quick)]
        if arch >= 90:  # the Gluon kernels: Hopper only
            # configs: (rows per consumer warpgroup, BLOCK_N, stages, consumer warpgroups); dk/dv's: (BLOCK_M,
            # keys per consumer warpgroup, stages, consumer warpgroups)
            fused = {D: cfg[:3] + (2,) for D, cfg in L.GLUON_CONFIGS["fused"].items()}  # (two consumer warpgroups)
            for kind, configs, fn in (("fox_fwd_sm90_kernel", L.GLUON_CONFIGS["fwd"], compile_gluon_fwd),
                                      ("fox_bwd_dq_sm90_kernel", L.GLUON_CONFIGS["dq"], compile_gluon_dq),
                                      ("fox_bwd_dkdv_sm90_kernel", L.GLUON_CONFIGS["dkdv"], compile_gluon_bwd),
                                      ("fox_bwd_fused_sm90_kernel", fused, compile_gluon_fused)):
                # (--quick: the ACP variants at head dim 64 only, the named model sizes' head dim)
                tile = "BLOCK_N" if kind in ("fox_fwd_sm90_kernel", "fox_bwd_dq_sm90_kernel") else "KEYS"
                todo += [(kind, {"HEAD_DIM": D, "BLOCK_M": bm, tile: bn, "NUM_WG": wgs, "HAS_ACP": acp}, 4, st,
                          lambda D=D, bm=bm, bn=bn, st=st, wgs=wgs, acp=acp, fn=fn: fn(D, bm, bn, st, wgs, acp, arch))
                         for D, (bm, bn, st, wgs) in sorted(configs.items())
                         for acp in ((False, True) if D == 64 or not args.quick else (False,))]
        for name, consts, w, s, compile_fn in todo:
            if arch < 90 and consts.get("HEAD_DIM") == 80:
                continue  # one head dim is enough to show the pre-Hopper path compiles
            try:
                kernel = compile_fn()
                shared = kernel.metadata.shared
                if shared > SHARED_LIMIT.get(arch, SHARED_LIMIT[80]):
                    raise RuntimeError(f"needs {shared} bytes of shared memory, sm{arch} allows "
                                       f"{SHARED_LIMIT.get(arch, SHARED_LIMIT[80])}")
                regs = ""
                if args.regs:
                    regs = ", {} registers, spills {} / {} bytes stored / loaded".format(*ptxas_usage(kernel, arch))
                if args.sass:
                    os.makedirs(args.sass, exist_ok=True)
                    tag = "_".join(f"{k}{v}" for k, v in consts.items() if k in ("HEAD_DIM", "HAS_ACP", "HAS_LO"))
                    n, loops = sass_loops(kernel, os.path.join(args.sass, f"sm{arch}_{name}_{tag}.sass"))
                    regs += f", {n} SASS instructions, wgmma loops of {loops} instructions"
                print(f"sm{arch} {name} {consts} warps {w} stages {s} ok ({shared} bytes shared{regs})", flush=True)
            except Exception as e:  # noqa: BLE001 (report every failure, then exit 1)
                failed += 1
                cause = e
                while cause.__cause__ is not None:
                    cause = cause.__cause__
                print(f"sm{arch} {name} {consts} FAILED: {str(e)[-800:]} | {str(cause)[-400:]}", flush=True)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
