"""What the installed triton offers for a Hopper (sm90) Forgetting Attention kernel: a diagnostic.

    python -m benchmarks.attention.probe --compile [--arch 90 100] 2>/dev/null   (no GPU needed; TRITON_INTERPRET
                                                                                  unset; stderr: MLIR reproducers)
    python -m benchmarks.attention.probe --bench                   (on a GPU of compute capability >= 9.0)

``--compile`` reports, per architecture, whether warp specialisation compiles:
  1. ``tl.range(..., warp_specialize=True)`` on a TMA-descriptor matmul loop (the simplest case);
  2. the same on the clean key-block loop of the FoX forward below, and whether a ``ttg.warp_specialize`` region
     came out of it (the compiler may also drop the request);
  3. Gluon's explicit ``gl.warp_specialize`` (a default and a one-warp worker partition). On a GPU of that
     generation it is also launched and both partitions' outputs are checked.
``--bench`` times the FoX forward with TMA-descriptor K/V loads (``fwd_tma_kernel``, dense, no padding / ACP,
head dim a power of two) against the op's Triton forward kernel at S2 / S3 / S4, and checks that the outputs
agree. What it found on triton 3.6 and 3.7.1, and why the Hopper kernels are written in Gluon: docs/kernel.md.
"""

from __future__ import annotations

import argparse
import os

import triton
import triton.language as tl

from forgetting_transformer.ops.forgetting_attention import stages as L


# the kernels' own helper: the row of PK for blocks of BLOCK positions, for one (b, h)
_prefix_plane = L.jit_kernel("_prefix_plane")


@triton.jit
def _ws_matmul(A, B, C, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    acc = tl.zeros((BM, BN), tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=True):
        acc = tl.dot(A.load([0, k]), B.load([k, 0]), acc)
    tl.store(C + tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :], acc)


@triton.jit
def _fwd_tile(acc, l_i, m_i, g, q, rq2, pos_q, K_DESC, V_DESC, PK_base, krow, kcol, n0, E, qk_scale, offs_n,
              CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """One key block of the forward (as ``_attn_fwd_inner``), K and V from TMA descriptors."""
    pos_k = n0 + offs_n
    ck = tl.load(PK_base + pos_k)
    tot_k = tl.load(PK_base + tl.minimum(n0 + BLOCK_N, E) - 1)
    k = K_DESC.load([krow + n0, kcol])  # (BLOCK_N, D)
    v = V_DESC.load([krow + n0, kcol])
    dk2 = ((tot_k - ck) + g) * 1.4426950408889634
    s = tl.dot(q, tl.trans(k)) * qk_scale + (dk2[None, :] - rq2[:, None])
    if CAUSAL:
        s = tl.where(pos_k[None, :] <= pos_q[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, l_i, m_new, g + tot_k


@triton.jit
def fwd_tma_kernel(Q, K_DESC, V_DESC, LF, PK, O, LSE, sqb, sqt, sqh, slb, slt, slh, H, Tq, Tk, sm_scale, spp, spr,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr):
    """The dense FoX forward (same arithmetic as ``_attn_fwd_kernel``) with K / V through TMA descriptors over
    (B·Tk, H·D) views; ``WS``: ``warp_specialize`` on the clean key blocks. q, k, v (B, T, H, D) contiguous."""
    pid_bh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    off = Tk - Tq
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < Tq
    pos_q = off + offs_m
    m0 = off + pid_m * BLOCK_M
    E = tl.minimum(m0 + BLOCK_M, Tk)
    Q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
    q = tl.load(Q_base + offs_m[:, None] * sqt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    LF_base = LF + b.to(tl.int64) * slb + h.to(tl.int64) * slh
    lf_q = tl.load(LF_base + pos_q * slt, mask=row_ok, other=0.0)
    rq2 = (tl.sum(lf_q, 0) - tl.cumsum(lf_q, 0)) * 1.4426950408889634
    qk_scale = sm_scale * 1.4426950408889634
    PK_base = _prefix_plane(PK, pid_bh, spp, spr, BLOCK_N)
    n_top = ((E - 1) // BLOCK_N) * BLOCK_N
    n_masked = tl.minimum(tl.maximum((n_top - m0) // BLOCK_N + 1, 1), n_top // BLOCK_N + 1)
    n_clean = n_top // BLOCK_N + 1 - n_masked
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    g = tl.sum(tl.zeros([BLOCK_N], dtype=tl.float32), 0)
    for it in range(0, n_masked):  # keys past Tk in a diagonal block are causally masked (TMA zero-fills the end)
        acc, l_i, m_i, g = _fwd_tile(acc, l_i, m_i, g, q, rq2, pos_q, K_DESC, V_DESC, PK_base, b * Tk,
                                     h * HEAD_DIM, n_top - it * BLOCK_N, E, qk_scale, offs_n, True, BLOCK_N)
    for it in tl.range(0, n_clean, warp_specialize=WS):
        acc, l_i, m_i, g = _fwd_tile(acc, l_i, m_i, g, q, rq2, pos_q, K_DESC, V_DESC, PK_base, b * Tk,
                                     h * HEAD_DIM, n_top - (n_masked + it) * BLOCK_N, E, qk_scale, offs_n, False,
                                     BLOCK_N)
    l_ok = l_i > 0.0
    o = acc / tl.where(l_ok, l_i, 1.0)[:, None]
    O_base = O + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
    tl.store(O_base + offs_m[:, None] * sqt + offs_d[None, :], o.to(O.dtype.element_ty), mask=row_ok[:, None])
    lse2 = tl.where(l_ok, m_i + tl.math.log2(tl.where(l_ok, l_i, 1.0)), 0.0)
    tl.store(LSE + pid_bh.to(tl.int64) * Tq + offs_m, lse2, mask=row_ok)


def _compile(fn, sig, consts, arch, num_warps, num_stages=3):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {n: "constexpr" if n in consts else sig.get(n, "i32") for n in fn.arg_names}
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages))


def _outcome(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 (reported, not raised: this is a probe)
        return f"fails: {type(e).__name__}: {str(e)[-160:]}"


def probe_matmul(arch):
    sig = {"A": "tensordesc<bf16[128,64]>", "B": "tensordesc<bf16[64,128]>", "C": "*fp32"}
    k = _compile(_ws_matmul, sig, dict(BM=128, BN=128, BK=64), arch, 4)
    return f"compiles; `ttg.warp_specialize` appears {k.asm['ttgir'].count('ttg.warp_specialize')}x in the TTGIR"


def probe_fox_forward(arch, D):
    bn, w = (128, 8) if D >= 128 else (64, 4)
    sig = {"Q": "*bf16", "O": "*bf16", "LF": "*fp32", "PK": "*fp32", "LSE": "*fp32", "sm_scale": "fp32",
           "K_DESC": f"tensordesc<bf16[{bn},{D}]>", "V_DESC": f"tensordesc<bf16[{bn},{D}]>"}
    k = _compile(fwd_tma_kernel, sig, dict(HEAD_DIM=D, BLOCK_M=128, BLOCK_N=bn, WS=True), arch, w)
    return f"compiles; `ttg.warp_specialize` appears {k.asm['ttgir'].count('ttg.warp_specialize')}x in the TTGIR"


def probe_gluon(arch):
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    @gluon.jit
    def _worker(X, Y, N: gl.constexpr):
        offs = gl.arange(0, N, layout=gl.BlockedLayout([1], [32], [1], [0]))
        gl.store(Y + offs, gl.load(X + offs) * 2.0)

    @gluon.jit
    def _default(X, Z, N: gl.constexpr):
        offs = gl.arange(0, N, layout=gl.BlockedLayout([1], [32], [4], [0]))
        gl.store(Z + offs, gl.load(X + offs) + 1.0)

    @gluon.jit
    def _ws(X, Y, Z, N: gl.constexpr):
        gl.warp_specialize([(_default, (X, Z, N)), (_worker, (X, Y, N))], [1], [24])

    from triton.backends.compiler import GPUTarget

    src = gluon._runtime.GluonASTSource(_ws, {"X": "*fp32", "Y": "*fp32", "Z": "*fp32", "N": "constexpr"},
                                        constexprs={(3,): 128})
    triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=4))
    import torch

    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] * 10 >= arch):
        return "compiles"
    x = torch.randn(128, device="cuda")
    y, z = torch.empty_like(x), torch.empty_like(x)
    _ws[(1,)](x, y, z, N=128, num_warps=4)
    ok = torch.equal(y, x * 2.0) and torch.equal(z, x + 1.0)
    return f"compiles, ran on {torch.cuda.get_device_name()}: outputs {'correct' if ok else 'WRONG'}"


def bench():
    import torch
    import torch.nn.functional as F
    from triton.tools.tensor_descriptor import TensorDescriptor

    print(f"triton {triton.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}; forward only, "
          f"median of do_bench", flush=True)
    shapes = {"S2": (1, 16384, 16, 64, 128, 64, 4), "S3": (2, 8192, 8, 128, 128, 128, 8),
              "S4": (1, 32768, 8, 128, 128, 128, 8)}  # (B, T, H, D, BLOCK_M, BLOCK_N, warps): the op's configs
    for name, (B, T, H, D, bm, bn, w) in shapes.items():
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, T, H, D, device="cuda", generator=g).bfloat16() for _ in range(3))
        lf = F.logsigmoid(torch.randn(B, T, H, device="cuda", generator=g) + 4)
        sm = D ** -0.5
        ref, _ = L.forward(q, k, v, lf, sm_scale=sm)
        t_ref = triton.testing.do_bench(lambda: L.forward(q, k, v, lf, sm_scale=sm), warmup=25, rep=200,
                                        return_mode="median")
        pk, _ = L.block_prefix(lf, T, query_side=False)
        kd, vd = (TensorDescriptor(t.view(B * T, H * D), [B * T, H * D], [H * D, 1], [bn, D]) for t in (k, v))
        o, lse = torch.empty_like(q), torch.empty(B, H, T, device="cuda")
        for stages in (3, 2):
            def run():
                fwd_tma_kernel[(B * H, triton.cdiv(T, bm))](
                    q, kd, vd, lf, pk, o, lse, *q.stride()[:3], *lf.stride(), H, T, T, sm, *pk.stride()[:2],
                    HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, WS=False, num_warps=w, num_stages=stages)

            run()
            diff = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
            t = triton.testing.do_bench(run, warmup=25, rep=200, return_mode="median")
            print(f"{name} ({B}, {T}, {H}, {D}): op forward {t_ref:.3f} ms | TMA K/V, {stages} stages {t:.3f} ms "
                  f"-> {t_ref / t:.3f}x; relative difference to the op's output {diff:.1e}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--arch", type=int, nargs="+", default=[90, 100])
    args = ap.parse_args()
    if not (args.compile or args.bench):
        ap.error("give --compile and/or --bench")
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("probe: unset TRITON_INTERPRET")
    if args.compile:
        for arch in args.arch:
            print(f"triton {triton.__version__} sm{arch}:", flush=True)
            print(f"  tl.range(warp_specialize=True), TMA matmul loop: {_outcome(lambda: probe_matmul(arch))}",
                  flush=True)
            for D in (64, 128):
                print(f"  tl.range(warp_specialize=True), FoX forward D={D}: "
                      f"{_outcome(lambda: probe_fox_forward(arch, D))}", flush=True)
            gluon = _outcome(lambda: probe_gluon(arch)) if arch >= 90 else "not probed (no setmaxnreg below sm90)"
            print(f"  gluon gl.warp_specialize: {gluon}", flush=True)
    if args.bench:
        bench()


if __name__ == "__main__":
    main()
