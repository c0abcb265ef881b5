"""CPU tests of the Triton Forgetting Attention kernel, run under ``TRITON_INTERPRET=1`` in float32.

The kernel (``backend="triton"``) is checked against the float64 reference for the output and all four
gradients (q, k, v, log f), with every output buffer the op allocates poisoned with NaN first.
"""

import importlib
import math
import os

import pytest
import torch
import torch.nn.functional as F

from forgetting_transformer.ops import forgetting_attention, forgetting_attention_ref
from forgetting_transformer.ops.reference import forgetting_attention_naive
from oracles import acp_masked_ref

fa = importlib.import_module("forgetting_transformer.ops.forgetting_attention")

if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU interpreter tests (the GPU is covered by test_kernel_gpu.py)", allow_module_level=True)
try:
    import triton  # noqa: F401
except Exception as e:  # pragma: no cover
    pytest.skip(f"triton unavailable: {e}", allow_module_level=True)

# fp32 kernel vs float64 reference: rounding of fp32 arithmetic (observed 1e-7 .. 2e-6).
RTOL = 2e-5


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """Every float buffer allocated with torch.empty / empty_like during a test starts as NaN, every integer one as
    123456789 (counters and tables must be written, not found zero)."""
    empty, empty_like = torch.empty, torch.empty_like

    def poisoned(t):
        if t.dtype == torch.bool:
            return t
        return t.fill_(float("nan") if t.is_floating_point() else 123456789)

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poisoned(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poisoned(empty_like(*a, **k)))


@pytest.fixture
def big_tiles(monkeypatch):
    """Larger interpreter tiles (fewer programs) for the longer sequences."""
    monkeypatch.setattr(fa, "_INTERPRET_CONFIGS", {
        "fwd": dict(BLOCK_M=64, BLOCK_N=32), "dq": dict(BLOCK_M=32, BLOCK_N=64), "dkdv": dict(BLOCK_M=32, BLOCK_N=64),
    })


def rel(a, b, floor=1e-300):
    """Relative L2 error ``|a - b| / max(|b|, floor)``."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(floor)).item()


def make(B, Tq, Tk, H, Hkv, D, lf=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Tq, H, D, generator=g)
    k = torch.randn(B, Tk, Hkv, D, generator=g)
    v = torch.randn(B, Tk, Hkv, D, generator=g)
    if lf is None:
        lf = F.logsigmoid(torch.randn(B, Tk, H, generator=g) + 1.5)
    elif isinstance(lf, float):
        lf = torch.full((B, Tk, H), lf)
    return q, k, v, lf


def run_grads(fn, inputs, do, **kw):
    xs = [t.detach().clone().requires_grad_() for t in inputs]
    o = fn(*xs, **kw)
    return (o,) + torch.autograd.grad(o, xs, do.to(o.dtype))


def check(q, k, v, lf, rtol=RTOL, **kw):
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(7))
    ours = run_grads(forgetting_attention, (q, k, v, lf), do, backend="triton", **kw)
    ref = run_grads(forgetting_attention_ref, [t.double() for t in (q, k, v, lf)], do.double(), **kw)
    errs = {}
    for name, a, r in zip(("o", "dq", "dk", "dv", "dlogf"), ours, ref):
        assert a.shape == r.shape, name
        assert torch.isfinite(a).all(), f"{name} has NaN/inf (unwritten or overflowed)"
        # exactly-zero gradients (T = 1: dq = dk = 0) are measured on the scale of dv (~ |do|)
        errs[name] = rel(a, r, floor=ref[3].norm().item())
    assert all(e <= rtol for e in errs.values()), errs
    return ours, ref


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
    o = forgetting_attention(q, k, v, lf, backend="triton")
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


@pytest.mark.parametrize("val", [-20.0, -1e-6])
def test_extreme_gates(val):
    q, k, v, lf = make(1, 64, 64, 2, 2, 16, lf=val)
    do = torch.randn_like(q)
    ours = run_grads(forgetting_attention, (q, k, v, lf), do, backend="triton")
    ref = run_grads(forgetting_attention_ref, [t.double() for t in (q, k, v, lf)], do.double())
    for name, a, r in zip(("o", "dq", "dk", "dv", "dlogf"), ours, ref):
        assert torch.isfinite(a).all(), name
        # at log f = -20, dq / dk / dlogf are ~e^-20 and ill-conditioned: compare on the scale of dv
        scale = r.norm() if (val != -20.0 or name in ("o", "dv")) else ref[3].norm()
        assert (a.double() - r).norm() <= RTOL * scale, name


def test_long_sequence_gates_near_one(big_tiles):
    """Forward at T=512 with gates near 1 (decays must be exact to fp32 rounding, not cancellation)."""
    q, k, v, _ = make(1, 512, 512, 1, 1, 16)
    lf = -torch.rand(1, 512, 1) * 1e-4 - 2.0 * (torch.arange(512) % 2 == 0).float()[None, :, None]
    with torch.no_grad():
        o = forgetting_attention(q, k, v, lf, backend="triton")
    ref = forgetting_attention_ref(*(t.double() for t in (q, k, v, lf)))
    assert rel(o, ref) <= RTOL


@pytest.mark.parametrize("Tq,Tk", [(300, 300), (37, 230)])
def test_block_prefix_sums(Tq, Tk):
    """The block-local log f prefix sums the inner loops read: key side aligned at 0, query side at Tk - Tq."""
    lf = F.logsigmoid(torch.randn(2, Tk, 3, generator=torch.Generator().manual_seed(Tk)))
    pk, pq = fa._block_prefix(lf, Tq)
    none, pq_only = fa._block_prefix(lf, Tq, key_side=False)  # the one-kernel backward's: no key side
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
    monkeypatch.setattr(fa, "_DQ_ROUND_ROWS", rows)
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
    got = fa._bwd_dlogf(drow, dcol, dq32, dq)
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
    delta, pq, z, dq32, rs8 = fa._bwd_fused_setup(o, do, lf, lse, 64)
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
        forgetting_attention(q, k, v, lf, backend="cuda-magic")


def test_bad_inputs_clear_errors():
    q, k, v, lf = make(1, 8, 8, 2, 2, 16)
    with pytest.raises(ValueError, match="head dim D=300"):
        forgetting_attention(*make(1, 8, 8, 1, 1, 300), backend="triton")
    with pytest.raises(ValueError, match="dtype"):
        forgetting_attention(q.double(), k.double(), v.double(), lf, backend="triton")
    with pytest.raises(ValueError, match="log_fgate"):
        forgetting_attention(q, k, v, lf.half(), backend="triton")
    with pytest.raises(ValueError, match="kv heads"):
        forgetting_attention(q, k[:, :, :1].expand(1, 8, 3, 16), v[:, :, :1].expand(1, 8, 3, 16), lf, backend="triton")


def test_non_contiguous_inputs():
    qkv = torch.randn(1, 30, 3, 2, 16)
    q, k, v = qkv.unbind(2)  # strided views
    lf = F.logsigmoid(torch.randn(1, 30, 2) + 1)
    check(q, k, v, lf)


def test_custom_op_opcheck():
    q, k, v, lf = make(1, 9, 9, 2, 1, 16)
    tables = fa._acp_tables(lf, torch.full((1, 2), -2.0), 9, 16)  # ACP's (lo, hi)
    for acp in ((None, None), tables):
        torch.library.opcheck(fa._fox_fwd, (q, k, v, lf, None, None, 0.25, *acp),
                              test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    w = torch.ones(16)
    for args in (("norms", None, 0.0, None, None), ("weights", None, 0.0, w, w), ("float", None, -3.0, None, None),
                 ("tensor", torch.full((1, 2), -2.0), 0.0, None, None)):
        torch.library.opcheck(fa._fox_acp_tables, (q, k, lf, 0.25, *args, -10.0),
                              test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("acp", [{}, dict(adaptive_threshold="auto"),
                                 dict(adaptive_threshold="auto", qk_norm_weights=(torch.ones(16), torch.ones(16)))])
def test_torch_compile_no_graph_break(acp):
    """The op (with ACP: also the boundary-table op) traces into one graph; gradients equal eager's."""
    q, k, v, lf = make(1, 16, 16, 2, 2, 16)

    def f(q, k, v, lf):
        return forgetting_attention(q * 2.0, k, v, lf, backend="triton", **acp).square().sum()

    xs = [t.clone().requires_grad_() for t in (q, k, v, lf)]
    torch.compile(f, backend="aot_eager", fullgraph=True)(*xs).backward()
    ys = [t.clone().requires_grad_() for t in (q, k, v, lf)]
    f(*ys).backward()
    for x, y in zip(xs, ys):
        assert rel(x.grad, y.grad) <= 1e-6


def test_compiled_graphs_hold_the_custom_ops():
    """Under torch.compile the forward and backward graphs call the opaque ops (fox_acp_tables, fox_fwd,
    fox_bwd) and never trace into a kernel launch (eager calls take ``_FoxEager`` instead)."""
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
    f = torch.compile(lambda *x: forgetting_attention(*x, backend="triton", adaptive_threshold="auto").sum(),
                      backend=backend, fullgraph=True)
    f(*xs).backward()
    assert "fox_acp_tables" in graphs["fwd"] and "fox_fwd" in graphs["fwd"], graphs["fwd"]
    assert "fox_bwd" in graphs["bwd"], graphs["bwd"]
    assert all(torch.isfinite(x.grad).all() for x in xs)


# ---------------------------------------------------------------------------------------------------------------
# Adaptive Computation Pruning
# ---------------------------------------------------------------------------------------------------------------


def acp_inputs(T=100, seed=0):
    q, k, v, _ = make(1, T, T, 4, 2, 16, seed=seed)
    lf = torch.full((1, T, 4), -1e-4)
    lf[..., :2] = -1.3  # heads 0, 1 local; heads 2, 3 global
    return q, k, v, lf


def test_acp_prunes_exactly_the_tile_mask():
    """Forward and all four gradients equal those of attention with ACP's pruned tiles masked out."""
    q, k, v, lf = acp_inputs()
    delta = torch.tensor([[-3.0, -6.0, -3.0, -6.0]])
    do = torch.randn_like(q)
    ours = run_grads(forgetting_attention, (q, k, v, lf), do, backend="triton", adaptive_threshold=delta)
    GM, GN = fa._acp_grid(16)
    ref = run_grads(lambda *x: acp_masked_ref(*x, delta.double(), GM, GN), [t.double() for t in (q, k, v, lf)],
                    do.double())
    for name, a, r in zip(("o", "dq", "dk", "dv", "dlogf"), ours, ref):
        assert torch.isfinite(a).all(), name
        assert rel(a, r, floor=ref[3].norm().item()) <= RTOL, name
    _, stats = forgetting_attention(q, k, v, lf, backend="triton", adaptive_threshold=delta, return_stats=True)
    assert (stats["pruned"][0, :2] > 0).all() and (stats["pruned"][0, 2:] == 0).all()
    dense = forgetting_attention(q, k, v, lf, backend="triton", return_stats=True)[1]
    assert torch.equal(stats["computed"] + stats["pruned"], dense["computed"]) and (dense["pruned"] == 0).all()


def test_return_stats_counts_the_tiles_of_the_forward_that_runs(monkeypatch):
    """``return_stats`` counts the tiles of the forward this call runs (the Triton forward's default config here; a
    consumer warpgroup's 64 rows by 128 keys where the Gluon forward runs), each pruned tile one whose every
    element ACP prunes for the tile's first row, counted here from the elementwise region of ``acp_masked_ref``."""
    T = 300
    q, k, v, lf = acp_inputs(T)
    delta = torch.tensor([[-3.0, -6.0, -3.0, -6.0]])
    GM, GN = fa._acp_grid(16)
    cfg = fa._fixed_config("fwd", 16)[0]
    assert fa._fwd_tiles(q, k, v, None) == (cfg["BLOCK_M"], cfg["BLOCK_N"])
    with monkeypatch.context() as m:  # shapes only: which tiles a Hopper call would count
        m.setattr(fa, "_use_sm90", lambda *a: True)
        x = q.new_empty(1, 8, 2, 64)
        assert fa._fwd_tiles(x, x, x, None) == fa._SM90_CONFIGS[64][:2] == (64, 128)
        assert fa._fwd_tiles(x, x, x, torch.zeros(1, 8, dtype=torch.int32)) == (cfg["BLOCK_M"], cfg["BLOCK_N"])
    c = torch.cumsum(lf.double(), 1)[0].T  # (H, T)
    i = torch.arange(T)
    m0 = (i // GM) * GM
    e = torch.clamp((i // GN) * GN + GN - 1, max=T - 1)
    pruned = (c[:, m0, None] - c[:, None, e] < delta[0, :, None, None]) & ((i // GN)[None] < (m0 // GN)[:, None])
    for bm, bn in ((cfg["BLOCK_M"], cfg["BLOCK_N"]), (GM, 2 * GN)):
        monkeypatch.setattr(fa, "_fwd_tiles", lambda *a, t=(bm, bn): t)
        _, stats = forgetting_attention(q, k, v, lf, backend="triton", adaptive_threshold=delta, return_stats=True)
        want_pruned, want_total = torch.zeros(4, dtype=torch.long), 0
        for r in range(0, T, bm):
            for n in range(0, min(r + bm, T), bn):  # causal tiles: key blocks up to the diagonal
                want_pruned += pruned[:, r, n:n + bn].all(-1).long()
                want_total += 1
        assert torch.equal(stats["pruned"][0], want_pruned), (bm, bn, stats, want_pruned)
        assert torch.equal(stats["computed"][0] + stats["pruned"][0], torch.full((4,), want_total))
        assert (want_pruned[:2] > 0).all() and (want_pruned[2:] == 0).all()


def test_acp_reference_path_prunes_what_the_kernel_prunes():
    """The CPU dispatch (reference) and the kernel prune one region: same output and gradients."""
    q, k, v, lf = acp_inputs(80)
    delta = torch.tensor([[-3.0, -6.0, -3.0, -6.0]])
    do = torch.randn_like(q)
    ours = run_grads(forgetting_attention, (q, k, v, lf), do, backend="triton", adaptive_threshold=delta)
    ref = run_grads(forgetting_attention, [t.double() for t in (q, k, v, lf)], do.double(), backend="reference",
                    adaptive_threshold=delta)
    for name, a, r in zip(("o", "dq", "dk", "dv", "dlogf"), ours, ref):
        assert rel(a, r, floor=ref[3].norm().item()) <= RTOL, name


def test_acp_region_independent_of_tiling(big_tiles):
    """Kernel tiles larger than ACP's grid in both dims (fwd 64x32, dq/dkdv 32x64 over a 16x16 grid), with
    Tq < Tk, GQA and left padding: every kernel masks the straddling elements, so the output and all gradients
    are still exactly those of the grid-masked attention."""
    q, k, v, lf = acp_inputs(112)
    q = q[:, 32:]
    seq_start = torch.tensor([5])
    delta = torch.tensor([[-2.0, -9.0, -3.0, -0.5]])
    do = torch.randn_like(q)
    fa._ACP_GRID_OVERRIDE = (16, 16)
    try:
        ours = run_grads(forgetting_attention, (q, k, v, lf), do, backend="triton", adaptive_threshold=delta,
                         seq_start=seq_start)
    finally:
        fa._ACP_GRID_OVERRIDE = None
    ref = run_grads(lambda *x: acp_masked_ref(*x, delta.double(), 16, 16, seq_start=seq_start),
                    [t.double() for t in (q, k, v, lf)], do.double())
    for name, a, r in zip(("o", "dq", "dk", "dv", "dlogf"), ours, ref):
        assert torch.isfinite(a).all(), name
        # log f = -1.3 over 64-long tiles: block-local decay sums reach ~80, whose fp32 rounding gives ~2.5e-5
        # (the same with delta = -inf, i.e. dense), so this test allows 2.5x RTOL
        assert rel(a, r, floor=ref[3].norm().item()) <= 2.5 * RTOL, name


def test_acp_positive_threshold_keeps_the_diagonal():
    """A threshold above 0 would prune every key; the grid block holding each query block's first row is kept
    (as in the ACP paper), so every row still attends to itself and nothing is NaN."""
    q, k, v, lf = acp_inputs(40)
    delta = torch.full((1, 4), 5.0)
    ours = forgetting_attention(q, k, v, lf, backend="triton", adaptive_threshold=delta)
    GM, GN = fa._acp_grid(16)
    ref = acp_masked_ref(*(t.double() for t in (q, k, v, lf)), delta.double(), GM, GN)
    assert torch.isfinite(ours).all() and rel(ours, ref) <= RTOL


@pytest.mark.parametrize("Tk", [0, 5])
def test_acp_without_queries(Tk):
    """No query rows (and no keys): the table launches have nothing to walk, the threshold is still formed; the
    output is empty and the gradients are zeros of the inputs' shapes, for every kind of threshold."""
    q, k, v, lf = make(2, 0, Tk, 2, 2, 16)
    for xs in (q, k, v, lf):
        xs.requires_grad_()
    for thr in ("auto", -3.0, torch.full((2, 2), -3.0)):
        for w in ((None, (torch.ones(16), torch.ones(16))) if thr == "auto" else (None,)):
            o = forgetting_attention(q, k, v, lf, backend="triton", adaptive_threshold=thr, qk_norm_weights=w)
            assert o.shape == q.shape
            grads = torch.autograd.grad(o, (q, k, v, lf), torch.ones_like(o))
            assert all(g.shape == x.shape and not g.any() for g, x in zip(grads, (q, k, v, lf))), (thr, w)
    lo, hi, delta = fa._acp_tables_for(q, k, lf, 0.25, -3.0, math.exp(-10), None)
    assert lo.shape == (4, 0) and torch.equal(hi, torch.full_like(hi, -1)) and torch.equal(delta, torch.full((2, 2), -3.0))


def test_acp_auto_within_eps_bound():
    """'auto' threshold: |o_acp - o_dense| <= 2 eps max|v| (pruned weight per row <= eps)."""
    q, k, v, _ = make(1, 160, 160, 2, 2, 16)
    q = F.normalize(q, dim=-1) * 4.0  # QK-norm-like
    k = F.normalize(k, dim=-1) * 4.0
    lf = torch.full((1, 160, 2), -3.0)
    for eps in (math.exp(-10), 0.05):
        o_acp, stats = forgetting_attention(q, k, v, lf, backend="triton", adaptive_threshold="auto", acp_eps=eps,
                                            return_stats=True)
        o = forgetting_attention_ref(*(t.double() for t in (q, k, v, lf)))
        assert (stats["pruned"] > 0).all(), stats
        assert (o_acp.double() - o).abs().max() <= 2 * eps * v.abs().max() + 1e-5
    w = torch.ones(16) * 4.0 / math.sqrt(16)  # RMSNorm weights giving the same norm bound
    o_w = forgetting_attention(q, k, v, lf, backend="triton", adaptive_threshold="auto", qk_norm_weights=(w, w))
    assert (o_w.double() - o).abs().max() <= 2 * math.exp(-10) * v.abs().max() + 1e-5


def test_acp_bad_threshold():
    q, k, v, lf = acp_inputs(20)
    with pytest.raises(ValueError, match="adaptive_threshold"):
        forgetting_attention(q, k, v, lf, backend="triton", adaptive_threshold="fast")
    with pytest.raises(ValueError, match="adaptive_threshold tensor"):
        forgetting_attention(q, k, v, lf, backend="triton", adaptive_threshold=torch.zeros(2, 2))


@pytest.mark.parametrize("Tq,Tk,chunks", [(100, 100, 64), (37, 230, 64), (1, 64, 64), (300, 700, 64), (300, 700, 3),
                                           (290, 4500, 5)])
def test_acp_boundary_kernels_match_searchsorted(monkeypatch, Tq, Tk, chunks):
    """The table kernels (windows of 16 blocks under the interpreter: (300, 700) needs several windows and a
    16-ary search step, (290, 4500) two steps; the cumsum in at most ``chunks`` chunks of positions, each of
    several sub-tiles when few) equal torch.searchsorted; one threshold is positive (only the diagonal cap keeps
    keys)."""
    monkeypatch.setattr(fa, "_ACP_CUMSUM_CHUNKS", chunks)
    g = torch.Generator().manual_seed(Tk)
    lf = -torch.rand(2, Tk, 3, generator=g) * torch.tensor([2.0, 0.3, 1e-3])
    delta = -torch.rand(2, 3, generator=g) * 20 - 1
    delta[1, 2] = 0.5
    for GM, GN in ((32, 16), (64, 64), (16, 32)):
        fa._ACP_GRID_OVERRIDE = (GM, GN)
        try:
            lo, hi = fa._acp_tables(lf, delta, Tq, 16)
        finally:
            fa._ACP_GRID_OVERRIDE = None
        lo_t, hi_t = fa._acp._tables_torch(lf, delta, Tq, GM, GN)
        assert torch.equal(lo, lo_t) and torch.equal(hi, hi_t), (GM, GN)


@pytest.mark.parametrize("Tq,Tk,H,Hkv,D", [(37, 230, 4, 2, 24), (1, 1, 2, 2, 16), (300, 300, 3, 1, 64)])
def test_acp_threshold_in_kernel_matches_acp_threshold(monkeypatch, Tq, Tk, H, Hkv, D):
    """The boundary kernel's threshold (every kind: "auto" from the max q / k norms, split over several chunk
    programs each striding over several chunks, and from QK-norm weights of each shape; a float; a tensor)
    equals ``acp.acp_threshold``, and its tables equal torch.searchsorted's for that threshold."""
    monkeypatch.setattr(fa, "_ACP_NORM_CHUNKS", 4)
    g = torch.Generator().manual_seed(Tk)
    q, k, _, _ = make(2, Tq, Tk, H, Hkv, D, seed=Tk)
    q[1, Tq // 2, 0] *= 5.0  # one row with a much larger norm
    lf = -torch.rand(2, Tk, H, generator=g) * 0.5
    weights = [None, (torch.rand(D, generator=g), torch.rand(D, generator=g) + 1),
               (torch.rand(H, D, generator=g), torch.rand(Hkv, D, generator=g)),
               (torch.rand(H, D, generator=g), torch.rand(H, D, generator=g))]
    cases = [("auto", w) for w in weights] + [(-7.5, None), (torch.rand(2, H, generator=g) * -20, None)]
    for thr, w in cases:
        for eps in (math.exp(-10), 0.3):
            lo, hi, delta = fa._acp_tables_for(q, k, lf, 0.3, thr, eps, w)
            want = fa._acp.acp_threshold(q, k, 0.3, thr, eps=eps, qk_norm_weights=w)
            assert torch.allclose(delta, want, rtol=1e-6, atol=0), (thr, w, delta, want)
            lo_t, hi_t = fa._acp._tables_torch(lf, delta, Tq, *fa._acp_grid(max(16, fa._next_pow2(D))))
            assert torch.equal(lo, lo_t) and torch.equal(hi, hi_t), (thr, w)


def test_acp_qk_norm_weight_shapes_are_checked():
    q, k, v, lf = acp_inputs(20)
    for w, bad in (((torch.ones(3, 16), torch.ones(16)), "gamma_q"), ((torch.ones(16), torch.ones(3, 16)), "gamma_k"),
                   ((torch.ones(17), torch.ones(16)), "gamma_q")):
        with pytest.raises(ValueError, match=bad):
            forgetting_attention(q, k, v, lf, backend="triton", adaptive_threshold="auto", qk_norm_weights=w)
        with pytest.raises(ValueError, match=bad):
            forgetting_attention(q, k, v, lf, backend="reference", adaptive_threshold="auto", qk_norm_weights=w)


def test_probe_tma_forward_matches_reference():
    """``benchmarks.attention.probe``'s forward with TMA-descriptor K/V loads (a diagnostic timed against the op on
    the GPU) computes the op's forward: float64 reference, two batch elements, T not a multiple of the tiles."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from benchmarks.attention import probe as hp
    B, T, H, D, bm, bn = 2, 100, 2, 16, 32, 16
    q, k, v, lf = make(B, T, T, H, H, D, seed=11)
    ref = forgetting_attention_ref(q.double(), k.double(), v.double(), lf.double())
    pk, _ = fa._block_prefix(lf, T, query_side=False)
    kd, vd = (TensorDescriptor(t.view(B * T, H * D), [B * T, H * D], [H * D, 1], [bn, D]) for t in (k, v))
    o, lse = torch.empty_like(q), torch.empty(B, H, T)
    hp.fwd_tma_kernel[(B * H, triton.cdiv(T, bm))](
        q, kd, vd, lf, pk, o, lse, *q.stride()[:3], *lf.stride(), H, T, T, D ** -0.5, *pk.stride()[:2],
        HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, WS=False)
    assert rel(o, ref) <= RTOL


def test_tma_descriptors_match_the_checked_constructor():
    """The Gluon launchers' descriptors (``_tma_desc`` / ``_tma_vec``) skip the constructor's per-call checks to
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
        same(fa._tma_desc(q, block), TensorDescriptor(q.view(80, 192), [80, 192], [192, 1], [block, 64],
                                                      fa._smem_layout((block, 64), torch.bfloat16)))
    pk = torch.randn(4, 6, 128)
    same(fa._tma_vec(pk, 64), TensorDescriptor(pk.reshape(-1), [pk.numel()], [1], [64],
                                               fa._smem_layout((64,), torch.float32)))
    with pytest.raises(ValueError, match="16-byte aligned"):
        fa._tma_vec(torch.zeros(1000)[1:], 64)


def test_kernels_compile_for_sm90(tmp_path):
    """The interpreter runs the kernels as Python; this compiles them through triton's real pipeline (down to
    ptxas) for sm90, specialised as at run time (ints equal to 1 as constants, aligned pointers and strides) and
    checked against the shared-memory limit: python -m benchmarks.attention.compile_kernels --quick --regs --sass, in
    a subprocess without TRITON_INTERPRET and with an empty cache."""
    import re
    import subprocess
    import sys

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    r = subprocess.run([sys.executable, "-m", "benchmarks.attention.compile_kernels", "--arch", "90", "--quick",
                        "--regs", "--sass", str(tmp_path / "sass")], cwd=root, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # 14 Triton kernels (the block prefix sums with and without the key side, the one-kernel backward's set-up,
    # ACP's three table kernels) + 3 Gluon kernels (forward, dq, dk/dv) at D = 64 and 128 dense, and at 64 with
    # ACP, and the one-kernel backward at 64 (dense and with ACP)
    assert r.stdout.count(" ok (") == 25, r.stdout

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
