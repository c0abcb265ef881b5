import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from forgetting_transformer.config import DecoderConfig
from forgetting_transformer.models import MODEL_REGISTRY, build_model
from forgetting_transformer.models.decoder import chunked_cross_entropy
from forgetting_transformer.models.layers import KVShift, apply_rotary, decay_bias_init, mlp_hidden_size

PRO = dict(qk_norm=True, output_gate=True, output_norm=True, kv_shift=True)


def tiny_cfg(**overrides):
    base = dict(name="t", arch="decoder", vocab_size=97, n_layers=2, d_model=32, head_dim=8)
    base.update(overrides)
    return OmegaConf.structured(DecoderConfig(**base))


VARIANTS = [{}, PRO, dict(qk_norm=True), dict(kv_shift=True), dict(n_kv_heads=2), dict(fgate="none", rope=True),
            dict(fgate="none", rope=True, n_kv_heads=1, **PRO), dict(rope=True, **PRO),
            dict(fgate="data_independent", fgate_init=[2, 64]), dict(fgate="fixed", fgate_init=[2, 64])]


@pytest.mark.parametrize("switches", VARIANTS)
def test_shapes_loss_and_every_parameter_gets_a_gradient(switches):
    torch.manual_seed(0)
    model = build_model(tiny_cfg(**switches))
    x = torch.randint(0, 97, (3, 21))
    logits = model(x)
    assert logits.shape == (3, 21, 97)
    loss = model(x, x)
    assert loss.shape == (3, 21) and loss.dtype == torch.float32
    torch.testing.assert_close(loss, F.cross_entropy(logits.transpose(1, 2), x, reduction="none"))
    loss.mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"{name} gets no gradient"


def test_initial_loss_is_near_uniform():
    model = build_model(tiny_cfg(**PRO))
    x = torch.randint(0, 97, (4, 64))
    assert abs(model(x, x).mean().item() - torch.log(torch.tensor(97.0)).item()) < 0.1


@pytest.mark.parametrize("switches", VARIANTS)
def test_causal(switches):
    torch.manual_seed(0)
    model = build_model(tiny_cfg(**switches))
    x = torch.randint(0, 97, (2, 30))
    y = x.clone()
    y[:, 20:] = torch.randint(0, 97, (2, 10))
    torch.testing.assert_close(model(x)[:, :20], model(y)[:, :20])
    assert not torch.allclose(model(x)[:, 20:], model(y)[:, 20:])


def test_init_is_normal_002_with_zero_biases():
    model = build_model(tiny_cfg(d_model=256, head_dim=64, n_layers=1, vocab_size=1000))
    w = model.blocks[0].mlp.w_up.weight
    assert abs(w.std().item() - 0.02) < 0.001 and abs(w.mean().item()) < 0.001
    assert (model.blocks[0].attn.fgate.proj.bias == 0).all()
    assert (model.norm.weight == 1).all()
    assert model.lm_head.weight.data_ptr() != model.embed.weight.data_ptr()  # untied


def test_pro_switches_add_exactly_their_parameters():
    names = {n for n, _ in build_model(tiny_cfg(**PRO)).named_parameters()}
    base = {n for n, _ in build_model(tiny_cfg()).named_parameters()}
    extra = {n.split(".", 3)[-1] for n in names - base}  # blocks.<i>.attn.<name>
    assert extra == {"k_shift.proj.weight", "v_shift.proj.weight", "q_norm.weight", "k_norm.weight",
                     "o_norm.weight", "g_proj.weight"}


def test_attention_layer_against_an_independent_computation():
    # FoX (LLaMA) layer written out by hand: sdpa with the decay bias as an explicit float mask.
    torch.manual_seed(0)
    model = build_model(tiny_cfg())
    layer = model.blocks[0].attn
    with torch.no_grad():
        layer.fgate.proj.bias.fill_(1.0)
    x = torch.randn(2, 11, 32)
    B, T, H, D = 2, 11, 4, 8
    q = layer.q_proj(x).view(B, T, H, D).transpose(1, 2)
    k = layer.k_proj(x).view(B, T, H, D).transpose(1, 2)
    v = layer.v_proj(x).view(B, T, H, D).transpose(1, 2)
    c = F.logsigmoid(layer.fgate.proj(x)).cumsum(1).transpose(1, 2)  # (B, H, T)
    bias = (c[..., :, None] - c[..., None, :]).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -torch.inf)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(B, T, H * D)
    torch.testing.assert_close(layer(x), layer.o_proj(o), rtol=1e-5, atol=1e-6)


def test_kv_shift_definition():
    torch.manual_seed(0)
    shift = KVShift(8, 2)
    h = torch.randn(1, 5, 8)
    x = torch.randn(1, 5, 2, 3)
    a = torch.sigmoid(shift.proj(h)).unsqueeze(-1)
    y = shift(h, x)
    torch.testing.assert_close(y[:, 0], (1 - a[:, 0]) * x[:, 0])  # nothing before the first token
    torch.testing.assert_close(y[:, 1:], a[:, 1:] * x[:, :-1] + (1 - a[:, 1:]) * x[:, 1:])


def test_mlp_hidden_size_rounds_up():
    assert mlp_hidden_size(256, 8 / 3, 64) == 704
    assert mlp_hidden_size(768, 8 / 3, 256) == 2048


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown model.arch='nope'"):
        build_model(OmegaConf.create({"arch": "nope"}))  # a config of no schema, as a run's config.yaml
    assert "decoder" in MODEL_REGISTRY


def test_token_id_out_of_vocab_is_a_clear_error():
    model = build_model(tiny_cfg())
    with pytest.raises(ValueError, match="token id 97 >= model.vocab_size=97"):
        model(torch.tensor([[1, 97]]))
    with pytest.raises(ValueError, match=r"token id -1 < 0: token ids must be in \[0, model.vocab_size=97\)"):
        model(torch.tensor([[1, -1]]))


def test_transformer_layer_is_rope_softmax_attention():
    torch.manual_seed(0)
    layer = build_model(tiny_cfg(fgate="none", rope=True, rope_base=100.0)).blocks[0].attn
    x = torch.randn(2, 9, 32)
    B, T, H, D = 2, 9, 4, 8
    pos = torch.arange(T)
    q = apply_rotary(layer.q_proj(x).view(B, T, H, D), pos, 100.0).transpose(1, 2)
    k = apply_rotary(layer.k_proj(x).view(B, T, H, D), pos, 100.0).transpose(1, 2)
    v = layer.v_proj(x).view(B, T, H, D).transpose(1, 2)
    w = torch.softmax((q @ k.transpose(-1, -2) / D**0.5).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(),
                                                                      -torch.inf), -1)
    o = (w @ v).transpose(1, 2).reshape(B, T, H * D)
    torch.testing.assert_close(layer(x), layer.o_proj(o), rtol=1e-5, atol=1e-6)
    assert layer.fgate is None


def test_rotary_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(i, j):
        return (apply_rotary(q, torch.tensor([i]), 10000.0) * apply_rotary(k, torch.tensor([j]), 10000.0)).sum()

    torch.testing.assert_close(score(5, 2), score(103, 100))
    assert not torch.allclose(score(5, 2), score(5, 3))
    torch.testing.assert_close(apply_rotary(q, torch.tensor([0]), 10000.0), q)  # position 0: identity
    torch.testing.assert_close(apply_rotary(q, torch.tensor([7]), 10.0).norm(), q.norm())  # a rotation


def test_decay_bias_init_gives_geometric_time_constants_and_alibi():
    b = decay_bias_init(4, 2.0, 256.0)
    t = -1.0 / F.logsigmoid(b)  # time constants
    torch.testing.assert_close(t, 2.0 * 128.0 ** (torch.arange(4, dtype=torch.float64) / 3))  # 2 ... 256
    # Fixed gates = ALiBi: the bias c_i - c_j equals -(i - j) / T_h.
    model = build_model(tiny_cfg(fgate="fixed", fgate_init=[2, 256]))
    gate = model.blocks[0].attn.fgate
    assert not any("fgate" in n for n, _ in model.named_parameters())  # frozen: a buffer, not a parameter
    log_f = gate(torch.randn(1, 5, 32))  # (1, 5, H)
    slopes = 1.0 / (2.0 * 128.0 ** (torch.arange(4) / 3))
    torch.testing.assert_close(log_f[0, 0].double(), -slopes.double(), rtol=1e-6, atol=0)


def test_data_independent_gate_is_trained_and_input_independent():
    model = build_model(tiny_cfg(fgate="data_independent", fgate_init=[2, 64]))
    gate = model.blocks[0].attn.fgate
    a, b = gate(torch.randn(1, 3, 32)), gate(torch.randn(1, 3, 32))
    torch.testing.assert_close(a, b)
    assert gate.bias.requires_grad


@pytest.mark.parametrize("V", [50, 128, 129])  # the LM head is padded to a multiple of 128 inside
def test_chunked_cross_entropy_matches_the_full_computation(V):
    torch.manual_seed(0)
    h = torch.randn(2, 37, 16, requires_grad=True)
    w = torch.randn(V, 16, requires_grad=True)
    y = torch.randint(0, V, (2, 37))
    full = F.cross_entropy((h @ w.T).transpose(1, 2), y, reduction="none")
    chunked = chunked_cross_entropy(h, w, y, chunk=8)
    torch.testing.assert_close(chunked, full)
    g_full = torch.autograd.grad(full.sum(), (h, w))
    g_chunk = torch.autograd.grad(chunked_cross_entropy(h, w, y, chunk=8).sum(), (h, w))
    for a, b in zip(g_chunk, g_full):
        torch.testing.assert_close(a, b)


def test_model_loss_is_the_same_with_any_loss_chunk():
    torch.manual_seed(0)
    model = build_model(tiny_cfg(loss_chunk=4096))
    x = torch.randint(0, 97, (2, 30))
    ref = model(x, x)
    model.cfg.loss_chunk = 7
    torch.testing.assert_close(model(x, x), ref)


def test_acp_switch_prunes_through_the_op(monkeypatch):
    """model.acp=true: every layer calls the op with the 'auto' threshold, the model's eps and its QK-norm weights;
    with steep fixed gates it prunes (the CPU reference masks the kernel's region) and stays within the eps bound
    of the dense model, and it trains."""
    import forgetting_transformer.models.layers as layers

    cfg = dict(fgate="fixed", fgate_init=[2, 4], qk_norm=True, acp_eps=1e-3)
    torch.manual_seed(0)
    dense = build_model(tiny_cfg(**cfg))
    acp = build_model(tiny_cfg(acp=True, **cfg))
    acp.load_state_dict(dense.state_dict())
    calls = []
    op = layers.forgetting_attention

    def spy(*args, **kwargs):
        out, stats = op(*args, **kwargs, return_stats=True)
        calls.append(dict(kwargs, pruned=int(stats["pruned"].sum())))
        return out

    monkeypatch.setattr(layers, "forgetting_attention", spy)
    x = torch.randint(0, 97, (2, 96))
    loss_acp = acp(x, x)
    assert len(calls) == 2 and all(c["adaptive_threshold"] == "auto" and c["acp_eps"] == 1e-3 for c in calls)
    assert all(c["qk_norm_weights"][0] is blk.attn.q_norm.weight for c, blk in zip(calls, acp.blocks))
    assert all(c["pruned"] > 0 for c in calls)
    torch.testing.assert_close(loss_acp, dense(x, x), rtol=5e-3, atol=0)
    loss_acp.mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in acp.parameters() if p.grad is not None)
