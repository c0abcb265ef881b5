"""Inputs and checks shared by the GPU tests of the kernels (bf16 / fp16 against float64, ``accuracy.py``'s
bounds)."""

import math

import torch
import torch.nn.functional as F

from accuracy import TOL, assert_within, errors, rel
from forgetting_transformer.ops.forgetting_attention import autograd as AG
from forgetting_transformer.ops.forgetting_attention import (default_options, forgetting_attention,
                                                             forgetting_attention_ref)
from oracles import acp_masked_ref




def make(B, Tq, Tk, H, Hkv, D, dtype=torch.bfloat16, gate_bias=2.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Tq, H, D, device="cuda", generator=g).to(dtype)
    k = torch.randn(B, Tk, Hkv, D, device="cuda", generator=g).to(dtype)
    v = torch.randn(B, Tk, Hkv, D, device="cuda", generator=g).to(dtype)
    lf = F.logsigmoid(torch.randn(B, Tk, H, device="cuda", generator=g) + gate_bias).float()
    return q, k, v, lf


def grads(fn, inputs, do, **kw):
    xs = [t.detach().requires_grad_() for t in inputs]
    o = fn(*xs, **kw)
    gs = torch.autograd.grad(o, xs, do.to(o.dtype))
    return (o,) + tuple(gs)


def dout(q, seed=1):
    return torch.randn(q.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)).to(q.dtype)


def check(q, k, v, lf, bounds=TOL, ours_kw=None, **kw):
    """The op's output and four gradients against float64 attention on the same inputs, within ``bounds``
    (printed with the same computation in PyTorch at q's dtype); returns the errors."""
    do = dout(q)
    ours = grads(forgetting_attention, (q, k, v, lf), do, **kw, **(ours_kw or {}))
    ref64 = grads(forgetting_attention_ref, [t.double() for t in (q, k, v, lf)], do.double(), **kw)
    ref_lp = grads(forgetting_attention_ref, (q, k, v, lf), do, **kw)
    errs, errs_lp = errors(ours, ref64), errors(ref_lp, ref64)
    msg = " ".join(f"{n}={e:.2e}(pytorch {errs_lp[n]:.2e})" for n, e in errs.items())
    print(f"\n[{tuple(q.shape)} kv{tuple(k.shape)} {q.dtype}] {msg}")
    assert_within(errs, bounds, f"[{tuple(q.shape)} kv{tuple(k.shape)} {q.dtype}]")
    return errs


def acp_case(seed, B=1, T=2048, H=4, D=64):
    """QK-normed inputs whose local heads (log f = -1.3; the rest -1e-4) depend on ``seed``, so that ACP's tables
    differ between seeds; the QK-norm weights for "auto"."""
    q, k, v, lf = make(B, T, T, H, H, D, seed=seed)
    q = (F.normalize(q.float(), dim=-1) * math.sqrt(D)).bfloat16()
    k = (F.normalize(k.float(), dim=-1) * math.sqrt(D)).bfloat16()
    local = torch.arange(H, device="cuda") % 2 == seed % 2
    lf[:] = torch.where(local, -1.3, -1e-4)
    w = torch.ones(D, device="cuda")
    return (q, k, v, lf), dout(q, seed + 100), dict(adaptive_threshold="auto", qk_norm_weights=(w, w))


def check_against_eager(got, inputs, do, acp):
    """``got`` (o, dq, dk, dv, dlf) of a graphed call: o, dk and dv bitwise those of an eager call on the same
    inputs (so the tables were formed from them; both are deterministic); dq and d log f, whose reduce-adds vary
    in order between runs, as close to float64 attention with ACP's pruned tiles masked as the eager call's."""
    from forgetting_transformer.ops.forgetting_attention import acp as _acp

    q, k, v, lf = inputs
    D = q.shape[-1]
    delta = AG.acp_tables_for(q, k, lf, D ** -0.5, "auto", _acp.DEFAULT_EPS, acp["qk_norm_weights"],
                              default_options())[2]
    GM, GN = _acp.grid(D)
    eager = grads(forgetting_attention, inputs, do, **acp)
    ref = grads(lambda *x: acp_masked_ref(*x, delta.double(), GM, GN), [t.double() for t in inputs], do.double())
    for name, a, e, r in zip(("o", "dq", "dk", "dv", "dlf"), got, eager, ref):
        assert torch.isfinite(a).all(), name
        if name in ("o", "dk", "dv"):
            assert torch.equal(a, e), name
        else:
            assert rel(a, r) <= 1.1 * rel(e, r) + 1e-5, (name, rel(a, r), rel(e, r))
