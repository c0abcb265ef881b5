"""The accuracy bounds of the kernels' GPU tests, the checks that apply them, and the PyTorch model of the kernels'
rounding that sets the bounds for rows that attend to few keys (``test_bounds.py`` runs it on the CPU).

Errors are relative L2 errors against float64 attention on the same (16-bit) inputs. ``TOL`` holds where rows
attend to many keys. Where they attend to few (local forget gates, log f = -20 with large scores), dS's rows
nearly cancel (dS_ij = P_ij (dP_ij - delta_i), delta_i = sum_j P_ij dP_ij), and rounding dS to 16 bits for the
dq and dk products, and summing its rows and columns in two kernels for d log f, leaves up to 2-4x the many-keys
error: ``TOL_FEW_KEYS``. Both fail a zero gradient (error 1) and one off by 2%.
"""

import math

import torch

TOL = {"o": 2.5e-3, "dq": 4e-3, "dk": 4e-3, "dv": 4e-3, "dlf": 5e-3}
TOL_FEW_KEYS = {"o": 2.5e-3, "dq": 1.5e-2, "dk": 1.5e-2, "dv": 4e-3, "dlf": 1.5e-2}
NAMES = ("o", "dq", "dk", "dv", "dlf")


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def errors(ours, ref, names=NAMES):
    """{name: relative L2 error} of ``ours`` against ``ref`` (o, dq, dk, dv, d log f); a gradient that is exactly
    zero in float64 (a single key: dq = dk = d log f = 0) is measured on the scale of dv. Non-finite values are an
    error."""
    out = {}
    scale = dict(zip(names, ref)).get("dv")
    for name, a, r in zip(names, ours, ref):
        assert torch.isfinite(a).all(), f"{name} has NaN/inf"
        if r.abs().max() == 0 and scale is not None:
            out[name] = (a.double().norm() / scale.double().norm()).item()
        else:
            out[name] = rel(a, r)
    return out


def assert_within(errs, bounds, context=""):
    bad = {name: e for name, e in errs.items() if not e <= bounds[name]}
    assert not bad, f"{context} errors above {({n: bounds[n] for n in bad})}: {bad} (all: {errs})"


def rounding_model(q, k, v, lf, do, sm_scale=None):
    """o, dq, dk, dv, d log f as the kernels round them, in PyTorch on dense (T x T) tiles: scores, softmax and dP in
    fp32 from the 16-bit inputs; P rounded to q's dtype for P V and P^T dO, o stored in q's dtype and delta =
    rowsum(o * dO) formed from it; dS rounded to q's dtype for dS K and dS^T Q; d log f the reverse cumsum of dS's
    row sums less its column sums. Causal, no documents or padding; MHA (k, v with H heads)."""
    B, T, H, D = q.shape
    sm = D ** -0.5 if sm_scale is None else sm_scale
    lp = q.dtype
    qf, kf, vf, dof = (t.float() for t in (q, k, v, do))
    c = torch.cumsum(lf.double(), 1).float().transpose(1, 2)  # (B, H, T)
    s = torch.einsum("bihd,bjhd->bhij", qf, kf) * sm + c[..., :, None] - c[..., None, :]
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), -math.inf)
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    lsum = p.sum(-1, keepdim=True)
    o = (torch.einsum("bhij,bjhd->bihd", p.to(lp).float(), vf) / lsum.transpose(1, 2)).to(lp)
    p = torch.exp(s - (m + torch.log(lsum)))
    delta = (o.float() * dof).sum(-1).transpose(1, 2)[..., None]
    ds = p * (torch.einsum("bihd,bjhd->bhij", dof, vf) - delta)
    dq = (torch.einsum("bhij,bjhd->bihd", ds.to(lp).float(), kf) * sm).to(lp)
    dk = (torch.einsum("bhij,bihd->bjhd", ds.to(lp).float(), qf) * sm).to(lp)
    dv = torch.einsum("bhij,bihd->bjhd", p.to(lp).float(), dof).to(lp)
    dc = (ds.sum(-1) - ds.sum(-2)).double()
    dlf = dc.flip(-1).cumsum(-1).flip(-1).float().transpose(1, 2)
    return o, dq, dk, dv, dlf


def on(backend: str):
    """The options in force (``use_options`` blocks included) with ``backend`` set: ``"triton"`` for the kernels,
    ``"reference"`` for the PyTorch reference."""
    from forgetting_transformer.ops.forgetting_attention import default_options

    return default_options().replace(backend=backend)

