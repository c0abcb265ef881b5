"""What surrounds the phases of a training run (training/loop.py): the checked config, the run directory, the
console copied into train.log, the process group, the attention options in force, and how the process ends.

``run(cfg, phases)`` is train.py's Hydra task. It validates the config and turns ``model.attention`` into the
kernel options, claims ``output_dir`` (one run per directory), then calls ``phases(cfg, ctx)`` (build → train →
evaluate) with a ``RunContext``. A user error (``USER_ERRORS``: a bad config value, missing data, a used run dir, a
full disk, a diverged run) prints one ``error:`` line and exits with code 1 (HYDRA_FULL_ERROR=1 shows the
traceback); a fresh run that fails before its first step leaves no run dir. A preemption signal ends the run
after its checkpoint with exit code ``PREEMPTED_EXIT_CODE``. ``one_line_config_errors`` makes the values Hydra
itself rejects (an Enum's, a type's) print as one line too.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

from ..config import ConfigError, validate
from ..ops import AttentionOptions, default_options, use_options
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
    """Validate, claim the run dir, then ``phases(cfg, ctx)`` with the console copied into train.log and the
    attention options of ``model.attention`` in force; exits with ``PREEMPTED_EXIT_CODE`` after a preemption
    stop. A fresh run that fails before ``build`` is done removes the run dir it made."""
    started = time.perf_counter()
    options = checked_options(cfg)
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
        with ConsoleLog(out / "train.log", enabled=dist.is_main), use_options(options):
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
    except USER_ERRORS as e:
        if dist.is_main and not found and not ctx.built:
            shutil.rmtree(out, ignore_errors=True)
        # The error's traceback keeps phases()' frames, and the model in them, alive; their locals go now, so the
        # model is collected before the process group (the message and the traceback's lines are kept).
        traceback.clear_frames(e.__traceback__)
        raise
    finally:
        # The model goes before the process group (distributed.shutdown says why): it lives in the frames of
        # phases(), which are gone here once they returned, their Preempted was handled or their user error's
        # frames were cleared.
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


def checked_options(cfg) -> AttentionOptions:
    """Validate ``cfg`` (config.validate) and return the attention options the run is to use: the process default
    with the values ``model.attention`` sets (the fla baselines have no such key). A value the kernels refuse
    raises ConfigError naming its key."""
    validate(cfg)
    attention = cfg.model.get("attention")
    changes = {}
    for key, value in ({} if attention is None else OmegaConf.to_container(attention, enum_to_str=True)).items():
        if key == "triton_configs":  # {kind: [block_m, block_n, ...] or None}
            for kind, tile in value.items():
                if tile is not None:
                    _check(f"{key}.{kind}", tile, triton_configs={kind: tuple(tile)})
            value = {kind: tuple(tile) for kind, tile in value.items() if tile is not None} or None
        elif value is not None:
            option = tuple(value) if key == "acp_grid" else value  # AttentionOptions holds a tuple
            _check(key, value, **{key: option})
            value = option
        if value is not None:
            changes[key] = value
    return default_options().replace(**changes)


def _check(key: str, value, **option) -> None:
    """Raise ConfigError naming ``model.attention.<key>`` if AttentionOptions refuses ``option``."""
    try:
        AttentionOptions(**option)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"invalid config: model.attention.{key}={value!r}: {e}") from None


_ENUM_ERROR = re.compile(r"Invalid value '.*', expected one of \[(.*)\]")
_TYPE_ERROR = re.compile(r"^Value '.*' of type '[\w.]+' ")  # before "could not be converted to Integer"


def config_error_line(e: ConfigCompositionException) -> str | None:
    """One line for a value or key Hydra rejected while composing the config, naming the key; None for the rest."""
    cause = e.__cause__
    unknown_key = isinstance(cause, (ConfigAttributeError, ConfigKeyError))  # a key the schema does not have
    if not (unknown_key or isinstance(cause, ValidationError)) or not getattr(cause, "full_key", None):
        return None
    if unknown_key:
        return f"invalid config: {cause.full_key}: no such key in {cause.object_type_str}"
    what = cause.msg.splitlines()[0]
    allowed = _ENUM_ERROR.match(what)
    why = f"must be one of {' | '.join(allowed.group(1).split(', '))}" if allowed else _TYPE_ERROR.sub("", what)
    return f"invalid config: {cause.full_key}={cause.value!r}: {why}"


def one_line_config_errors() -> None:
    """Make a config that Hydra rejects while composing it (a value not among an Enum's, one of the wrong type, an
    unknown key) print as one ``error:`` line naming the key, as ``validate``'s errors do, instead of Hydra's
    report with OmegaConf's full_key / reference_type / object_type lines. Hydra reports everything through
    ``hydra._internal.utils.run_and_report``, so that is where this hooks in; every other error is reported as
    Hydra does it, and HYDRA_FULL_ERROR=1 still shows the traceback."""
    from hydra._internal import utils

    report = utils.run_and_report

    def run_and_report(func):
        def composed():
            try:
                return func()
            except ConfigCompositionException as e:
                line = config_error_line(e)
                if line is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
                    raise
                print(f"error: {line}", file=sys.stderr, flush=True)
                sys.exit(1)

        return report(composed)

    utils.run_and_report = run_and_report
