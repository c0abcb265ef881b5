"""Every model config of configs/model builds at the tiny size, trains a few steps and round-trips a checkpoint."""

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from forgetting_transformer.config import register_configs, validate
from forgetting_transformer.models import build_model
from forgetting_transformer.training.checkpoint import TrainState, load_model_weights, save_checkpoint
from forgetting_transformer.training.optim import build_optimizer

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# the fla baselines have their own (interpreter-sized) tests in test_baselines.py: at these settings the Triton
# interpreter takes minutes per model
MODELS = sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml") if "arch: fla_" not in p.read_text())
register_configs()


class NoData:
    def state_dict(self):
        return {}

    def load_state_dict(self, sd):
        pass


def test_all_paper_models_have_configs():
    assert {"fox_llama", "fox_pro", "transformer_llama", "transformer_pro", "fox_pro_rope",
            "fox_pro_data_independent", "fox_pro_fixed"} <= set(MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_model_trains_and_round_trips_a_checkpoint(name, tmp_path):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={name}", "model.n_layers=2", "model.d_model=64",
                                           "model.head_dim=16", "optim.lr=3e-3"])
    validate(cfg)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt = build_optimizer(model, cfg.optim)
    for g in opt.param_groups:
        g["lr"] = cfg.optim.lr
    x = torch.randint(0, cfg.model.vocab_size, (4, 32))
    losses = []
    for _ in range(5):
        loss = model(x, x.roll(-1, 1)).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses  # it fits a fixed batch
    path = save_checkpoint(TrainState(model, opt, NoData(), step=5), tmp_path, keep=1)
    fresh = build_model(cfg.model)
    load_model_weights(fresh, path)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)
