"""CPU tests of the Triton Forgetting Attention kernels, run under ``TRITON_INTERPRET=1`` in float32.

The kernels (``options=on("triton")``) are checked against the float64 reference for the output and all four
gradients (q, k, v, log f), with every output buffer the op allocates poisoned with NaN first.
"""

import math
import os

import pytest
import torch
import torch.nn.functional as F

from accuracy import on
from forgetting_transformer.ops.forgetting_attention import (AttentionOptions, forgetting_attention,
                                                             forgetting_attention_ref)
from forgetting_transformer.ops.forgetting_attention import autograd as DP
from forgetting_transformer.ops.forgetting_attention.gluon import launch as GL
from forgetting_transformer.ops.forgetting_attention.triton import launch as TL
from forgetting_transformer.ops.forgetting_attention.acp import grid as acp_grid
from forgetting_transformer.ops.options import default_options
from forgetting_transformer.ops.forgetting_attention.reference import forgetting_attention_naive
from kernel_cases import RTOL, check, make, rel, run_grads

if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU interpreter tests (the GPU is covered by test_kernel_gpu.py)", allow_module_level=True)
try:
    import triton  # noqa: F401
except Exception as e:  # pragma: no cover
    pytest.skip(f"triton unavailable: {e}", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("poison")


@pytest.mark.parametrize("T", [1, 17, 63, 128])
def test_fwd_bwd_gqa(T):
    check(*make(2, T, T, 4, 2, 16, seed=T))


def test_fwd_bwd_T300(big_tiles):
    check(*make(1, 300, 300, 2, 1, 32, seed=3))


@pytest.mark.parametrize("Tq,Tk", [(1, 63), (17, 63), (40, 100)])
def test_tq_lt_tk(Tq, Tk):
    check(*make(1, Tq, Tk, 2, 2, 16, seed=Tq))


@pytest.mark.parametrize("D", [24, 64])
def test_head_dims(D):
    check(*make(1, 33, 33, 2, 1, D, seed=D))


def test_mqa_and_sm_scale():
    check(*make(1, 40, 40, 4, 1, 16), sm_scale=0.3)


def test_against_naive_definition():
    q, k, v, lf = make(1, 20, 29, 2, 1, 16)
    o = forgetting_attention(q, k, v, lf, options=on("triton"))
    o_naive = forgetting_attention_naive(*(t.double() for t in (q, k, v, lf)))
    assert rel(o, o_naive) <= RTOL


def test_cu_seqlens():
    q, k, v, lf = make(1, 100, 100, 2, 2, 16)
    check(q, k, v, lf, cu_seqlens=torch.tensor([0, 5, 6, 40, 77, 100]))


def test_seq_start_left_padding():
    q, k, v, lf = make(3, 50, 50, 2, 2, 16)
    ours, _ = check(q, k, v, lf, seq_start=torch.tensor([0, 33, 49]))
    # with Tq < Tk and a start beyond some query rows: those rows see no key and give exactly 0
    q, k, v, lf = make(2, 20, 70, 2, 1, 16)
    ours, _ = check(q, k, v, lf, seq_start=torch.tensor([0, 60]))
    assert ours[0][1, :10].abs().max() == 0


def test_gates_near_one():
    check(*make(1, 64, 64, 2, 2, 16, lf=-1e-6))


def test_gate_minus_20():
    """log f = -20 at every position. With scores ~ N(0, 100) (sm_scale = 2.5 at head dim 16) some rows keep O(1)
    weight on earlier keys, so all four gradients are well-conditioned: against float64 within ``few_keys`` (dq and
    dk 2.5x RTOL; d log f 5e-4: it sums dS's row and column sums, formed by two kernels whose fp32 roundings of
    the diagonal terms do not cancel, and with few keys per row it is small against them). At the default scale
    each row's weight sits on its own key: o and dv within RTOL, and dq, dk and d log f (~e^-20, below what fp32
    resolves of dS) finite."""
    few_keys = {"o": RTOL, "dq": 5e-5, "dk": 5e-5, "dv": RTOL, "dlogf": 5e-4}
    q, k, v, lf = make(1, 64, 64, 2, 2, 16, lf=-20.0)
    do = torch.randn_like(q)
    for kw, bounds in ((dict(sm_scale=2.5), few_keys), ({}, {"o": RTOL, "dv": RTOL})):
        ours = run_grads(forgetting_attention, (q, k, v, lf), do, options=on("triton"), **kw)
        ref = run_grads(forgetting_attention_ref, [t.double() for t in (q, k, v, lf)], do.double(), **kw)
        for name, a, r in zip(("o", "dq", "dk", "dv", "dlogf"), ours, ref):
            assert torch.isfinite(a).all(), name
            if name in bounds:
                assert rel(a, r) <= bounds[name], (kw, name, rel(a, r))


def test_long_sequence_gates_near_one(big_tiles):
    """Forward at T=512 with gates near 1 (decays must be exact to fp32 rounding, not cancellation)."""
    q, k, v, _ = make(1, 512, 512, 1, 1, 16)
    lf = -torch.rand(1, 512, 1) * 1e-4 - 2.0 * (torch.arange(512) % 2 == 0).float()[None, :, None]
    with torch.no_grad():
        o = forgetting_attention(q, k, v, lf, options=on("triton"))
    ref = forgetting_attention_ref(*(t.double() for t in (q, k, v, lf)))
    assert rel(o, ref) <= RTOL


@pytest.mark.parametrize("Tq,Tk", [(300, 300), (37, 230)])
def test_block_prefix_sums(Tq, Tk):
    """The block-local log f prefix sums the inner loops read: key side aligned at 0, query side at Tk - Tq."""
    lf = F.logsigmoid(torch.randn(2, Tk, 3, generator=torch.Generator().manual_seed(Tk)))
    pk, pq = TL.block_prefix(lf, Tq)
    none, pq_only = TL.block_prefix(lf, Tq, key_side=False)  # the one-kernel backward's: no key side
    assert none is None and torch.equal(pq_only, pq)
    tpad = pk.shape[2]
    x = lf.permute(0, 2, 1).reshape(6, Tk).double()
    xk = F.pad(x, (0, tpad - Tk))
    xq = F.pad(x[:, Tk - Tq:], (0, tpad - Tq))
    for plane, size in enumerate((16, 32, 64, 128)):
        for got, src in ((pk, xk), (pq, xq)):
            want = src.view(6, tpad // size, size).cumsum(-1).view(6, tpad)
            assert (got[plane].double() - want).abs().max() <= 1e-5 * want.abs().max(), (plane, size)


@pytest.mark.parametrize("Tq,Tk,strided,rows", [(300, 300, False, 128), (37, 230, False, 128), (1, 64, False, 128),
                                                (200, 1000, False, 128), (300, 300, True, 128), (37, 230, True, 128),
                                                (300, 300, True, 16), (37, 230, True, 16), (1, 64, True, 32)])
def test_dlogf_scan(Tq, Tk, strided, rows, monkeypatch):
    """d log f = the reverse cumsum of drow - dcol (drow at the last Tq positions), in chunks of 64 under the
    interpreter that run in parallel with float64 carries, against float64 torch; every element written.
    ``strided``: drow is column 0 of (B, Tq, H, 8) row sums, as the one-kernel backward leaves it, and the launch
    also rounds that backward's fp32 dq accumulator (head dim 24) to fp16, equal to torch's rounding, in tiles of
    ``rows`` rows (16 or 32: several rounding programs per chunk; 128: one, the chunk being 64 rows here)."""
    monkeypatch.setattr(TL, "DQ_ROUND_ROWS", rows)
    g = torch.Generator().manual_seed(Tk)
    drow, dcol = torch.randn(2, Tq, 3, generator=g), torch.randn(2, Tk, 3, generator=g)
    dq32 = dq = None
    if strided:
        rs8 = torch.randn(2, Tq, 3, 8, generator=g) * 1e3  # (the other columns must not be read)
        rs8[..., 0] = drow
        drow = rs8[..., 0]
        dq32 = torch.randn(2, Tq, 3, 24, generator=g) * 3
        dq = torch.full((2, Tq, 3, 24), float("nan"), dtype=torch.float16)
    dc = -dcol.double()
    dc[:, Tk - Tq:] += drow.double()
    want = dc.flip(1).cumsum(1).flip(1)
    got = TL.bwd_dlogf(drow, dcol, dq32, dq)
    assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
    if strided:
        assert torch.equal(dq, dq32.half())


@pytest.mark.parametrize("Tq,Tk,D", [(1, 1, 64), (67, 67, 24), (300, 300, 64), (37, 230, 64)])
def test_bwd_fused_setup(Tq, Tk, D):
    """The one-kernel backward's set-up launch (``_bwd_fused_setup_kernel``): delta = rowsum(o * dO), (B, H, Tq),
    against float64 torch (partial row blocks, a head dim padded to a power of two); pq, the block-local prefix
    sums of log f over 64-row query tiles (queries at the last Tq of Tk positions; whole blocks, rows past Tq
    adding 0), and z = pq * log2(e) - lse, (B*H, Tq rounded up to 4), against float64 torch; and the zeroed fp32
    accumulators of its reduce-adds, dq (B, Tq, H, D) and the row sums (B, Tq, H, 8); every element written (the
    buffers start poisoned)."""
    g = torch.Generator().manual_seed(Tq)
    o, do = (torch.randn(2, Tq, 3, D, generator=g) for _ in range(2))
    lf = F.logsigmoid(torch.randn(2, Tk, 3, generator=g))
    lse = torch.randn(2, 3, Tq, generator=g) * 5
    want = (o.double() * do.double()).sum(-1).permute(0, 2, 1)
    delta, pq, z, dq32, rs8 = GL.bwd_fused_setup(o, do, lf, lse, 64)
    assert delta.shape == (2, 3, Tq) and (delta.double() - want).abs().max() <= 1e-5 * want.abs().max()
    x = F.pad(lf[:, Tk - Tq:].permute(0, 2, 1).reshape(6, Tq).double(), (0, -Tq % 64))
    want_pq = x.view(6, -1, 64).cumsum(-1).view(6, -1)
    assert pq.shape == want_pq.shape and (pq.double() - want_pq).abs().max() <= 1e-5 * want_pq.abs().max()
    want_z = want_pq[:, :Tq] / math.log(2) - lse.reshape(6, Tq).double()
    assert z.shape == (6, -(-Tq // 4) * 4)
    assert (z[:, :Tq].double() - want_z).abs().max() <= 1e-5 * want_z.abs().max()
    for name, t, shape in (("dq32", dq32, (2, Tq, 3, D)), ("rs8", rs8, (2, Tq, 3, 8))):
        assert t.shape == shape and t.dtype == torch.float32 and t.is_contiguous(), name
        assert torch.equal(t, torch.zeros_like(t)), name


def test_default_dispatch_cpu_is_reference():
    q, k, v, lf = make(1, 10, 10, 2, 2, 16)
    assert torch.equal(forgetting_attention(q, k, v, lf), forgetting_attention_ref(q, k, v, lf))
    with pytest.raises(ValueError, match="backend"):
        forgetting_attention(q, k, v, lf, options=AttentionOptions(backend="cuda-magic"))


def test_bad_inputs_clear_errors():
    q, k, v, lf = make(1, 8, 8, 2, 2, 16)
    with pytest.raises(ValueError, match="head dim D=300"):
        forgetting_attention(*make(1, 8, 8, 1, 1, 300), options=on("triton"))
    with pytest.raises(ValueError, match="dtype"):
        forgetting_attention(q.double(), k.double(), v.double(), lf, options=on("triton"))
    with pytest.raises(ValueError, match="log_fgate"):
        forgetting_attention(q, k, v, lf.half(), options=on("triton"))
    with pytest.raises(ValueError, match="kv heads"):
        forgetting_attention(q, k[:, :, :1].expand(1, 8, 3, 16), v[:, :, :1].expand(1, 8, 3, 16), lf,
                             options=on("triton"))


def test_non_contiguous_inputs():
    qkv = torch.randn(1, 30, 3, 2, 16)
    q, k, v = qkv.unbind(2)  # strided views
    lf = F.logsigmoid(torch.randn(1, 30, 2) + 1)
    check(q, k, v, lf)


def test_custom_op_opcheck():
    q, k, v, lf = make(1, 9, 9, 2, 1, 16)
    tables = TL.acp_tables(lf, torch.full((1, 2), -2.0), 9, acp_grid(16))  # ACP's (lo, hi)
    token = default_options().token
    for acp in ((None, None), tables):
        torch.library.opcheck(DP.fox_fwd, (q, k, v, lf, None, None, 0.25, *acp, token),
                              test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    w = torch.ones(16)
    for args in (("norms", None, 0.0, None, None), ("weights", None, 0.0, w, w), ("float", None, -3.0, None, None),
                 ("tensor", torch.full((1, 2), -2.0), 0.0, None, None)):
        torch.library.opcheck(DP.fox_acp_tables, (q, k, lf, 0.25, *args, -10.0, 16, 16),
                              test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("acp", [{}, dict(adaptive_threshold="auto"),
                                 dict(adaptive_threshold="auto", qk_norm_weights=(torch.ones(16), torch.ones(16)))])
def test_torch_compile_no_graph_break(acp):
    """The op (with ACP: also the boundary-table op) traces into one graph; gradients equal eager's."""
    q, k, v, lf = make(1, 16, 16, 2, 2, 16)
    kernels = on("triton")  # (formed outside the compiled function, as a caller would)

    def f(q, k, v, lf):
        return forgetting_attention(q * 2.0, k, v, lf, options=kernels, **acp).square().sum()

    xs = [t.clone().requires_grad_() for t in (q, k, v, lf)]
    torch.compile(f, backend="aot_eager", fullgraph=True)(*xs).backward()
    ys = [t.clone().requires_grad_() for t in (q, k, v, lf)]
    f(*ys).backward()
    for x, y in zip(xs, ys):
        assert rel(x.grad, y.grad) <= 1e-6


def test_calls_without_gradients_skip_autograd_and_compute_the_same(monkeypatch):
    """Eager calls with nothing to differentiate (no input requiring grad, or under ``no_grad``) run the forward
    without the autograd layer (``FoxEager`` is not entered): no graph node, the same output bitwise as the
    differentiable call."""
    q, k, v, lf = make(1, 40, 40, 2, 2, 16)
    for acp in ({}, {"adaptive_threshold": "auto"}):
        xs = [t.clone().requires_grad_() for t in (q, k, v, lf)]
        o = forgetting_attention(*xs, options=on("triton"), **acp)
        assert type(o.grad_fn).__name__ == "FoxEagerBackward", o.grad_fn
        with monkeypatch.context() as m:
            m.setattr(DP.FoxEager, "apply", lambda *a: pytest.fail("FoxEager entered without gradients"))
            with torch.no_grad():
                o_nograd = forgetting_attention(*xs, options=on("triton"), **acp)
            o_plain = forgetting_attention(q, k, v, lf, options=on("triton"), **acp)
        for got in (o_nograd, o_plain):
            assert got.grad_fn is None and not got.requires_grad
            assert torch.equal(got, o.detach())


def test_compiled_graphs_hold_the_custom_ops():
    """Under torch.compile the forward and backward graphs call the opaque ops (fox_acp_tables, fox_fwd,
    fox_bwd) and never trace into a kernel launch (eager calls take ``FoxEager`` instead)."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = {}

    def backend(gm, example_inputs):
        def keep(name):
            def compiler(g, _):
                graphs[name] = str(g.code)
                return make_boxed_func(g.forward)
            return compiler
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep("fwd"), bw_compiler=keep("bwd"))

    q, k, v, lf = make(1, 16, 16, 2, 2, 16)
    xs = [t.clone().requires_grad_() for t in (q, k, v, lf)]
    kernels = on("triton")
    f = torch.compile(lambda *x: forgetting_attention(*x, options=kernels, adaptive_threshold="auto").sum(),
                      backend=backend, fullgraph=True)
    f(*xs).backward()
    assert "fox_acp_tables" in graphs["fwd"] and "fox_fwd" in graphs["fwd"], graphs["fwd"]
    assert "fox_bwd" in graphs["bwd"], graphs["bwd"]
    assert all(torch.isfinite(x.grad).all() for x in xs)


def test_probe_tma_forward_matches_reference():
    """``benchmarks.attention.probe``'s forward with TMA-descriptor K/V loads (a diagnostic timed against the op on
    the GPU) computes the op's forward: float64 reference, two batch elements, T not a multiple of the tiles."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from benchmarks.attention import probe as hp
    B, T, H, D, bm, bn = 2, 100, 2, 16, 32, 16
    q, k, v, lf = make(B, T, T, H, H, D, seed=11)
    ref = forgetting_attention_ref(q.double(), k.double(), v.double(), lf.double())
    pk, _ = TL.block_prefix(lf, T, query_side=False)
    kd, vd = (TensorDescriptor(t.view(B * T, H * D), [B * T, H * D], [H * D, 1], [bn, D]) for t in (k, v))
    o, lse = torch.empty_like(q), torch.empty(B, H, T)
    hp.fwd_tma_kernel[(B * H, triton.cdiv(T, bm))](
        q, kd, vd, lf, pk, o, lse, *q.stride()[:3], *lf.stride(), H, T, T, D ** -0.5, *pk.stride()[:2],
        HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, WS=False)
    assert rel(o, ref) <= RTOL


def test_tma_descriptors_match_the_checked_constructor():
    """The Gluon launchers' descriptors (``tma_desc`` / ``tma_vec``) skip the constructor's per-call checks to
    save host time; their fields equal those of descriptors the constructor builds over the same views, and a
    base that is not 16-byte aligned is refused with its address."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    def same(got, want):
        assert type(got) is type(want)
        assert got.base.data_ptr() == want.base.data_ptr() and got.base.dtype == want.base.dtype
        assert {k: v for k, v in vars(got).items() if k != "base"} == {k: v for k, v in vars(want).items()
                                                                       if k != "base"}

    q = torch.randn(2, 40, 3, 64).to(torch.bfloat16)
    for block in (64, 128):
        same(GL.tma_desc(q, block), TensorDescriptor(q.view(80, 192), [80, 192], [192, 1], [block, 64],
                                                      GL.smem_layout((block, 64), torch.bfloat16)))
    pk = torch.randn(4, 6, 128)
    same(GL.tma_vec(pk, 64), TensorDescriptor(pk.reshape(-1), [pk.numel()], [1], [64],
                                               GL.smem_layout((64,), torch.float32)))
    with pytest.raises(ValueError, match="16-byte aligned"):
        GL.tma_vec(torch.zeros(1000)[1:], 64)
