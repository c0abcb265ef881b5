"""Checkpoints: one ``Stateful`` train state saved through ``torch.distributed.checkpoint`` (DCP).

Layout: ``<output_dir>/checkpoints/step_00000123/`` (a DCP directory plus ``checksums.json``, the SHA-256 of
every file in it). A checkpoint is written to ``step_00000123.tmp`` and renamed into place only once complete, and
one is removed by renaming it to ``step_00000123.old`` before deleting it, so at any instant a ``step_*``
directory is a whole checkpoint: a crash mid-write or mid-delete leaves the previous ones loadable, and the
``.tmp``/``.old`` leftovers are cleared by the next save or resume. Weights that are not finite are never saved;
a resume checks each checkpoint's checksums and falls back from a damaged one to the newest one that loads
(``load_latest_checkpoint``); a checkpoint that cannot be written (a full disk) raises ``RunDirError`` naming the
cause and leaves nothing of itself.
"""

from __future__ import annotations

import hashlib
import json
import os
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

from .distributed import barrier, broadcast_from_main
from .rundir import RunDirError, write_cause

_STEP_DIR = re.compile(r"^step_(\d{8})$")
CHECKSUMS = "checksums.json"

# DCP warns that it runs without a process group; in a single process that is exactly the intent.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


class CheckpointError(RuntimeError):
    """No checkpoint of a run loads (each one tried is named)."""


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
        return {"model": model_sd, "optim": optim_sd, "data": self._data_state(), "step": self.step,
                "tokens": self.tokens, "rng": _rng_state()}

    def _data_state(self) -> dict:
        """The data position. Where the ranks' positions differ (a reader that skips all-zero rows, each rank
        in its own stream) every rank's is gathered and saved, since DCP keeps one copy of a non-tensor entry;
        otherwise rank 0's alone, which every rank shares."""
        sd = self.data.state_dict()
        if not (dist.is_initialized() and dist.get_world_size() > 1 and getattr(self.data, "skip_zero_rows", False)):
            return sd
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, sd)
        return {"per_rank": per_rank}

    def load_state_dict(self, sd: dict) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        data = sd["data"]
        self.data.load_state_dict(data["per_rank"][dist.get_rank()] if "per_rank" in data else data)
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


def _first_failure(e: BaseException) -> BaseException:
    """The first rank's own error of DCP's CheckpointException; ``e`` itself otherwise."""
    if isinstance(e, CheckpointException) and e.failures:
        return next(iter(e.failures.values()))[0]
    return e


def describe(e: BaseException) -> str:
    """One line for an error, looking through DCP's CheckpointException to the first rank's own error."""
    e = _first_failure(e)
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if not isinstance(e, OSError) else text or type(e).__name__


def clear_leftovers(root: str | Path) -> None:
    """Remove what an interrupted save or removal left under ``root`` (``*.tmp``, ``*.old``); rank 0 only."""
    root = Path(root)
    for stale in [*root.glob("step_*.tmp"), *root.glob("step_*.old")] if root.is_dir() else []:
        shutil.rmtree(stale, ignore_errors=True)


def _discard(path: Path) -> None:
    """Remove a checkpoint so that no instant shows a half-deleted ``step_*`` directory."""
    old = path.with_name(f"{path.name}.old")
    path.rename(old)
    shutil.rmtree(old)


def prune_checkpoints(root: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints under ``root`` (rank 0). A removal that fails leaves a whole
    checkpoint, which the next prune removes."""
    try:
        for old in checkpoint_dirs(root)[:-keep]:
            _discard(old)
        _fsync_dir(root)
    except OSError:
        pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # the renames themselves survive a power loss
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _split(files: list[Path]) -> list[Path]:
    """This rank's share of ``files`` (each rank reads its part, not all of them)."""
    if not dist.is_initialized():
        return files
    return files[dist.get_rank()::dist.get_world_size()]


def _gather(part: dict) -> dict:
    if not dist.is_initialized():
        return part
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, part)
    return {k: v for p in parts for k, v in p.items()}


def save_checkpoint(state: TrainState, root: str | Path, keep: int) -> Path:
    """Write ``state`` atomically as ``root/step_<step>`` (with its checksums) and keep only the newest ``keep``
    checkpoints. Weights with a NaN or inf raise FloatingPointError and write nothing; a write that fails (a
    full disk) raises RunDirError on every rank and leaves nothing of the new checkpoint.

    Collective: every rank writes its shards into ``.tmp`` and hashes its share of the files; rank 0 writes the
    checksums and renames ``.tmp`` once all are done."""
    root = Path(root)
    if not params_finite(state.model):
        raise FloatingPointError(f"the weights hold NaN or inf at step {state.step}: not checkpointed; last good "
                                 f"checkpoint: {latest_checkpoint(root)}")
    main = not dist.is_initialized() or dist.get_rank() == 0
    final = root / f"step_{state.step:08d}"
    tmp = root / f"{final.name}.tmp"

    def prepare():
        root.mkdir(parents=True, exist_ok=True)
        clear_leftovers(root)

    failure = _on_main(prepare, main)
    if failure is None:
        try:
            dcp.save({"app": state}, checkpoint_id=str(tmp))
            barrier()
            sums = _gather({p.name: _sha256(p) for p in _split(sorted(p for p in tmp.iterdir() if p.is_file()))})
        except (Exception, CheckpointException) as e:  # DCP's CheckpointException derives from BaseException
            failure = e

    def publish():
        (tmp / CHECKSUMS).write_text(json.dumps(sums, indent=0, sort_keys=True))
        if final.exists():  # re-saving a step (after a fall-back): replace it only once the new one is whole
            _discard(final)
        tmp.rename(final)
        prune_checkpoints(root, keep)

    failure = failure or _on_main(publish, main)
    if failure is not None:
        if main:
            shutil.rmtree(tmp, ignore_errors=True)  # frees the space the partial write took
        cause = write_cause(_first_failure(failure)) or describe(failure)  # a full disk as torch's writer wraps it
        raise RunDirError(f"could not write checkpoint {final.name} in {root}: {cause}; nothing of it "
                          f"was kept (the newest complete checkpoint is {latest_checkpoint(root)}); free space (or "
                          "fix the directory), then resume=true continues from there") from failure
    return final


def _on_main(fn, main: bool) -> OSError | None:
    """Run ``fn`` on rank 0 and give every rank the OSError it raised (None when it did not), so that all ranks
    fail alike instead of waiting for rank 0."""
    failure = None
    if main:
        try:
            fn()
        except OSError as e:
            failure = e
    return broadcast_from_main(failure)


def verify_checkpoint(path: str | Path) -> bool:
    """Check the files of checkpoint ``path`` against its ``checksums.json`` (each rank hashes its share).
    Returns False when the checkpoint has no checksums (written before they were kept); raises CheckpointError
    naming the files that are missing or differ."""
    path = Path(path)
    if not (path / ".metadata").is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no .metadata)")
    if not (path / CHECKSUMS).is_file():
        return False
    try:
        sums = json.loads((path / CHECKSUMS).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path / CHECKSUMS} does not read: {describe(e)}") from e
    mine = {}
    for name in _split(sorted(sums)):
        if not (path / name).is_file():
            mine[name] = "missing"
        elif _sha256(path / name) != sums[name]:
            mine[name] = "differs"
    bad = _gather(mine)
    if bad:
        raise CheckpointError(f"{path}: " + ", ".join(f"{n} {why}" for n, why in sorted(bad.items()))
                              + f" (against {CHECKSUMS})")
    return True


def load_checkpoint(state: TrainState, path: str | Path) -> bool:
    """Load ``state`` from checkpoint ``path`` after checking its checksums; returns whether it had any."""
    verified = verify_checkpoint(path)
    dcp.load({"app": state}, checkpoint_id=str(path))
    return verified


def load_latest_checkpoint(state: TrainState, root: str | Path, say=print) -> Path | None:
    """Load the newest checkpoint under ``root`` that loads whole; a damaged one (a file that differs from its
    checksum, a truncated shard, no ``.metadata``) is named through ``say`` and the next older one is tried.
    Returns the checkpoint loaded, None when ``root`` holds none; raises CheckpointError naming every checkpoint
    tried when none loads. Each attempt loads every entry of the state, so a failed one leaves nothing of itself
    behind."""
    tried = []
    for path in reversed(checkpoint_dirs(root)):
        try:
            verified = load_checkpoint(state, path)
        except (Exception, CheckpointException) as e:  # any failure to read one makes it unusable
            reason = describe(e)
            say(f"checkpoint {path} does not load ({reason[:300]}); trying the previous one")
            tried.append(f"{path.name} ({reason[:120]})")
            continue
        if not verified:
            say(f"checkpoint {path} has no {CHECKSUMS} (written by an older version): its files were not checked")
        if tried:
            say(f"resuming from {path}: the newer checkpoint(s) did not load")
        return path
    if tried:
        raise CheckpointError(f"no checkpoint under {root} loads: {'; '.join(tried)}")
    return None


def load_model_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load only the model from a training checkpoint (for evaluation), after checking its checksums."""
    verify_checkpoint(path)
    sd = {"app": {"model": model.state_dict()}}
    dcp.load(sd, checkpoint_id=str(path))
    model.load_state_dict(sd["app"]["model"])
