"""PaTH attention: the plain-PyTorch reference (ops/path/reference.py) against the definition written out with
explicit D x D matrices, its gradients, its reduction to FoX / softmax attention at beta = 0; the layer
(models/path.py) against a hand computation, against FoX's Attention at beta = 0, decoding with a cache against the
full forward; fla's kernel against the reference.

On a CPU fla's Triton kernel runs under the interpreter (tests/conftest.py sets TRITON_INTERPRET=1) at tiny sizes
in fp32; the ``gpu`` test runs it in bf16 at a training-like length.
"""

import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from forgetting_transformer.models import path as path_module
from forgetting_transformer.models.layers import Attention, LayerCache
from forgetting_transformer.models.path import PathAttention, PathCache
from forgetting_transformer.ops.path import path_attention_ref, path_transform_keys
from forgetting_transformer.ops.forgetting_attention.reference import forgetting_attention_ref

PRO = dict(qk_norm=True, output_gate=True, output_norm=True, kv_shift=True)


def layer_cfg(**overrides):
    """The model-config fields the attention layers read."""
    base = dict(d_model=16, fgate="data_dependent", fgate_init=None, qk_norm=False, output_gate=False,
                output_norm=False, kv_shift=False, norm_eps=1e-6, rope=False, rope_base=500000.0, acp=False,
                acp_eps=4.5e-5)
    base.update(overrides)
    return SimpleNamespace(**base)


def make_inputs(B, T, H, Hkv, D, gate=True, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=g, dtype=dtype)
    k = torch.randn(B, T, Hkv, D, generator=g, dtype=dtype)
    v = torch.randn(B, T, Hkv, D, generator=g, dtype=dtype)
    w = F.normalize(torch.randn(B, T, Hkv, D, generator=g, dtype=dtype), dim=-1)
    beta = 2 * torch.rand(B, T, Hkv, generator=g, dtype=dtype)
    log_f = F.logsigmoid(torch.randn(B, T, H, generator=g, dtype=dtype) + 2.0) if gate else None
    return q, k, v, w, beta, log_f


def path_by_matrices(q, k, v, w, beta, log_f=None):
    """The definition with explicit transforms: ``P = H_i H_{i-1} ... H_{j+1}`` as D x D matrices, the decay
    bias as a sum of log f over (j, i]."""
    B, T, H, D = q.shape
    G = H // k.shape[2]
    Hs = torch.eye(D, dtype=q.dtype) - beta[..., None, None] * w[..., :, None] * w[..., None, :]  # (B, T, Hkv, D, D)
    rows = []
    for i in range(T):
        P = torch.eye(D, dtype=q.dtype).expand(B, k.shape[2], D, D)
        scores = []
        for j in range(i, -1, -1):
            kj = torch.einsum("bhde,bhe->bhd", P, k[:, j]).repeat_interleave(G, dim=1)  # (B, H, D)
            s = (q[:, i] * kj).sum(-1) / math.sqrt(D)
            if log_f is not None:
                s = s + log_f[:, j + 1 : i + 1].sum(1)
            scores.append(s)
            P = P @ Hs[:, j]
        p = torch.softmax(torch.stack(scores[::-1], dim=-1), dim=-1)  # (B, H, i + 1)
        rows.append(torch.einsum("bhj,bjhd->bhd", p, v[:, : i + 1].repeat_interleave(G, dim=2)))
    return torch.stack(rows, dim=1)  # (B, T, H, D)


SHAPES = [  # B, T, H, Hkv, D
    (2, 9, 2, 2, 5),
    (1, 12, 4, 2, 8),  # GQA
    (1, 7, 3, 1, 4),  # MQA
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("gate", [True, False])
def test_reference_matches_explicit_matrix_products_output_and_all_gradients(shape, gate):
    inputs = [t.requires_grad_() for t in make_inputs(*shape, gate=gate) if t is not None]
    out = path_attention_ref(*inputs)
    expected = path_by_matrices(*inputs)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    do = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, inputs, do), torch.autograd.grad(expected, inputs, do)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("gate", [True, False])
def test_reference_gradcheck(gate):
    inputs = [t.requires_grad_() for t in make_inputs(1, 5, 2, 1, 4, gate=gate, seed=1) if t is not None]
    assert torch.autograd.gradcheck(path_attention_ref, inputs)


def test_transformed_keys_match_explicit_products():
    _, k, _, w, beta, _ = make_inputs(2, 8, 2, 2, 5)
    expected = []
    for j in range(k.shape[1]):
        kj = k[:, j]
        for s in range(j + 1, k.shape[1]):  # H_{j+1} first, H_{T-1} last
            kj = kj - beta[:, s, :, None] * (kj * w[:, s]).sum(-1, keepdim=True) * w[:, s]
        expected.append(kj)
    torch.testing.assert_close(path_transform_keys(k, w, beta), torch.stack(expected, dim=1))


@pytest.mark.parametrize("shape", SHAPES)
def test_beta_zero_is_forgetting_attention_and_softmax_attention(shape):
    q, k, v, w, beta, log_f = make_inputs(*shape)
    zero = torch.zeros_like(beta)
    torch.testing.assert_close(path_attention_ref(q, k, v, w, zero, log_f), forgetting_attention_ref(q, k, v, log_f))
    torch.testing.assert_close(path_attention_ref(q, k, v, w, zero),
                               forgetting_attention_ref(q, k, v, torch.zeros_like(log_f)))


def test_reference_left_padding_matches_the_unpadded_row():
    q, k, v, w, beta, log_f = make_inputs(2, 10, 2, 1, 4)
    out = path_attention_ref(q, k, v, w, beta, log_f, seq_start=torch.tensor([3, 0]))
    torch.testing.assert_close(out[0, 3:], path_attention_ref(*(t[:1, 3:] for t in (q, k, v, w, beta, log_f)))[0])
    torch.testing.assert_close(out[1], path_attention_ref(*(t[1:] for t in (q, k, v, w, beta, log_f)))[0])
    assert (out[0, :3] == 0).all()


# ---------------------------------------------------------------------------------------------------------------
# The layer.

def make_layer(seed=0, dtype=torch.float64, heads=(4, 2), head_dim=4, **overrides):
    torch.manual_seed(seed)
    layer = PathAttention(layer_cfg(**overrides), head_dim, *heads, w_rank=3)
    with torch.no_grad():  # away from the init's zero biases, so every term matters
        for p in layer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return layer.to(dtype)


def layer_by_hand(layer, x):
    """A PaTH-FoX layer (no Pro switches) written out: matmuls, the convolution tap by tap, the attention by
    explicit matrices."""
    B, T, _ = x.shape
    H, Hkv, D = layer.n_heads, layer.n_kv_heads, layer.head_dim
    q = (x @ layer.q_proj.weight.T).view(B, T, H, D)
    k = (x @ layer.k_proj.weight.T).view(B, T, Hkv, D)
    v = (x @ layer.v_proj.weight.T).view(B, T, Hkv, D)
    u = x @ layer.w_proj[0].weight.T @ layer.w_proj[1].weight.T  # (B, T, Hkv * D)
    taps = layer.w_conv.weight[:, 0, :]  # (Hkv * D, conv_size); the last tap multiplies the current token
    K = taps.shape[1]
    conv = sum(taps[:, K - 1 - s] * F.pad(u, (0, 0, s, 0))[:, :T] for s in range(K))  # u_{t-s} for tap K-1-s
    w = F.normalize(F.silu(conv).view(B, T, Hkv, D), dim=-1)
    beta = 2 * torch.sigmoid(x @ layer.b_proj.weight.T + layer.b_proj.bias)
    log_f = F.logsigmoid(x @ layer.fgate.proj.weight.T + layer.fgate.proj.bias)
    o = path_by_matrices(q, k, v, w, beta, log_f)
    return o.reshape(B, T, H * D) @ layer.o_proj.weight.T


def test_layer_matches_a_hand_computation():
    layer = make_layer(heads=(4, 2))
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    torch.testing.assert_close(layer(x), layer_by_hand(layer, x))


@pytest.mark.parametrize("switches", [dict(fgate="data_dependent", **PRO), dict(fgate="none", **PRO),
                                      dict(fgate="fixed", fgate_init=[2, 64]), dict(fgate="none")])
def test_layer_with_beta_zero_is_the_fox_attention_layer(switches):
    layer = make_layer(**switches)
    with torch.no_grad():
        layer.b_proj.weight.zero_()
        layer.b_proj.bias.fill_(-float("inf"))  # beta = 2 sigmoid(-inf) = 0: every H_t is the identity
    fox = Attention(layer_cfg(**switches), 4, 4, 2).to(torch.float64)
    missing, _ = fox.load_state_dict(layer.state_dict(), strict=False)
    assert not missing  # the switches' parameters have the same names in both layers
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    torch.testing.assert_close(layer(x), fox(x))


@pytest.mark.parametrize("switches", [dict(fgate="data_dependent", **PRO), dict(fgate="none")])
def test_layer_gradcheck_of_every_parameter(switches):
    # in float64 the forget gate and the Pro switches compute in float64 too, so finite differences resolve them
    layer = make_layer(heads=(2, 1), head_dim=2, d_model=8, **switches)
    names = [n for n, _ in layer.named_parameters()]
    x = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)

    def f(x, *values):
        return torch.func.functional_call(layer, dict(zip(names, values)), (x,))

    params = (p.detach().requires_grad_() for p in layer.parameters())
    assert torch.autograd.gradcheck(f, (x, *params), fast_mode=True)


@pytest.mark.parametrize("switches", [dict(fgate="data_dependent", **PRO), dict(fgate="none", **PRO),
                                      dict(fgate="none")])
@pytest.mark.parametrize("heads", [(4, 2), (2, 2)])
@pytest.mark.parametrize("seed", range(4))
def test_decoding_with_a_cache_matches_the_full_forward(switches, heads, seed):
    # Several weight draws: a float32 step inside a float64 layer shows up as ulp-sized differences between the
    # one-token and the full-sequence CPU loops, which a single draw can happen to miss.
    layer = make_layer(seed=seed, heads=heads, **switches)
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    full = layer(x)
    one_at_a_time = PathCache()
    steps = torch.cat([layer(x[:, t : t + 1], cache=one_at_a_time) for t in range(12)], dim=1)
    torch.testing.assert_close(steps, full)
    assert one_at_a_time.get_seq_length() == 12
    chunked = PathCache()  # prefill 5 in parallel, decode 4 in one call, then one at a time
    parts = [layer(x[:, :5], cache=chunked), layer(x[:, 5:9], cache=chunked)]
    parts += [layer(x[:, t : t + 1], cache=chunked) for t in range(9, 12)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full)


def test_a_float64_layer_computes_and_caches_in_float64():
    layer = make_layer(fgate="data_dependent", **PRO)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    cache = PathCache()
    layer(x[:, :4], cache=cache)
    inp = layer.project(x[:, 4:], cache=cache)
    assert all(t.dtype == torch.float64 for t in (*inp[:7], *inp.shift_state)), [t.dtype for t in inp[:7]]
    layer(x[:, 4:], cache=cache)
    stored = (cache.keys, cache.values, cache.log_fgate, cache.conv_state, *cache.shift_state)
    assert all(t.dtype == torch.float64 for t in stored), [t.dtype for t in stored]
    fox = Attention(layer_cfg(fgate="data_dependent", rope=True, **PRO), 4, 4, 2).to(torch.float64)
    fox_cache = LayerCache()
    fox(x[:, :4], cache=fox_cache)
    assert all(t.dtype == torch.float64 for t in fox.project(x[:, 4:], cache=fox_cache))


def test_both_layers_register_the_shared_submodules_under_one_set_of_names_in_one_order():
    # The names are checkpoint and export keys; the order is the order in which the model's init draws weights.
    cfg = layer_cfg(fgate="data_dependent", **PRO)
    path_names = [n for n, _ in PathAttention(cfg, 4, 4, 2, w_rank=3).named_children()]
    fox_names = [n for n, _ in Attention(cfg, 4, 4, 2).named_children()]
    assert fox_names == ["q_proj", "k_proj", "v_proj", "o_proj", "fgate", "k_shift", "v_shift", "q_norm", "k_norm",
                         "o_norm", "g_proj"]
    assert path_names == fox_names[:4] + ["w_proj", "w_conv", "b_proj"] + fox_names[4:]


def test_left_padding_matches_the_unpadded_row_in_forward_and_decoding():
    layer = make_layer(fgate="data_dependent", **PRO)
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    seq_start = torch.tensor([3, 0])
    full = layer(x, seq_start=seq_start)
    torch.testing.assert_close(full[0, 3:], layer(x[:1, 3:])[0])
    torch.testing.assert_close(full[1], layer(x[1:])[0])
    cache = PathCache()
    parts = [layer(x[:, :4], cache=cache, seq_start=seq_start)]
    parts += [layer(x[:, t : t + 1], cache=cache, seq_start=seq_start) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(parts, dim=1)[:, 3:], full[:, 3:])


def test_configuration_errors():
    with pytest.raises(ValueError, match="RoPE"):
        PathAttention(layer_cfg(rope=True), 4, 4, 4)
    with pytest.raises(ValueError, match="acp"):
        PathAttention(layer_cfg(acp=True), 4, 4, 4)
    with pytest.raises(ValueError, match="backend"):
        PathAttention(layer_cfg(), 4, 4, 4, backend="cuda")
    with pytest.raises(ValueError, match="w_rank"):
        PathAttention(layer_cfg(), 4, 4, 4, w_rank=0)


def test_triton_backend_without_a_gpu_or_the_interpreter_is_an_error(monkeypatch):
    monkeypatch.setattr(path_module, "interpreting", lambda: False)
    layer = PathAttention(layer_cfg(), 16, 1, 1, backend="triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        layer(torch.randn(1, 4, 16))


# ---------------------------------------------------------------------------------------------------------------
# fla's kernel (the Triton interpreter on a CPU).

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROOT = Path(__file__).resolve().parents[2]
# Relative L2 errors allowed against the reference in fp32 (output, gradients): the interpreter computes in NumPy
# fp32; on a GPU the kernel's fp32 dots may use TF32, and it casts w to fp16 for the inter-chunk products.
KERNEL_TOL = (1e-5, 1e-4) if DEVICE == "cpu" else (5e-3, 2e-2)


def rel_err(actual, expected):
    return ((actual.double() - expected.double()).norm() / expected.double().norm()).item()


KERNEL_WARNINGS = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's NumPy on masked lanes


@KERNEL_WARNINGS
@pytest.mark.parametrize("gate", [True, False])
def test_kernel_matches_reference_output_and_all_gradients(gate):
    pytest.importorskip("fla")
    # T = 40 spans two of the kernel's chunks on the interpreter; GQA
    inputs = [t.float().to(DEVICE).requires_grad_() for t in make_inputs(2, 40, 4, 2, 16, gate=gate) if t is not None]
    q, k, v, w, beta = inputs[:5]
    log_f = inputs[5] if gate else None
    g = None if log_f is None else log_f * 4.0  # fla scales the bias with the scores: g = log f * sqrt(D)
    o, _ = path_module._parallel_path_attn()(q, k, v, w, beta, g)
    expected = path_attention_ref(*inputs)
    assert rel_err(o, expected) < KERNEL_TOL[0]
    do = torch.randn_like(o)
    for name, got, want in zip("q k v w beta log_f".split(), torch.autograd.grad(o, inputs, do),
                               torch.autograd.grad(expected, inputs, do)):
        assert rel_err(got, want) < KERNEL_TOL[1], name


@KERNEL_WARNINGS
@pytest.mark.parametrize("switches", [dict(fgate="data_dependent", **PRO), dict(fgate="none")])
def test_layer_kernel_matches_reference_and_fills_the_cache(switches):
    pytest.importorskip("fla")
    layer = make_layer(dtype=torch.float32, heads=(4, 2), head_dim=16, **switches).to(DEVICE)
    x = torch.randn(2, 24, 16, device=DEVICE, requires_grad=True)
    results = {}
    for backend in ("triton", "reference"):
        layer.backend = backend
        layer.zero_grad()
        out = layer(x)
        grads = torch.autograd.grad(out, [x, *layer.parameters()], torch.ones_like(out))
        results[backend] = out, grads
    assert rel_err(results["triton"][0], results["reference"][0]) < KERNEL_TOL[0]
    names = ["x"] + [n for n, _ in layer.named_parameters()]
    for name, got, want in zip(names, results["triton"][1], results["reference"][1]):
        assert rel_err(got, want) < KERNEL_TOL[1], name
    layer.backend = "triton"  # the kernel's transformed keys as the prefill cache
    with torch.no_grad():
        cache = PathCache()
        parts = [layer(x[:, :20], cache=cache)] + [layer(x[:, t : t + 1], cache=cache) for t in range(20, 24)]
        assert rel_err(torch.cat(parts, dim=1), results["reference"][0]) < KERNEL_TOL[0]


@KERNEL_WARNINGS
def test_kernel_takes_left_padding_row_by_row_as_the_reference_masks_it():
    pytest.importorskip("fla")
    layer = make_layer(dtype=torch.float32, heads=(4, 2), head_dim=16, fgate="data_dependent", **PRO).to(DEVICE)
    x = torch.randn(3, 12, 16, device=DEVICE)
    seq_start = torch.tensor([5, 0, 12], device=DEVICE)  # padded, unpadded, all padding
    out = {}
    with torch.no_grad():
        for backend in ("triton", "reference"):
            layer.backend, cache = backend, PathCache()
            full = layer(x[:, :9], cache=cache, seq_start=seq_start)  # the parallel pass fills the cache
            out[backend] = torch.cat([full, layer(x[:, 9:], cache=cache, seq_start=seq_start)], dim=1)
    real = torch.arange(12, device=DEVICE)[None, :] >= seq_start[:, None]  # (B, T): pad outputs are 0 in both
    assert rel_err(out["triton"][real], out["reference"][real]) < KERNEL_TOL[0]
    assert not out["triton"][2].any()


COMPILED_FIRST_CALL = """
import sys, torch
from tests.models.test_path import DEVICE, PRO, make_layer, rel_err
layer = make_layer(dtype=torch.float32, heads=(4, 2), head_dim=16, fgate="data_dependent", **PRO).to(DEVICE)
layer.backend = "triton"
x = torch.randn(2, 24, 16, device=DEVICE)
out = torch.compile(layer, backend="eager")(x)
layer.backend = "reference"
print("rel_err", rel_err(out, layer(x)))
"""


def test_the_kernel_runs_under_torch_compile_when_its_first_call_is_compiled():
    """fla is imported on the first kernel call. In a fresh process (fla not imported yet), as in ``train.py`` with
    ``strategy.compile=true``, that first call happens inside a compiled graph, where Dynamo cannot trace the
    import; it must run and give the reference's output."""
    pytest.importorskip("fla")
    env = {**os.environ, "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1" if DEVICE == "cpu" else "0")}
    res = subprocess.run([sys.executable, "-W", "ignore", "-c", COMPILED_FIRST_CALL], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert float(res.stdout.split("rel_err")[-1]) < KERNEL_TOL[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_bf16_kernel_layer_and_decoding_match_fp32_reference():
    torch.manual_seed(0)
    layer = PathAttention(layer_cfg(d_model=512, **PRO), 64, 8, 4).cuda()
    with torch.no_grad():  # the decoder's N(0, 0.02) weights
        for lin in (layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj, layer.g_proj, *layer.w_proj):
            lin.weight.normal_(0.0, 0.02)
    x = torch.randn(2, 1000, 512, device="cuda", requires_grad=True)
    results = {}
    for backend, dtype in (("triton", torch.bfloat16), ("reference", torch.float32)):
        layer.backend = backend
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            out = layer(x)
        results[backend] = out, torch.autograd.grad(out.float().square().sum(), [x, *layer.parameters()])
    expected = results["reference"][0]
    assert rel_err(results["triton"][0], expected) < 2e-2
    names = ["x"] + [n for n, _ in layer.named_parameters()]
    for name, got, want in zip(names, results["triton"][1], results["reference"][1]):
        assert rel_err(got, want) < 5e-2, name
    layer.backend = "triton"  # bf16 decoding: the kernel's prefill cache, then FoX's op over the cache
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        cache = PathCache()
        parts = [layer(x[:, :990], cache=cache)] + [layer(x[:, t : t + 1], cache=cache) for t in range(990, 1000)]
    assert rel_err(torch.cat(parts, dim=1)[:, 990:], expected[:, 990:]) < 2e-2
