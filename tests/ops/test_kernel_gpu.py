"""GPU tests of the Forgetting Attention op (bf16 / fp16 against float64; bounds in ``accuracy.py``).

Run on the device: ``bash benchmarks/attention/gpu_tests.sh`` (this file and ``test_gluon_gpu.py``, once as users
get the op, autotuned, and once with ``FOX_AUTOTUNE=0``).
"""

import math

import pytest
import torch
import torch.nn.functional as F

from accuracy import TOL, TOL_FEW_KEYS, assert_within, errors, rel
from forgetting_transformer.ops.forgetting_attention import (acp as _acp, autograd as DP, default_options,
                                                             forgetting_attention, forgetting_attention_ref, tiles,
                                                             use_options)
from forgetting_transformer.ops.forgetting_attention.triton import launch as TL
from forgetting_transformer.ops.forgetting_attention.gluon import launch as GL
from gpu_cases import AG, acp_case, check, check_against_eager, dout, grads, make

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Triton kernel on real hardware)"),
]


@pytest.mark.parametrize(
    "B,T,H,Hkv,D",
    [(2, 1024, 4, 4, 64), (2, 1024, 4, 2, 128), (1, 4096, 4, 1, 64), (1, 4096, 2, 2, 128), (1, 16384, 2, 2, 64)],
)
def test_bf16_accuracy(B, T, H, Hkv, D):
    check(*make(B, T, T, H, Hkv, D))


@pytest.mark.parametrize("D,T", [(16, 1024), (32, 1024), (96, 1024), (80, 1024)]
                         + [(D, T) for D in (192, 256) for T in (1, 64, 513, 1031, 4096)])
def test_head_dims(D, T):
    """Head dims padded inside the Triton kernels (80, 96, 192) and the largest (256: most tile configs do not fit
    its shared memory and are pruned), forward and backward, at lengths that are not multiples of the tiles."""
    check(*make(1, T, T, 4, 2, D))


def test_fp16_and_tq_lt_tk():
    check(*make(2, 1000, 2048, 4, 2, 64, dtype=torch.float16))
    check(*make(1, 1, 1024, 2, 1, 64))


def test_varlen_and_left_padding():
    q, k, v, lf = make(1, 3000, 3000, 4, 2, 64)
    cu = torch.tensor([0, 1, 700, 2048, 2100, 3000], device="cuda", dtype=torch.int32)
    check(q, k, v, lf, cu_seqlens=cu)
    q, k, v, lf = make(3, 1024, 1024, 2, 2, 64)
    check(q, k, v, lf, seq_start=torch.tensor([0, 100, 1000], device="cuda"))


def test_gate_near_one():
    q, k, v, lf = make(1, 4096, 4096, 2, 2, 64)
    check(q, k, v, torch.full_like(lf, -1e-6))


def test_gate_minus_20():
    """log f = -20 at every position (a decay of e^-20 per step). With scores ~ N(0, 100) (sm_scale = 1.25) some
    rows keep O(1) weight on earlier keys, so all four gradients are well-conditioned: each against float64
    within ``TOL_FEW_KEYS`` (few keys per row). At the default scale every row's weight sits on its own key: o and
    dv within ``TOL``; dq, dk and d log f (~e^-20) lie below what fp32 resolves of dS (dP - delta cancels to
    ~1e-7 |dO| |v|), so they are only required finite."""
    q, k, v, lf = make(1, 4096, 4096, 2, 2, 64)
    check(q, k, v, torch.full_like(lf, -20.0), bounds=TOL_FEW_KEYS, sm_scale=1.25)
    lf = torch.full_like(lf, -20.0)
    do = dout(q)
    ours = grads(forgetting_attention, (q, k, v, lf), do)
    ref = grads(forgetting_attention_ref, [t.double() for t in (q, k, v, lf)], do.double())
    errs = errors(ours, ref)  # (checks every output finite)
    assert_within({n: errs[n] for n in ("o", "dv")}, TOL, "[log f = -20, default scale]")


@pytest.mark.parametrize("D", [64, 128])
def test_deterministic_backward(D):
    """With ``torch.use_deterministic_algorithms`` or ``AttentionOptions(deterministic=True)`` the backward is
    bitwise reproducible (on Hopper at head dim 64 it then runs the dq and dk/dv kernels instead of the one-kernel
    backward, whose reduce-adds vary in order); by default two runs agree to fp32 rounding of the accumulators."""
    q, k, v, lf = make(1, 2048, 2048, 4, 1, D)
    do = torch.randn_like(q)
    default = [grads(forgetting_attention, (q, k, v, lf), do) for _ in range(2)]
    for x, y in zip(*default):
        assert rel(x, y) <= 1e-3
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        assert not GL.use_fused_bwd(q, k, v, do, q, default_options())
        a = grads(forgetting_attention, (q, k, v, lf), do)
        b = grads(forgetting_attention, (q, k, v, lf), do)
    finally:
        torch.use_deterministic_algorithms(prev)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    with use_options(deterministic=True) as opts:
        assert not GL.use_fused_bwd(q, k, v, do, q, opts)
        c = grads(forgetting_attention, (q, k, v, lf), do)
    for x, y in zip(a, c):
        assert torch.equal(x, y)


def test_million_tokens_last_block():
    """T = 2^20, gates near 1: the last block of outputs equals a float64 computation on that window."""
    T, D, W = 1 << 20, 64, 128
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(1, T, 1, D, device="cuda", generator=g).bfloat16()
    k = torch.randn(1, T, 1, D, device="cuda", generator=g).bfloat16()
    v = torch.randn(1, T, 1, D, device="cuda", generator=g).bfloat16()
    lf = -torch.rand(1, T, 1, device="cuda", generator=g) * 2e-5  # c_T ~ -10, gates ~ 1
    with torch.no_grad():
        o = forgetting_attention(q, k, v, lf)
    assert torch.isfinite(o).all()
    c = torch.cumsum(lf[0, :, 0].double(), 0)
    s = (q[0, T - W:, 0].double() @ k[0, :, 0].double().T) / math.sqrt(D)
    s = s + c[T - W:, None] - c[None, :]
    mask = torch.arange(T, device="cuda")[None, :] <= torch.arange(T - W, T, device="cuda")[:, None]
    ref = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v[0, :, 0].double()
    err = rel(o[0, T - W:, 0], ref)
    ref_bf16 = rel(ref.bfloat16(), ref)
    print(f"\n[T=2^20 last block] rel err {err:.2e} (bf16 rounding of the exact output {ref_bf16:.2e})")
    assert err <= max(2 * ref_bf16, 2.5e-3)


def compiled_against_eager(fn, inputs):
    """(compiled, eager) gradients of ``fn(*inputs).float().square().sum()``, ``fn`` traced without graph breaks."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda *x: fn(*x).float().square().sum(), fullgraph=True)
    out = []
    for f in (compiled, lambda *x: fn(*x).float().square().sum()):
        xs = [t.detach().requires_grad_() for t in inputs]
        f(*xs).backward()
        out.append([x.grad for x in xs])
    return out


@pytest.mark.parametrize("acp", [False, True])
def test_torch_compile_fullgraph(acp):
    """A compiled call (dense, or with ACP "auto" from QK-norm weights: the table op too) traces without graph
    breaks and runs the eager call's kernels: with a deterministic backward its gradients are bitwise eager's; by
    default dk and dv are, and dq and d log f (added in varying order by the one-kernel backward) differ as two
    eager runs do (``test_deterministic_backward``)."""
    q, k, v, lf = make(1, 2048, 2048, 2, 2, 64)
    lf[..., 0] = -1.0
    w = torch.ones(64, device="cuda")
    kw = dict(adaptive_threshold="auto", qk_norm_weights=(w, w)) if acp else {}
    fn = lambda q, k, v, lf: forgetting_attention(q * 1.0, k, v, lf, **kw)  # noqa: E731
    with use_options(deterministic=True):
        compiled, eager = compiled_against_eager(fn, (q, k, v, lf))
    assert all(torch.equal(x, y) for x, y in zip(compiled, eager))
    compiled, eager = compiled_against_eager(fn, (q, k, v, lf))
    for name, x, y in zip(("dq", "dk", "dv", "dlf"), compiled, eager):
        assert torch.equal(x, y) if name in ("dk", "dv") else rel(x, y) <= 1e-3, name


def test_acp_bf16():
    """ACP ('auto', QK-normed q/k, half the heads local): against the dense float64 reference (the pruned weight is
    at most eps = e^-10 per row) ACP's output and gradients are within ``TOL_FEW_KEYS`` (the local heads attend to
    few keys) and no further from it than the dense kernel's (within 5%), and the local heads prune."""
    B, T, H, D = 1, 4096, 4, 64
    q, k, v, lf = make(B, T, T, H, H, D)
    q = (F.normalize(q.float(), dim=-1) * math.sqrt(D)).bfloat16()
    k = (F.normalize(k.float(), dim=-1) * math.sqrt(D)).bfloat16()
    lf[..., : H // 2] = -1.3
    lf[..., H // 2:] = -1e-4
    w = torch.ones(D, device="cuda")
    acp = dict(adaptive_threshold="auto", qk_norm_weights=(w, w))
    do = dout(q)
    ref = grads(forgetting_attention_ref, [t.double() for t in (q, k, v, lf)], do.double())
    dense, pruned = (errors(grads(forgetting_attention, (q, k, v, lf), do, **kw), ref) for kw in ({}, acp))
    print("\n[ACP] " + " ".join(f"{n}: acp {pruned[n]:.2e} dense {dense[n]:.2e}" for n in pruned))
    assert_within(pruned, TOL_FEW_KEYS, "[ACP]")
    assert all(pruned[n] <= 1.05 * dense[n] + 1e-4 for n in pruned), (pruned, dense)
    _, stats = forgetting_attention(q, k, v, lf, return_stats=True, **acp)
    print(f"\n[ACP] computed {stats['computed'].tolist()} pruned {stats['pruned'].tolist()}")
    assert (stats["pruned"][:, : H // 2] > 0).all() and (stats["pruned"][:, H // 2:] == 0).all()


@pytest.mark.parametrize("T,H,Hkv,D", [(16384, 4, 2, 128), (300000, 1, 1, 64)])
def test_acp_threshold_and_tables_on_the_gpu(T, H, Hkv, D):
    """The boundary kernel's in-kernel "auto" threshold (max q / k norms over many chunk programs; QK-norm
    weights) equals acp.acp_threshold, and its tables equal torch.searchsorted's for that threshold."""
    q, k, _, lf = make(2, T, T, H, Hkv, D)
    q[1, T // 3, 0] *= 4.0
    w = (torch.rand(H, D, device="cuda") + 0.5, torch.rand(D, device="cuda") + 0.5)
    for weights in (None, w):
        lo, hi, delta = AG.acp_tables_for(q, k, lf, D ** -0.5, "auto", math.exp(-10), weights, default_options())
        want = _acp.acp_threshold(q, k, D ** -0.5, "auto", qk_norm_weights=weights)
        assert torch.allclose(delta, want, rtol=1e-5, atol=0), (delta, want)
        lo_t, hi_t = _acp._tables_torch(lf, delta, T, *_acp.grid(D))
        assert torch.equal(lo, lo_t) and torch.equal(hi, hi_t)


def test_cuda_graph_replay_with_acp():
    """The op with ACP ("auto") captured in a CUDA graph (forward and the four gradients): replayed on other
    inputs, whose local heads differ, it gives what an eager call on those inputs gives. So nothing in the op waits
    for the host, and the tables are formed on the GPU from the replayed inputs."""
    inputs, do, acp = acp_case(0)
    xs = [t.detach().clone().requires_grad_() for t in inputs]
    do_s = do.clone()

    def step():
        o = forgetting_attention(*xs, **acp)
        return (o,) + torch.autograd.grad(o, xs, do_s)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compilation, allocator) outside the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for seed in (1, 2):
        inputs, do, _ = acp_case(seed)
        with torch.no_grad():
            for x, t in zip(xs + [do_s], list(inputs) + [do]):
                x.copy_(t)
        graph.replay()
        torch.cuda.synchronize()
        check_against_eager([t.clone() for t in out], inputs, do, acp)


def test_reduce_overhead_compile_with_acp(monkeypatch):
    """``torch.compile(mode="reduce-overhead")`` (CUDA graphs through Inductor's cudagraph trees) runs the op with
    ACP from recorded graphs: after the first calls no launcher of the op runs on the host, no graph is skipped,
    and the forward and gradients match eager on each new input."""
    from torch._dynamo.utils import counters

    launches = []
    for name in ("fwd_impl", "bwd_impl"):
        impl = getattr(DP, name)
        monkeypatch.setattr(DP, name, lambda *a, _impl=impl, _name=name: launches.append(_name) or _impl(*a))
    torch._dynamo.reset()
    counters.clear()
    *_, acp = acp_case(0)
    f = torch.compile(lambda q, k, v, lf: forgetting_attention(q, k, v, lf, **acp), mode="reduce-overhead",
                      fullgraph=True)
    for seed in range(4):  # the first calls warm up and record, the later ones replay
        inputs, do, _ = acp_case(seed)
        before = len(launches)
        got = [t.clone() for t in grads(f, inputs, do)]
        if seed >= 2:
            assert len(launches) == before, launches[before:]
        check_against_eager(got, inputs, do, acp)
    assert launches and not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


@pytest.mark.parametrize("D", [64, 256])
def test_autotuned_launches(monkeypatch, D):
    """With autotuning on (the default), the first call tunes each Triton kernel over the configs that fit the
    device's shared memory (at head dim 256 most are pruned) and later calls launch the pick directly
    (``TL._TUNED``); both calls meet the float64 bounds, every config timed fits, and the pick is the
    autotuner's."""
    monkeypatch.setattr(TL, "_TUNED", {})
    monkeypatch.setattr(TL, "_KERNELS", {})  # fresh autotuners: each times its candidates on this call
    arch, limit = tiles.device_limits(torch.cuda.current_device())
    with use_options(autotune=True, gluon=False):  # (the Gluon kernels have fixed configs)
        q, k, v, lf = make(1, 1024, 1024, 4, 2, D)
        first = check(q, k, v, lf)
        assert {key[0] for key in TL._TUNED} == {"fwd", "dq", "dkdv"}
        for (kind, _, _), cfg in TL._TUNED.items():
            tuned = TL.tuned_kernel(kind)
            assert cfg is tuned.best_config or cfg in tuned.cache.values()
            timed = [tiles._tile(c) for c in tuned.configs_timings]
            assert timed and all(tiles.shared_memory(kind, c, D, 2, arch) <= limit for c in timed), (kind, timed)
            if D == 256:
                assert len(timed) < len(tiles.AUTOTUNE_CONFIGS[kind]), (kind, timed)
        assert check(q, k, v, lf) == first  # the same configs: bit-identical results
