"""Named sizes are data: every model config (the fla baselines included) at every paper size is within 5% of its
nominal size."""

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from forgetting_transformer.config import register_configs
from forgetting_transformer.models import build_model

from tests.script_modules import load_script

count_params = load_script("count_params")
BASELINES, MODELS, SIZES, count = count_params.BASELINES, count_params.MODELS, count_params.SIZES, count_params.count

register_configs()  # the schemas the config files extend (count_params.main does the same)


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("model", MODELS + BASELINES)
def test_non_embedding_parameters_within_5_percent_of_nominal(model, size):
    non_embedding, total = count(model, size)
    assert abs(non_embedding / SIZES[size] - 1) < 0.05, (model, size, non_embedding)
    assert total > non_embedding


def test_head_dim_sweep_keeps_the_width():
    # The paper's 760M Transformer uses 12 heads of 128 instead of 24 of 64: same parameters.
    assert count("transformer_llama", "760m", ["model.head_dim=128"]) == count("transformer_llama", "760m")


def test_mamba2_stacks_two_blocks_per_layer():
    # Mamba-2 blocks have no MLP, so a size's layer is two of them: the paper's 24/48/48 blocks.
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / "configs"), version_base="1.3"):
        cfg = compose("config", overrides=["model=mamba2", "model/size=760m"])
    with torch.device("meta"):
        model = build_model(cfg.model)
    assert len(model.blocks) == 48 and model.blocks[0].mlp is None
    assert model.blocks[0].mixer.num_heads == 48 and model.blocks[0].mixer.ssm_state_size == 128
