"""GPU tests of the warp-specialised Gluon kernels (Hopper): each against float64 attention and against the Triton
kernel it stands in for, with ACP's tables, and the op's choice between them (bounds in ``accuracy.py``).

Run on the device: ``bash benchmarks/attention/gpu_tests.sh``.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from accuracy import TOL, TOL_FEW_KEYS, rel
from forgetting_transformer.ops.forgetting_attention import acp as _acp
from forgetting_transformer.ops.forgetting_attention import default_options, forgetting_attention_ref, use_options
from forgetting_transformer.ops.forgetting_attention.gluon import launch as GL
from forgetting_transformer.ops.forgetting_attention.triton import launch as TL
from gpu_cases import check, grads, make
from oracles import acp_masked_ref

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Triton kernel on real hardware)"),
]


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.skipif(not _hopper(), reason="the Gluon forward needs a Hopper GPU (compute capability 9.x)")
@pytest.mark.parametrize("B,Tq,Tk,H,Hkv,D,dtype,config", [
    (2, 1000, 1000, 4, 2, 128, torch.bfloat16, None),   # T not a multiple of the tiles, GQA, rows past the batch
    (1, 300, 1111, 4, 1, 128, torch.float16, None),     # Tq < Tk, MQA, fp16
    (1, 1, 77, 2, 2, 128, torch.bfloat16, None),        # one query
    (3, 129, 129, 2, 2, 64, torch.bfloat16, (64, 128, 3, 2)),
    (3, 129, 129, 2, 2, 64, torch.bfloat16, (64, 128, 3, 3)),  # three consumer warpgroups
    (2, 1000, 1000, 4, 2, 64, torch.bfloat16, (64, 128, 2, 3)),  # ... with partial last blocks, GQA
    (1, 4096, 4096, 2, 2, 64, torch.bfloat16, (64, 64, 4, 3)),
    (1, 4096, 4096, 2, 2, 128, torch.bfloat16, (64, 64, 3, 2)),
])
def test_gluon_forward(B, Tq, Tk, H, Hkv, D, dtype, config):
    """The warp-specialised Gluon forward (``gluon.launch.fwd_sm90``): o within the bf16 bound of the float64 reference
    and as close to it as the Triton forward, and the same log-sum-exp as the Triton forward (the backward reads it)."""
    q, k, v, lf = make(B, Tq, Tk, H, Hkv, D, dtype)
    sm = D ** -0.5
    o, lse = GL.fwd_sm90(q, k, v, lf, sm, config)
    o_t, lse_t = TL.fwd(q, k, v, lf, None, sm, default_options())
    ref = forgetting_attention_ref(q.double(), k.double(), v.double(), lf.double())
    assert torch.isfinite(o).all()
    e, e_t = rel(o, ref), rel(o_t, ref)
    assert e <= TOL["o"] and e <= 1.05 * e_t, (e, e_t)
    assert (lse - lse_t).abs().max().item() < 1e-4 * max(1.0, lse_t.abs().max().item())


@pytest.mark.skipif(not _hopper(), reason="the Gluon dk/dv kernel needs a Hopper GPU (compute capability 9.x)")
@pytest.mark.parametrize("B,Tq,Tk,H,Hkv,D,dtype,config", [
    (2, 1000, 1000, 4, 2, 128, torch.bfloat16, None),   # a partial last query tile, GQA, rows past the batch
    (1, 300, 1111, 4, 1, 128, torch.float16, None),     # Tq < Tk (key blocks before the first query), MQA, fp16
    (1, 1, 77, 2, 2, 128, torch.bfloat16, None),        # one query
    (3, 129, 129, 2, 2, 64, torch.bfloat16, (64, 64, 2, 2)),
    (3, 129, 129, 2, 2, 64, torch.bfloat16, (64, 64, 3, 3)),   # three consumer warpgroups (192-key blocks)
    (2, 1000, 1000, 4, 2, 64, torch.bfloat16, (32, 64, 4, 3)),  # ... with a partial last key block, GQA
    (1, 4096, 4096, 2, 2, 64, torch.bfloat16, None),
    (1, 4096, 4096, 2, 2, 128, torch.bfloat16, (64, 64, 3, 2)),
])
def test_gluon_dkdv(B, Tq, Tk, H, Hkv, D, dtype, config):
    """The warp-specialised Gluon dk/dv kernel (``gluon.launch.bwd_dkdv_sm90``): dk, dv and d log f (from its column
    sums) within the bounds of float64 autograd and as close to it as the Triton dk/dv kernel."""
    q, k, v, lf = make(B, Tq, Tk, H, Hkv, D, dtype)
    sm = D ** -0.5
    o, lse = TL.fwd(q, k, v, lf, None, sm, default_options())
    do = torch.randn(q.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)).to(dtype)
    pk, pq = TL.block_prefix(lf, Tq)
    _, drow, delta = TL.bwd_dq(do, q, k, v, lf, pk, o, lse, None, sm, default_options())
    xs = [t.double().requires_grad_() for t in (q, k, v, lf)]
    ref = dict(zip(("dk", "dv", "dlf"), torch.autograd.grad(forgetting_attention_ref(*xs), xs, do.double())[1:]))
    ours = GL.bwd_dkdv_sm90(do, q, k, v, lf, pq, lse, delta, sm, config)
    triton_ = TL.bwd_dkdv(do, q, k, v, lf, pq, lse, delta, None, None, sm, default_options())
    got = {name: dict(zip(("dk", "dv", "dlf"), (r[0], r[1], TL.bwd_dlogf(drow, r[2]))))
           for name, r in (("gluon", ours), ("triton", triton_))}
    for name in ("dk", "dv", "dlf"):
        a = got["gluon"][name]
        assert torch.isfinite(a).all(), name
        e, e_t = rel(a, ref[name]), rel(got["triton"][name], ref[name])
        assert e <= TOL[name] and e <= 1.1 * e_t + 1e-5, (name, e, e_t)


@pytest.mark.skipif(not _hopper(), reason="the Gluon dq kernel needs a Hopper GPU (compute capability 9.x)")
@pytest.mark.parametrize("B,Tq,Tk,H,Hkv,D,dtype,config", [
    (2, 1000, 1000, 4, 2, 128, torch.bfloat16, None),   # a partial last query block, GQA, rows past the batch
    (1, 300, 1111, 4, 1, 128, torch.float16, None),     # Tq < Tk, MQA, fp16
    (1, 1, 77, 2, 2, 64, torch.bfloat16, None),         # one query
    (3, 129, 129, 2, 2, 64, torch.bfloat16, (64, 128, 2, 2)),
    (3, 129, 129, 2, 2, 64, torch.bfloat16, (64, 64, 3, 3)),   # three consumer warpgroups
    (1, 4096, 4096, 2, 2, 64, torch.bfloat16, None),
    (1, 4096, 4096, 2, 2, 128, torch.bfloat16, (64, 128, 2, 2)),
])
def test_gluon_dq(B, Tq, Tk, H, Hkv, D, dtype, config):
    """The warp-specialised Gluon dq kernel (``gluon.launch.bwd_dq_sm90``): dq and d log f (from its row sums) within
    the bounds of float64 autograd and as close to it as the Triton dq kernel, and the same delta as that kernel (the
    dk/dv kernel reads it)."""
    q, k, v, lf = make(B, Tq, Tk, H, Hkv, D, dtype)
    sm = D ** -0.5
    o, lse = TL.fwd(q, k, v, lf, None, sm, default_options())
    do = torch.randn(q.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)).to(dtype)
    pk, pq = TL.block_prefix(lf, Tq)
    xs = [t.double().requires_grad_() for t in (q, k, v, lf)]
    g = torch.autograd.grad(forgetting_attention_ref(*xs), xs, do.double())
    ref = {"dq": g[0], "dlf": g[3]}
    dq, drow, delta = GL.bwd_dq_sm90(do, q, k, v, lf, pk, o, lse, sm, config)
    dq_t, drow_t, delta_t = TL.bwd_dq(do, q, k, v, lf, pk, o, lse, None, sm, default_options())
    dcol = TL.bwd_dkdv(do, q, k, v, lf, pq, lse, delta_t, None, None, sm, default_options())[2]
    got = {"gluon": {"dq": dq, "dlf": TL.bwd_dlogf(drow, dcol)},
           "triton": {"dq": dq_t, "dlf": TL.bwd_dlogf(drow_t, dcol)}}
    for name in ("dq", "dlf"):
        a = got["gluon"][name]
        assert torch.isfinite(a).all(), name
        e, e_t = rel(a, ref[name]), rel(got["triton"][name], ref[name])
        assert e <= TOL[name] and e <= 1.1 * e_t + 1e-5, (name, e, e_t)
    assert (delta - delta_t).abs().max().item() <= 1e-5 * max(1.0, delta_t.abs().max().item())


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels need a Hopper GPU (compute capability 9.x)")
@pytest.mark.parametrize("B,Tq,Tk,H,Hkv,D,grid", [
    (1, 4096, 4096, 4, 2, 128, None),        # ACP's own grid (64 x 64 on the GPU), GQA
    (2, 1000, 1000, 4, 2, 64, None),         # partial last tiles, rows past the batch
    (1, 300, 1111, 4, 1, 128, None),         # Tq < Tk, MQA
    (1, 300, 1111, 4, 1, 64, None),          # the same through the one-kernel backward
    (1, 2048, 2048, 2, 2, 64, (16, 16)),     # a grid finer than every tile: per-row / per-key bounds
    (1, 2048, 2048, 2, 1, 128, (128, 256)),  # a grid coarser than the tiles
])
def test_gluon_acp(B, Tq, Tk, H, Hkv, D, grid):
    """ACP in the Gluon forward, dq and dk/dv kernels and (head dim 64) the one-kernel backward: o, dq, dk, dv and
    d log f equal those of float64 attention with exactly ACP's pruned tiles masked out (``acp_masked_ref``) within
    ``TOL_FEW_KEYS`` (the local heads attend to few keys) and as closely as the Triton kernels' with the same
    tables (d log f of the one kernel within 2x, 1.5-1.7x measured: its row and column sums are of the 16-bit dS,
    as in ``test_gluon_fused_bwd``), and the log-sum-exp equals the Triton forward's. Half the heads are local
    (heavy pruning), half global (none)."""
    opts = default_options().replace(acp_grid=grid)
    GM, GN = _acp.grid(D, opts.acp_grid)
    q, k, v, lf = make(B, Tq, Tk, H, Hkv, D)
    g = torch.Generator(device="cuda").manual_seed(2)
    lf[..., : H // 2] = F.logsigmoid(torch.randn(B, Tk, H // 2, device="cuda", generator=g) - 3.5)  # ~ -0.04
    lf[..., H // 2:] = -1e-4
    delta = torch.full((B, H), -6.0, device="cuda")
    tables = TL.acp_tables(lf, delta, Tq, (GM, GN))
    sm = D ** -0.5
    do = torch.randn(q.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)).to(q.dtype)
    # float64, and the same masked attention in PyTorch at q's dtype (log f in fp32, as the kernels take it)
    ref, ref_lp = ({name: t for name, t in zip(("o", "dq", "dk", "dv", "dlf"), grads(
        lambda *x: acp_masked_ref(*x, delta.to(x[3].dtype), GM, GN), xs, do.to(xs[0].dtype)))}
        for xs in ([t.double() for t in (q, k, v, lf)], (q, k, v, lf)))
    assert ref["o"].isfinite().all()

    o, lse = GL.fwd_sm90(q, k, v, lf, sm, acp_tables=tables, grid=(GM, GN))
    o_t, lse_t = TL.fwd(q, k, v, lf, None, sm, opts, tables)
    pk, pq = TL.block_prefix(lf, Tq)
    dq, drow, delta_o = GL.bwd_dq_sm90(do, q, k, v, lf, pk, o_t, lse_t, sm, acp_tables=tables, grid=(GM, GN))
    dq_t, drow_t, delta_t = TL.bwd_dq(do, q, k, v, lf, pk, o_t, lse_t, None, sm, opts, tables)
    ours = GL.bwd_dkdv_sm90(do, q, k, v, lf, pq, lse_t, delta_t, sm, acp_tables=tables, grid=(GM, GN))
    triton_ = TL.bwd_dkdv(do, q, k, v, lf, pq, lse_t, delta_t, None, None, sm, opts, tables)
    got = {name: dict(zip(("o", "dq", "dk", "dv", "dlf"), (oo, dq_, r[0], r[1], TL.bwd_dlogf(dr, r[2]))))
           for name, oo, dq_, dr, r in (("gluon", o, dq, drow, ours), ("triton", o_t, dq_t, drow_t, triton_))}
    if D == 64:
        f = GL.bwd_fused_sm90(do, q, k, v, lf, o_t, lse_t, sm, acp_tables=tables, grid=(GM, GN))
        got["fused"] = dict(zip(("o", "dq", "dk", "dv", "dlf"), (o, f[0], f[1], f[2], TL.bwd_dlogf(f[3], f[4]))))
    errs = {}
    for kernels in [k_ for k_ in ("gluon", "fused") if k_ in got]:
        for name in ("o", "dq", "dk", "dv", "dlf"):
            a = got[kernels][name]
            assert torch.isfinite(a).all(), (kernels, name)
            errs[kernels, name] = e, e_t, e_lp = (rel(a, ref[name]), rel(got["triton"][name], ref[name]),
                                                  rel(ref_lp[name], ref[name]))
            slack = 2.0 if (kernels, name) == ("fused", "dlf") else 1.1
            assert e <= TOL_FEW_KEYS[name] and e <= slack * e_t + 1e-5, (kernels, name, e, e_t, e_lp)
    print(f"\n[gluon ACP {B, Tq, Tk, H, Hkv, D} grid {GM}x{GN}] " + " ".join(
        f"{n}={e:.2e}(triton {e_t:.2e}, pytorch {e_lp:.2e})" for n, (e, e_t, e_lp) in errs.items()))
    assert (lse - lse_t).abs().max().item() < 1e-4 * max(1.0, lse_t.abs().max().item())
    lo = tables[0].view(B, H, -1)
    assert (lo[:, : H // 2] > 0).any() and (lo[:, H // 2:] == 0).all()  # the local heads prune, the global not


@pytest.mark.skipif(not _hopper(), reason="the one-kernel Gluon backward needs a Hopper GPU (compute capability 9.x)")
@pytest.mark.parametrize("B,Tq,Tk,H,Hkv,dtype", [
    (2, 1000, 1000, 4, 2, torch.bfloat16),   # a partial last query tile, GQA, rows past the batch
    (1, 300, 1111, 4, 1, torch.float16),     # Tq < Tk (key blocks before the first query), MQA, fp16
    (1, 1, 77, 2, 2, torch.bfloat16),        # one query
    (3, 129, 129, 2, 2, torch.bfloat16),     # a partial last key block
    (1, 4096, 4096, 2, 2, torch.bfloat16),
    (1, 4096, 4096, 4, 1, torch.bfloat16),   # MQA: four heads' tiles through one program
])
def test_gluon_fused_bwd(B, Tq, Tk, H, Hkv, dtype):
    """The one-kernel Gluon backward (``gluon.launch.bwd_fused_sm90``, head dim 64): dq, dk, dv and d log f against
    float64 autograd within the ``TOL`` bounds, as close to it as the Triton dq and dk/dv kernels for dq, dk and dv, and
    within 1.5x of them for d log f: its row and column sums of dS are both taken of the 16-bit dS that the dq and dk
    products use (1.2-1.35x the two kernels' error, which sum the fp32 dS)."""
    D = 64
    q, k, v, lf = make(B, Tq, Tk, H, Hkv, D, dtype)
    sm = D ** -0.5
    do = torch.randn(q.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)).to(dtype)
    xs = [t.double().requires_grad_() for t in (q, k, v, lf)]
    ref = dict(zip(("dq", "dk", "dv", "dlf"), torch.autograd.grad(forgetting_attention_ref(*xs), xs, do.double())))
    o, lse = TL.fwd(q, k, v, lf, None, sm, default_options())
    dq, dk, dv, drow, dcol = GL.bwd_fused_sm90(do, q, k, v, lf, o, lse, sm)
    pk, pq = TL.block_prefix(lf, Tq)
    dq_t, drow_t, delta_t = TL.bwd_dq(do, q, k, v, lf, pk, o, lse, None, sm, default_options())
    dk_t, dv_t, dcol_t = TL.bwd_dkdv(do, q, k, v, lf, pq, lse, delta_t, None, None, sm, default_options())
    got = {"dq": dq, "dk": dk, "dv": dv, "dlf": TL.bwd_dlogf(drow, dcol)}
    two = {"dq": dq_t, "dk": dk_t, "dv": dv_t, "dlf": TL.bwd_dlogf(drow_t, dcol_t)}
    errs = {}
    for name, a in got.items():
        assert torch.isfinite(a).all(), name
        errs[name] = e, e_t = rel(a, ref[name]), rel(two[name], ref[name])
        assert e <= TOL[name] and e <= (1.5 if name == "dlf" else 1.1) * e_t + 1e-5, (name, errs)
    print(f"\n[fused {B, Tq, Tk, H, Hkv} {dtype}] " + " ".join(
        f"{n}={e:.2e}(two kernels {e_t:.2e})" for n, (e, e_t) in errs.items()))


@pytest.mark.skipif(not _hopper(), reason="the Gluon kernels need a Hopper GPU (compute capability 9.x)")
def test_gluon_dispatch(monkeypatch):
    """Dense and ACP calls on Hopper run the Gluon forward and backward kernels (D = 64 and 128): at head dim 64 the
    one-kernel backward, unless ``fused_backward=False`` (or a deterministic backward is asked for,
    ``test_deterministic_backward``); ``gluon=False`` turns them off, and calls with left padding keep the Triton
    kernels. fwd + all gradients stay within the float64 bounds either way."""
    calls = []
    for name in ("fwd_sm90", "bwd_dq_sm90", "bwd_dkdv_sm90", "bwd_fused_sm90"):
        real = getattr(GL, name)
        monkeypatch.setattr(GL, name, lambda *a, _r=real, _n=name, **kw: calls.append(_n) or _r(*a, **kw))
    with use_options(gluon=True, fused_backward=True):
        q, k, v, lf = make(2, 1024, 1024, 4, 2, 128)
        check(q, k, v, lf)
        assert calls == ["fwd_sm90", "bwd_dq_sm90", "bwd_dkdv_sm90"]
        q64, k64, v64, lf64 = make(2, 1000, 1000, 4, 2, 64)
        check(q64, k64, v64, lf64)
        assert calls[3:] == ["fwd_sm90", "bwd_fused_sm90"]
        with use_options(fused_backward=False):
            check(q64, k64, v64, lf64)
        assert calls[5:] == ["fwd_sm90", "bwd_dq_sm90", "bwd_dkdv_sm90"]
        check(q, k, v, lf, seq_start=torch.tensor([0, 5], device="cuda"))
        assert len(calls) == 8
        for t in ((q, k, v, lf), (q64, k64, v64, lf64)):  # ACP runs them too
            D = t[0].shape[-1]
            qn, kn = ((F.normalize(x.float(), dim=-1) * math.sqrt(D)).bfloat16() for x in t[:2])
            w = torch.ones(D, device="cuda")
            check(qn, kn, *t[2:], ours_kw=dict(adaptive_threshold="auto", qk_norm_weights=(w, w)))
        assert calls[8:] == ["fwd_sm90", "bwd_dq_sm90", "bwd_dkdv_sm90", "fwd_sm90", "bwd_fused_sm90"]
        with use_options(gluon=False):
            check(q, k, v, lf)
        assert len(calls) == 13
