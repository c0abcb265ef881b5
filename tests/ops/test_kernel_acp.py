"""CPU tests of Adaptive Computation Pruning in the Triton kernels, under ``TRITON_INTERPRET=1`` in float32:
the pruned region against a float64 masked oracle, the table kernels against ``torch.searchsorted``, the
threshold against ``acp.acp_threshold``, and ``return_stats``."""

import math
import os

import pytest
import torch
import torch.nn.functional as F

from accuracy import on
from forgetting_transformer.ops.forgetting_attention import autograd as AG
from forgetting_transformer.ops.forgetting_attention import acp as _acp
from forgetting_transformer.ops.forgetting_attention import autograd as DP
from forgetting_transformer.ops.forgetting_attention import (forgetting_attention, forgetting_attention_ref, tiles,
                                                             use_options)
from forgetting_transformer.ops.forgetting_attention.gluon import launch as GL
from forgetting_transformer.ops.forgetting_attention.triton import launch as TL
from forgetting_transformer.ops.options import default_options
from kernel_cases import RTOL, acp_inputs, make, rel, run_grads
from oracles import acp_masked_ref

if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU interpreter tests (the GPU is covered by test_kernel_gpu.py)", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("poison")




def test_acp_prunes_exactly_the_tile_mask():
    """Forward and all four gradients equal those of attention with ACP's pruned tiles masked out."""
    q, k, v, lf = acp_inputs()
    delta = torch.tensor([[-3.0, -6.0, -3.0, -6.0]])
    do = torch.randn_like(q)
    ours = run_grads(forgetting_attention, (q, k, v, lf), do, options=on("triton"), adaptive_threshold=delta)
    GM, GN = _acp.grid(16)
    ref = run_grads(lambda *x: acp_masked_ref(*x, delta.double(), GM, GN), [t.double() for t in (q, k, v, lf)],
                    do.double())
    for name, a, r in zip(("o", "dq", "dk", "dv", "dlogf"), ours, ref):
        assert torch.isfinite(a).all(), name
        assert rel(a, r, floor=ref[3].norm().item()) <= RTOL, name
    _, stats = forgetting_attention(q, k, v, lf, options=on("triton"), adaptive_threshold=delta, return_stats=True)
    assert (stats["pruned"][0, :2] > 0).all() and (stats["pruned"][0, 2:] == 0).all()
    dense = forgetting_attention(q, k, v, lf, options=on("triton"), return_stats=True)[1]
    assert torch.equal(stats["computed"] + stats["pruned"], dense["computed"]) and (dense["pruned"] == 0).all()


def test_return_stats_counts_the_tiles_of_the_forward_that_runs(monkeypatch):
    """``return_stats`` counts the tiles of the forward this call runs (the Triton forward's default config here; a
    consumer warpgroup's 64 rows by 128 keys where the Gluon forward runs), each pruned tile one whose every
    element ACP prunes for the tile's first row, counted here from the elementwise region of ``acp_masked_ref``."""
    T = 300
    q, k, v, lf = acp_inputs(T)
    delta = torch.tensor([[-3.0, -6.0, -3.0, -6.0]])
    GM, GN = _acp.grid(16)
    opts = default_options()
    cfg = tiles.fixed_config("fwd", 16, 4, None, opts)
    assert DP.fwd_tiles(q, k, v, None, opts) == (cfg.block_m, cfg.block_n)
    with monkeypatch.context() as m:  # shapes only: which tiles a Hopper call would count
        m.setattr(GL, "use_sm90", lambda *a: True)
        x = q.new_empty(1, 8, 2, 64)
        assert DP.fwd_tiles(x, x, x, None, opts) == tiles.GLUON_FWD_CONFIGS[64][:2] == (64, 128)
        assert DP.fwd_tiles(x, x, x, torch.zeros(1, 8, dtype=torch.int32), opts) == (cfg.block_m, cfg.block_n)
    c = torch.cumsum(lf.double(), 1)[0].T  # (H, T)
    i = torch.arange(T)
    m0 = (i // GM) * GM
    e = torch.clamp((i // GN) * GN + GN - 1, max=T - 1)
    pruned = (c[:, m0, None] - c[:, None, e] < delta[0, :, None, None]) & ((i // GN)[None] < (m0 // GN)[:, None])
    for bm, bn in ((cfg.block_m, cfg.block_n), (GM, 2 * GN)):
        monkeypatch.setattr(DP, "fwd_tiles", lambda *a, t=(bm, bn): t)
        _, stats = forgetting_attention(q, k, v, lf, options=on("triton"), adaptive_threshold=delta, return_stats=True)
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
    ours = run_grads(forgetting_attention, (q, k, v, lf), do, options=on("triton"), adaptive_threshold=delta)
    ref = run_grads(forgetting_attention, [t.double() for t in (q, k, v, lf)], do.double(), options=on("reference"),
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
    with use_options(acp_grid=(16, 16)):
        ours = run_grads(forgetting_attention, (q, k, v, lf), do, options=on("triton"), adaptive_threshold=delta,
                         seq_start=seq_start)
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
    ours = forgetting_attention(q, k, v, lf, options=on("triton"), adaptive_threshold=delta)
    GM, GN = _acp.grid(16)
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
            o = forgetting_attention(q, k, v, lf, options=on("triton"), adaptive_threshold=thr, qk_norm_weights=w)
            assert o.shape == q.shape
            grads = torch.autograd.grad(o, (q, k, v, lf), torch.ones_like(o))
            assert all(g.shape == x.shape and not g.any() for g, x in zip(grads, (q, k, v, lf))), (thr, w)
    lo, hi, delta = AG.acp_tables_for(q, k, lf, 0.25, -3.0, math.exp(-10), None, default_options())
    assert lo.shape == (4, 0) and torch.equal(hi, torch.full_like(hi, -1))
    assert torch.equal(delta, torch.full((2, 2), -3.0))


def test_acp_auto_within_eps_bound():
    """'auto' threshold: |o_acp - o_dense| <= 2 eps max|v| (pruned weight per row <= eps)."""
    q, k, v, _ = make(1, 160, 160, 2, 2, 16)
    q = F.normalize(q, dim=-1) * 4.0  # QK-norm-like
    k = F.normalize(k, dim=-1) * 4.0
    lf = torch.full((1, 160, 2), -3.0)
    for eps in (math.exp(-10), 0.05):
        o_acp, stats = forgetting_attention(q, k, v, lf, options=on("triton"), adaptive_threshold="auto", acp_eps=eps,
                                            return_stats=True)
        o = forgetting_attention_ref(*(t.double() for t in (q, k, v, lf)))
        assert (stats["pruned"] > 0).all(), stats
        assert (o_acp.double() - o).abs().max() <= 2 * eps * v.abs().max() + 1e-5
    w = torch.ones(16) * 4.0 / math.sqrt(16)  # RMSNorm weights giving the same norm bound
    o_w = forgetting_attention(q, k, v, lf, options=on("triton"), adaptive_threshold="auto", qk_norm_weights=(w, w))
    assert (o_w.double() - o).abs().max() <= 2 * math.exp(-10) * v.abs().max() + 1e-5


def test_acp_bad_threshold():
    q, k, v, lf = acp_inputs(20)
    with pytest.raises(ValueError, match="adaptive_threshold"):
        forgetting_attention(q, k, v, lf, options=on("triton"), adaptive_threshold="fast")
    with pytest.raises(ValueError, match="adaptive_threshold tensor"):
        forgetting_attention(q, k, v, lf, options=on("triton"), adaptive_threshold=torch.zeros(2, 2))


@pytest.mark.parametrize("Tq,Tk,chunks", [(100, 100, 64), (37, 230, 64), (1, 64, 64), (300, 700, 64), (300, 700, 3),
                                           (290, 4500, 5)])
def test_acp_boundary_kernels_match_searchsorted(monkeypatch, Tq, Tk, chunks):
    """The table kernels (windows of 16 blocks under the interpreter: (300, 700) needs several windows and a
    16-ary search step, (290, 4500) two steps; the cumsum in at most ``chunks`` chunks of positions, each of
    several sub-tiles when few) equal torch.searchsorted; one threshold is positive (only the diagonal cap keeps
    keys)."""
    monkeypatch.setattr(TL, "ACP_CUMSUM_CHUNKS", chunks)
    g = torch.Generator().manual_seed(Tk)
    lf = -torch.rand(2, Tk, 3, generator=g) * torch.tensor([2.0, 0.3, 1e-3])
    delta = -torch.rand(2, 3, generator=g) * 20 - 1
    delta[1, 2] = 0.5
    for GM, GN in ((32, 16), (64, 64), (16, 32)):
        lo, hi = TL.acp_tables(lf, delta, Tq, (GM, GN))
        lo_t, hi_t = _acp._tables_torch(lf, delta, Tq, GM, GN)
        assert torch.equal(lo, lo_t) and torch.equal(hi, hi_t), (GM, GN)


@pytest.mark.parametrize("case", range(24))
def test_acp_tables_match_searchsorted_on_random_shapes(monkeypatch, case):
    """lo and hi of the one table launch equal torch.searchsorted's on random shapes, grids, chunkings and gates:
    gates from none to steep decay, stretches of log f = 0 with a zero threshold (ties: c[m0] - c[end_n] = delta is
    kept), positive thresholds (only the diagonal kept)."""
    import random

    rnd = random.Random(case)
    Tk = rnd.choice([1, 5, 16, 17, 63, 64, 65, 200, 513, 1031])
    Tq = rnd.randint(1, Tk)
    monkeypatch.setattr(TL, "ACP_CUMSUM_CHUNKS", rnd.choice([3, 64, 128]))
    g = torch.Generator().manual_seed(case)
    lf = -torch.rand(2, Tk, rnd.choice([1, 3]), generator=g) * rnd.choice([0.0, 1e-4, 1e-2, 0.3, 3.0])
    if case % 2:  # stretches of log f = 0: c is flat there, so with delta = 0 its comparisons meet ties
        lf[:, ::7] = 0.0
        lf[:, Tk // 4:Tk // 2] = 0.0
    delta = -torch.rand(2, lf.shape[2], generator=g) * rnd.choice([0.5, 5.0, 30.0]) - rnd.choice([0.0, 1.0])
    delta[1, 0] = 0.0
    if rnd.random() < 0.2:
        delta[0, 0] = 1.0
    GM, GN = rnd.choice([(16, 16), (32, 16), (16, 32), (64, 64), (16, 64)])
    lo, hi = TL.acp_tables(lf, delta, Tq, (GM, GN))
    lo_t, hi_t = _acp._tables_torch(lf, delta, Tq, GM, GN)
    assert torch.equal(lo, lo_t) and torch.equal(hi, hi_t), (Tq, Tk, GM, GN)


@pytest.mark.parametrize("Tq,Tk,H,Hkv,D", [(37, 230, 4, 2, 24), (1, 1, 2, 2, 16), (300, 300, 3, 1, 64)])
def test_acp_threshold_in_kernel_matches_acp_threshold(monkeypatch, Tq, Tk, H, Hkv, D):
    """The boundary kernel's threshold (every kind: "auto" from the max q / k norms, split over several chunk
    programs each striding over several chunks, and from QK-norm weights of each shape; a float; a tensor)
    equals ``acp.acp_threshold``, and its tables equal torch.searchsorted's for that threshold."""
    monkeypatch.setattr(TL, "ACP_NORM_CHUNKS", 4)
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
            lo, hi, delta = AG.acp_tables_for(q, k, lf, 0.3, thr, eps, w, default_options())
            want = _acp.acp_threshold(q, k, 0.3, thr, eps=eps, qk_norm_weights=w)
            assert torch.allclose(delta, want, rtol=1e-6, atol=0), (thr, w, delta, want)
            lo_t, hi_t = _acp._tables_torch(lf, delta, Tq, *_acp.grid(D))
            assert torch.equal(lo, lo_t) and torch.equal(hi, hi_t), (thr, w)


def test_acp_qk_norm_weight_shapes_are_checked():
    q, k, v, lf = acp_inputs(20)
    for w, bad in (((torch.ones(3, 16), torch.ones(16)), "gamma_q"), ((torch.ones(16), torch.ones(3, 16)), "gamma_k"),
                   ((torch.ones(17), torch.ones(16)), "gamma_q")):
        with pytest.raises(ValueError, match=bad):
            forgetting_attention(q, k, v, lf, options=on("triton"), adaptive_threshold="auto", qk_norm_weights=w)
        with pytest.raises(ValueError, match=bad):
            forgetting_attention(q, k, v, lf, options=on("reference"), adaptive_threshold="auto", qk_norm_weights=w)
