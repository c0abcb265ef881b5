import json
import math

import numpy as np
import pytest
import torch

from forgetting_transformer.plotting import cumulative_average, moving_average
from forgetting_transformer.training.metrics import (MetricsLogger, attention_context, flops_per_token, matmul_params,
                                                     peak_flops)
from forgetting_transformer.training.optim import build_optimizer, decay_split
from forgetting_transformer.training.schedule import warmup_cosine_lr


def test_warmup_cosine_schedule_values():
    kw = dict(lr=1.0, warmup_tokens=100, total_tokens=1100, min_lr_ratio=0.1)
    assert warmup_cosine_lr(0, **kw) == 0.0
    assert warmup_cosine_lr(50, **kw) == pytest.approx(0.5)
    assert warmup_cosine_lr(100, **kw) == pytest.approx(1.0)
    assert warmup_cosine_lr(600, **kw) == pytest.approx(0.1 + 0.9 * 0.5)  # half way through the cosine
    assert warmup_cosine_lr(1100, **kw) == pytest.approx(0.1)
    assert warmup_cosine_lr(5000, **kw) == pytest.approx(0.1)  # stays at the floor after the end
    lrs = [warmup_cosine_lr(t, **kw) for t in range(100, 1101, 50)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))  # monotone decay
    assert warmup_cosine_lr(10, lr=1.0, warmup_tokens=0, total_tokens=10) == pytest.approx(0.0, abs=1e-12)


def test_weight_decay_only_on_matrices():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    decay, no_decay = decay_split(model.named_parameters())
    assert decay == ["0.weight", "1.weight"]
    assert no_decay == ["1.bias", "2.weight", "2.bias"]
    opt = build_optimizer(model, type("O", (), dict(weight_decay=0.1, betas=[0.9, 0.95], eps=1e-8))())
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert opt.param_groups[0]["betas"] == (0.9, 0.95)


def test_flops_per_token_palm_definition():
    # 6N + 12 L H Q T, e.g. N=1e6, L=2, H=4, Q=16, T=128
    assert flops_per_token(10**6, 2, 4, 16, 128) == 6 * 10**6 + 12 * 2 * 4 * 16 * 128
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 3))
    assert matmul_params(model) == 4 * 3 + 3


def test_attention_context_per_architecture():
    from types import SimpleNamespace as C

    assert attention_context(C(arch="decoder", n_layers=24), 16384) == (24, 16384)
    assert attention_context(C(arch="fla_swa", n_layers=24, window_size=2048), 16384) == (24, 2048)
    assert attention_context(C(arch="fla_swa", n_layers=24, window_size=2048), 1024) == (24, 1024)
    assert attention_context(C(arch="fla_samba", n_layers=24, window_size=2048), 16384) == (12, 2048)
    for arch in ("fla_mamba2", "fla_deltanet", "fla_hgrn2"):
        assert attention_context(C(arch=arch, n_layers=24), 16384)[0] == 0


def test_peak_flops_unknown_on_cpu_and_overridable():
    assert peak_flops(torch.device("cpu")) is None
    assert peak_flops(torch.device("cpu"), override_tflops=100.0) == 1e14


def test_moving_average_is_centred_and_shrinks_at_the_ends():
    x = np.arange(10, dtype=float) ** 2
    y = moving_average(x, 3)
    assert y[0] == x[0] and y[-1] == x[-1]
    assert y[4] == pytest.approx((x[3] + x[4] + x[5]) / 3)
    assert moving_average(np.ones(50), 101).tolist() == [1.0] * 50
    with pytest.raises(ValueError, match="window=4"):
        moving_average(x, 4)


def test_metrics_logger_writes_rows_and_truncates_for_resume(tmp_path, capsys):
    log = MetricsLogger(tmp_path / "metrics.jsonl")
    for step in (1, 2, 3):
        log.log({"step": step, "loss": 1.0 / step, "mfu": None})
    assert "step 2 | loss 0.5 | mfu n/a" in capsys.readouterr().out
    log.log({"step": 3, "heldout_loss": 2.5})
    log.truncate_for_resume(3)  # a finished run resumed: its evaluation row is redone, not duplicated
    rows = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], "heldout_loss" in r) for r in rows] == [(1, False), (2, False), (3, False)]
    log.truncate_for_resume(2)
    rows = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and math.isclose(rows[1]["loss"], 0.5)
    log.truncate_for_resume(0)  # resumed without a checkpoint: starts from step 0, keeps no row
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_cumulative_average():
    np.testing.assert_allclose(cumulative_average([4.0, 2.0, 3.0, 3.0]), [4.0, 3.0, 3.0, 3.0])
