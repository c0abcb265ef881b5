"""The plain-PyTorch reference against the float64 definition written out (forgetting_attention_naive)."""

import math

import pytest
import torch
import torch.nn.functional as F

from forgetting_transformer.ops.forgetting_attention import forgetting_attention
from forgetting_transformer.ops.forgetting_attention.reference import (forgetting_attention_naive,
                                                                       forgetting_attention_ref)


def make_inputs(B, Tq, Tk, H, Hkv, D, dtype=torch.float64, seed=0, gate_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Tq, H, D, generator=g, dtype=dtype)
    k = torch.randn(B, Tk, Hkv, D, generator=g, dtype=dtype)
    v = torch.randn(B, Tk, Hkv, D, generator=g, dtype=dtype)
    log_f = F.logsigmoid(gate_scale * torch.randn(B, Tk, H, generator=g, dtype=torch.float64) + 2.0)
    return [t.requires_grad_() for t in (q, k, v, log_f)]


SHAPES = [  # B, Tq, Tk, H, Hkv, D
    (1, 1, 1, 1, 1, 16),
    (2, 17, 17, 3, 3, 7),  # odd head dim
    (1, 63, 63, 4, 2, 32),  # GQA
    (2, 40, 63, 4, 1, 24),  # MQA, Tq < Tk (prefill with a cache)
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("chunk_size", [5, 1024])
def test_reference_matches_definition_output_and_all_gradients(shape, chunk_size):
    B, Tq, Tk, H, Hkv, D = shape
    inputs = make_inputs(*shape)
    out = forgetting_attention_ref(*inputs, chunk_size=chunk_size)
    expected = forgetting_attention_naive(*inputs)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, do)
    expected_grads = torch.autograd.grad(expected, inputs, do)
    for name, g, e in zip(("dq", "dk", "dv", "dlog_fgate"), grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-11, msg=lambda m: f"{name}: {m}")


def test_sm_scale_is_applied():
    q, k, v, f = make_inputs(1, 9, 9, 2, 2, 8)
    torch.testing.assert_close(forgetting_attention_ref(q, k, v, f, sm_scale=0.3),
                               forgetting_attention_naive(q, k, v, f, sm_scale=0.3))
    # With all gates = 1 the op is plain causal softmax attention.
    zero = torch.zeros_like(f)
    sdpa = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    torch.testing.assert_close(forgetting_attention_ref(q, k, v, zero), sdpa.transpose(1, 2))


def test_cu_seqlens_equals_separate_documents():
    lens = [5, 1, 11, 7]
    T = sum(lens)
    q, k, v, f = make_inputs(1, T, T, 2, 1, 8)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)))
    out = forgetting_attention_ref(q, k, v, f, cu_seqlens=cu, chunk_size=4)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        doc = forgetting_attention_naive(q[:, s:e], k[:, s:e], v[:, s:e], f[:, s:e])
        torch.testing.assert_close(out[:, s:e], doc)
    out.sum().backward()  # gradients flow through the packed path too
    assert torch.isfinite(f.grad).all()


def test_seq_start_masks_left_padding():
    B, T = 3, 12
    q, k, v, f = make_inputs(B, T, T, 2, 2, 8)
    start = torch.tensor([0, 4, 11])
    out = forgetting_attention_ref(q, k, v, f, seq_start=start)
    for b, s in enumerate(start.tolist()):
        real = forgetting_attention_naive(q[b : b + 1, s:], k[b : b + 1, s:], v[b : b + 1, s:], f[b : b + 1, s:])
        torch.testing.assert_close(out[b : b + 1, s:], real)
        assert (out[b, :s] == 0).all()  # queries with no visible key give 0, not NaN


def test_long_sequence_decay_has_no_cancellation():
    # Gates near 1 over a long sequence: a global fp32 cumsum reaches ~-40 and differencing it loses ~1e-5 per
    # entry; the reference forms c_i - c_j in float64, so fp32 inputs match the float64 computation closely.
    T, H, D = 8192, 1, 16
    q, k, v, _ = make_inputs(1, 64, T, H, H, D, dtype=torch.float32)
    log_f = torch.full((1, T, H), -5e-3, dtype=torch.float32)
    out = forgetting_attention_ref(q, k, v, log_f)
    ref = forgetting_attention_ref(q.double(), k.double(), v.double(), log_f.double())
    err = (out.double() - ref).norm() / ref.norm()
    assert err < 1e-6, err


def test_chunked_backward_does_not_keep_the_full_score_matrix():
    # With autograd, each query chunk is recomputed in backward (checkpoint), so saved activations scale with
    # T * chunk, not T^2.
    T, chunk = 2048, 128
    q, k, v, f = make_inputs(1, T, T, 1, 1, 16, dtype=torch.float32)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forgetting_attention_ref(q, k, v, f, chunk_size=chunk)
    assert max(saved) < T * T / 4, max(saved)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v, f))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(k=torch.zeros(1, 4, 2, 9)), "head dim mismatch"),
        (dict(k=torch.zeros(1, 4, 3, 8), v=torch.zeros(1, 4, 3, 8), log_fgate=torch.zeros(1, 4, 4)),
         r"kv heads \(3\) must divide"),
        (dict(log_fgate=torch.zeros(1, 4, 4, dtype=torch.bfloat16)), "log_fgate must be float32"),
        (dict(log_fgate=torch.zeros(1, 5, 4)), r"log_fgate must be \(B, Tk, H\)"),
        (dict(q=torch.zeros(1, 5, 4, 8)), r"seqlen_q \(5\) must be <= seqlen_k \(4\)"),
        (dict(cu_seqlens=torch.tensor([0, 3])), "end at T=4"),
        (dict(adaptive_threshold="fast"), "adaptive_threshold must be None, 'auto'"),
    ],
)
def test_bad_inputs_raise_clear_errors(kwargs, match):
    args = dict(q=torch.zeros(1, 4, 4, 8), k=torch.zeros(1, 4, 2, 8), v=torch.zeros(1, 4, 2, 8),
                log_fgate=torch.zeros(1, 4, 4))
    extra = {key: kwargs.pop(key) for key in list(kwargs) if key not in args}
    args.update(kwargs)
    if "k" in kwargs and "v" not in kwargs:
        args["v"] = args["k"]
    with pytest.raises((ValueError, NotImplementedError), match=match):
        forgetting_attention_ref(args["q"], args["k"], args["v"], args["log_fgate"], **extra)


def test_public_op_on_cpu_is_the_reference():
    inputs = make_inputs(2, 33, 33, 2, 2, 8, dtype=torch.float32)
    torch.testing.assert_close(forgetting_attention(*inputs), forgetting_attention_ref(*inputs))
    assert math.isfinite(forgetting_attention(*inputs).sum().item())


@pytest.mark.parametrize("Tq,Tk,seq_start", [(90, 90, None), (50, 90, torch.tensor([7, 0]))])
def test_acp_masks_exactly_the_grid_region(Tq, Tk, seq_start):
    """ACP on the reference (chunked, chunk 32 to cross chunk and grid boundaries): output and all four
    gradients equal float64 attention with the grid tiles masked that ACP prunes (tests/ops/oracles.py), and
    the stats count those tiles."""
    from oracles import acp_masked_ref

    q, k, v, lf = make_inputs(2, Tq, Tk, 4, 2, 16)
    with torch.no_grad():
        lf[..., :2] = -1.3  # heads 0, 1 local; 2, 3 keep their gates
    delta = torch.tensor([[-3.0, -6.0, -3.0, -0.5], [-4.0, -9.0, -1.0, 2.0]])  # 2.0 > 0: only diagonals kept
    grid = (16, 8)
    ours = forgetting_attention_ref(q, k, v, lf, adaptive_threshold=delta, acp_grid=grid, chunk_size=32,
                                    seq_start=seq_start)
    ref = acp_masked_ref(q, k, v, lf, delta.double(), *grid, seq_start=seq_start)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    do = torch.randn_like(ours)
    for a, b in zip(torch.autograd.grad(ours, (q, k, v, lf), do), torch.autograd.grad(ref, (q, k, v, lf), do)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    _, stats = forgetting_attention_ref(q, k, v, lf, adaptive_threshold=delta, acp_grid=grid, return_stats=True)
    dense = forgetting_attention_ref(q, k, v, lf, acp_grid=grid, return_stats=True)[1]
    assert torch.equal(stats["computed"] + stats["pruned"], dense["computed"]) and (dense["pruned"] == 0).all()
    assert (stats["pruned"][:, :2] > 0).all()


def test_acp_auto_on_the_cpu_path_stays_within_the_eps_bound():
    """The public op on CPU with ACP 'auto' (QK-norm weights): within 2 eps max|v| of dense attention."""
    q, k, v, lf = (t.detach().float() for t in make_inputs(1, 256, 256, 2, 2, 16))
    q, k = F.normalize(q, dim=-1) * 4.0, F.normalize(k, dim=-1) * 4.0
    lf = torch.full_like(lf, -3.0)
    w = torch.ones(16)
    o_acp, stats = forgetting_attention(q, k, v, lf, adaptive_threshold="auto", qk_norm_weights=(w, w),
                                        return_stats=True)
    o = forgetting_attention(q, k, v, lf)
    assert (stats["pruned"] > 0).all()
    assert (o_acp - o).abs().max() <= 2 * math.exp(-10) * v.abs().max() + 1e-6
