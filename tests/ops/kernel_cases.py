"""Inputs and checks shared by the interpreter tests of the kernels (fp32 kernels against float64)."""

import torch
import torch.nn.functional as F

from accuracy import on
from forgetting_transformer.ops.forgetting_attention import forgetting_attention, forgetting_attention_ref

# fp32 kernel vs float64 reference: rounding of fp32 arithmetic (observed 1e-7 .. 2e-6).
RTOL = 2e-5
NAMES = ("o", "dq", "dk", "dv", "dlogf")


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
    ours = run_grads(forgetting_attention, (q, k, v, lf), do, options=on("triton"), **kw)
    ref = run_grads(forgetting_attention_ref, [t.double() for t in (q, k, v, lf)], do.double(), **kw)
    errs = {}
    for name, a, r in zip(NAMES, ours, ref):
        assert a.shape == r.shape, name
        assert torch.isfinite(a).all(), f"{name} has NaN/inf (unwritten or overflowed)"
        # exactly-zero gradients (T = 1: dq = dk = 0) are measured on the scale of dv (~ |do|)
        errs[name] = rel(a, r, floor=ref[3].norm().item())
    assert all(e <= rtol for e in errs.values()), errs
    return ours, ref


def acp_inputs(T=100, seed=0):
    q, k, v, _ = make(1, T, T, 4, 2, 16, seed=seed)
    lf = torch.full((1, T, 4), -1e-4)
    lf[..., :2] = -1.3  # heads 0, 1 local; heads 2, 3 global
    return q, k, v, lf
