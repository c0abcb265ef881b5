"""Pretrain a Forgetting Transformer (or any registered model) on LongCrawl64-format data.

    python train.py                                   # tiny FoX (Pro) on the embedded corpus, CPU-friendly
    python train.py model=fox_llama optim.lr=1e-3     # any Hydra override
    python train.py output_dir=outputs/run1 resume=true
    torchrun --nproc_per_node=8 train.py strategy=fsdp      # FSDP2 over 8 GPUs (gloo ranks on CPU)

Builds everything from the config, trains with AdamW + warmup/cosine (in tokens) and gradient accumulation,
logs one line and one metrics.jsonl row per log step, checkpoints atomically, and finishes with a held-out
loss and a per-token-loss plot. Model, data, optimizer and checkpoint code live in forgetting_transformer/.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from eval.per_token_loss.plot import plot_per_token_loss
from forgetting_transformer.config import register_configs, validate
from forgetting_transformer.data import LongCrawl64Dataset, ensure_data, load_meta, read_rows
from forgetting_transformer.models import build_model, resolve_heads
from forgetting_transformer.training.checkpoint import (CheckpointError, TrainState, clear_leftovers,
                                                        latest_checkpoint, load_latest_checkpoint, prune_checkpoints,
                                                        save_checkpoint)
from forgetting_transformer.training.distributed import (barrier, broadcast_from_main, init_distributed,
                                                         mean_across_ranks, shutdown)
from forgetting_transformer.training.evaluate import autocast_context, heldout_loss, per_token_loss, spread_rows
from forgetting_transformer.training.metrics import (MetricsLogger, attention_context, flops_per_token, matmul_params,
                                                     peak_flops, peak_memory_gib)
from forgetting_transformer.training.optim import build_optimizer
from forgetting_transformer.training.parallel import autocast_needed, parallelize, set_grad_sync
from forgetting_transformer.training.preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionFlag
from forgetting_transformer.training.progress import Progress, rate_text
from forgetting_transformer.training.rundir import (ConsoleLog, RunDirError, claim, discard_if_unused, run_files,
                                                    write_atomic)
from forgetting_transformer.training.schedule import lr_at

register_configs()


# What a user's config, data or run dir can get wrong (a full disk, no loadable checkpoint included), and a run
# that diverged: the message alone, no traceback (HYDRA_FULL_ERROR=1 shows it).
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, FloatingPointError, RunDirError, CheckpointError)


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    hc = HydraConfig.get()  # multirun (-m): each job writes to its own sweep dir unless output_dir is given
    if hc.mode == RunMode.MULTIRUN and not any(o.lstrip("+~").startswith("output_dir=") for o in hc.overrides.task):
        cfg.output_dir = hc.runtime.output_dir
    OmegaConf.resolve(cfg)  # fix ${now:...} and friends once, so the saved config is the one that ran
    try:
        run(cfg)
    except USER_ERRORS as e:
        discard_if_unused(Path(hc.runtime.output_dir))  # a start that failed leaves no run dir behind
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)


def run(cfg) -> None:
    """Validate, claim the run dir, then build → train → evaluate with the console copied into train.log. A fresh
    run that fails before its first step (a data or setup error) removes the run dir it made."""
    t_start = time.perf_counter()
    validate(cfg)
    cfg.data.data_dir = str(Path(cfg.data.data_dir).resolve())  # the saved config must work from any directory
    dist = init_distributed(cfg.strategy)  # torchrun's env; rank 0 alone writes files and prints
    out = Path(broadcast_from_main(str(Path(cfg.output_dir).resolve())))  # ranks may resolve ${now:} differently
    found = broadcast_from_main(run_files(out))  # what an earlier run left there, as rank 0 sees it
    claim(out, found, resume=cfg.resume, overwrite=cfg.overwrite, delete=dist.is_main)  # one run per directory
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)  # Hydra makes its run dir, which is not output_dir in a multirun
    barrier()
    fresh = not found
    setup = preempted = None
    try:
        with ConsoleLog(out / "train.log", enabled=dist.is_main):
            try:
                setup = build(cfg, dist, out)
                train(cfg, dist, setup)
                evaluate(cfg, dist, setup)
                setup.metrics.say(f"done in {time.perf_counter() - t_start:.0f} s: held-out loss "
                                  f"{setup.heldout:.4f}")
                setup.metrics.finish()
            except Preempted as stop:  # the checkpoint is written
                received = setup.preemption.received
                setup.metrics.say(f"stopping on signal {received if received is not None else '(of another rank)'}"
                                  f" {stop.when}")
                preempted = setup.preemption
            except USER_ERRORS as e:  # into train.log too; main() prints it on the console
                if dist.is_main:
                    try:
                        with open(out / "train.log", "a") as f:
                            f.write(f"error: {e}\n")
                    except OSError:  # a full disk: the console still shows it
                        pass
                raise
    except USER_ERRORS:
        if dist.is_main and fresh and setup is None:
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        setup = None  # the model goes before the process group (distributed.shutdown says why)
        shutdown()
    if preempted is not None:  # the job script (or submitit, on its SIGUSR2) requeues the job
        preempted.hand_over()  # submitit's SIGUSR2 handler: requeue and exit
        sys.exit(PREEMPTED_EXIT_CODE)


@dataclass
class Setup:
    """What build() makes and train() / evaluate() use."""

    out: Path
    device: torch.device
    autocast: bool
    data_dir: Path
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    state: TrainState
    metrics: MetricsLogger
    total_steps: int
    flops_tok: float
    data_kw: dict
    preemption: PreemptionFlag
    heldout: float = float("nan")


def build(cfg, dist, out: Path) -> Setup:
    """Data, model (parallelized), optimizer and train state, resumed from the newest loadable checkpoint."""
    device = dist.device
    # torch's generator is seeded where the weights are drawn; Python's and NumPy's are seeded here, so that two
    # runs of one config (and a resumed one) hold the same checkpoints bit for bit, RNG states included
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    mixed = cfg.strategy.mixed_precision == "bf16" or (cfg.strategy.mixed_precision == "auto" and device.type == "cuda")
    metrics = MetricsLogger(out / "metrics.jsonl", enabled=dist.is_main)
    if dist.is_main:
        write_atomic(out / "config.yaml", OmegaConf.to_yaml(cfg))
    metrics.say(f"output dir: {out}")

    # Data: prepare the corpus on first use (idempotent), then read seq_len chunks of train.zarr rows; each
    # rank reads its own slice of every global batch.
    data_dir = ensure_data(cfg.data, cache_dir=cfg.cache_dir)
    train_cfg, mb = cfg.train, cfg.train.micro_batch_size
    if train_cfg.batch_size % (mb * dist.world_size):
        raise ValueError(f"train.batch_size={train_cfg.batch_size} must be a multiple of train.micro_batch_size={mb} "
                         f"x {dist.world_size} ranks")
    data_kw = dict(vocab_size=cfg.data.vocab_size, bos_id=cfg.data.bos_id)
    train_data = LongCrawl64Dataset(data_dir / "train.zarr", cfg.data.seq_len, mb, rank=dist.rank,
                                    world_size=dist.world_size, shuffle=cfg.data.shuffle, seed=cfg.seed,
                                    skip_zero_rows=cfg.data.skip_zero_rows, **data_kw)

    with torch.device("meta"):  # shapes only: parallelize() allocates each rank's shard and initialises it
        model = build_model(cfg.model)
    n_params, n_matmul = sum(p.numel() for p in model.parameters()), matmul_params(model)
    model = parallelize(model, cfg.strategy, device, mixed, seed=cfg.seed)  # the weights of an eager CPU build
    optimizer = build_optimizer(model, cfg.optim)
    state = TrainState(model, optimizer, train_data)
    if cfg.resume:
        if dist.is_main:
            clear_leftovers(out / "checkpoints")  # of a save or removal that a crash cut short
        ckpt = load_latest_checkpoint(state, out / "checkpoints", say=metrics.say)
        if dist.is_main and ckpt is not None and ckpt == latest_checkpoint(out / "checkpoints"):
            prune_checkpoints(out / "checkpoints", train_cfg.keep_checkpoints)  # what a crash left of a prune
        # rows after the restored step, and the final evaluation's, are redone below: the log matches the state
        metrics.truncate_for_resume(state.step)
        metrics.say(f"resumed from {ckpt} (step {state.step}, {state.tokens:,} tokens)" if ckpt else
                    f"resume=true: no checkpoint in {out / 'checkpoints'}; starting from step 0")
    metrics.start_wandb(cfg.wandb, out, OmegaConf.to_container(cfg, resolve=True))

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
    return Setup(out, device, autocast_needed(cfg.strategy, mixed), data_dir, model, optimizer, state, metrics,
                 total_steps, flops_tok, data_kw, PreemptionFlag())


def train(cfg, dist, setup: Setup) -> None:
    """Steps until the token budget: AdamW on the warmup-cosine schedule, gradient accumulation, one log row per
    log step (a progress line in between, at least every ~10 s), atomic checkpoints; a preemption signal
    checkpoints and exits with code 75."""
    state, device = setup.state, setup.device
    tokens_per_step = cfg.train.batch_size * cfg.data.seq_len
    bar = Progress(setup.total_steps, "training", "step", initial=state.step, enabled=dist.is_main,
                   detail=lambda: f"{rate_text(bar.rate() * tokens_per_step)} tokens/s")
    since_log = (time.perf_counter(), state.tokens)
    while state.step < setup.total_steps:
        lr, loss_mean, grad_norm = optimizer_step(cfg, dist, setup)
        state.step += 1
        state.tokens += tokens_per_step
        bar.update()
        if state.step % cfg.train.log_every == 0 or state.step == setup.total_steps:
            log_row(cfg, dist, setup, lr, loss_mean, grad_norm, since_log)
            since_log = (time.perf_counter(), state.tokens)
            bar.hold()
        stop = setup.preemption.should_stop(device)
        if state.step % cfg.train.checkpoint_every == 0 or state.step == setup.total_steps or stop:
            save_checkpoint(state, setup.out / "checkpoints", keep=cfg.train.keep_checkpoints)  # finite weights only
        if stop:
            raise Preempted(f"after step {state.step}; resume=true continues")


def optimizer_step(cfg, dist, setup: Setup) -> tuple[float, torch.Tensor, torch.Tensor]:
    """One optimizer step over the accumulated micro-batches: (lr, mean loss, gradient norm). A non-finite
    gradient norm stops the run or skips the update (``train.nonfinite``), so no update and no checkpoint ever
    carries NaN or inf."""
    model, optimizer, state, device = setup.model, setup.optimizer, setup.state, setup.device
    accum = cfg.train.batch_size // (cfg.train.micro_batch_size * dist.world_size)
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
                                 f"last good checkpoint: {latest_checkpoint(setup.out / 'checkpoints')}")
    else:
        setup.metrics.say(f"step {state.step + 1}: gradient norm {grad_norm.item()}, update skipped "
                          "(train.nonfinite=skip)")
    optimizer.zero_grad(set_to_none=True)
    return lr, loss_sum / accum, grad_norm


def log_row(cfg, dist, setup: Setup, lr: float, loss_mean: torch.Tensor, grad_norm: torch.Tensor,
            since: tuple[float, int]) -> None:
    """The metrics row of this step (throughput since the last row, ``since``: its time and token count)."""
    state, device = setup.state, setup.device
    loss_val = mean_across_ranks(loss_mean).item()
    if not math.isfinite(loss_val) and cfg.train.nonfinite == "stop":
        raise FloatingPointError(f"loss is {loss_val} at step {state.step}; last good checkpoint: "
                                 f"{latest_checkpoint(setup.out / 'checkpoints')}")
    tok_s = (state.tokens - since[1]) / (time.perf_counter() - since[0])
    peak = peak_flops(device, cfg.train.peak_tflops)
    setup.metrics.log({"step": state.step, "loss": loss_val, "grad_norm": grad_norm.item(), "lr": lr,
                       "tokens": state.tokens, "tokens_per_s": tok_s,
                       "tokens_per_s_per_device": tok_s / dist.world_size,
                       "tflops": tok_s * setup.flops_tok / dist.world_size / 1e12,
                       "mfu": tok_s * setup.flops_tok / dist.world_size / peak if peak else None,
                       "memory_gib": peak_memory_gib(device)})


def evaluate(cfg, dist, setup: Setup) -> None:
    """Held-out loss on the first batches of heldout.zarr (all with null), then L(i) over whole held-out rows
    spread over the split (every rank runs the same batches: FSDP needs all ranks in each forward). A preemption
    signal stops it after the current batch (exit code 75; the final checkpoint is written, and the resumed run
    evaluates again)."""
    model, device, metrics, out = setup.model, setup.device, setup.metrics, setup.out
    mb, data_dir = cfg.train.micro_batch_size, setup.data_dir
    kw = dict(device=device, mixed_precision=setup.autocast, progress=dist.is_main,
              after_batch=lambda: setup.preemption.raise_if_stopping(device))
    try:
        heldout = LongCrawl64Dataset(data_dir / "heldout.zarr", cfg.data.seq_len, mb, shuffle=False, **setup.data_kw)
        setup.heldout = heldout_loss(model, heldout, cfg.eval.heldout_batches, **kw)
        metrics.log({"step": setup.state.step, "heldout_loss": setup.heldout})
        if not cfg.eval.per_token_loss:
            return
        length = cfg.eval.per_token_len or heldout.doc_len
        rows = spread_rows(heldout.num_rows, cfg.eval.per_token_rows)
        inputs, labels = read_rows(data_dir / "heldout.zarr", rows, length, **setup.data_kw)  # (N, length) each
        curve = per_token_loss(model, inputs, labels, batch_size=mb, **kw)
    except Preempted:
        raise Preempted(f"during the final evaluation (step {setup.state.step} is checkpointed); resume=true "
                        "evaluates again") from None
    if dist.is_main:
        ptl = out / "per_token_loss.json"
        fingerprint = (load_meta(data_dir) or {}).get("tokenizer_fingerprint")
        write_atomic(ptl, json.dumps({"name": cfg.model.name, "train_len": cfg.data.seq_len, "step": setup.state.step,
                                      "data": str(data_dir / "heldout.zarr"), "tokenizer_fingerprint": fingerprint,
                                      "rows": rows, "loss": curve.tolist()}))
        plot_per_token_loss([ptl], out / "per_token_loss.png", window=cfg.eval.window)
        metrics.say(f"per-token loss: {ptl} and {out / 'per_token_loss.png'}")


if __name__ == "__main__":
    main()
