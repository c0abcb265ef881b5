"""What surrounds the phases of a training run (training/loop.py): the checked config, the run directory, the
console copied into train.log, the process group, and how the process ends.

``run(cfg, phases)`` is train.py's Hydra task. It validates the config, claims ``output_dir`` (one run per
directory), then calls ``phases(cfg, ctx)`` (build → train → evaluate) with a ``RunContext``. A user error (``USER_ERRORS``: a bad config value, missing data, a used run dir, a
full disk, a diverged run) prints one ``error:`` line and exits with code 1 (HYDRA_FULL_ERROR=1 shows the
traceback); a fresh run that fails before its first step leaves no run dir. A preemption signal ends the run
after its checkpoint with exit code ``PREEMPTED_EXIT_CODE``.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from ..config import validate
from .checkpoint import CheckpointError
from .distributed import DistInfo, barrier, broadcast_from_main, init_distributed, shutdown
from .metrics import MetricsLogger
from .preemption import PREEMPTED_EXIT_CODE, Preempted
from .rundir import ConsoleLog, RunDirError, claim, discard_if_unused, run_files

# What a user's config, data or run dir can get wrong (a full disk, no loadable checkpoint included), and a run
# that diverged: the message alone, no traceback (HYDRA_FULL_ERROR=1 shows it).
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, FloatingPointError, RunDirError, CheckpointError)


@dataclass
class RunContext:
    """What ``run`` hands the phases: this process's rank and device, the run dir, the metrics logger (stdout,
    metrics.jsonl, wandb; rank 0 alone writes). ``build`` sets ``built`` once the run has a model and a state:
    a fresh run that fails before that leaves no run dir."""

    dist: DistInfo
    out: Path
    metrics: MetricsLogger
    started: float = field(default_factory=time.perf_counter)
    built: bool = False

    def elapsed(self) -> float:
        """Seconds since the run started (before its config was checked)."""
        return time.perf_counter() - self.started


def run(cfg, phases: Callable[[object, RunContext], None]) -> None:
    """Hydra's task: ``phases`` as one run of ``cfg`` (see the module docstring); exit code 1 for a user error."""
    hydra_cfg = HydraConfig.get()  # multirun (-m): each job writes to its own sweep dir unless output_dir is given
    if hydra_cfg.mode == RunMode.MULTIRUN and not any(o.lstrip("+~").startswith("output_dir=")
                                                      for o in hydra_cfg.overrides.task):
        cfg.output_dir = hydra_cfg.runtime.output_dir
    OmegaConf.resolve(cfg)  # fix ${now:...} and friends once, so the saved config is the one that ran
    try:
        run_in_dir(cfg, phases)
    except USER_ERRORS as e:
        discard_if_unused(Path(hydra_cfg.runtime.output_dir))  # a start that failed leaves no run dir behind
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)


def run_in_dir(cfg, phases: Callable[[object, RunContext], None]) -> None:
    """Validate, claim the run dir, then ``phases(cfg, ctx)`` with the console copied into train.log; exits with
    ``PREEMPTED_EXIT_CODE`` after a preemption stop. A fresh run that fails before ``build`` is done removes the
    run dir it made."""
    started = time.perf_counter()
    validate(cfg)
    cfg.data.data_dir = str(Path(cfg.data.data_dir).resolve())  # the saved config must work from any directory
    dist = init_distributed(cfg.strategy)  # torchrun's env; rank 0 alone writes files and prints
    out = Path(broadcast_from_main(str(Path(cfg.output_dir).resolve())))  # ranks may resolve ${now:} differently
    found = broadcast_from_main(run_files(out))  # what an earlier run left there, as rank 0 sees it
    claim(out, found, resume=cfg.resume, overwrite=cfg.overwrite, delete=dist.is_main)  # one run per directory
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)  # Hydra makes its run dir, which is not output_dir in a multirun
    barrier()
    ctx = RunContext(dist, out, MetricsLogger(out / "metrics.jsonl", enabled=dist.is_main), started)
    preempted = None
    try:
        with ConsoleLog(out / "train.log", enabled=dist.is_main):
            try:
                phases(cfg, ctx)
                ctx.metrics.finish()
            except Preempted as stop:  # the checkpoint is written
                received = stop.flag.received
                ctx.metrics.say(f"stopping on signal {received if received is not None else '(of another rank)'}"
                                f" {stop.when}")
                preempted = stop.flag
            except USER_ERRORS as e:  # into train.log too; run() prints it on the console
                log_error(out / "train.log", e, dist.is_main)
                raise
    except USER_ERRORS:
        if dist.is_main and not found and not ctx.built:
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        # The model goes before the process group (distributed.shutdown says why): it lives in the frames of
        # phases(), which are gone here once they returned or their Preempted was handled.
        shutdown()
    if preempted is not None:  # the job script (or submitit, on its SIGUSR2) requeues the job
        preempted.hand_over()  # submitit's SIGUSR2 handler: requeue and exit
        sys.exit(PREEMPTED_EXIT_CODE)


def log_error(path: Path, e: BaseException, is_main: bool) -> None:
    """Append ``error: e`` to train.log (rank 0); a full disk keeps it on the console alone."""
    if not is_main:
        return
    try:
        with open(path, "a") as f:
            f.write(f"error: {e}\n")
    except OSError:
        pass
