"""The typed config tree: dataclass schemas (registered in Hydra's ConfigStore) and value validation.

YAML files under ``configs/`` hold values; these schemas hold types and defaults. Required keys are ``MISSING``
(Hydra fails naming them), unknown keys fail in Hydra's struct mode, a key with a fixed set of values is an Enum
(Hydra rejects any other value), and ``validate`` rejects the remaining bad values with a message naming the key.

The model schemas are two: ``DecoderConfig`` (FoX, the Transformer) and ``FlaConfig`` (the fla baselines), each
holding only the keys its models read; ``configs/model/*.yaml`` extend one of them. This module imports neither
torch nor the models (``tests/training/test_config.py`` checks that the architectures named here are those of
``models.MODEL_REGISTRY``), so configs load fast and the models need no Hydra.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, make_dataclass
from enum import StrEnum
from typing import Any, List, Optional

from omegaconf import MISSING

from .ops.options import BACKENDS, KINDS, AttentionOptions


class Fgate(StrEnum):
    """``model.fgate``: the decoder's forget gate."""

    data_dependent = "data_dependent"  # f = sigmoid(w_f x + b_f): FoX
    data_independent = "data_independent"  # f = sigmoid(b_f), b_f trained (from model.fgate_init)
    fixed = "fixed"  # f = sigmoid(b_f), b_f frozen at model.fgate_init: ALiBi
    none = "none"  # no forget gate: the softmax Transformer


class Mixer(StrEnum):
    """``model.mixer``: the decoder's token mixer (docs/path.md for PaTH)."""

    softmax = "softmax"  # softmax attention: Forgetting Attention with a forget gate, RoPE optional (FoX, Transformer)
    path = "path"  # PaTH attention (models/path.py): PaTH-FoX with a forget gate; no RoPE, no ACP


PATH_HEAD_DIMS = (16, 32, 64, 128)  # the head dims of fla's PaTH kernel (models/path.py KERNEL_HEAD_DIMS)


class DecoderArch(StrEnum):
    """``model.arch`` of the decoder schema (forgetting_transformer.models.MODEL_REGISTRY)."""

    decoder = "decoder"


class FlaArch(StrEnum):
    """``model.arch`` of the fla baselines' schema (forgetting_transformer.models.MODEL_REGISTRY)."""

    fla_mamba2 = "fla_mamba2"
    fla_deltanet = "fla_deltanet"
    fla_hgrn2 = "fla_hgrn2"
    fla_samba = "fla_samba"
    fla_swa = "fla_swa"


class SsdKernel(StrEnum):
    """``model.ssd_kernel``: fla's kernels of Mamba-2's scan (auto: gla on Hopper GPUs, where fla's simple_gla
    backward is wrong or crashes; simple_gla elsewhere; docs/baselines.md)."""

    auto = "auto"
    simple_gla = "simple_gla"
    gla = "gla"


@dataclass
class ModelConfig:
    """The keys every model reads. A model config extends ``DecoderConfig`` or ``FlaConfig``, never this."""

    name: str = MISSING  # the config's name, e.g. fox_pro (used in run names and plots)
    arch: str = MISSING  # key in forgetting_transformer.models.MODEL_REGISTRY; each schema lists its own
    vocab_size: int = MISSING
    n_layers: int = MISSING
    d_model: int = MISSING
    head_dim: int = 64
    n_heads: Optional[int] = None  # default d_model // head_dim
    n_kv_heads: Optional[int] = None  # default n_heads (no GQA)
    mlp_hidden_ratio: float = 8 / 3
    mlp_multiple_of: int = 64
    rope: bool = False  # the decoder; fla_swa and fla_samba's attention layers
    rope_base: float = 500000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02
    loss_chunk: int = 4096  # tokens per chunk of the LM head + cross-entropy (bounds fp32 logits memory)


# ``model.attention``: the kernel options of the decoder's attention, derived from ``AttentionOptions`` (one source:
# a new option there is a new key here). Every key defaults to null, which keeps the process default
# (AttentionOptions' own, with the FOX_* environment variables' overrides, docs/kernel.md); training/run.py turns
# the keys set into the options in force for the whole run. They choose kernels, not weights: a checkpoint loads and
# runs under any of them.
AttentionBackend = StrEnum("AttentionBackend", {b: b for b in BACKENDS if b is not None})

# ``model.attention.triton_configs``: fixed launch tiles ``[block_m, block_n, num_warps, num_stages]`` (the last two
# optional) of the Triton kernel named, instead of autotuning or the head dim's config; null: not fixed.
TileConfigs = make_dataclass("TileConfigs", [(kind, Optional[List[int]], None) for kind in KINDS])
TileConfigs.__module__ = __name__  # (make_dataclass names the module types; the configs pickle by this name)


def _attention_key(f: dataclasses.Field) -> tuple:
    """The schema key of the ``AttentionOptions`` field ``f``: (name, type, default), null by default."""
    if f.name == "backend":
        return f.name, Optional[AttentionBackend], None
    if f.name == "triton_configs":
        return f.name, TileConfigs, field(default_factory=TileConfigs)
    if f.name == "acp_grid":
        return f.name, Optional[List[int]], None
    if f.type in (bool, "bool"):
        return f.name, Optional[bool], None
    raise TypeError(f"AttentionOptions.{f.name} ({f.type}) has no schema type in forgetting_transformer/config.py")


AttentionConfig = make_dataclass("AttentionConfig", [_attention_key(f) for f in dataclasses.fields(AttentionOptions)])
AttentionConfig.__module__ = __name__


@dataclass
class DecoderConfig(ModelConfig):
    """``model/decoder_schema``: FoX, the Transformer and the paper's ablations (models/decoder.py)."""

    arch: DecoderArch = DecoderArch.decoder
    mixer: Mixer = Mixer.softmax
    path_w_rank: Optional[int] = 32  # PaTH: rank of the projection giving w_t; null: a full projection
    path_conv_size: int = 3  # PaTH: width of the causal convolution over w_t
    fgate: Fgate = Fgate.data_dependent
    fgate_init: Optional[list] = None  # [T_min, T_max]: forget-gate bias init by decay time constants
    qk_norm: bool = False
    qk_norm_eps: Optional[float] = None  # the QK-norm's eps (null: norm_eps); the released models: 1e-5
    output_gate: bool = False
    output_norm: bool = False
    output_norm_per_head: bool = False  # true: the output norm has H x head_dim weights (the released models)
    kv_shift: bool = False
    mlp_hidden_size: Optional[int] = None  # the SwiGLU width; null: mlp_hidden_ratio * d_model up to mlp_multiple_of
    acp: bool = False  # Adaptive Computation Pruning in the forget-gate attention ("auto" threshold)
    acp_eps: float = 4.5399929762484854e-05  # e^-10: ACP's bound on the attention weight pruned from any row
    acp_eviction: bool = False  # generation: drop cached keys decayed below ACP's threshold (docs/generation.md)
    attention: AttentionConfig = field(default_factory=AttentionConfig)


@dataclass
class FlaConfig(ModelConfig):
    """``model/fla_schema``: the paper's baselines on flash-linear-attention's token mixers (models/baselines.py).
    Defaults: the paper's settings."""

    arch: FlaArch = MISSING
    state_size: int = 128  # SSM state per head (Mamba-2) or per channel (Samba's Mamba: 16)
    expand: int = 2  # Mamba / Mamba-2 inner width = expand * d_model
    conv_size: int = 4  # causal short-convolution width (Mamba, Mamba-2, DeltaNet)
    linear_head_dim: int = 128  # DeltaNet q/k/v head width; HGRN2 state expansion (d_model / it heads)
    window_size: int = 2048  # sliding-window attention (fla_swa, fla_samba): keys per query, its own included
    ssd_kernel: SsdKernel = SsdKernel.auto
    # Samba: the SwiGLU width after the Mamba layers (after the attention layers: mlp_hidden_ratio)
    mamba_mlp_hidden_ratio: float = 2.0


class TextEscape(StrEnum):
    """``data.text_escape``: the escape applied to each document's text before it was tokenized
    (``forgetting_transformer.data.tokenizer.TEXT_ESCAPES``); evaluations and generation apply it to their text."""

    none = "none"  # the text as it is
    json = "json"  # json.dumps(text)[1:-1]: a newline is the two characters \n (LongCrawl64)


@dataclass
class PrepareConfig:
    """How the embedded corpus (or another local corpus) is turned into the LongCrawl64 layout on first use."""

    inputs: list = field(default_factory=list)  # files or dirs; empty = the embedded Gutenberg sample
    tokenizer: str = "train-bpe"  # train-bpe | gpt2 | path to a tokenizer.json
    vocab_size: int = 4096
    doc_len: int = 2048
    min_doc_tokens: Optional[int] = None
    heldout_docs: int = 2
    # files or dirs whose documents form the held-out split (then all inputs train)
    heldout_inputs: Optional[list] = None


@dataclass
class DataConfig:
    name: str = MISSING
    data_dir: str = MISSING  # holds train.zarr and heldout.zarr
    seq_len: int = MISSING
    vocab_size: int = MISSING
    bos_id: int = MISSING
    shuffle: bool = True
    skip_zero_rows: bool = False  # true: skip (and count) train sequences of all-zero rows instead of refusing them
    prepare: Optional[PrepareConfig] = None  # set: build data_dir from a corpus on first run (idempotent)
    text_escape: TextEscape = TextEscape.none  # how the text was escaped before tokenizing (json: LongCrawl64)


class OptimName(StrEnum):
    adamw = "adamw"


@dataclass
class OptimConfig:
    name: OptimName = OptimName.adamw
    lr: float = MISSING
    betas: list = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0


class ScheduleName(StrEnum):
    warmup_cosine = "warmup_cosine"


@dataclass
class ScheduleConfig:
    name: ScheduleName = ScheduleName.warmup_cosine
    warmup_tokens: int = MISSING
    total_tokens: int = MISSING
    min_lr_ratio: float = 0.0  # cosine decays to min_lr_ratio * lr


class StrategyName(StrEnum):
    single = "single"  # one process
    ddp = "ddp"  # DistributedDataParallel, under torchrun
    fsdp = "fsdp"  # FSDP2, under torchrun


class Device(StrEnum):
    auto = "auto"  # this rank's GPU if any, else the CPU
    cpu = "cpu"
    cuda = "cuda"


class MixedPrecision(StrEnum):
    auto = "auto"  # bf16 on CUDA, fp32 on CPU
    bf16 = "bf16"
    fp32 = "fp32"


class ActivationCheckpointing(StrEnum):
    none = "none"
    full = "full"  # every block
    selective = "selective"  # every ac_every-th block


class FsdpPrecision(StrEnum):
    """How FSDP runs in bf16 (strategy.mixed_precision on; in fp32 both compute the same)."""

    autocast = "autocast"  # fp32 parameters under bf16 autocast, as single and ddp (the official FoX training)
    bf16_params = "bf16_params"  # FSDP2 casts the parameters to bf16: bf16 all-gathers, bf16 residual stream


@dataclass
class StrategyConfig:
    name: StrategyName = StrategyName.single
    device: Device = Device.auto
    mixed_precision: MixedPrecision = MixedPrecision.auto
    activation_checkpointing: ActivationCheckpointing = ActivationCheckpointing.none
    ac_every: int = 2
    compile: bool = False  # torch.compile each block
    # true: torch.use_deterministic_algorithms for the run, so that GPU steps repeat bit for bit (warn_only: an op
    # without a deterministic kernel warns instead): the FoX attention backward runs its two deterministic kernels
    # instead of the one-kernel backward (docs/kernel.md), cuBLAS a fixed workspace; some speed for it.
    # model.attention.deterministic=true asks for the attention's deterministic backward alone.
    deterministic: bool = False
    # fsdp only: false keeps each block's gathered parameters from its forward to its backward (one all-gather
    # per block per step instead of two, for the memory of the unsharded parameters)
    reshard_after_forward: bool = True
    fsdp_prefetch: int = 0  # fsdp only: >0: each block starts the next N blocks' all-gathers (0: FSDP2's default)
    # fsdp only: how bf16 is computed, autocast or bf16_params (configs/strategy/fsdp.yaml's default); single and
    # ddp always autocast, so they take this default alone
    fsdp_precision: FsdpPrecision = FsdpPrecision.autocast


class NonFinite(StrEnum):
    stop = "stop"  # raise, naming the step and the last good checkpoint
    skip = "skip"  # drop that update and go on


@dataclass
class TrainConfig:
    batch_size: int = MISSING  # sequences per optimizer step, over all ranks
    micro_batch_size: int = MISSING  # sequences per forward pass per rank
    log_every: int = 10
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    max_steps: Optional[int] = None  # stop early (the schedule still follows schedule.total_tokens)
    nonfinite: NonFinite = NonFinite.stop  # what a NaN/inf gradient norm (or loss) does
    peak_tflops: Optional[float] = None  # per-device peak for MFU; default: looked up by GPU name (none on CPU)


@dataclass
class EvalConfig:
    heldout_batches: Optional[int] = None  # the first batches of heldout.zarr for the held-out loss; null: all of it
    per_token_loss: bool = True  # after training: L(i) over heldout rows, saved and plotted
    per_token_rows: int = 8  # rows spread evenly over heldout.zarr (all when it has fewer)
    per_token_len: Optional[int] = None  # default: the rows' full length (may exceed data.seq_len)
    window: int = 101


class WandbMode(StrEnum):
    disabled = "disabled"
    offline = "offline"
    online = "online"


@dataclass
class WandbConfig:
    mode: WandbMode = WandbMode.disabled
    project: str = "forgetting-transformer"
    name: Optional[str] = None


class ResumeChanges(StrEnum):
    """``resume_changes``: what a resume may change of the keys that change a run's computation
    (training/changes.py)."""

    refuse = "refuse"  # a resume whose config changes one of them is refused, naming each
    allow = "allow"  # each change applies from the step the run resumes at, recorded in config_changes.jsonl


@dataclass
class Config:
    model: Any = MISSING  # a DecoderConfig or a FlaConfig (typed Any: a ModelConfig field would keep its base types)
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    schedule: ScheduleConfig = MISSING
    strategy: StrategyConfig = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    output_dir: str = MISSING
    cache_dir: str = MISSING
    seed: int = 0
    resume: bool = False
    overwrite: bool = False  # true: delete the run already in output_dir (without resume) before starting
    resume_changes: ResumeChanges = ResumeChanges.refuse  # allow: a resume may change the computation's keys


# (group, name) -> schema: a YAML file of the group extends one with ``defaults: [<name>, _self_]``
SCHEMAS = {("model", "decoder_schema"): DecoderConfig, ("model", "fla_schema"): FlaConfig,
           ("data", "data_schema"): DataConfig, ("optim", "optim_schema"): OptimConfig,
           ("schedule", "schedule_schema"): ScheduleConfig, ("strategy", "strategy_schema"): StrategyConfig}


def register_configs() -> None:
    """Register the schemas in Hydra's ConfigStore: ``config_schema`` (the whole tree) and those of ``SCHEMAS``."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for (group, name), schema in SCHEMAS.items():
        cs.store(group=group, name=name, node=schema)


class ConfigError(ValueError):
    """A config value is invalid; the message names the key."""


def _require(cond: bool, key: str, value: Any, why: str) -> None:
    if not cond:
        raise ConfigError(f"invalid config: {key}={value!r}: {why}")


def _validate_model(m) -> int:
    """The keys of every model; returns the number of heads."""
    for key in ("vocab_size", "n_layers", "d_model", "head_dim", "loss_chunk"):
        _require(m[key] > 0, f"model.{key}", m[key], "must be > 0")
    _require(m.n_heads is not None or m.d_model % m.head_dim == 0, "model.head_dim", m.head_dim,
             f"must divide model.d_model={m.d_model} (or set model.n_heads)")
    n_heads = m.n_heads or m.d_model // m.head_dim
    _require(n_heads > 0, "model.n_heads", m.n_heads, "must be > 0")
    if m.n_kv_heads is not None:
        _require(m.n_kv_heads > 0 and n_heads % m.n_kv_heads == 0, "model.n_kv_heads", m.n_kv_heads,
                 f"must divide the number of heads ({n_heads})")
    _require(m.rope_base > 0, "model.rope_base", m.rope_base, "must be > 0")
    _require(not m.rope or m.head_dim % 2 == 0, "model.head_dim", m.head_dim, "must be even with model.rope")
    return n_heads


def _validate_decoder(m, strategy) -> None:
    """The decoder's keys (models/decoder.py)."""
    if m.fgate in (Fgate.data_independent, Fgate.fixed):
        _require(m.fgate_init is not None, "model.fgate_init", m.fgate_init,
                 f"model.fgate={m.fgate} needs [T_min, T_max] to initialise the gate biases")
    if m.fgate_init is not None:
        _require(m.fgate != Fgate.none, "model.fgate_init", list(m.fgate_init), "needs a forget gate (model.fgate)")
        _require(len(m.fgate_init) == 2 and 1 < m.fgate_init[0] <= m.fgate_init[1], "model.fgate_init",
                 list(m.fgate_init), "must be [T_min, T_max] with 1 < T_min <= T_max")
    _require(not m.acp or m.fgate != Fgate.none, "model.acp", m.acp, "prunes by forget-gate decay: needs model.fgate")
    _require(m.qk_norm_eps is None or m.qk_norm_eps > 0, "model.qk_norm_eps", m.qk_norm_eps, "must be > 0 or null")
    _require(m.mlp_hidden_size is None or m.mlp_hidden_size > 0, "model.mlp_hidden_size", m.mlp_hidden_size,
             "must be > 0 or null")
    _require(0 < m.acp_eps < 1, "model.acp_eps", m.acp_eps, "must be in (0, 1)")
    _require(not m.acp_eviction or (m.fgate != Fgate.none and m.qk_norm), "model.acp_eviction", m.acp_eviction,
             "evicts by forget-gate decay with a threshold from the QK-norm weights: needs model.fgate and "
             "model.qk_norm")
    if m.mixer == Mixer.path:
        _validate_path(m)
    _require(m.attention.deterministic is not False or not strategy.deterministic, "model.attention.deterministic",
             False, "strategy.deterministic=true makes every op deterministic, the attention's backward included; "
             "leave it null (or true)")


def _validate_path(m) -> None:
    """PaTH's keys (models/path.py): the Householder transforms carry the position, fla's kernel prunes nothing."""
    for key, why in (("rope", "the Householder transforms carry the position"),
                     ("acp", "fla's PaTH kernel has no pruning"),
                     ("acp_eviction", "the static generation path has no PaTH cache")):
        _require(not m[key], f"model.{key}", m[key], f"must be false with model.mixer=path: {why}")
    _require(m.head_dim in PATH_HEAD_DIMS, "model.head_dim", m.head_dim,
             f"must be one of {PATH_HEAD_DIMS} with model.mixer=path (fla's PaTH kernel)")
    _require(m.path_w_rank is None or m.path_w_rank > 0, "model.path_w_rank", m.path_w_rank,
             "must be > 0, or null for a full-rank projection")
    _require(m.path_conv_size > 0, "model.path_conv_size", m.path_conv_size, "must be > 0")


def _validate_fla(m, n_heads: int) -> None:
    """The fla baselines' keys (models/baselines.py)."""
    for key in ("state_size", "expand", "window_size"):
        _require(m[key] > 0, f"model.{key}", m[key], "must be > 0")
    _require(m.conv_size >= 2, "model.conv_size", m.conv_size, "must be >= 2")
    _require(m.mamba_mlp_hidden_ratio > 0, "model.mamba_mlp_hidden_ratio", m.mamba_mlp_hidden_ratio, "must be > 0")
    if m.arch in (FlaArch.fla_deltanet, FlaArch.fla_hgrn2):
        _require(m.linear_head_dim > 0 and m.d_model % m.linear_head_dim == 0, "model.linear_head_dim",
                 m.linear_head_dim, f"must divide model.d_model={m.d_model}")
    if m.arch == FlaArch.fla_mamba2:
        _require(m.n_heads is None, "model.n_heads", m.n_heads,
                 "must be null for fla_mamba2 (heads = model.expand * model.d_model / model.head_dim)")
        _require(m.expand * m.d_model % m.head_dim == 0, "model.head_dim", m.head_dim,
                 f"must divide model.expand * model.d_model = {m.expand * m.d_model}")
    if m.arch in (FlaArch.fla_swa, FlaArch.fla_samba):
        _require(m.n_kv_heads is None or m.n_kv_heads == n_heads, "model.n_kv_heads", m.n_kv_heads,
                 f"GQA is not implemented for {m.arch}; leave it null")
    else:
        _require(not m.rope, "model.rope", m.rope, f"{m.arch} has no attention layers to rotate")


def unknown_key_error(full_key: str, schema: type) -> ConfigError:
    """The error for ``full_key``, a key its parent's schema (a dataclass) does not have: it names the schema's
    nearest key by spelling (difflib), or its keys when none is near."""
    import dataclasses
    import difflib

    parent, _, key = full_key.rpartition(".")
    keys = [f.name for f in dataclasses.fields(schema)]
    near = difflib.get_close_matches(key, keys, n=1)
    hint = f"did you mean {parent + '.' if parent else ''}{near[0]}?" if near else f"its keys: {', '.join(keys)}"
    return ConfigError(f"invalid config: {full_key}: no such key in {schema.__name__}; {hint}")


def check_known_keys(node, prefix: str = "", ignore: tuple = ()) -> None:
    """Refuse a key that the schema of its node lacks, in ``node`` and the nodes below it (but the top-level keys
    in ``ignore``, e.g. Hydra's own ``hydra``). Hydra's struct mode refuses ``key=value`` for an unknown key, but
    ``+key=value`` and ``++key=value`` add one without a word; a node without a schema (a plain dict) takes any
    key."""
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return
    known = {f.name for f in dataclasses.fields(schema)}
    for key in node:
        if key in ignore:
            continue
        if key not in known:
            raise unknown_key_error(f"{prefix}{key}", schema)
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not (child._is_none() or child._is_missing()):
            check_known_keys(child, f"{prefix}{key}.")


def validate(cfg) -> None:
    """Check the keys and values Hydra's types cannot; every error names the offending key and value."""
    from omegaconf import OmegaConf

    check_known_keys(cfg)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"missing required config value(s): {', '.join(missing)} (set them on the command line, "
                          f"e.g. {missing[0]}=...)")
    m, d, o, s, st, t = cfg.model, cfg.data, cfg.optim, cfg.schedule, cfg.strategy, cfg.train
    if OmegaConf.get_type(m) not in (DecoderConfig, FlaConfig):  # an untyped model config: no key is checked
        raise ConfigError(f"invalid config: model {m.get('name')!r} extends no model schema: its defaults list "
                          "must start with decoder_schema or fla_schema")
    n_heads = _validate_model(m)
    if m.arch == DecoderArch.decoder:
        _validate_decoder(m, st)
    else:
        _validate_fla(m, n_heads)
    _require(m.vocab_size == d.vocab_size, "model.vocab_size", m.vocab_size,
             f"must equal data.vocab_size={d.vocab_size}")
    _require(0 <= d.bos_id < d.vocab_size, "data.bos_id", d.bos_id, f"must be in [0, data.vocab_size={d.vocab_size})")
    _require(d.seq_len > 0, "data.seq_len", d.seq_len, "must be > 0")
    _require(o.lr > 0, "optim.lr", o.lr, "must be > 0")
    _require(len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas), "optim.betas", list(o.betas),
             "must be two values in [0, 1)")
    _require(o.weight_decay >= 0, "optim.weight_decay", o.weight_decay, "must be >= 0")
    _require(o.grad_clip > 0, "optim.grad_clip", o.grad_clip, "must be > 0 (use a large value to disable)")
    _require(s.total_tokens > 0, "schedule.total_tokens", s.total_tokens, "must be > 0")
    _require(0 <= s.warmup_tokens <= s.total_tokens, "schedule.warmup_tokens", s.warmup_tokens,
             f"must be in [0, schedule.total_tokens={s.total_tokens}]")
    _require(0 <= s.min_lr_ratio <= 1, "schedule.min_lr_ratio", s.min_lr_ratio, "must be in [0, 1]")
    _require(st.ac_every > 0, "strategy.ac_every", st.ac_every, "must be > 0")
    _require(st.fsdp_prefetch >= 0, "strategy.fsdp_prefetch", st.fsdp_prefetch, "must be >= 0")
    plain = OmegaConf.to_container(st, enum_to_str=True)  # an Enum's value reads as its name in the message
    for key, default in (("fsdp_prefetch", 0), ("reshard_after_forward", True), ("fsdp_precision", "autocast")):
        _require(st.name == StrategyName.fsdp or plain[key] == default, f"strategy.{key}", plain[key],
                 f"only applies to strategy.name=fsdp (got strategy.name={st.name})")
    _require(t.micro_batch_size > 0, "train.micro_batch_size", t.micro_batch_size, "must be > 0")
    _require(t.batch_size > 0 and t.batch_size % t.micro_batch_size == 0, "train.batch_size", t.batch_size,
             f"must be a positive multiple of train.micro_batch_size={t.micro_batch_size}")
    for key in ("log_every", "checkpoint_every", "keep_checkpoints"):
        _require(t[key] > 0, f"train.{key}", t[key], "must be > 0")
    _require(t.max_steps is None or t.max_steps > 0, "train.max_steps", t.max_steps, "must be > 0 or null")
    _require(cfg.eval.window > 0 and cfg.eval.window % 2 == 1, "eval.window", cfg.eval.window, "must be odd and > 0")
    _require(cfg.eval.heldout_batches is None or cfg.eval.heldout_batches > 0, "eval.heldout_batches",
             cfg.eval.heldout_batches, "must be > 0, or null for the whole held-out split")
