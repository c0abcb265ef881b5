"""eval.gates: the hook recomputation against the modules' own outputs, F against a direct product of gates, A
against an explicit softmax, ACP fractions against brute-force counts, the CLI on a trained run, re-plotting."""

import json
import math
import shutil

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from eval.common import load_run
from eval.gates import analysis, plot, run
from forgetting_transformer.config import DecoderConfig
from forgetting_transformer.models import build_model

PRO = dict(qk_norm=True, output_gate=True, output_norm=True, kv_shift=True)
VARIANTS = {
    "fox_llama": {},
    "fox_pro": PRO,
    "fox_pro_rope_gqa": dict(rope=True, n_kv_heads=2, **PRO),
    "fox_data_independent": dict(fgate="data_independent", fgate_init=[2, 64]),
    "transformer_pro": dict(fgate="none", rope=True, **PRO),
}


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    base = dict(name="t", arch="decoder", vocab_size=97, n_layers=3, d_model=32, head_dim=8)
    model = build_model(OmegaConf.structured(DecoderConfig(**{**base, **overrides}))).eval()
    with torch.no_grad():
        for block in model.blocks:  # non-trivial weights: random norm gains and gate biases, so no term is a no-op
            attn = block.attn
            for norm in (attn.q_norm, attn.k_norm, attn.o_norm):
                if norm is not None:
                    norm.weight.uniform_(0.5, 2.0)
            for name, p in attn.named_parameters():
                if p.dim() == 2 and not name.startswith("fgate"):
                    p.mul_(5.0)  # larger scores than init_std gives, so the softmax is far from uniform
            if attn.fgate is not None and attn.fgate.kind == "data_dependent":
                attn.fgate.proj.bias.copy_(torch.linspace(-1.0, 4.0, attn.n_heads))  # local ... long-range heads
                attn.fgate.proj.weight.mul_(10.0)  # gates that vary with the token
    return model


def ids(T, seed=1):
    return torch.randint(0, 97, (1, T), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def direct_gates(attn, x):
    """f (T, H) float64 computed from the gate's parameters directly (not through ForgetGate.forward)."""
    if attn.fgate.kind == "data_dependent":
        return torch.sigmoid(x[0].double() @ attn.fgate.proj.weight.double().T + attn.fgate.proj.bias.double())
    return torch.sigmoid(attn.fgate.bias.double()).expand(x.shape[1], -1)


def direct_F(f_h):
    T = f_h.shape[0]
    F = torch.zeros(T, T, dtype=torch.float64)
    for i in range(T):
        for j in range(i + 1):
            F[i, j] = torch.prod(f_h[j + 1 : i + 1])  # empty product (j = i) = 1
    return F


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_recomputation_reproduces_each_attention_modules_output(variant):
    model = tiny_model(**VARIANTS[variant])
    captured = analysis.capture(model, ids(40), [0, 1, 2])
    assert sorted(captured) == [0, 1, 2]
    x_in = model.embed(ids(40))
    torch.testing.assert_close(captured[0][0], model.blocks[0].attn_norm(x_in))  # the hook saw the real input
    for layer, (x, out) in captured.items():
        attn = model.blocks[layer].attn
        q, k, v, log_f = analysis.project(attn, x)
        assert (log_f is None) == (variant == "transformer_pro")
        rebuilt = analysis.module_output(attn, x, analysis.heads_output(q, k, v, log_f))
        torch.testing.assert_close(rebuilt, out, rtol=1e-5, atol=1e-5)
        A = analysis.head_matrices(q, k, log_f, [0, 3], gates=False, attention=True)["A"]
        analysis.check_layer(attn, layer, x, out, q, k, v, log_f, [0, 3], A)  # also A @ v == the op's heads
    # the check fails loudly when the recomputed inputs are off (a scaled key or gate here)
    x, out = captured[1]
    q, k, v, log_f = analysis.project(model.blocks[1].attn, x)
    wrong = (q, 2 * k, v, log_f) if log_f is None else (q, k, v, log_f * 1.5)
    with pytest.raises(RuntimeError, match="no longer reproduces"):
        analysis.check_layer(model.blocks[1].attn, 1, x, out, *wrong, [0])
    A = analysis.head_matrices(q, k, log_f, [1], gates=False, attention=True)["A"]
    with pytest.raises(RuntimeError, match="head 0: A @ v"):  # A of head 1 passed as head 0's
        analysis.check_layer(model.blocks[1].attn, 1, x, out, q, k, v, log_f, [0], A)


@pytest.mark.parametrize("variant", ["fox_pro", "fox_data_independent"])
def test_F_is_the_product_of_the_gates(variant):
    model = tiny_model(**VARIANTS[variant])
    T = 24
    x, _ = analysis.capture(model, ids(T), [1])[1]
    attn = model.blocks[1].attn
    q, k, v, log_f = analysis.project(attn, x)
    f = direct_gates(attn, x)  # (T, H) float64
    mats = analysis.head_matrices(q, k, log_f, [0, 2, 3], gates=True, attention=False)
    assert set(mats) == {"F"} and mats["F"].dtype == torch.float64
    for i, h in enumerate([0, 2, 3]):
        ref = direct_F(f[:, h])
        torch.testing.assert_close(mats["F"][i], ref, rtol=2e-5, atol=1e-12)
        assert torch.all(mats["F"][i].triu(1) == 0) and torch.all(mats["F"][i].diagonal() == 1)
    assert mats["F"][0, -1, 0] < 1e-3 < mats["F"][2, -1, 0]  # heads differ: a local one and a longer-range one


@pytest.mark.parametrize("variant", ["fox_pro_rope_gqa", "transformer_pro"])
def test_A_is_the_explicit_softmax(variant):
    model = tiny_model(**VARIANTS[variant])
    T = 20
    x, _ = analysis.capture(model, ids(T), [2])[2]
    attn = model.blocks[2].attn
    q, k, v, log_f = analysis.project(attn, x)
    heads = [0, 1, 3]
    A = analysis.head_matrices(q, k, log_f, heads, gates=False, attention=True)["A"]
    group = attn.n_heads // attn.n_kv_heads
    D = q.shape[-1]
    for n, h in enumerate(heads):
        qh, kh = q[0, :, h].double(), k[0, :, h // group].double()
        decay = None if log_f is None else direct_F(direct_gates(attn, x)[:, h]).log()
        ref = torch.zeros(T, T, dtype=torch.float64)
        for i in range(T):
            s = torch.stack([qh[i] @ kh[j] / math.sqrt(D) + (0 if decay is None else decay[i, j])
                             for j in range(i + 1)])
            e = torch.exp(s - s.max())
            ref[i, : i + 1] = e / e.sum()
        torch.testing.assert_close(A[n], ref, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(A[n].sum(-1), torch.ones(T, dtype=torch.float64))
        assert torch.all(A[n].triu(1) == 0)
        assert A[n].max() > 0.5  # not a flat softmax: the test would not see a wrong scale otherwise


def brute_force_acp(log_f_h, delta, BM, BN):
    """(element fraction, pruned tiles, causal tiles) of one head from the full decay matrix."""
    c = torch.cumsum(log_f_h.double(), 0)
    T = c.shape[0]
    D = c[:, None] - c[None, :]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    below = (D < delta) & causal
    pruned = total = 0
    for m in range(0, T, BM):
        for n in range(0, T, BN):
            cz = causal[m : m + BM, n : n + BN]
            if not cz.any():
                continue  # entirely above the diagonal: no tile
            total += 1
            pruned += bool(below[m : m + BM, n : n + BN][cz].all())
    return below.sum().item() / causal.sum().item(), pruned, total


@pytest.mark.parametrize("block", [(16, 16), (16, 32), (32, 16)])
def test_acp_fractions_match_brute_force(block):
    torch.manual_seed(0)
    T, H, D = 150, 4, 8
    q, k = torch.randn(1, T, H, D), torch.randn(1, T, H, D)
    # per head a different decay: strongly local ... nearly global
    log_f = torch.nn.functional.logsigmoid(torch.randn(1, T, H) + torch.tensor([0.0, 2.0, 5.0, 12.0]))
    no_norm = type("A", (), {"q_norm": None})()
    stats = analysis.acp_layer_stats(no_norm, q, k, log_f, block=block)
    # auto threshold without QK-norm, by hand: U = max|q| max|k| / sqrt(D) per head
    delta = (-2 * q[0].norm(dim=-1).amax(0) * k[0].norm(dim=-1).amax(0) / math.sqrt(D) - math.log(T) - 10.0)
    torch.testing.assert_close(torch.tensor(stats["delta"]), delta, rtol=1e-5, atol=1e-5)
    fracs = []
    for h in range(H):
        elem, pruned, total = brute_force_acp(log_f[0, :, h], stats["delta"][h], *block)
        assert stats["tiles_pruned"][h] == pruned and stats["tiles_total"][h] == total
        assert stats["tile_fraction"][h] == pytest.approx(pruned / total)
        assert stats["element_fraction"][h] == pytest.approx(elem, abs=1e-12)
        fracs.append(elem)
    assert fracs[0] > 0.5 and fracs[3] < 0.05  # the local head is pruned, the global one is not
    # a fixed threshold; a non-negative one is refused with the value named
    fixed = analysis.acp_layer_stats(no_norm, q, k, log_f, block=block, threshold=-3.0)
    assert fixed["delta"] == [-3.0] * H
    assert fixed["element_fraction"][1] == pytest.approx(brute_force_acp(log_f[0, :, 1], -3.0, *block)[0])
    with pytest.raises(ValueError, match=r"--threshold 0.5: must be < 0"):
        analysis.acp_layer_stats(no_norm, q, k, log_f, threshold=0.5)


def test_acp_threshold_uses_the_qk_norm_weights():
    model = tiny_model(**PRO)
    attn = model.blocks[0].attn
    x, _ = analysis.capture(model, ids(64), [0])[0]
    q, k, v, log_f = analysis.project(attn, x)
    stats = analysis.acp_layer_stats(attn, q, k, log_f, block=(16, 16))
    D = attn.head_dim
    # |q| <= max|gamma_q| sqrt(D), |k| <= max|gamma_k| sqrt(D), U = |q| |k| / sqrt(D)
    U = attn.q_norm.weight.detach().abs().max() * attn.k_norm.weight.detach().abs().max() * math.sqrt(D)
    assert stats["delta"] == pytest.approx([float(-2 * U - math.log(64) - 10.0)] * attn.n_heads, rel=1e-6)


@pytest.mark.parametrize("flag, value", [("--length", "0"), ("--step", "-1")])
def test_numbers_below_one_are_argparse_errors_naming_the_flag(flag, value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        run.main(["--run", "some_run", "--out", str(tmp_path), flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {flag}: must be an integer >= 1; got {value}" in err


def test_errors_name_the_value(tmp_path):
    tf = tiny_model(**VARIANTS["transformer_pro"])
    with pytest.raises(ValueError, match=r"forget-gate matrix F needs a forget gate.*'t' has none.*--what A"):
        run.analyze(tf, ids(16), tmp_path / "tf", progress=False)
    with pytest.raises(ValueError, match=r"ACP needs a forget gate"):
        run.analyze(tf, ids(16), tmp_path / "tf", what=["A", "acp"], progress=False)
    fox = tiny_model()
    with pytest.raises(ValueError, match=r"--layers: 5 is out of range: the model has 3 layers \(0\.\.2\)"):
        run.analyze(fox, ids(16), tmp_path / "x", layers=[0, 5], progress=False)
    with pytest.raises(ValueError, match=r"--heads: -1 is out of range: the model has 4 heads"):
        run.analyze(fox, ids(16), tmp_path / "x", heads=[-1], progress=False)
    with pytest.raises(ValueError, match=r"--heads: 2 is given twice"):
        run.analyze(fox, ids(16), tmp_path / "x", heads=[2, 1, 2], progress=False)
    with pytest.raises(ValueError, match=r"--block '64y': expected"):
        run.parse_block("64y")
    assert run.parse_block("64") == (64, 64) and run.parse_block("32x128") == (32, 128)
    with pytest.raises(ValueError, match=r"--what 'F,B'"):
        run.parse_what("F,B")
    with pytest.raises(ValueError, match=r"--layers 'a': expected comma-separated integers"):
        run.parse_ints("--layers", "a")
    assert run.default_layers(3) == [0, 1, 2] and run.default_layers(24) == [0, 8, 15, 23]
    # a Transformer still gets its attention maps
    files = run.analyze(tf, ids(16), tmp_path / "tf", what=["A"], layers=[1], heads=[0, 1], progress=False)
    with np.load(files["npz"]) as z:
        assert set(z.files) == {"layers", "heads", "A"} and z["A"].shape == (1, 2, 16, 16)
    assert files["gates_png"].is_file() and files["acp"] is None


def test_head_histogram_bins():
    share = plot.head_histogram([0.0, 0.049, 0.05, 0.5, 0.95, 1.0])
    expected = np.zeros(20)
    expected[[0, 1, 10]] = [2 / 6, 1 / 6, 1 / 6]
    expected[19] = 2 / 6  # [95%, 100%] is closed
    np.testing.assert_allclose(share, expected)


def test_cli_on_a_trained_run_and_replot(tiny_text_run, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("It was the best of times, it was the worst of times, it was the age of wisdom. " * 30)
    out = tmp_path / "gates"
    run.main(["--run", str(tiny_text_run), "--text-file", str(text), "--length", "96", "--layers", "1,0",
              "--heads", "1", "--block", "16x32", "--out", str(out), "--device", "cpu"])
    rec = json.loads((out / "gates.json").read_text())
    assert rec["tokens"] == 96 and len(rec["input_ids"]) == 96 and rec["layers"] == [1, 0] and rec["heads"] == [1]
    assert rec["text"] == str(text) and rec["name"].startswith("fox_pro")
    with np.load(out / "gates.npz") as z:
        F, A, log_f = z["F"], z["A"], z["log_fgate"]
    assert F.shape == A.shape == (2, 1, 96, 96) and log_f.shape == (2, 96, 2)
    c = np.cumsum(log_f[0, :, 1].astype(np.float64))  # layer 1, head 1: F rebuilt from the saved gates
    np.testing.assert_allclose(F[0, 0], np.tril(np.exp(c[:, None] - c[None, :])), rtol=1e-5, atol=1e-30)
    # the arrays follow the order of --layers: F[0] is layer 1's, computed here from its gates directly
    model = load_run(tiny_text_run)[0]
    x, _ = analysis.capture(model, torch.tensor([rec["input_ids"]]), [1])[1]
    np.testing.assert_allclose(F[0, 0], direct_F(direct_gates(model.blocks[1].attn, x)[:, 1]).numpy(), rtol=1e-4,
                               atol=1e-30)
    np.testing.assert_allclose(A.sum(-1), 1.0, rtol=1e-5)
    assert np.all(np.triu(A[0, 0], 1) == 0)
    acp_rec = json.loads((out / "acp.json").read_text())
    assert [r["layer"] for r in acp_rec["layers"]] == [0, 1] and acp_rec["block"] == [16, 32]
    assert acp_rec["qk_norm_bound"] is True  # fox_pro has QK-norm
    pruned = sum(sum(r["tiles_pruned"]) for r in acp_rec["layers"])
    total = sum(sum(r["tiles_total"]) for r in acp_rec["layers"])
    assert acp_rec["tile_fraction"] == pytest.approx(pruned / total)
    # 6 query blocks of 16 x 3 key blocks of 32: the causal tiles per query block are 1, 1, 2, 2, 3, 3
    assert all(r["tiles_total"] == [12, 12] for r in acp_rec["layers"])
    assert (out / "gates.png").stat().st_size > 10_000 and (out / "acp.png").stat().st_size > 10_000
    # re-plot from the saved files only (a copy without the run), element metric, linear A
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    for f in ("gates.png", "acp.png"):
        (copy / f).unlink()
    plot.main([str(copy), "--a-scale", "linear", "--acp-metric", "element"])
    assert (copy / "gates.png").is_file() and (copy / "acp.png").is_file()
    with pytest.raises(FileNotFoundError, match="neither gates.npz nor acp.json"):
        plot.main([str(tmp_path)])
    with pytest.raises(ValueError, match=r"--length 5000: the text gives only 3 tokens"):
        run.text_tokens(lambda t: {"input_ids": t.split()}, "three short words", 5000)


def test_pruning_share_of_a_row_matches_brute_force_over_layers_and_heads():
    """eval.gates.pruning.row_share: pruned over causal tiles of every layer and head, each tile checked on the full
    decay matrix against the threshold computed here from the QK-norm weights."""
    from eval.gates import pruning

    model, T, block = tiny_model(**PRO), 96, (16, 16)
    x_ids = ids(T)
    captured = analysis.capture(model, x_ids, range(len(model.blocks)))
    pruned = total = 0
    for layer, block_ in enumerate(model.blocks):
        attn = block_.attn
        log_f = analysis.project(attn, captured[layer][0])[3]
        U = attn.q_norm.weight.detach().abs().max() * attn.k_norm.weight.detach().abs().max() * math.sqrt(attn.head_dim)
        delta = float(-2 * U - math.log(T) - 10.0)
        for h in range(attn.n_heads):
            _, p, t = brute_force_acp(log_f[0, :, h], delta, *block)
            pruned, total = pruned + p, total + t
    assert 0 < pruned < total  # the local heads prune, the long-range ones do not
    assert pruning.row_share(model, x_ids, block=block) == pytest.approx(pruned / total)
    with pytest.raises(ValueError, match="has no forget gate"):
        pruning.row_share(tiny_model(**VARIANTS["transformer_pro"]), x_ids)


def test_pruning_cli_on_held_out_rows(tiny_text_run, tmp_path, capsys):
    from eval.gates import pruning
    from forgetting_transformer.data import read_rows

    out = tmp_path / "acp"
    pruning.main(["--run", str(tiny_text_run), "--out", str(out), "--rows", "3", "--length", "128", "--block", "16",
                  "--eps", "0.5", "--device", "cpu"])
    rec = json.loads((out / "acp_rows.json").read_text())
    data = OmegaConf.load(tiny_text_run / "config.yaml").data
    n_rows = len(rec["rows"])
    assert rec["tokens"] == 128 and rec["block"] == [16, 16] and rec["eps"] == 0.5
    assert len(rec["tile_fraction"]) == n_rows
    assert rec["rows"] == sorted(set(rec["rows"])) and 1 <= n_rows <= 3
    model = load_run(tiny_text_run)[0]
    inputs, _ = read_rows(f"{data.data_dir}/heldout.zarr", rec["rows"], 128, vocab_size=data.vocab_size,
                          bos_id=data.bos_id)
    for share, row in zip(rec["tile_fraction"], inputs):
        assert share == pytest.approx(pruning.row_share(model, row[None], block=(16, 16), eps=0.5))
    assert rec["mean"] == pytest.approx(np.mean(rec["tile_fraction"]))
    assert (rec["ci"] is None) == (n_rows == 1)
    assert "ACP prunes" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"--eps 1.5: must be in \(0, 1\)"):
        pruning.main(["--run", str(tiny_text_run), "--out", str(out), "--eps", "1.5"])
