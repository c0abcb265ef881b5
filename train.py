"""Pretrain a Forgetting Transformer (or any registered model) on LongCrawl64-format data.

    python train.py                                   # tiny FoX (Pro) on the embedded corpus, CPU-friendly
    python train.py model=fox_llama optim.lr=1e-3     # any Hydra override
    python train.py output_dir=outputs/run1 resume=true
    torchrun --nproc_per_node=8 train.py strategy=fsdp      # FSDP2 over 8 GPUs (gloo ranks on CPU)

Builds everything from the config, trains with AdamW + warmup/cosine (in tokens) and gradient accumulation,
logs one line and one metrics.jsonl row per log step, checkpoints atomically, and finishes with a held-out
loss and a per-token-loss plot. The phases live in forgetting_transformer/training/loop.py, what surrounds them
(the checked config, the run directory, train.log, the process group, errors, preemption) in training/run.py.
"""

from __future__ import annotations

import hydra

from forgetting_transformer.config import register_configs
from forgetting_transformer.training.loop import build, evaluate, train
from forgetting_transformer.training.run import RunContext, one_line_errors, run

register_configs()


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    """One training run of ``cfg`` in its own output directory: ``pretrain``, inside ``run``."""
    run(cfg, pretrain)


def pretrain(cfg, ctx: RunContext) -> None:
    """Build → train → evaluate."""
    setup = build(cfg, ctx)  # data, model, optimizer, train state (resumed from the newest loadable checkpoint)
    train(cfg, ctx, setup)  # optimizer steps to the token budget: log rows, checkpoints
    evaluate(cfg, ctx, setup)  # held-out loss; per-token loss, saved and plotted
    ctx.metrics.say(f"done in {ctx.elapsed():.0f} s: held-out loss {setup.heldout:.4f} over {setup.heldout_covers}"
                    if setup.heldout_covers else f"done in {ctx.elapsed():.0f} s")


if __name__ == "__main__":
    one_line_errors()
    main()
