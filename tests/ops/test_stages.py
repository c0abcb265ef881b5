"""``forgetting_transformer.ops.forgetting_attention.stages`` (the kernel tools' way into the op) under the CPU
interpreter: each stage computes what the op computes, chained as the op chains them, and its contexts restore what
they change."""

import importlib
import os

import pytest
import torch
import torch.nn.functional as F

from accuracy import on
from forgetting_transformer.ops.forgetting_attention import autograd as AG
from forgetting_transformer.ops.forgetting_attention import TileConfig, default_options, forgetting_attention
from forgetting_transformer.ops.forgetting_attention import stages as L

if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU interpreter tests", allow_module_level=True)




def inputs(B=2, T=40, H=2, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=g) for _ in range(3))
    lf = F.logsigmoid(torch.randn(B, T, H, generator=g) + 2.0)
    return q, k, v, lf


@pytest.mark.parametrize("acp", [False, True])
def test_stages_chain_to_the_ops_outputs_and_gradients(acp):
    """forward, then backward_dq, backward_dkdv and dlogf (and ``backward`` in one call) give the op's output and
    its four gradients, dense and with ACP's tables."""
    q, k, v, lf = inputs()
    if acp:
        lf[..., 0] = -1.5  # a local head
    T = q.shape[1]
    kw = dict(adaptive_threshold="auto") if acp else {}
    xs = [t.clone().requires_grad_() for t in (q, k, v, lf)]
    o_ref = forgetting_attention(*xs, options=on("triton"), **kw)
    do = torch.randn_like(o_ref)
    grads_ref = torch.autograd.grad(o_ref, xs, do)

    tables = L.acp_tables(q, k, lf)[:2] if acp else None
    o, lse = L.forward(q, k, v, lf, acp=tables)
    torch.testing.assert_close(o, o_ref.detach(), rtol=0, atol=0)
    pk, pq = L.block_prefix(lf, T)
    dq, drow, delta = L.backward_dq(do, q, k, v, lf, pk, o, lse, acp=tables)
    dk, dv, dcol = L.backward_dkdv(do, q, k, v, lf, pq, lse, delta, acp=tables)
    for got, want in zip((dq, dk, dv, L.dlogf(drow, dcol)), grads_ref):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    for got, want in zip(L.backward(do, q, k, v, lf, o, lse, acp=tables), grads_ref):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_acp_tables_and_grid():
    """The tables are the op's (lo, hi, delta) on ACP's grid; the threshold kinds the op accepts pass through."""
    q, k, v, lf = inputs(T=64)
    lo, hi, delta = L.acp_tables(q, k, lf, threshold=-3.0)
    GM, GN = L.acp_grid(q.shape[-1])
    assert lo.shape == (2 * 2, -(-64 // GM)) and hi.shape == (2 * 2, -(-64 // GN))
    assert torch.equal(delta, torch.full((2, 2), -3.0))
    want = AG.acp_tables_for(q, k, lf, 16 ** -0.5, -3.0, L.DEFAULT_EPS, None, default_options())
    assert all(torch.equal(a, b) for a, b in zip((lo, hi, delta), want))


def test_triton_config_context_restores_the_forced_configs():
    before = default_options()
    with L.triton_config("dq", 64, 32, 4, 2):
        assert default_options().triton_config("dq") == TileConfig(64, 32, 4, 2)
        with L.triton_config("fwd", 32, 32, 4, 3):
            assert default_options().triton_config("fwd") == TileConfig(32, 32, 4, 3)
            assert default_options().triton_config("dq") == TileConfig(64, 32, 4, 2)
        assert default_options().triton_config("fwd") is None
    assert default_options() is before
    with pytest.raises(ValueError, match="kind must be"):
        with L.triton_config("fused", 64, 64, 4, 2):
            pass


def test_kernel_names_and_choices():
    assert L.jit_kernel("_attn_fwd_kernel") is importlib.import_module(
        "forgetting_transformer.ops.forgetting_attention.triton.kernels")._attn_fwd_kernel
    with pytest.raises(ValueError, match="no kernel 'nope'"):
        L.jit_kernel("nope")
    with pytest.raises(ValueError, match="kernel must be one of"):
        L.forward(*inputs(), kernel="cuda")
    assert set(L.GLUON_CONFIGS) == set(L.GLUON_KERNELS) == {"fwd", "dq", "dkdv", "fused"}
    assert not L.gluon_runs("fwd", *inputs()[:3])  # no Hopper GPU here
    assert L.gluon_maxnreg(8) == 168 and L.gluon_maxnreg(12) == 128


def test_host_stages_time_the_stages_and_restore_them():
    """Inside the context every host-side stage and kernel launch of a call adds its time; after it the op's
    functions and the launch function are the originals again."""
    from forgetting_transformer.ops import launch_cache

    stages = [(importlib.import_module(f"forgetting_transformer.ops.forgetting_attention.{m}"), name)
              for m, _, name in (s.rpartition(".") for s in L.HOST_STAGES)]
    saved = [getattr(module, name) for module, name in stages]
    launch = launch_cache.launch
    q, k, v, lf = (t.requires_grad_() for t in inputs())
    with L.host_stages() as acc:
        forgetting_attention(q, k, v, lf, options=on("triton"), adaptive_threshold="auto").sum().backward()
    for name in ("forgetting_attention_triton", "check_inputs", "acp_tables_for", "acp_launch", "fwd_impl",
                 "block_prefix", "bwd_impl", "bwd", "bwd_dlogf"):
        assert acc.get(name, 0) > 0, (name, sorted(acc))
    for kernel in ("_attn_fwd_kernel", "_acp_tables_kernel", "_dlogf_kernel"):
        assert acc.get(f"launch {kernel}", 0) > 0, (kernel, sorted(acc))
    assert [getattr(module, name) for module, name in stages] == saved
    assert launch_cache.launch is launch
