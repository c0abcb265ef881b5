"""The phases of a training run, in the order train.py calls them: ``build`` (data, model, optimizer, the train
state resumed from the newest loadable checkpoint), ``train`` (optimizer steps up to the token budget, a log row
per log step, atomic checkpoints) and ``evaluate`` (held-out loss, per-token loss saved and plotted). Each takes
the config and the ``RunContext`` that ``training.run.run`` made (rank, device, output dir, metrics logger).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from ..data import LongCrawl64Dataset, ensure_data, load_meta, read_rows
from ..models import build_model, resolve_heads
from ..plotting import plot_per_token_loss
from .changes import record_changes
from .checkpoint import (TrainState, clear_leftovers, latest_checkpoint, load_latest_checkpoint, prune_checkpoints,
                         save_checkpoint)
from .distributed import mean_across_ranks
from .evaluate import ROW_BAND, autocast_context, heldout_loss, per_token_loss, spread_rows
from .metrics import attention_context, flops_per_token, gpu_memory_elsewhere_gib, matmul_params, peak_flops, \
    peak_memory_gib
from .optim import build_optimizer
from .parallel import autocast_needed, parallelize, set_grad_sync
from .preemption import Preempted, PreemptionFlag
from .progress import Progress, rate_text
from .rundir import RunDirError, not_written, on_main, write_atomic
from .run import RunContext
from .schedule import lr_at


@dataclass
class Setup:
    """What ``build`` makes and ``train`` / ``evaluate`` use."""

    autocast: bool
    data_dir: Path
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    state: TrainState
    total_steps: int
    flops_tok: float
    data_kw: dict
    preemption: PreemptionFlag
    heldout_data: LongCrawl64Dataset
    heldout: float = float("nan")
    heldout_covers: str = ""  # what the held-out loss covers of the split (HeldoutLoss.covers)


def build(cfg, ctx: RunContext) -> Setup:
    """Data, model (parallelized), optimizer and train state, resumed from the newest loadable checkpoint."""
    dist, out, metrics = ctx.dist, ctx.out, ctx.metrics
    device = dist.device
    # torch's generator is seeded where the weights are drawn; Python's and NumPy's are seeded here, so that two
    # runs of one config (and a resumed one) hold the same checkpoints bit for bit, RNG states included
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    mixed = cfg.strategy.mixed_precision == "bf16" or (cfg.strategy.mixed_precision == "auto" and device.type == "cuda")
    metrics.say(f"output dir: {out}")

    # Data: prepare the corpus on first use (idempotent), then read seq_len chunks of train.zarr rows; each
    # rank reads its own slice of every global batch.
    data_dir = ensure_data(cfg.data, cache_dir=cfg.cache_dir)
    train_cfg, mb = cfg.train, cfg.train.micro_batch_size
    if train_cfg.batch_size % (mb * dist.world_size):
        raise ValueError(f"train.batch_size={train_cfg.batch_size} must be a multiple of train.micro_batch_size={mb} "
                         f"x {dist.world_size} ranks")
    data_kw = dict(vocab_size=cfg.data.vocab_size, bos_id=cfg.data.bos_id, text_escape=cfg.data.text_escape)
    train_data = LongCrawl64Dataset(data_dir / "train.zarr", cfg.data.seq_len, mb, rank=dist.rank,
                                    world_size=dist.world_size, shuffle=cfg.data.shuffle, seed=cfg.seed,
                                    skip_zero_rows=cfg.data.skip_zero_rows, **data_kw)
    heldout = open_heldout(cfg, data_dir, data_kw)

    with torch.device("meta"):  # shapes only: parallelize() allocates each rank's shard and initialises it
        model = build_model(cfg.model)
    n_params, n_matmul = sum(p.numel() for p in model.parameters()), matmul_params(model)
    model = parallelize(model, cfg.strategy, device, mixed, seed=cfg.seed)  # the weights of an eager CPU build
    optimizer = build_optimizer(model, cfg.optim)
    state = TrainState(model, optimizer, train_data)
    if cfg.resume:
        resume(cfg, ctx, state)
    metrics.start_wandb(cfg.wandb, out, OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))

    tokens_per_step = train_cfg.batch_size * cfg.data.seq_len
    total_steps = math.ceil(cfg.schedule.total_tokens / tokens_per_step)
    if train_cfg.max_steps is not None:
        total_steps = min(total_steps, train_cfg.max_steps)
    head_dim, n_heads, _ = resolve_heads(cfg.model)
    attn_layers, attn_keys = attention_context(cfg.model, cfg.data.seq_len)  # softmax-attention layers, keys/query
    flops_tok = flops_per_token(n_matmul, attn_layers, n_heads, head_dim, attn_keys)
    metrics.say(f"model {cfg.model.name}: {n_params / 1e6:.2f}M parameters | {cfg.strategy.name} on {dist.world_size}"
                f" x {device.type} | bf16 {mixed} | {total_steps} steps of {tokens_per_step:,} tokens "
                f"({train_cfg.batch_size // (mb * dist.world_size)} micro-batches of {mb} per rank)")
    ctx.built = True
    return Setup(autocast_needed(cfg.strategy, mixed), data_dir, model, optimizer, state, total_steps, flops_tok,
                 data_kw, PreemptionFlag(), heldout)


def open_heldout(cfg, data_dir: Path, data_kw: dict) -> LongCrawl64Dataset:
    """heldout.zarr, opened and checked as train.zarr is (shape, dtype, chunk files, meta.json), with its first
    batch read (token ids in range, no all-zero row): a damaged held-out split stops the run before its first step,
    not once training is over."""
    heldout = LongCrawl64Dataset(data_dir / "heldout.zarr", cfg.data.seq_len, cfg.train.micro_batch_size,
                                 shuffle=False, **data_kw)
    heldout.read_sequences(heldout.sequence_indices(0, 0))  # reads without moving the reader's position
    return heldout


def resume(cfg, ctx: RunContext, state: TrainState) -> None:
    """Load the newest loadable checkpoint of the run dir into ``state`` (none: step 0), after clearing what a
    crash left of a save, removal or prune, and cut metrics.jsonl back to the state it holds; then record what the
    config changes from the next step on (``changes.record_changes``)."""
    ckpts, metrics = ctx.out / "checkpoints", ctx.metrics
    if ctx.dist.is_main:
        clear_leftovers(ckpts)  # of a save or removal that a crash cut short
    ckpt = load_latest_checkpoint(state, ckpts, say=metrics.say)
    if ctx.dist.is_main and ckpt is not None and ckpt == latest_checkpoint(ckpts):
        prune_checkpoints(ckpts, cfg.train.keep_checkpoints)  # what a crash left of a prune
    # rows after the restored step, and the final evaluation's, are redone: the log matches the state
    metrics.truncate_for_resume(state.step)
    metrics.say(f"resumed from {ckpt} (step {state.step}, {state.tokens:,} tokens)" if ckpt else
                f"resume=true: no checkpoint in {ckpts}; starting from step 0")
    on_main(lambda: record_changes(ctx.out, cfg, state.step, metrics.say), ctx.dist.is_main)


def train(cfg, ctx: RunContext, setup: Setup) -> None:
    """Steps until the token budget: AdamW on the warmup-cosine schedule, gradient accumulation, one log row per
    log step (a progress line in between, at least every ~10 s), atomic checkpoints; a preemption signal
    checkpoints and exits with code 75."""
    state, device = setup.state, ctx.dist.device
    tokens_per_step = cfg.train.batch_size * cfg.data.seq_len
    bar = Progress(setup.total_steps, "training", "step", initial=state.step, enabled=ctx.dist.is_main,
                   detail=lambda: f"{rate_text(bar.rate() * tokens_per_step)} tokens/s")
    since_log = (time.perf_counter(), state.tokens)
    while state.step < setup.total_steps:
        lr, loss_mean, grad_norm = optimizer_step(cfg, ctx, setup)
        state.step += 1
        state.tokens += tokens_per_step
        bar.update()
        if state.step % cfg.train.log_every == 0 or state.step == setup.total_steps:
            log_row(cfg, ctx, setup, lr, loss_mean, grad_norm, since_log)
            since_log = (time.perf_counter(), state.tokens)
            bar.hold()
        stop = setup.preemption.should_stop(device)
        if state.step % cfg.train.checkpoint_every == 0 or state.step == setup.total_steps or stop:
            save_checkpoint(state, ctx.out / "checkpoints", keep=cfg.train.keep_checkpoints)  # finite weights only
        if stop:
            raise Preempted(f"after step {state.step}; resume=true continues", setup.preemption)


def optimizer_step(cfg, ctx: RunContext, setup: Setup) -> tuple[float, torch.Tensor, torch.Tensor]:
    """One optimizer step over the accumulated micro-batches: (lr, mean loss, gradient norm). A non-finite
    gradient norm stops the run or skips the update (``train.nonfinite``), so no update and no checkpoint ever
    carries NaN or inf."""
    model, optimizer, state, device = setup.model, setup.optimizer, setup.state, ctx.dist.device
    accum = cfg.train.batch_size // (cfg.train.micro_batch_size * ctx.dist.world_size)
    lr = lr_at(state.tokens + cfg.train.batch_size * cfg.data.seq_len, cfg.optim, cfg.schedule)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=device)
    for micro in range(accum):
        x, y = state.data.next_batch()  # (mb, T) int64 each
        set_grad_sync(model, micro == accum - 1)  # reduce gradients once per step
        with autocast_context(device, setup.autocast):
            loss = model(x.to(device), y.to(device)).mean()  # per-token (mb, T) → scalar
        (loss / accum).backward()
        loss_sum += loss.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: DTensor
    if bool(torch.isfinite(grad_norm)):  # the same on every rank: the norm is global
        optimizer.step()
    elif cfg.train.nonfinite == "stop":
        raise FloatingPointError(f"gradient norm is {grad_norm.item()} at step {state.step + 1} (loss "
                                 f"{mean_across_ranks(loss_sum / accum).item()}); the update was not applied; "
                                 f"last good checkpoint: {latest_checkpoint(ctx.out / 'checkpoints')}")
    else:
        ctx.metrics.say(f"step {state.step + 1}: gradient norm {grad_norm.item()}, update skipped "
                        "(train.nonfinite=skip)")
    optimizer.zero_grad(set_to_none=True)
    return lr, loss_sum / accum, grad_norm


def log_row(cfg, ctx: RunContext, setup: Setup, lr: float, loss_mean: torch.Tensor, grad_norm: torch.Tensor,
            since: tuple[float, int]) -> None:
    """The metrics row of this step (throughput since the last row, ``since``: its time and token count)."""
    state, device, world = setup.state, ctx.dist.device, ctx.dist.world_size
    loss_val = mean_across_ranks(loss_mean).item()
    if not math.isfinite(loss_val) and cfg.train.nonfinite == "stop":
        raise FloatingPointError(f"loss is {loss_val} at step {state.step}; last good checkpoint: "
                                 f"{latest_checkpoint(ctx.out / 'checkpoints')}")
    tok_s = (state.tokens - since[1]) / (time.perf_counter() - since[0])
    peak = peak_flops(device, cfg.train.peak_tflops)
    ctx.metrics.log({"step": state.step, "loss": loss_val, "grad_norm": grad_norm.item(), "lr": lr,
                     "tokens": state.tokens, "tokens_per_s": tok_s, "tokens_per_s_per_device": tok_s / world,
                     "tflops": tok_s * setup.flops_tok / world / 1e12,
                     "mfu": tok_s * setup.flops_tok / world / peak if peak else None,
                     "memory_gib": peak_memory_gib(device), "gpu_elsewhere_gib": gpu_memory_elsewhere_gib(device)})


def evaluate(cfg, ctx: RunContext, setup: Setup) -> None:
    """Held-out loss on the first batches of heldout.zarr (all with null), then L(i) over whole held-out rows
    spread over the split (every rank runs the same batches: FSDP needs all ranks in each forward). A preemption
    signal stops it after the current batch (exit code 75; the final checkpoint is written, and the resumed run
    evaluates again)."""
    model, device, data_dir = setup.model, ctx.dist.device, setup.data_dir
    mb = cfg.train.micro_batch_size
    kw = dict(device=device, mixed_precision=setup.autocast, progress=ctx.dist.is_main,
              after_batch=lambda: setup.preemption.raise_if_stopping(device))
    try:
        heldout = setup.heldout_data
        held = heldout_loss(model, heldout, cfg.eval.heldout_batches, **kw)
        setup.heldout, setup.heldout_covers = held.loss, held.covers()
        ctx.metrics.log({"step": setup.state.step, **held.record()})
        ctx.metrics.say(held.text())
        if not cfg.eval.per_token_loss:
            return
        length = cfg.eval.per_token_len or heldout.doc_len
        rows = spread_rows(heldout.num_rows, cfg.eval.per_token_rows)
        inputs, labels = read_rows(data_dir / "heldout.zarr", rows, length, **setup.data_kw)  # (N, length) each
        curve, bands = per_token_loss(model, inputs, labels, batch_size=mb, band=ROW_BAND, **kw)
    except Preempted as stop:
        raise Preempted(f"during the final evaluation (step {setup.state.step} is checkpointed); resume=true "
                        "evaluates again", stop.flag) from None
    if ctx.dist.is_main:
        save_per_token_loss(cfg, ctx, setup, rows, curve, bands)


def save_per_token_loss(cfg, ctx: RunContext, setup: Setup, rows: list[int], curve: np.ndarray,
                        bands: np.ndarray) -> None:
    """per_token_loss.json (the curve with what it was measured on, and each row's mean over bands of
    ROW_BAND positions, ``row_bands`` (rows, bands), for intervals across rows) and its plot, in the run dir."""
    ptl, png = ctx.out / "per_token_loss.json", ctx.out / "per_token_loss.png"
    fingerprint = (load_meta(setup.data_dir) or {}).get("tokenizer_fingerprint")
    write_atomic(ptl, json.dumps({"name": cfg.model.name, "train_len": cfg.data.seq_len, "step": setup.state.step,
                                  "data": str(setup.data_dir / "heldout.zarr"), "tokenizer_fingerprint": fingerprint,
                                  "rows": rows, "loss": curve.tolist(), "band": ROW_BAND,
                                  "row_bands": bands.round(5).tolist()}))
    tmp = png.with_name(f"{png.stem}.tmp{png.suffix}")  # replaced in one step, as the other files of the run
    try:
        plot_per_token_loss([ptl], tmp, window=cfg.eval.window)
        os.replace(tmp, png)
    except OSError as e:
        with contextlib.suppress(OSError):  # a read-only file system refuses the removal too
            tmp.unlink(missing_ok=True)
        raise RunDirError(not_written(png, e)) from e
    ctx.metrics.say(f"per-token loss: {ptl} and {png}")
