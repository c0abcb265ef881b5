"""Pretrain a Forgetting Transformer (or any registered model) on LongCrawl64-format data.

    python train.py                                   # tiny FoX (Pro) on the embedded corpus, CPU-friendly
    python train.py model=fox_llama optim.lr=1e-3     # any Hydra override
    python train.py output_dir=outputs/run1 resume=true

Builds everything from the config, trains with AdamW + warmup/cosine (in tokens) and gradient accumulation,
logs one line and one metrics.jsonl row per log step, checkpoints atomically, and finishes with a held-out
loss and a per-token-loss plot. Model, data, optimizer and checkpoint code live in forgetting_transformer/.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from pathlib import Path

import hydra
import torch
from omegaconf import OmegaConf

from eval.per_token_loss.plot import plot_per_token_loss
from forgetting_transformer.config import register_configs, validate
from forgetting_transformer.data import LongCrawl64Dataset, ensure_data, read_rows
from forgetting_transformer.models import build_model, resolve_heads
from forgetting_transformer.training.checkpoint import TrainState, latest_checkpoint, load_checkpoint, save_checkpoint
from forgetting_transformer.training.evaluate import autocast_context, heldout_loss, per_token_loss
from forgetting_transformer.training.metrics import (MetricsLogger, flops_per_token, matmul_params, peak_flops,
                                                     peak_memory_gib)
from forgetting_transformer.training.optim import build_optimizer
from forgetting_transformer.training.schedule import lr_at

register_configs()


def setup_wandb(cfg, out: Path):
    if cfg.wandb.mode == "disabled":
        return None
    import wandb

    # The run id is stored beside the checkpoints so a resumed run continues the same wandb run.
    id_file = out / "wandb_id.txt"
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
    id_file.write_text(run_id)
    return wandb.init(mode=cfg.wandb.mode, project=cfg.wandb.project, name=cfg.wandb.name or out.name, id=run_id,
                      resume="allow", dir=str(out), config=OmegaConf.to_container(cfg, resolve=True))


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    OmegaConf.resolve(cfg)  # fix ${now:...} and friends once, so the saved config is the one that ran
    validate(cfg)
    out = Path(cfg.output_dir).resolve()
    ckpt_root = out / "checkpoints"
    if latest_checkpoint(ckpt_root) is not None and not cfg.resume:
        raise FileExistsError(f"{out} already holds checkpoints; pass resume=true to continue it, "
                              "or choose another output_dir")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    print(f"output dir: {out}", flush=True)

    device = torch.device("cuda" if cfg.strategy.device == "auto" and torch.cuda.is_available()
                          else "cpu" if cfg.strategy.device == "auto" else cfg.strategy.device)
    mixed = cfg.strategy.mixed_precision == "bf16" or (cfg.strategy.mixed_precision == "auto" and device.type == "cuda")
    torch.manual_seed(cfg.seed)

    # Data: prepare the corpus on first use (idempotent), then read seq_len chunks of train.zarr rows.
    data_dir = ensure_data(cfg.data, cache_dir=cfg.cache_dir)
    train, mb = cfg.train, cfg.train.micro_batch_size
    accum = train.batch_size // mb
    data_kw = dict(vocab_size=cfg.data.vocab_size, bos_id=cfg.data.bos_id)
    train_data = LongCrawl64Dataset(data_dir / "train.zarr", cfg.data.seq_len, mb, shuffle=cfg.data.shuffle,
                                    seed=cfg.seed, **data_kw)

    model = build_model(cfg.model).to(device)
    optimizer = build_optimizer(model, cfg.optim)
    state = TrainState(model, optimizer, train_data)
    metrics = MetricsLogger(out / "metrics.jsonl")
    if cfg.resume and (ckpt := latest_checkpoint(ckpt_root)) is not None:
        load_checkpoint(state, ckpt)
        metrics.truncate_after(state.step)  # rows after the checkpoint are redone identically below
        print(f"resumed from {ckpt} (step {state.step}, {state.tokens:,} tokens)", flush=True)
    metrics.wandb_run = setup_wandb(cfg, out)

    tokens_per_step = train.batch_size * cfg.data.seq_len
    total_steps = math.ceil(cfg.schedule.total_tokens / tokens_per_step)
    if train.max_steps is not None:
        total_steps = min(total_steps, train.max_steps)
    n_params = sum(p.numel() for p in model.parameters())
    head_dim, n_heads, _ = resolve_heads(cfg.model)
    flops_tok = flops_per_token(matmul_params(model), cfg.model.n_layers, n_heads, head_dim, cfg.data.seq_len)
    peak = peak_flops(device)
    print(f"model {cfg.model.name}: {n_params / 1e6:.2f}M parameters | device {device} | bf16 {mixed} | "
          f"{total_steps} steps of {tokens_per_step:,} tokens ({accum} micro-batches of {mb})", flush=True)

    t_log, tokens_log = time.perf_counter(), state.tokens
    while state.step < total_steps:
        lr = lr_at(state.tokens + tokens_per_step, cfg.optim, cfg.schedule)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=device)
        for _ in range(accum):
            x, y = train_data.next_batch()  # (mb, T) int64 each
            with autocast_context(device, mixed):
                loss = model(x.to(device), y.to(device)).mean()  # per-token (mb, T) → scalar
            (loss / accum).backward()
            loss_sum += loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.tokens += tokens_per_step

        if state.step % train.log_every == 0 or state.step == total_steps:
            loss_val = (loss_sum / accum).item()
            if not math.isfinite(loss_val):
                last = latest_checkpoint(ckpt_root)
                raise FloatingPointError(f"loss is {loss_val} at step {state.step}; last good checkpoint: {last}")
            dt = time.perf_counter() - t_log
            tok_s = (state.tokens - tokens_log) / dt
            metrics.log({"step": state.step, "loss": loss_val, "grad_norm": grad_norm.item(), "lr": lr,
                         "tokens": state.tokens, "tokens_per_s": tok_s, "tflops": tok_s * flops_tok / 1e12,
                         "mfu": tok_s * flops_tok / peak if peak else None, "memory_gib": peak_memory_gib(device)})
            t_log, tokens_log = time.perf_counter(), state.tokens
        if state.step % train.checkpoint_every == 0 or state.step == total_steps:
            save_checkpoint(state, ckpt_root, keep=train.keep_checkpoints)

    # Held-out loss on the first batches of heldout.zarr, then L(i) over whole held-out rows.
    heldout = LongCrawl64Dataset(data_dir / "heldout.zarr", cfg.data.seq_len, mb, shuffle=False, **data_kw)
    result = {"step": state.step, "heldout_loss": heldout_loss(model, heldout, cfg.eval.heldout_batches,
                                                               device=device, mixed_precision=mixed)}
    metrics.log(result)
    if cfg.eval.per_token_loss:
        length = cfg.eval.per_token_len or heldout.doc_len
        rows = list(range(min(cfg.eval.per_token_rows, heldout.num_rows)))
        inputs, labels = read_rows(data_dir / "heldout.zarr", rows, length, **data_kw)  # (N, length) each
        curve = per_token_loss(model, inputs, labels, batch_size=mb, device=device, mixed_precision=mixed)
        ptl = out / "per_token_loss.json"
        ptl.write_text(json.dumps({"name": cfg.model.name, "train_len": cfg.data.seq_len, "step": state.step,
                                   "rows": rows, "loss": curve.tolist()}))
        plot_per_token_loss([ptl], out / "per_token_loss.png", window=cfg.eval.window)
        print(f"per-token loss: {ptl} and {out / 'per_token_loss.png'}", flush=True)
    if metrics.wandb_run is not None:
        metrics.wandb_run.finish()


if __name__ == "__main__":
    main()
