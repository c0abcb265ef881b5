"""Checkpoints: one ``Stateful`` train state saved through ``torch.distributed.checkpoint`` (DCP).

Layout: ``<output_dir>/checkpoints/step_00000123/`` (a DCP directory). A checkpoint is written to
``step_00000123.tmp`` and renamed into place only once complete, so a crash mid-write leaves the previous
checkpoint as the latest loadable one; ``.tmp`` leftovers are ignored and cleaned up by the next save. Weights
that are not finite are never saved, and a resume falls back from a damaged checkpoint to the newest one that
loads (``load_latest_checkpoint``).
"""

from __future__ import annotations

import random
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from .distributed import barrier

_STEP_DIR = re.compile(r"^step_(\d{8})$")

# DCP warns that it runs without a process group; in a single process that is exactly the intent.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class TrainState(Stateful):
    """Everything a resumed run needs to continue exactly: model, optimizer, data position, RNG, counters."""

    def __init__(self, model, optimizer, data, step: int = 0, tokens: int = 0):
        self.model, self.optimizer, self.data = model, optimizer, data
        self.step, self.tokens = step, tokens

    def state_dict(self) -> dict:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd, "data": self.data.state_dict(), "step": self.step,
                "tokens": self.tokens, "rng": _rng_state()}

    def load_state_dict(self, sd: dict) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        self.data.load_state_dict(sd["data"])
        self.step, self.tokens = sd["step"], sd["tokens"]
        _set_rng_state(sd["rng"])


def checkpoint_dirs(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: str | Path) -> Path | None:
    dirs = checkpoint_dirs(root)
    return dirs[-1] if dirs else None


def params_finite(model: torch.nn.Module) -> bool:
    """Whether every parameter of ``model`` is finite, on every rank (each checks its own shards)."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    bad = torch.stack([(~torch.isfinite(p.detach())).any() for p in local]).any().float()
    if dist.is_initialized():
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return not bool(bad)


def save_checkpoint(state: TrainState, root: str | Path, keep: int) -> Path:
    """Write ``state`` atomically as ``root/step_<step>`` and keep only the newest ``keep`` checkpoints.
    Weights with a NaN or inf raise FloatingPointError and write nothing.

    Collective: every rank writes its shards into ``.tmp``; rank 0 renames it once all are done."""
    root = Path(root)
    if not params_finite(state.model):
        raise FloatingPointError(f"the weights hold NaN or inf at step {state.step}: not checkpointed; last good "
                                 f"checkpoint: {latest_checkpoint(root)}")
    main = not dist.is_initialized() or dist.get_rank() == 0
    final = root / f"step_{state.step:08d}"
    tmp = root / f"{final.name}.tmp"
    if main:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("*.tmp"):
            shutil.rmtree(stale)
    barrier()
    dcp.save({"app": state}, checkpoint_id=str(tmp))
    barrier()
    if main:
        if final.exists():  # re-saving a step (e.g. after a resume): replace it only once the new one is whole
            shutil.rmtree(final)
        tmp.rename(final)
        for old in checkpoint_dirs(root)[:-keep]:
            shutil.rmtree(old)
    barrier()
    return final


def load_checkpoint(state: TrainState, path: str | Path) -> None:
    if not (Path(path) / ".metadata").is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no .metadata)")
    dcp.load({"app": state}, checkpoint_id=str(path))


def load_latest_checkpoint(state: TrainState, root: str | Path, say=print) -> Path | None:
    """Load the newest checkpoint under ``root`` that loads whole; a damaged one (truncated shard, missing
    ``.metadata``) is named through ``say`` and the next older one is tried. Returns the checkpoint loaded, None
    when ``root`` holds none; raises RuntimeError naming every checkpoint tried when none loads. Each attempt
    loads every entry of the state, so a failed one leaves nothing of itself behind."""
    tried = []
    for path in reversed(checkpoint_dirs(root)):
        try:
            load_checkpoint(state, path)
            if tried:
                say(f"resuming from {path}: the newer checkpoint(s) did not load")
            return path
        except (Exception, CheckpointException) as e:  # any failure to read one makes it unusable (DCP's own
            # CheckpointException derives from BaseException)
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            say(f"checkpoint {path} does not load ({reason[:300]}); trying the previous one")
            tried.append(f"{path.name} ({reason[:120]})")
    if tried:
        raise RuntimeError(f"no checkpoint under {root} loads: {'; '.join(tried)}")
    return None


def load_model_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load only the model from a training checkpoint (for evaluation)."""
    if not (Path(path) / ".metadata").is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no .metadata)")
    sd = {"app": {"model": model.state_dict()}}
    dcp.load(sd, checkpoint_id=str(path))
    model.load_state_dict(sd["app"]["model"])
