"""One place that turns a training run directory into a model (and its config) for evaluation."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from forgetting_transformer.models import build_model
from forgetting_transformer.training.checkpoint import checkpoint_dirs, load_model_weights


def load_run(run_dir: str | Path, *, step: int | None = None, device: str | torch.device = "cpu"):
    """Build the run's model from ``run_dir/config.yaml`` and load the weights of checkpoint ``step``
    (default: the latest). Returns ``(model, cfg, checkpoint_path)`` with the model in eval mode."""
    run_dir = Path(run_dir)
    cfg_file = run_dir / "config.yaml"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{cfg_file} not found: pass a run directory written by train.py")
    cfg = OmegaConf.load(cfg_file)
    ckpts = checkpoint_dirs(run_dir / "checkpoints")
    if step is not None:
        ckpts = [c for c in ckpts if c.name == f"step_{step:08d}"]
    if not ckpts:
        what = f"step {step}" if step is not None else "any checkpoint"
        raise FileNotFoundError(f"no complete checkpoint ({what}) under {run_dir / 'checkpoints'}")
    model = build_model(cfg.model)
    load_model_weights(model, ckpts[-1])
    return model.to(device).eval(), cfg, ckpts[-1]
