"""What surrounds the phases of a training run (training/loop.py): the checked config, the run directory, the
console copied into train.log, the process group, the attention options in force, and how the process ends.

``run(cfg, phases)`` is train.py's Hydra task. It validates the config and turns ``model.attention`` into the
kernel options, locks ``output_dir`` (one process per run dir), claims it (one run per directory; a resume may not
change the run's computation unless allowed), and only then writes the run's config files; then it calls
``phases(cfg, ctx)`` (build → train → evaluate) with a ``RunContext``. A user error (``USER_ERRORS``: a bad config
value, missing data, a used or locked run dir, a full disk, a diverged run) prints one ``error:`` line and exits
with code 1 (HYDRA_FULL_ERROR=1 shows the traceback); a new run that fails before it is built leaves no run dir. A
preemption signal (Ctrl-C included) ends the run after its checkpoint with exit code ``PREEMPTED_EXIT_CODE``.
``one_line_errors`` makes what Hydra itself rejects (an Enum's value, a type's, a run dir it cannot make) print as
one line too.
"""

from __future__ import annotations

import dataclasses
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

from ..config import ConfigError, check_known_keys, unknown_key_error, validate
from ..ops.forgetting_attention import AttentionOptions, default_options, use_options
from .changes import check_resume, stored_config
from .checkpoint import CheckpointError
from .distributed import DistInfo, broadcast_from_main, init_distributed, shutdown
from .metrics import MetricsLogger
from .preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionFlag
from .rundir import (ConsoleLog, RunDirError, RunLock, claim, discard_if_empty, on_main, run_files, write_cause,
                     write_record)

# What a user's config, data or run dir can get wrong (a full disk, no loadable checkpoint included), and a run
# that diverged: the message alone, no traceback (HYDRA_FULL_ERROR=1 shows it).
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, FloatingPointError, RunDirError, CheckpointError)


@dataclass
class RunContext:
    """What ``run`` hands the phases: this process's rank and device, the run dir, the metrics logger (stdout,
    metrics.jsonl, wandb; rank 0 alone writes). ``build`` sets ``built`` once the run has a model and a state:
    a new run that fails before that leaves no run dir."""

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
    hydra_cfg = HydraConfig.get()
    files = hydra_files(cfg)
    # multirun (-m): each job writes to its own sweep dir unless output_dir is given
    if hydra_cfg.mode == RunMode.MULTIRUN and not any(o.lstrip("+~").startswith("output_dir=")
                                                      for o in hydra_cfg.overrides.task):
        cfg.output_dir = hydra_cfg.runtime.output_dir
    OmegaConf.resolve(cfg)  # fix ${now:...} and friends once, so the saved config is the one that ran
    try:
        run_in_dir(cfg, phases, files)
    except USER_ERRORS as e:
        discard_if_empty(Path(hydra_cfg.runtime.output_dir))  # a start that failed leaves no empty run dir behind
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C before training began (from then on it stops the run like SIGTERM)
        discard_if_empty(Path(hydra_cfg.runtime.output_dir))
        print("interrupted before the first step: nothing to checkpoint", file=sys.stderr, flush=True)
        sys.exit(130)


def hydra_files(cfg) -> dict[str, str]:
    """What Hydra writes into ``.hydra/`` (the composed config, Hydra's own, the overrides), for ``run_in_dir`` to
    write once the run owns its dir: configs/config.yaml sets ``hydra.output_subdir: null``, so that a refused
    start leaves the ``.hydra/`` of the run already there as it was."""
    hydra_cfg = HydraConfig.instance().cfg
    return {".hydra/config.yaml": OmegaConf.to_yaml(cfg), ".hydra/hydra.yaml": OmegaConf.to_yaml(hydra_cfg),
            ".hydra/overrides.yaml": OmegaConf.to_yaml(hydra_cfg.hydra.overrides.task)}


def run_in_dir(cfg, phases: Callable[[object, RunContext], None],
               hydra_record: dict[str, str] | None = None) -> None:
    """Validate, lock and claim the run dir (``claim_run_dir``), then ``phases(cfg, ctx)`` with the console copied
    into train.log and the attention options of ``model.attention`` in force; exits with ``PREEMPTED_EXIT_CODE``
    after a preemption stop. ``hydra_record``: ``hydra_files``. A new run that fails before ``build`` is done
    removes the run dir."""
    started = time.perf_counter()
    options = checked_options(cfg)
    cfg.data.data_dir = str(Path(cfg.data.data_dir).resolve())  # the saved config must work from any directory
    dist = init_distributed(cfg.strategy)  # torchrun's env; rank 0 alone writes files and prints
    out = Path(broadcast_from_main(str(Path(cfg.output_dir).resolve())))  # ranks may resolve ${now:} differently
    preempted = None
    try:
        with RunLock(out, enabled=dist.is_main):  # one process in the run dir until the run ends
            found = on_main(lambda: claim_run_dir(cfg, out, hydra_record or {}), dist.is_main)
            ctx = RunContext(dist, out, MetricsLogger(out / "metrics.jsonl", enabled=dist.is_main), started)
            try:
                preempted = run_phases(cfg, phases, ctx, options, append=bool(found))
            except (*USER_ERRORS, KeyboardInterrupt):
                if dist.is_main and not found and not ctx.built:
                    shutil.rmtree(out, ignore_errors=True)
                raise
    except (*USER_ERRORS, KeyboardInterrupt) as e:
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


def claim_run_dir(cfg, out: Path, hydra_record: dict[str, str]) -> list[str]:
    """Rank 0, holding the lock: make ``out`` this run's directory and return the record an earlier run left there
    (``run_files``). A fresh run refuses one (``overwrite`` deletes it), a resume may not change the run's
    computation (``check_resume``); only then are the config files written: all of them for a new run, the missing
    ones for a resumed run, which keeps its own."""
    found = run_files(out)
    claim(out, found, resume=cfg.resume, overwrite=cfg.overwrite)
    if cfg.resume and found:
        check_resume(stored_config(out), cfg, out)
    write_record(out, {**hydra_record, "config.yaml": OmegaConf.to_yaml(cfg)}, replace=not found)
    return found


def run_phases(cfg, phases: Callable[[object, RunContext], None], ctx: RunContext, options: AttentionOptions,
               append: bool) -> PreemptionFlag | None:
    """``phases(cfg, ctx)`` with the console copied into train.log (``append``: a resumed run's) and ``options`` in
    force; returns the flag that stopped the run on a preemption signal, None when it ran to its end."""
    with ConsoleLog(ctx.out / "train.log", enabled=ctx.dist.is_main, append=append), use_options(options):
        try:
            phases(cfg, ctx)
            ctx.metrics.finish()
        except Preempted as stop:  # the checkpoint is written
            received = stop.flag.received
            ctx.metrics.say(f"stopping on signal {received if received is not None else '(of another rank)'}"
                            f" {stop.when}")
            return stop.flag
        except USER_ERRORS as e:  # into train.log too; run() prints it on the console
            log_error(ctx.out / "train.log", e, ctx.dist.is_main)
            raise
    return None


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
    cause = e.__cause__ or e.__context__  # a key in an experiment yaml is reported through the context
    unknown_key = isinstance(cause, (ConfigAttributeError, ConfigKeyError))  # a key the schema does not have
    if not (unknown_key or isinstance(cause, ValidationError)) or not getattr(cause, "full_key", None):
        return None
    if unknown_key:
        if dataclasses.is_dataclass(cause.object_type):
            return str(unknown_key_error(cause.full_key, cause.object_type))
        return f"invalid config: {cause.full_key}: no such key in {cause.object_type_str}"
    what = cause.msg.splitlines()[0]
    allowed = _ENUM_ERROR.match(what)
    why = f"must be one of {' | '.join(allowed.group(1).split(', '))}" if allowed else _TYPE_ERROR.sub("", what)
    return f"invalid config: {cause.full_key}={cause.value!r}: {why}"


def one_line_errors() -> None:
    """Make a config that Hydra rejects while composing it (a value not among an Enum's, one of the wrong type, an
    unknown key) print as one ``error:`` line naming the key, as ``validate``'s errors do, instead of Hydra's
    report with OmegaConf's full_key / reference_type / object_type lines; and a write that fails for a cause the
    user must fix (``write_cause``: a full disk, a read-only or forbidden directory) outside the run's own write
    points (Hydra making the run dir) print as one line naming the path. Hydra reports everything through
    ``hydra._internal.utils.run_and_report``, so that is where this hooks in; every other error is reported as
    Hydra does it, and HYDRA_FULL_ERROR=1 still shows the traceback."""
    from hydra._internal import utils

    report = utils.run_and_report

    def run_and_report(func):
        def composed():
            try:
                return func()
            except (ConfigCompositionException, OSError) as e:
                if isinstance(e, ConfigCompositionException):
                    line = config_error_line(e)
                else:
                    line = write_cause(e) and f"could not write {e.filename or 'the run dir'}: {write_cause(e)}"
                if not line or os.environ.get("HYDRA_FULL_ERROR") == "1":
                    raise
                print(f"error: {line}", file=sys.stderr, flush=True)
                sys.exit(1)

        return report(composed)

    utils.run_and_report = run_and_report
    _check_keys_when_composed()


def _check_keys_when_composed() -> None:
    """Refuse an unknown key (``+key=``, ``++key=``) as soon as Hydra composes the config, so that ``--cfg job`` and
    multirun report it too, not only a run's ``validate``."""
    from hydra._internal.hydra import Hydra

    compose = Hydra.compose_config
    if getattr(compose, "checks_keys", False):
        return

    def compose_config(self, *args, **kwargs):
        cfg = compose(self, *args, **kwargs)
        try:
            check_known_keys(cfg, ignore=("hydra",))
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            sys.exit(1)
        return cfg

    compose_config.checks_keys = True
    Hydra.compose_config = compose_config
