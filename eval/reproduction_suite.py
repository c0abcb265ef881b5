"""The reproduction suite's runs: every part's training runs (``scripts/reproduce.py --parts``; the parts are
listed in its docstring), the learning rates and seeds they train at, and the Pro models' legacy definition."""

from __future__ import annotations

from dataclasses import dataclass, field

SWEEP = {"lr": (1e-3, 2e-3), "lr-wide": (5e-4, 4e-3)}
# The LLaMA pair's own sweep: with main's run at the Pro picks, each model has the Pro sweep's four rates
LLAMA_SWEEP = {"fox_llama": (5e-4, 2e-3, 4e-3), "transformer_llama": (5e-4, 1e-3, 4e-3)}


@dataclass
class Run:
    """One training run of the suite and the evaluations that follow it."""

    label: str  # model or ablation name, e.g. fox_pro, fox_pro_no_kv_shift
    model: str  # the preset's model: experiment=books/<model>_125m
    family: str  # fox | transformer: whose learning-rate pick it trains at
    part: str
    seed: int = 0
    lr: float | None = None  # None: the family's pick of the sweep
    overrides: list = field(default_factory=list)
    niah: bool = False
    gates: bool = False  # F / A maps of a held-out book (ACP statistics: every run with a forget gate)
    acp_trajectory: bool = False
    retrieval: bool = False  # the retrieval probes (eval.retrieval): the needle's gain and the passkey's rank
    frontier: bool = False  # the eviction frontier (eval.eviction.frontier): loss against KV cache kept
    shards: tuple[str, ...] | None = None  # train shards other than the suite's --shards (the long part's)
    pruning: bool = False  # ACP's pruned tile share over PRUNING_ROWS held-out rows (eval.gates.pruning)
    back_to_back: str | None = None  # runs with one key train one after another on a GPU with nothing beside them

    def name(self, lr: float) -> str:
        return f"{self.label}-lr{lr:g}-s{self.seed}"


def _sweep() -> list[Run]:
    return [Run(m, m, m.split("_")[0], part, lr=lr) for part, lrs in SWEEP.items() for lr in lrs
            for m in ("fox_pro", "transformer_pro")]


def _main() -> list[Run]:
    return [Run("fox_pro", "fox_pro", "fox", "main", seed=1, niah=True, gates=True),
            Run("transformer_pro", "transformer_pro", "transformer", "main", seed=1, niah=True),
            Run("fox_llama", "fox_llama", "fox", "main", niah=True, gates=True),
            Run("transformer_llama", "transformer_llama", "transformer", "main", niah=True)]


def _lr_llama() -> list[Run]:
    return [Run(m, m, m.split("_")[0], "lr-llama", lr=lr) for m, lrs in LLAMA_SWEEP.items() for lr in lrs]


def _ablations() -> list[Run]:
    return [Run(f"fox_pro_no_{switch}", "fox_pro", "fox", "ablations", overrides=[f"model.{switch}=false"])
            for switch in ("kv_shift", "output_gate", "output_norm", "qk_norm")]


def _gates() -> list[Run]:
    return [Run("fox_pro_data_independent", "fox_pro_data_independent", "fox", "gates"),
            Run("fox_pro_fixed", "fox_pro_fixed", "fox", "gates"), Run("fox_pro_rope", "fox_pro_rope", "fox", "gates"),
            Run("transformer_llama_no_rope", "transformer_llama", "transformer", "gates",
                overrides=["model.rope=false"])]


def _acp() -> list[Run]:
    return [Run("fox_pro_acp", "fox_pro", "fox", "acp", seed=seed, overrides=["model.acp=true"],
                acp_trajectory=seed == 0) for seed in (0, 1)]


def _path() -> list[Run]:
    return [Run(m, m, "fox", "path", niah=True) for m in ("path_pro", "path_fox_pro")]


def _released() -> list[Run]:
    probes = dict(retrieval=True, frontier=True)  # (seeds 0-2 trained before the probes and the frontier existed)
    return [run for seed in RELEASED_SEEDS for run in (
        Run("fox_pro_released", "fox_pro", "fox", "released", seed=seed, **probes),
        Run("transformer_pro_released", "transformer_pro", "transformer", "released", seed=seed, **probes),
        Run("fox_pro_released_no_kv_shift", "fox_pro", "fox", "released", seed=seed,
            overrides=["model.kv_shift=false"]))]


def _long() -> list[Run]:
    longer = [f"schedule.total_tokens={LONG * BOOKS_TOKENS}", f"schedule.warmup_tokens={LONG * BOOKS_WARMUP}"]
    models = (("fox_pro_released", "fox_pro", "fox", []),
              ("transformer_pro_released", "transformer_pro", "transformer", []),
              ("fox_pro_released_no_kv_shift", "fox_pro", "fox", ["model.kv_shift=false"]))
    return [Run(f"{label}_{LONG}x", model, family, "long", seed=seed, overrides=[*ovr, *longer], shards=LONG_SHARDS)
            for seed in LONG_SEEDS for label, model, family, ovr in models]


def _acp_released() -> list[Run]:
    runs = []
    for seed in ACP_RELEASED_SEEDS:  # a dense run timed just before the ACP run, on the same GPU
        timed = f"acp-released-s{seed}" if seed in ACP_TIMED_SEEDS else None
        if timed:
            runs.append(Run("fox_pro_released_dense", "fox_pro", "fox", "acp-released", seed=seed, back_to_back=timed))
        runs.append(Run("fox_pro_released_acp", "fox_pro", "fox", "acp-released", seed=seed,
                        overrides=["model.acp=true"], pruning=True, back_to_back=timed))
    return runs


def _acp_16k() -> list[Run]:
    return [Run(f"fox_pro_released_{kind}_16k", "fox_pro", "fox", "acp-16k", overrides=[*CONTEXT_16K, *acp],
                pruning=bool(acp), back_to_back="acp-16k-s0")
            for kind, acp in (("dense", []), ("acp", ["model.acp=true"]))]


def _path_released() -> list[Run]:  # PaTH on the released definition, paired with the released pair
    return [Run(f"{m}_released", m, "fox", "path-released", seed=seed) for seed in PATH_SEEDS for m in PATH_MODELS]


def _path_lr() -> list[Run]:
    return [Run(f"{m}_released", m, "fox", "path-lr", lr=lr) for m in PATH_MODELS for lr in PATH_LRS]


def _released_gates() -> list[Run]:  # Table 3's gates and RoPE: the presets now train the released models
    return [run for seed in RELEASED_ABLATION_SEEDS for run in (
        *(Run(f"fox_pro_released_{kind}", f"fox_pro_{kind}", "fox", "released-gates", seed=seed)
          for kind in ("data_independent", "fixed", "rope")),
        Run("transformer_llama_no_rope", "transformer_llama", "transformer", "released-gates", seed=seed,
            lr=LLAMA_PICK, overrides=["model.rope=false"]))]


def _released_ablations() -> list[Run]:
    return [Run(f"fox_pro_released_no_{switch}", "fox_pro", "fox", "released-ablations", seed=seed,
                overrides=[f"model.{switch}=false"])
            for seed in RELEASED_ABLATION_SEEDS for switch in ("output_gate", "output_norm", "qk_norm")]


def _llama_seeds() -> list[Run]:
    return [Run(m, m, m.split("_")[0], "llama-seeds", seed=seed, lr=LLAMA_PICK) for seed in LLAMA_SEEDS
            for m in LLAMA_SWEEP]


def _baselines() -> list[Run]:
    return [Run(m, m, "baseline", "baselines", lr=lr) for m, lrs in BASELINE_LRS.items() for lr in lrs]


def _baseline_seeds() -> list[Run]:
    return [Run(m, m, "baseline", "baseline-seeds", seed=seed, lr=lr) for m, lr in BASELINE_PICK.items()
            for seed in BASELINE_SEEDS]


def _tmax() -> list[Run]:  # seed-major: a first pass over every T_max at seed 0
    return [Run(f"fox_pro_released_{kind}_tmax{t}", f"fox_pro_{kind}", "fox", "tmax", seed=seed,
                overrides=[f"model.fgate_init=[{TMIN},{t}]"])
            for seed in TMAX_SEEDS for t in TMAX for kind in ("data_independent", "fixed")]


def _train_lengths() -> list[Run]:  # the released pair at shorter contexts, the same tokens per step
    return [Run(f"{label}_ctx{n}", model, family, "train-lengths", seed=seed,
                overrides=[f"data.seq_len={n}", f"train.batch_size={STEP_TOKENS // n}",
                           f"train.micro_batch_size={STEP_TOKENS // n // 2}"])
            for seed in LENGTH_SEEDS for n in TRAIN_LENGTHS for label, model, family in (
                ("fox_pro_released", "fox_pro", "fox"), ("transformer_pro_released", "transformer_pro", "transformer"))]


# every part's runs, in the suite's order (the parts themselves: the module docstring)
BUILDERS = (_sweep, _main, _lr_llama, _ablations, _gates, _acp, _path, _released, _long, _acp_released, _acp_16k,
            _path_released, _path_lr, _released_gates, _released_ablations, _llama_seeds, _baselines, _baseline_seeds,
            _tmax, _train_lengths)
LEGACY_PARTS = ("lr", "lr-wide", "main", "ablations", "gates", "acp", "path")  # trained before the released models


def suite() -> list[Run]:
    """Every run of the suite, part by part. The Pro models of the parts trained before the presets became the
    released models keep the definition they trained with (``LEGACY_OVERRIDES``)."""
    runs = [run for build in BUILDERS for run in build()]
    for run in runs:
        if run.part in LEGACY_PARTS and run.model in LEGACY_PRO:
            run.overrides = [*LEGACY_OVERRIDES, *run.overrides]
    return runs


PARTS = ("lr", "lr-wide", "main", "lr-llama", "ablations", "gates", "acp", "path", "released", "released-ablations",
         "llama-seeds", "baselines", "baseline-seeds", "long", "acp-released", "acp-16k", "released-gates",
         "path-released", "path-lr", "tmax", "train-lengths")
# The Pro models of every part but "released" keep the definition they were trained with: the output norm's
# weights shared across heads and the QK-norm eps equal to norm_eps (1e-6). The released models' (the presets
# now): per-head output-norm weights, QK-norm eps 1e-5 (docs/official.md).
LEGACY_PRO = ("fox_pro", "transformer_pro", "fox_pro_data_independent", "fox_pro_fixed", "fox_pro_rope", "path_pro",
              "path_fox_pro")
LEGACY_OVERRIDES = ("model.output_norm_per_head=false", "model.qk_norm_eps=null")
RELEASED_SEEDS, RELEASED_ABLATION_SEEDS = (0, 1, 2, 3, 4), (0, 1, 2)
LLAMA_PICK, LLAMA_SEEDS = 1e-3, (1, 2)  # both LLaMA models' best rate of their own sweep (lr-llama)
# the paper's 2e-3 and either side, and one rate past an end of the grid that came out best; seeds 1 and 2 at a best
# rate that is inside its grid
BASELINE_LRS = {"mamba2": (1e-3, 2e-3, 4e-3, 8e-3), "hgrn2": (5e-4, 1e-3, 2e-3, 4e-3), "deltanet": (1e-3, 2e-3, 4e-3)}
BASELINE_PICK, BASELINE_SEEDS = {"mamba2": 4e-3, "hgrn2": 1e-3, "deltanet": 2e-3}, (1, 2)
# models that need a GPU to themselves whatever --gpus says: fla's Mamba-2 peaks at 107 GiB on an H200 (micro-batch
# 16 x 4k), so a job beside it runs out of memory
ALONE = ("mamba2",)
BOOKS_TOKENS, BOOKS_WARMUP = 52_428_800, 5_242_880  # the protocol's tokens and warmup (experiment/shared/books.yaml)
LONG, LONG_SHARDS, LONG_SEEDS = 4, tuple(f"train-{i:02d}" for i in range(6)), (0, 1)  # the long part
# ACP on the released FoX (Pro): its seeds, and those whose ACP run trains right after a dense twin on one GPU
ACP_RELEASED_SEEDS, ACP_TIMED_SEEDS, PRUNING_ROWS = (0, 1, 2), (0, 1), 64
# PaTH (Pro) and PaTH-FoX (Pro) on the released definition: their seeds, and the rates either side of the FoX pick
PATH_MODELS, PATH_SEEDS, PATH_LRS = ("path_pro", "path_fox_pro"), (0, 1, 2), (5e-4, 2e-3)
# the acp-16k pair: 16,384-token context at the protocol's 131,072 tokens per step (8 sequences, 4 per micro-batch)
CONTEXT_16K = ("data.seq_len=16384", "train.batch_size=8", "train.micro_batch_size=4")
# the T_max sweep of the data-independent and fixed gates (the paper fixes T_min = 2; the presets' T_max is 256)
TMIN, TMAX, TMAX_SEEDS = 2, (32, 2048, 16384), (0, 1, 2)
# the released pair trained at shorter contexts, the protocol's 131,072 tokens per step (2 micro-batches)
STEP_TOKENS, TRAIN_LENGTHS, LENGTH_SEEDS = 131_072, (1024, 2048), (0, 1, 2)
