"""Config composition and validation: Hydra rejects unknown/mistyped keys, validate() names bad values."""

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from forgetting_transformer.config import ConfigError, register_configs, validate

CONFIGS = str(Path(__file__).resolve().parents[2] / "configs")
register_configs()


def load(*overrides):
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_default_config_composes_and_validates():
    cfg = load()
    validate(cfg)
    assert cfg.model.name == "fox_pro" and cfg.model.kv_shift and cfg.model.qk_norm
    assert cfg.model.vocab_size == cfg.data.vocab_size == 4096
    assert cfg.optim.betas == [0.9, 0.95] and cfg.optim.weight_decay == 0.1 and cfg.optim.grad_clip == 1.0


def test_groups_and_overrides_compose():
    cfg = load("model=fox_llama", "optim.lr=1e-3", "data=longcrawl64", "data.data_dir=/x")
    validate(cfg)
    assert cfg.model.name == "fox_llama" and not cfg.model.output_gate
    assert cfg.optim.lr == 1e-3 and cfg.data.vocab_size == cfg.model.vocab_size == 50257


def test_unknown_key_is_hydras_error():
    with pytest.raises(ConfigCompositionException, match="nope"):
        load("model.nope=1")


def test_wrong_type_is_hydras_error():
    with pytest.raises(ConfigCompositionException, match="n_layers"):
        load("model.n_layers=many")


def test_missing_required_value_names_the_key():
    cfg = load("data=longcrawl64")
    with pytest.raises(ConfigError, match=r"data.data_dir"):
        validate(cfg)


@pytest.mark.parametrize(
    "override, key",
    [
        ("optim.lr=-1", "optim.lr=-1.0"),
        ("model.head_dim=100", "model.head_dim=100"),
        ("model.fgate=sometimes", "model.fgate=.sometimes."),
        ("model.fgate=fixed", "model.fgate_init=None"),
        ("model.fgate_init=[0.5,10]", "model.fgate_init=[0.5, 10]"),
        ("model.arch=gpt9", "model.arch='gpt9'"),
        ("train.batch_size=10", "train.batch_size=10"),
        ("schedule.warmup_tokens=999999999999", "schedule.warmup_tokens"),
        ("strategy.name=tp", "strategy.name='tp'"),
        ("strategy.activation_checkpointing=some", "strategy.activation_checkpointing='some'"),
        (("strategy=fsdp", "strategy.fsdp_prefetch=-1"), "strategy.fsdp_prefetch=-1"),
        ("strategy.fsdp_prefetch=2", "strategy.fsdp_prefetch=2: only applies to strategy.name=fsdp"),
        ("strategy.reshard_after_forward=false", "strategy.reshard_after_forward=False: only applies"),
        ("wandb.mode=sometimes", "wandb.mode='sometimes'"),
        ("data.bos_id=5000", "data.bos_id=5000"),
        ("model.n_kv_heads=2", "model.n_kv_heads=2"),
        ("model.acp_eps=2", "model.acp_eps=2.0"),
        (("model=transformer_pro", "model.acp=true"), "model.acp=True"),
    ],
)
def test_invalid_values_name_the_key(override, key):
    cfg = load(*([override] if isinstance(override, str) else override))
    with pytest.raises(ConfigError, match=key.replace("(", r"\(").replace("[", r"\[")):
        validate(cfg)


def test_model_vocab_must_match_data():
    cfg = load("model.vocab_size=100")
    with pytest.raises(ConfigError, match="model.vocab_size=100"):
        validate(cfg)


def test_schema_types_are_enforced_after_compose():
    cfg = load()
    with pytest.raises(ValidationError):
        cfg.train.batch_size = "lots"
    assert OmegaConf.is_missing(load("data=longcrawl64").data, "data_dir")


EXPERIMENTS = sorted(p.relative_to(Path(CONFIGS) / "experiment").with_suffix("").as_posix()
                     for p in (Path(CONFIGS) / "experiment" / "longcrawl64").rglob("*.yaml"))
# the books presets (small-scale reproduction): tests/training/test_presets.py


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_paper_presets_compose(name):
    cfg = load(f"experiment={name}", "data.data_dir=/data/longcrawl64")
    validate(cfg)
    assert cfg.data.seq_len * cfg.train.batch_size == 2**19  # 0.5M tokens per step
    assert cfg.schedule.warmup_tokens == 256 * 2**20 and cfg.schedule.min_lr_ratio == 0
    assert cfg.strategy.name == "fsdp" and cfg.data.vocab_size == cfg.model.vocab_size == 50257
    model, size = name.split("/")[1].split("_")[:-2], name.split("_")[-2]
    assert cfg.model.name == "_".join(model) and cfg.model.d_model == {"125m": 768, "360m": 1024, "760m": 1536}[size]


@pytest.mark.parametrize("strategy", ["single", "ddp", "fsdp"])
def test_deterministic_strategy_turns_on_torch_determinism(monkeypatch, strategy):
    """``strategy.deterministic=true`` (every strategy) makes init_distributed turn on
    ``torch.use_deterministic_algorithms`` (which the FoX attention reads per call to pick its bitwise-reproducible
    backward) and cuBLAS's fixed workspace; the default leaves both alone."""
    import torch

    from forgetting_transformer.training.distributed import init_distributed

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    prev = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        init_distributed(load(f"strategy={strategy}", "strategy.device=cpu").strategy)
        assert not torch.are_deterministic_algorithms_enabled()
        cfg = load(f"strategy={strategy}", "strategy.device=cpu", "strategy.deterministic=true")
        validate(cfg)
        init_distributed(cfg.strategy)
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(prev[0], warn_only=prev[1])
