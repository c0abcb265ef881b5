"""The fla baselines (models/baselines.py): the model contract, the two mixers we wire ourselves (Mamba-2's scan,
sliding-window attention) against independent computations, config errors, and a train.py run.

On a CPU, fla's Triton kernels run under the interpreter (tests/conftest.py sets TRITON_INTERPRET=1), at tiny
sizes and fp32; on a GPU machine the same tests run on CUDA, plus the ``gpu`` tests (bf16, the chunked kernels,
longer sequences), through scripts/gpu_baselines.sh.
"""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from forgetting_transformer.config import ConfigError, register_configs, validate
from forgetting_transformer.models import baselines, build_model
from forgetting_transformer.models.fla_import import import_fla
from forgetting_transformer.training.run import config_error_line

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Relative L2 error allowed between two fp32 computations of the same thing: exact-ish on the CPU (the
# interpreter computes in NumPy fp32); on a GPU, Triton's fp32 dots use TF32 (10-bit mantissa).
REL_TOL = 1e-5 if DEVICE == "cpu" else 1e-2
V, T = 128, 32
# Tiny and cheap under the interpreter: its cost grows with heads x batch x tokens.
TINY = ["model.n_layers=2", "model.d_model=64", "model.head_dim=32", "model.linear_head_dim=32",
        "model.window_size=12", "model.state_size=16", f"data.prepare.vocab_size={V}"]
BASELINES = {"mamba2": ["model.n_layers=1"], "deltanet": [], "hgrn2": [], "samba": [], "transformer_swa": []}
register_configs()


def assert_rel_close(actual, expected, tol):
    rel = ((actual.double() - expected.double()).norm() / expected.double().norm()).item()
    assert rel < tol, f"relative error {rel:.2e} > {tol:.0e}"


def config(name, *overrides):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={name}", *TINY, *BASELINES.get(name, []), *overrides])
    validate(cfg)
    return cfg


@pytest.mark.parametrize("name", list(BASELINES))
def test_model_contract(name, tmp_path):
    """Build, shapes, a finite fp32 per-token loss, every parameter trained, a repeated batch fitted, a state_dict
    round trip, causality."""
    cfg = config(name)
    torch.manual_seed(0)
    model = build_model(cfg.model).to(DEVICE)
    assert isinstance(model.blocks, nn.ModuleList) and len(model.blocks) == 2  # mamba2: 2 blocks per layer
    assert model.lm_head.weight.data_ptr() != model.embed.weight.data_ptr()  # untied
    x = torch.randint(0, V, (1, T), device=DEVICE)
    labels = x.roll(-1, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(2):
        loss = model(x, labels)
        assert loss.shape == (1, T) and loss.dtype == torch.float32 and torch.isfinite(loss).all()
        loss.mean().backward()
        if step == 0:
            for n, p in model.named_parameters():
                assert p.grad is not None and p.grad.abs().sum() > 0, f"{n} gets no gradient"
        opt.step()
        opt.zero_grad()
        losses.append(loss.mean().item())

    # Round trip: a fresh model (other seed) loads the trained weights bit for bit, and it is the loaded model
    # that must show the fitted loss (a fresh init sits at ~log V) and causality.
    torch.save(model.state_dict(), tmp_path / "model.pt")
    torch.manual_seed(1)
    model = build_model(cfg.model).to(DEVICE)
    model.load_state_dict(torch.load(tmp_path / "model.pt"))
    saved = torch.load(tmp_path / "model.pt")
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())

    t = T // 2
    changed = x.clone()
    changed[:, t:] = (changed[:, t:] + 1) % V
    with torch.no_grad():
        logits = model(torch.cat([x, changed]))
    assert logits.shape == (2, T, V)
    fitted = F.cross_entropy(logits[0].float(), labels[0]).item()
    assert fitted < losses[0] - 0.1, (losses, fitted)  # it fits the repeated batch
    torch.testing.assert_close(logits[1, :t], logits[0, :t])  # tokens >= t do not change earlier logits
    assert (logits[1, t:] - logits[0, t:]).abs().max() > 1e-3  # ... but do change their own


@pytest.mark.parametrize("name", list(BASELINES))
def test_reset_parameters_covers_everything_deterministically(name):
    cfg = config(name)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            t.fill_(float("nan"))
    torch.manual_seed(3)
    model.reset_parameters()
    first = {k: v.clone() for k, v in model.state_dict().items()}
    assert all(torch.isfinite(v).all() for v in first.values()), "reset_parameters missed a tensor"
    torch.manual_seed(3)
    model.reset_parameters()
    assert all(torch.equal(first[k], v) for k, v in model.state_dict().items())
    # Meta-device init (training/parallel.py): to_empty, then reset_parameters, gives the same weights.
    with torch.device("meta"):
        meta = build_model(cfg.model)
    meta.to_empty(device="cpu")
    torch.manual_seed(3)
    meta.reset_parameters()
    assert all(torch.equal(first[k], v) for k, v in meta.state_dict().items())
    w = model.lm_head.weight
    assert abs(w.std().item() - 0.02) < 0.002 and (model.norm.weight == 1).all()


def test_mamba2_scan_matches_flas_naive_ssd():
    """Our Mamba-2 forward (fla's GLA kernels) against fla's own PyTorch SSD on the same layer (fla runs that naive
    path whenever mamba_ssm is not installed)."""
    fla_layers = import_fla()["layers"]
    torch.manual_seed(0)
    layer = baselines._mamba2_ssd_class()(hidden_size=32, head_dim=16, state_size=16, expand=2, n_groups=1,
                                          conv_kernel=4, chunk_size=16).to(DEVICE)
    with torch.no_grad():
        layer.A_log.uniform_(-1, 1)  # decays from fast to slow, so the gate's sign and scale matter
    h = torch.randn(2, 40, 32, device=DEVICE)
    with torch.no_grad():
        assert_rel_close(layer(h), fla_layers.Mamba2.forward(layer, h)[0], REL_TOL)


def test_mamba2_gla_kernel_computes_the_simple_gla_scan():
    """model.ssd_kernel=gla (fla's GLA kernels, the scalar decay repeated over the state) is the same recurrence as
    simple_gla: output and every parameter gradient agree (here through fla's recurrent kernels)."""
    torch.manual_seed(0)
    kw = dict(hidden_size=32, head_dim=16, state_size=16, expand=2, n_groups=1, conv_kernel=4, chunk_size=16)
    ssd = baselines._mamba2_ssd_class()
    a, b = ssd(**kw, ssd_kernel="simple_gla").to(DEVICE), ssd(**kw, ssd_kernel="gla").to(DEVICE)
    with torch.no_grad():
        a.A_log.uniform_(-1, 1)  # decays from fast to slow, so the gate's sign and scale matter
    b.load_state_dict(a.state_dict())
    h = torch.randn(2, 40, 32, device=DEVICE)
    ya, yb = a(h), b(h)
    assert_rel_close(yb, ya, REL_TOL)
    ya.square().sum().backward()
    yb.square().sum().backward()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert_rel_close(pb.grad, pa.grad, REL_TOL)
    cfg = config("mamba2", "model.ssd_kernel=gla")
    assert all(blk.mixer.ssd_kernel == "gla" for blk in build_model(cfg.model).blocks)


def test_sliding_window_attention_matches_masked_sdpa():
    cfg = config("transformer_swa", "model.window_size=8", "model.head_dim=16")
    torch.manual_seed(0)
    attn = baselines.SlidingWindowAttention(cfg.model, import_fla()["parallel_attn"]).to(DEVICE)
    x = torch.randn(2, 40, 64, device=DEVICE)
    with torch.no_grad():
        ours = attn(x)
        q, k, v = (p(x).view(2, 40, 4, 16) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        pos = torch.arange(40, device=DEVICE)
        q, k = baselines.apply_rotary(q, pos, cfg.model.rope_base), baselines.apply_rotary(k, pos, cfg.model.rope_base)
        i, j = pos[:, None], pos[None, :]
        band = (j <= i) & (i - j < 8)  # each query sees itself and the 7 keys before it
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=band)
        reference = attn.o_proj(o.transpose(1, 2).reshape(2, 40, 64))
    assert_rel_close(ours, reference, REL_TOL)


def test_token_id_out_of_range_names_the_key():
    model = build_model(config("transformer_swa").model)
    with pytest.raises(ValueError, match=rf"model.vocab_size={V}"):
        model(torch.tensor([[1, V]]))


def test_cpu_without_the_interpreter_says_how_to_run(monkeypatch):
    model = build_model(config("hgrn2").model)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        model(torch.tensor([[1, 2]]))


@pytest.mark.parametrize("name,override,key", [
    ("deltanet", "model.linear_head_dim=48", "model.linear_head_dim=48"),
    ("mamba2", "model.head_dim=48", "model.head_dim=48"),
    ("mamba2", "model.n_heads=2", "model.n_heads=2"),
    ("mamba2", "model.rope=true", "model.rope=True"),
    ("transformer_swa", "model.window_size=0", "model.window_size=0"),
    ("samba", "model.n_kv_heads=1", "model.n_kv_heads=1"),
    ("samba", "model.conv_size=1", "model.conv_size=1"),
    ("samba", "model.mamba_mlp_hidden_ratio=0", "model.mamba_mlp_hidden_ratio=0"),
])
def test_bad_values_name_the_key(name, override, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        config(name, override)


@pytest.mark.parametrize("name,override,line", [
    ("hgrn2", "model.kv_shift=true", "invalid config: model.kv_shift: no such key in FlaConfig"),
    ("mamba2", "model.fgate=data_dependent", "invalid config: model.fgate: no such key in FlaConfig"),
    ("mamba2", "model.ssd_kernel=chunked",
     "invalid config: model.ssd_kernel='chunked': must be one of auto | simple_gla | gla"),
])
def test_decoder_keys_and_values_outside_the_schema_are_refused_by_hydra(name, override, line):
    with pytest.raises(ConfigCompositionException) as e:
        config(name, override)
    assert config_error_line(e.value).startswith(line)  # an unknown key's line goes on with the schema's keys


def test_models_import_without_fla_and_building_one_says_how_to_install():
    code = ("import sys; sys.modules['fla'] = None\n"  # an import of fla now fails, as if not installed
            "import forgetting_transformer.models as m\n"
            "from forgetting_transformer.config import FlaConfig\n"
            "try:\n"
            "    m.build_model(FlaConfig(name='x', arch='fla_hgrn2', vocab_size=8, n_layers=1, d_model=64, "
            "linear_head_dim=64))\n"
            "except ImportError as e:\n"
            "    print('IMPORT_ERROR', e)\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "IMPORT_ERROR" in res.stdout and "pip install flash-linear-attention==0.6.0 fla-core==0.6.0" in res.stdout


def test_building_a_baseline_keeps_our_hf_auto_classes():
    # fla's import registers its own "forgetting_transformer" model type with transformers; ours must stay.
    code = ("import forgetting_transformer.hf as hf\n"
            "from transformers import AutoConfig\n"
            "from forgetting_transformer.config import FlaConfig\n"
            "from forgetting_transformer.models import build_model\n"
            "build_model(FlaConfig(name='x', arch='fla_hgrn2', vocab_size=8, n_layers=1, d_model=64, "
            "linear_head_dim=64))\n"
            "import fla.models\n"  # fla's registration has run
            "print('OURS', type(AutoConfig.for_model(hf.MODEL_TYPE)) is hf.FoXConfig)\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "OURS True" in res.stdout


def test_train_py_runs_a_baseline(markov_data_dir, tmp_path):
    """train.py end to end with the sliding-window Transformer: steps, checkpoint, held-out and per-token loss."""
    import json

    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "train.py"), "model=transformer_swa", f"output_dir={out}", "data=longcrawl64",
           f"data.data_dir={markov_data_dir}", "data.seq_len=64", "data.vocab_size=64", "data.bos_id=0",
           "model.n_layers=2", "model.d_model=64", "model.head_dim=32", "model.window_size=16",
           "train.batch_size=2", "train.micro_batch_size=2", "train.max_steps=3", "train.log_every=1",
           "train.checkpoint_every=3", "optim.lr=3e-3", "schedule.warmup_tokens=0", "schedule.total_tokens=384",
           "eval.heldout_batches=1", "eval.per_token_rows=2", "eval.per_token_len=64", "eval.window=11",
           f"strategy.device={DEVICE}"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    assert 0 < rows[-1]["heldout_loss"] < 10
    assert (out / "checkpoints" / "step_00000003").is_dir()
    assert len(json.loads((out / "per_token_loss.json").read_text())["loss"]) == 64


# ---------------------------------------------------------------------------------------------------------------
# GPU: bf16, the chunked kernels that training uses, longer sequences (scripts/gpu_baselines.sh).

def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(test))


@gpu
@pytest.mark.parametrize("name", ["deltanet", "hgrn2"])
def test_gpu_chunked_kernels_match_the_recurrent_ones(name):
    torch.manual_seed(0)
    model = build_model(config(name, "model.d_model=256", "model.linear_head_dim=128").model).cuda()
    x = torch.randint(0, V, (2, 700), device="cuda")
    # bf16 as in training: fla's chunked delta rule refuses fp32 inputs
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        chunked = model(x).float()
        for block in model.blocks:
            assert block.mixer.mode == "chunk"
            block.mixer.mode = "fused_recurrent"
        recurrent = model(x).float()
    assert_rel_close(chunked, recurrent, 2e-2)  # bf16 logits


def markov_batch(batch, seq_len, device, seed=0):
    """Tokens from a first-order Markov chain with 3 successors per token: learnable within a few steps (the
    achievable loss is ~log 3, against log V at init), unlike uniform random tokens."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, V, (V, 3), generator=g)
    x = torch.empty(batch, seq_len, dtype=torch.long)
    x[:, 0] = torch.randint(0, V, (batch,), generator=g)
    choice = torch.randint(0, 3, (batch, seq_len), generator=g)
    for t in range(1, seq_len):
        x[:, t] = successors[x[:, t - 1], choice[:, t]]
    return x.to(device)


def bf16_training_losses(name, seq_len, steps=10, device="cuda"):
    torch.manual_seed(0)
    model = build_model(config(name, "model.d_model=256", "model.head_dim=64", "model.linear_head_dim=128",
                              "model.window_size=256").model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    x = markov_batch(2, seq_len + 1, device)
    losses = []
    for _ in range(steps):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(x[:, :-1], x[:, 1:]).mean()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@gpu
@pytest.mark.parametrize("name", list(BASELINES))
def test_gpu_bf16_training_fits_a_batch(name):
    # Samba's Mamba layers run fla's sequential PyTorch scan without mamba_ssm: a shorter sequence.
    losses = bf16_training_losses(name, 512 if name == "samba" else 2048)
    print(name, [round(v, 3) for v in losses])
    # A model that learns nothing stays at ~log V = 4.85; the chain allows ~log 3. (A CPU run of transformer_swa at
    # 256 tokens: 4.91 -> 4.09, with one spike on the way, hence the best of the last three.)
    assert all(math.isfinite(v) for v in losses) and min(losses[-3:]) < losses[0] - 0.3, losses


def bf16(fn, *args):
    """``fn(*args)`` under bf16 autocast, as in training (bf16 inputs select fla's chunked kernels), as fp32."""
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        return fn(*args).float()


@gpu
def test_gpu_mamba2_chunked_scan_matches_flas_naive_ssd_at_length():
    """bf16 (chunked kernels) against fla's naive SSD in fp32, at 1,000 tokens."""
    fla_layers = import_fla()["layers"]
    torch.manual_seed(0)
    layer = baselines._mamba2_ssd_class()(hidden_size=256, head_dim=64, state_size=128, expand=2, n_groups=1,
                                          conv_kernel=4, chunk_size=128).cuda()
    h = torch.randn(1, 1000, 256, device="cuda")
    with torch.no_grad():
        assert_rel_close(bf16(layer, h), fla_layers.Mamba2.forward(layer, h)[0], 2e-2)


@gpu
def test_gpu_mamba2_gla_kernel_matches_simple_gla_forward():
    """The chunked GLA route ("auto" on Hopper) against chunk_simple_gla, forward only: simple_gla's backward is
    the part that is broken on Hopper (docs/baselines.md)."""
    fla_layers = import_fla()["layers"]
    torch.manual_seed(0)
    layer = baselines._mamba2_ssd_class()(hidden_size=256, head_dim=64, state_size=128, expand=2, n_groups=1,
                                          conv_kernel=4, chunk_size=128, ssd_kernel="gla").cuda()
    h = torch.randn(1, 2048, 256, device="cuda")
    y_gla = bf16(layer, h)  # bf16: the chunked kernels
    layer.ssd_kernel = "simple_gla"
    assert_rel_close(y_gla, bf16(layer, h), 2e-2)
    with torch.no_grad():
        assert_rel_close(y_gla, fla_layers.Mamba2.forward(layer, h)[0], 2e-2)


@gpu
def test_gpu_sliding_window_attention_bf16_matches_sdpa():
    cfg = config("transformer_swa", "model.d_model=512", "model.head_dim=128", "model.window_size=256")
    torch.manual_seed(0)
    attn = baselines.SlidingWindowAttention(cfg.model, import_fla()["parallel_attn"]).cuda()
    x = torch.randn(2, 2048, 512, device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        ours = attn(x).float()
        q, k, v = (p(x).view(2, 2048, 4, 128) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        pos = torch.arange(2048, device="cuda")
        q, k = baselines.apply_rotary(q, pos, 5e5), baselines.apply_rotary(k, pos, 5e5)
        i, j = pos[:, None], pos[None, :]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=(j <= i) & (i - j < 256))
        reference = attn.o_proj(o.transpose(1, 2).reshape(2, 2048, 512)).float()
    assert_rel_close(ours, reference, 2e-2)  # bf16 inputs and outputs


def test_generation_based_evals_refuse_baselines_clearly():
    from eval.common import to_hf

    with pytest.raises(NotImplementedError, match="model.arch=fla_deltanet .* has no decoding cache"):
        to_hf(None, config("deltanet"))
