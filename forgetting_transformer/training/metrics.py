"""Per-step metrics: FLOPs per token, MFU, and one record per log step to stdout, metrics.jsonl and wandb."""

from __future__ import annotations

import json
import math
import resource
import uuid
from pathlib import Path

import torch

from .rundir import RunDirError, write_atomic, write_cause

# Dense bf16 peak FLOP/s by device-name substring (checked in order). Override with train.peak_tflops.
PEAK_BF16_FLOPS = (
    ("H200", 989.5e12),
    ("H100", 989.5e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("A6000", 154.8e12),
    ("4090", 165.2e12),
)


def flops_per_token(n_params: int, n_layers: int, n_heads: int, head_dim: int, seq_len: int) -> float:
    """Training FLOPs per token, PaLM's definition (Chowdhery et al. 2022, App. B): ``6 N + 12 L H Q T``
    (``L``, ``T``: softmax-attention layers and keys per query, see ``attention_context``).

    ``N`` counts the parameters that do matmul work (all but the input embedding table); the attention term is
    PaLM's, not halved for causality, so MFU is comparable with PaLM/torchtitan figures.
    """
    return 6 * n_params + 12 * n_layers * n_heads * head_dim * seq_len


def attention_context(model_cfg, seq_len: int) -> tuple[int, int]:
    """(softmax-attention layers, keys per query) for the attention term of ``flops_per_token``: every layer over
    the whole context for the decoder models (FoX, Transformer); the sliding-window layers of ``fla_swa`` (all)
    and ``fla_samba`` (every other one) over ``min(T, window)``; none for the linear-recurrent baselines, whose
    chunked state updates are not counted (their MFU is a lower bound)."""
    if model_cfg.arch == "decoder":
        return model_cfg.n_layers, seq_len
    if model_cfg.arch in ("fla_swa", "fla_samba"):
        layers = model_cfg.n_layers if model_cfg.arch == "fla_swa" else model_cfg.n_layers // 2
        return layers, min(seq_len, model_cfg.window_size)
    return 0, seq_len


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters that take part in matmuls: everything except embedding tables."""
    emb = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))
    return sum(p.numel() for p in model.parameters()) - emb


def peak_flops(device: torch.device, override_tflops: float | None = None) -> float | None:
    """Peak dense bf16 FLOP/s of ``device``; None when unknown (CPU), so MFU is reported as null, not guessed."""
    if override_tflops is not None:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS if key in name), None)


def peak_memory_gib(device: torch.device) -> float:
    """Peak GPU memory allocated (CUDA) or peak resident set size of this process (CPU), in GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux


def gpu_memory_elsewhere_gib(device: torch.device) -> float | None:
    """GPU memory in use outside this process's allocator, in GiB: the device's used memory less what this process
    reserved. It holds this process's CUDA context and that of torch.compile's compile-worker process (a GiB or two)
    and whatever other processes hold: a run sharing its GPU with another training job shows tens of GiB. None on
    the CPU."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return (total - free - torch.cuda.memory_reserved(device)) / 2**30


class MetricsLogger:
    """Writes each record as one stdout line, one metrics.jsonl row and (if set) one wandb log. Only the process
    with ``enabled=True`` (rank 0) writes anything; the others call the same methods and do nothing."""

    def __init__(self, path: str | Path, wandb_run=None, enabled: bool = True):
        self.path = Path(path)
        self.wandb_run = wandb_run
        self.enabled = enabled

    def start_wandb(self, wandb_cfg, out: Path, config: dict) -> None:
        """Log to wandb too (``wandb.mode`` online / offline; nothing when disabled or not rank 0). The run id is
        stored beside the checkpoints, so a resumed run continues the same wandb run."""
        if not self.enabled or wandb_cfg.mode == "disabled":
            return
        import wandb

        id_file = out / "wandb_id.txt"
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id)
        self.wandb_run = wandb.init(mode=wandb_cfg.mode, project=wandb_cfg.project, name=wandb_cfg.name or out.name,
                                    id=run_id, resume="allow", dir=str(out), config=config)

    def finish(self) -> None:
        if self.wandb_run is not None:
            self.wandb_run.finish()

    def say(self, message: str) -> None:
        if self.enabled:
            print(message, flush=True)

    def truncate_for_resume(self, step: int) -> None:
        """Keep the rows of the state a run resumes from (``step``; 0 without a checkpoint): drop training rows
        after it and every evaluation row (``heldout_loss``) from it on, since the resumed run logs them again.
        A last line cut short (a write a crash or a full disk interrupted) is dropped too; the file is replaced
        in one step, so a crash meanwhile loses no row."""
        if not self.enabled or not self.path.exists():
            return
        kept = []
        lines = self.path.read_text().split("\n")
        for i, line in enumerate(lines[:-1]):
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{self.path}, line {i + 1}: not a metrics row ({e}): {line[:80]!r}; only its "
                                 "last line can be cut by a crash, so this file was edited or damaged: fix or "
                                 "remove that line, then resume again") from e
            if row.get("step", 0) <= step and not ("heldout_loss" in row and row["step"] >= step):
                kept.append(line)
        if lines[-1]:
            self.say(f"{self.path}: dropped a last line cut short by an interrupted write ({lines[-1][:60]!r})")
        write_atomic(self.path, "".join(r + "\n" for r in kept))

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        print(format_record(record), flush=True)
        try:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:  # a row cut short by it is dropped by the next resume
            raise RunDirError(f"could not append to {self.path}: {write_cause(e) or e}; resume=true continues from "
                              "the newest checkpoint once the directory takes writes again") from e
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in record.items() if v is not None}, step=record["step"])


def _fmt(key: str, value) -> str:
    if value is None:
        return f"{key} n/a"
    if isinstance(value, float):
        if key == "lr":
            return f"{key} {value:.2e}"
        if key == "mfu":
            return f"{key} {100 * value:.1f}%"
        return f"{key} {value:.4g}" if math.isfinite(value) else f"{key} {value}"
    return f"{key} {value}"


def format_record(record: dict) -> str:
    return " | ".join(_fmt(k, v) for k, v in record.items())
