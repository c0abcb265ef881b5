"""Config composition and validation: Hydra rejects unknown or mistyped keys and values outside an Enum (one line
naming the key), validate() names bad values and keys added with + that no schema has, the model schemas split the
decoder's keys from the fla baselines', and model.attention becomes the attention options in force for a run."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from forgetting_transformer.config import (AttentionConfig, ConfigError, DecoderArch, DecoderConfig, FlaArch,
                                           FlaConfig, TileConfigs, register_configs, validate)
from forgetting_transformer.ops.forgetting_attention import AttentionOptions, default_options
from forgetting_transformer.ops.options import KINDS
from forgetting_transformer.training.run import checked_options, config_error_line, run_in_dir

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = str(ROOT / "configs")
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


@pytest.mark.parametrize("overrides, message", [
    (["+optim.lrr=1e-3"], "optim.lrr: no such key in OptimConfig; did you mean optim.lr?"),
    (["++model.kv_shiftt=true"], "model.kv_shiftt: no such key in DecoderConfig; did you mean model.kv_shift?"),
    (["model=mamba2", "+model.state_sise=16"], "model.state_sise: no such key in FlaConfig; did you mean "
                                               "model.state_size?"),
    (["++model.attention.triton_configs.fwdd=[64,64]"],
     "model.attention.triton_configs.fwdd: no such key in TileConfigs; did you mean "
     "model.attention.triton_configs.fwd?"),
    (["+train.x.y=1"], "train.x: no such key in TrainConfig; its keys: batch_size, micro_batch_size, "),
    (["+foo=1"], "foo: no such key in Config; its keys: model, data, optim, "),
], ids=["plus", "plus_plus", "fla_schema", "nested", "subtree", "top_level"])
def test_a_key_added_with_plus_is_refused_naming_the_nearest_key(overrides, message):
    """``+key=`` and ``++key=`` add a key to Hydra's struct config; validate refuses one no schema has."""
    with pytest.raises(ConfigError) as e:
        validate(load(*overrides))
    assert str(e.value).startswith(f"invalid config: {message}")


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
        ("model.fgate=fixed", "model.fgate_init=None"),
        ("model.fgate_init=[0.5,10]", "model.fgate_init=[0.5, 10]"),
        ("train.batch_size=10", "train.batch_size=10"),
        ("schedule.warmup_tokens=999999999999", "schedule.warmup_tokens"),
        (("strategy=fsdp", "strategy.fsdp_prefetch=-1"), "strategy.fsdp_prefetch=-1"),
        ("strategy.fsdp_prefetch=2", "strategy.fsdp_prefetch=2: only applies to strategy.name=fsdp"),
        ("strategy.reshard_after_forward=false", "strategy.reshard_after_forward=False: only applies"),
        (("strategy=ddp", "strategy.fsdp_precision=bf16_params"),
         "strategy.fsdp_precision='bf16_params': only applies to strategy.name=fsdp .got strategy.name=ddp"),
        ("data.bos_id=5000", "data.bos_id=5000"),
        ("model.n_kv_heads=2", "model.n_kv_heads=2"),
        ("model.acp_eps=2", "model.acp_eps=2.0"),
        (("model=transformer_pro", "model.acp=true"), "model.acp=True"),
        (("model=mamba2", "model.rope=true"), "model.rope=True: fla_mamba2 has no attention layers"),
        (("model=path_fox_pro", "model.rope=true"), "model.rope=True: must be false with model.mixer=path"),
        (("model=path_fox_pro", "model.acp=true"), "model.acp=True: must be false with model.mixer=path"),
        (("model=path_fox_pro", "model.acp_eviction=true"),
         "model.acp_eviction=True: must be false with model.mixer=path"),
        (("model=path_pro", "model.head_dim=48"), "model.head_dim=48: must be one of .16, 32, 64, 128. with "
                                                  "model.mixer=path"),
        (("model=path_pro", "model.path_w_rank=0"), "model.path_w_rank=0: must be > 0, or null"),
        (("model=path_pro", "model.path_conv_size=0"), "model.path_conv_size=0: must be > 0"),
        (("strategy.deterministic=true", "model.attention.deterministic=false"),
         "model.attention.deterministic=False: strategy.deterministic=true makes every op deterministic"),
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
    assert cfg.strategy.fsdp_precision == "autocast"  # the official FoX training's precision
    model, size = name.split("/")[1].split("_")[:-2], name.split("_")[-2]
    assert cfg.model.name == "_".join(model) and cfg.model.d_model == {"125m": 768, "360m": 1024, "760m": 1536}[size]


def test_fsdp_precision_defaults():
    """strategy=fsdp runs on bf16 parameters unless strategy.fsdp_precision=autocast; single and ddp always
    autocast (the schema's default), so a paper preset, which sets autocast, also validates with strategy=ddp."""
    assert load("strategy=fsdp").strategy.fsdp_precision == "bf16_params"
    assert load().strategy.fsdp_precision == load("strategy=ddp").strategy.fsdp_precision == "autocast"
    cfg = load("experiment=longcrawl64/fox_pro_760m_48b", "data.data_dir=/x", "strategy=ddp")
    validate(cfg)
    assert cfg.strategy.name == "ddp" and cfg.strategy.fsdp_precision == "autocast"


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


ENUM_KEYS = [  # (overrides, key, value, allowed values in order)
    ("model.fgate=sometimes", "model.fgate", "sometimes", "data_dependent | data_independent | fixed | none"),
    ("model.arch=gpt9", "model.arch", "gpt9", "decoder"),
    ("model.mixer=linear", "model.mixer", "linear", "softmax | path"),
    (("model=mamba2", "model.arch=gpt9"), "model.arch", "gpt9",
     "fla_mamba2 | fla_deltanet | fla_hgrn2 | fla_samba | fla_swa"),
    (("model=mamba2", "model.ssd_kernel=fast"), "model.ssd_kernel", "fast", "auto | simple_gla | gla"),
    ("model.attention.backend=cuda", "model.attention.backend", "cuda", "triton | reference"),
    ("strategy.name=tp", "strategy.name", "tp", "single | ddp | fsdp"),
    ("strategy.device=tpu", "strategy.device", "tpu", "auto | cpu | cuda"),
    ("strategy.mixed_precision=fp8", "strategy.mixed_precision", "fp8", "auto | bf16 | fp32"),
    ("strategy.activation_checkpointing=some", "strategy.activation_checkpointing", "some", "none | full | selective"),
    ("train.nonfinite=ignore", "train.nonfinite", "ignore", "stop | skip"),
    ("wandb.mode=sometimes", "wandb.mode", "sometimes", "disabled | offline | online"),
    ("optim.name=sgd", "optim.name", "sgd", "adamw"),
    ("schedule.name=linear", "schedule.name", "linear", "warmup_cosine"),
]


@pytest.mark.parametrize("overrides, key, value, allowed", ENUM_KEYS, ids=[k[1] + "=" + k[2] for k in ENUM_KEYS])
def test_enum_keys_reject_other_values_naming_the_key_and_the_choices(overrides, key, value, allowed):
    with pytest.raises(ConfigCompositionException) as e:
        load(*([overrides] if isinstance(overrides, str) else overrides))
    assert config_error_line(e.value) == f"invalid config: {key}={value!r}: must be one of {allowed}"


def test_enum_values_compare_as_the_strings_of_the_yaml_files():
    cfg = load("model=fox_pro_fixed", "strategy.mixed_precision=bf16", "wandb.mode=offline")
    assert cfg.model.fgate == "fixed" and cfg.strategy.mixed_precision == "bf16" and cfg.wandb.mode == "offline"
    assert f"{cfg.model.fgate}|{cfg.model.arch}" == "fixed|decoder"
    saved = OmegaConf.to_yaml(cfg)
    assert "fgate: fixed" in saved and "mixed_precision: bf16" in saved and "Fgate" not in saved


@pytest.mark.parametrize("overrides, line", [
    (["model.fgate=sometimes"],
     "error: invalid config: model.fgate='sometimes': must be one of data_dependent | data_independent | fixed | none"),
    (["model=mamba2", "model.qk_norm=true"],
     "error: invalid config: model.qk_norm: no such key in FlaConfig; its keys: "
     "name, arch, vocab_size, n_layers, d_model, head_dim, n_heads, n_kv_heads, mlp_hidden_ratio, "
     "mlp_multiple_of, rope, rope_base, norm_eps, init_std, loss_chunk, state_size, expand, conv_size,"
     " linear_head_dim, window_size, ssd_kernel, mamba_mlp_hidden_ratio"),
    (["model.n_layers=many"], "error: invalid config: model.n_layers='many': could not be converted to Integer"),
    (["+optim.lrr=1e-3"], "error: invalid config: optim.lrr: no such key in OptimConfig; did you mean optim.lr?"),
    (["+optim.lrr=1e-3", "--cfg", "job"],
     "error: invalid config: optim.lrr: no such key in OptimConfig; did you mean optim.lr?"),
    (["experiment=typo"], "error: invalid config: optim.lrr: no such key in OptimConfig; did you mean optim.lr?"),
], ids=["enum", "unknown_key", "type", "added_key", "added_key_cfg_job", "experiment_yaml"])
def test_train_py_reports_a_value_hydra_rejects_in_one_line(overrides, line, tmp_path):
    extra = tmp_path / "configs" / "experiment"  # an experiment yaml with a mistyped key, on Hydra's search path
    extra.mkdir(parents=True)
    (extra / "typo.yaml").write_text("# @package _global_\noptim:\n  lrr: 0.1\n")
    res = subprocess.run([sys.executable, str(ROOT / "train.py"), f"output_dir={tmp_path / 'run'}",
                          f"hydra.searchpath=[file://{tmp_path / 'configs'}]", *overrides],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and res.stderr.strip().splitlines() == [line], res.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_model_schemas_hold_only_their_models_keys():
    decoder, fla = load().model, load("model=deltanet").model
    assert OmegaConf.get_type(decoder) is DecoderConfig and OmegaConf.get_type(fla) is FlaConfig
    fla_only = {"state_size", "expand", "conv_size", "linear_head_dim", "window_size", "ssd_kernel",
                "mamba_mlp_hidden_ratio"}
    decoder_only = {"mixer", "path_w_rank", "path_conv_size", "fgate", "fgate_init", "qk_norm", "output_gate",
                    "output_norm", "kv_shift", "acp", "acp_eps", "acp_eviction", "attention"}
    assert fla_only.isdisjoint(decoder) and fla_only <= set(fla)
    assert decoder_only.isdisjoint(fla) and decoder_only <= set(decoder)
    with pytest.raises(ConfigCompositionException, match="qk_norm"):
        load("model=deltanet", "model.qk_norm=true")
    with pytest.raises(ConfigCompositionException, match="state_size"):
        load("model.state_size=16")


@pytest.mark.parametrize("name, fgate", [("path_pro", "none"), ("path_fox_pro", "data_dependent"),
                                         ("path_llama", "none"), ("path_fox_llama", "data_dependent")])
def test_path_presets_validate_with_their_gate_and_a_full_rank_w_is_accepted(name, fgate):
    cfg = load(f"model={name}")
    validate(cfg)
    assert cfg.model.mixer == "path" and cfg.model.fgate == fgate and not cfg.model.rope
    assert (cfg.model.path_w_rank, cfg.model.path_conv_size) == (32, 3)
    validate(load(f"model={name}", "model.path_w_rank=null"))
    assert load().model.mixer == "softmax"  # every other decoder: softmax attention


def test_a_model_config_without_a_schema_is_refused():
    cfg = load()
    cfg.model = OmegaConf.create({**OmegaConf.to_container(cfg.model, enum_to_str=True), "name": "mine"})
    with pytest.raises(ConfigError, match="model 'mine' extends no model schema"):
        validate(cfg)


def test_the_tiny_size_sets_the_fla_only_head_width_of_the_fla_models_alone():
    assert load("model=deltanet").model.linear_head_dim == 64  # 128 does not divide tiny's d_model 192
    assert load("model=deltanet", "model/size=125m").model.linear_head_dim == 128  # the schema's (paper) value
    assert "linear_head_dim" not in load("model=fox_pro", "model/size=tiny").model


def test_arch_names_of_the_schemas_are_the_model_registry():
    from forgetting_transformer.models import MODEL_REGISTRY
    from forgetting_transformer.models.baselines import FLA_ARCHS

    assert {*DecoderArch, *FlaArch} == set(MODEL_REGISTRY)
    assert list(FlaArch) == list(FLA_ARCHS)


@pytest.mark.parametrize("imported, absent", [
    ("forgetting_transformer.config", ["torch", "forgetting_transformer.models"]),
    ("forgetting_transformer.hf", ["forgetting_transformer.config"]),
])
def test_config_and_models_do_not_import_each_other(imported, absent):
    code = f"import sys, {imported}\nprint([m for m in {absent!r} if m in sys.modules])"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr[-2000:]


def test_attention_keys_are_the_kernel_options():
    assert [f.name for f in dataclasses.fields(AttentionConfig)] == [
        f.name for f in dataclasses.fields(AttentionOptions)]
    assert tuple(f.name for f in dataclasses.fields(TileConfigs)) == KINDS
    assert checked_options(load()) == default_options()  # all null: the process default
    assert checked_options(load("model=mamba2")) == default_options()  # the fla baselines have no model.attention


def test_attention_values_become_the_options():
    cfg = load("model.attention.autotune=false", "model.attention.backend=reference", "model.attention.gluon=false",
               "model.attention.triton_configs.fwd=[64,32,4,2]", "model.attention.triton_configs.dq=[32,64]",
               "model.attention.acp_grid=[64,32]", "model.attention.deterministic=true")
    assert checked_options(cfg) == default_options().replace(
        autotune=False, backend="reference", gluon=False, deterministic=True, acp_grid=(64, 32),
        triton_configs={"fwd": (64, 32, 4, 2), "dq": (32, 64)})


@pytest.mark.parametrize("override, message", [
    ("model.attention.triton_configs.fwd=[24,64]",
     "model.attention.triton_configs.fwd=[24, 64]: TileConfig.block_m must be a power of two >= 16; got 24"),
    ("model.attention.triton_configs.dkdv=[64,64,3]", "model.attention.triton_configs.dkdv=[64, 64, 3]: TileConfig"),
    ("model.attention.triton_configs.dq=[64]", "model.attention.triton_configs.dq=[64]"),
    ("model.attention.acp_grid=[0,16]", "model.attention.acp_grid=[0, 16]: acp_grid must be"),
])
def test_attention_values_the_kernels_refuse_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(";", ".")):
        checked_options(load(override))


def test_model_attention_is_in_force_during_the_run_and_only_then(markov_data_dir, tmp_path):
    """``python train.py model.attention.autotune=false ...``: the run's phases see the options the override asks
    for; the process default is back after the run."""
    before, seen = default_options(), []
    cfg = load("data=longcrawl64", f"data.data_dir={markov_data_dir}", "data.vocab_size=64", "data.bos_id=0",
               f"output_dir={tmp_path / 'run'}", "strategy.device=cpu", "model.attention.autotune=false",
               "model.attention.fused_backward=false")
    run_in_dir(cfg, lambda cfg, ctx: seen.append(default_options()))
    assert seen == [before.replace(autotune=False, fused_backward=False)]
    assert default_options() == before
