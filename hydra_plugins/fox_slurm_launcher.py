"""train.py's SLURM launcher for sweeps (``hydra/launcher=slurm``, configs/hydra/launcher/slurm.yaml):
hydra-submitit-launcher's, with a dry run and one-line errors where no cluster answers.

    python train.py -m hydra/launcher=slurm hydra.launcher.dry_run=true optim.lr=1e-3,2e-3

``dry_run=true`` prints the sbatch script that would be submitted for the sweep's job array (submitit's own text,
from the same parameters) and each task's overrides, then returns: no sbatch call, no job, no pickle written.
Without it the sweep is submitted and awaited as by hydra-submitit-launcher; when ``sbatch`` or ``srun`` is not on
the PATH, or ``sbatch`` fails (no controller reachable, a bad partition), the command ends with one ``error:``
line naming what failed and the dry-run command (HYDRA_FULL_ERROR=1 shows the traceback).

Hydra finds this module as a plugin (``hydra_plugins`` is a namespace package; the repository root, train.py's
directory, is on ``sys.path``). A job unpickles the launcher, so jobs start in the repository root, as every
SLURM script here assumes. (No ``from __future__ import annotations``: Hydra's scanner runs the module before it
is in ``sys.modules``, where dataclasses look up string annotations.)
"""

import os
import shlex
import shutil
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, filter_overrides
from hydra.plugins.launcher import Launcher
from omegaconf import OmegaConf

TARGET = "hydra_plugins.fox_slurm_launcher.SlurmLauncher"
# submitit's own keys, not sbatch parameters (hydra-submitit-launcher passes them to the executor's constructor)
EXECUTOR_KEYS = ("submitit_folder", "max_num_timeout")

try:
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, SlurmQueueConf
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher
except ImportError as e:
    # Hydra imports every plugin on every run, sweep or not: without the SLURM packages train.py runs as
    # everywhere, and only choosing this launcher fails, naming what to install.
    MISSING = (f"hydra/launcher=slurm needs the packages hydra-submitit-launcher and submitit ({e}): "
               "pip install -r requirements.txt")

    class SubmititSlurmLauncher(Launcher):  # a Launcher, so that Hydra finds it and calls it
        def __init__(self, **params: Any) -> None:
            raise ImportError(MISSING)

        def setup(self, **kwargs: Any) -> None:  # Launcher's abstract method (never reached: __init__ raises)
            raise ImportError(MISSING)

    # an open node, not SlurmQueueConf's schema: slurm.yaml's and the command line's keys merge into it
    QUEUE_CONF: Any = OmegaConf.create({"_target_": TARGET, "dry_run": False}, flags={"struct": False})
else:
    @dataclass
    class FoxSlurmQueueConf(SlurmQueueConf):
        _target_: str = TARGET
        dry_run: bool = False  # print the sbatch script of the sweep and submit nothing

    QUEUE_CONF = FoxSlurmQueueConf

ConfigStore.instance().store(group="hydra/launcher", name="fox_slurm", node=QUEUE_CONF,
                             provider="forgetting_transformer")


class SlurmUnavailable(RuntimeError):
    """No SLURM cluster takes the sweep from this machine."""


class SlurmLauncher(SubmititSlurmLauncher):
    """hydra-submitit-launcher's ``SlurmLauncher`` with ``dry_run`` (see the module docstring)."""

    def __init__(self, dry_run: bool = False, **params: Any) -> None:
        super().__init__(**params)
        self.dry_run = dry_run

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        if self.dry_run:
            print(dry_run_text(self.params, job_overrides, initial_job_idx, self.config.hydra.sweep.dir), flush=True)
            return []
        try:
            missing = [cmd for cmd in ("sbatch", "srun") if shutil.which(cmd) is None]
            if missing:
                raise SlurmUnavailable(f"{' and '.join(missing)} not found on the PATH: this machine cannot submit "
                                       f"to a SLURM cluster. {dry_run_hint()}")
            return super().launch(job_overrides, initial_job_idx)
        except SlurmUnavailable as e:
            fail(e)
        except Exception as e:
            if not submission_failed(e):
                raise
            fail(SlurmUnavailable(f"sbatch failed ({last_line(str(e))}): is a SLURM cluster reachable from this "
                                  f"machine? {dry_run_hint()}"))


def submission_failed(e: Exception) -> bool:
    """Whether ``e`` is sbatch's failure, raised while submitting (submitit's ``_submit_command`` raises
    FailedJobError with sbatch's stderr), not a job's failure (the same type, raised while waiting)."""
    from submitit.core.utils import FailedJobError

    return isinstance(e, FailedJobError) and any(
        frame.name == "_submit_command" for frame in traceback.extract_tb(e.__traceback__))


def last_line(text: str) -> str:
    """The last non-empty line: sbatch ends its report with the fatal one."""
    return [line for line in text.splitlines() if line.strip()][-1].strip()


def dry_run_hint() -> str:
    command = shlex.join(["python", *sys.argv, "hydra.launcher.dry_run=true"])
    return f"The dry run prints the sbatch script and submits nothing: {command}"


def fail(e: SlurmUnavailable) -> None:
    """One ``error:`` line and exit code 1, as train.py reports a user error (HYDRA_FULL_ERROR=1: the traceback)."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise e
    print(f"error: {e}", file=sys.stderr, flush=True)
    sys.exit(1)


def sbatch_parameters(params: dict) -> dict:
    """The launcher's keys as submitit's SlurmExecutor holds them, converted as hydra-submitit-launcher and
    submitit's AutoExecutor convert them: unset (None) keys dropped, the shared names (timeout_min, mem_gb,
    tasks_per_node, name, ...) renamed by the executor's own table, mem_gb written as sbatch takes it ("64GB").
    (An executor instance would do it, but SlurmExecutor refuses to be made where srun is missing.)"""
    from submitit.slurm.slurm import SlurmExecutor, _convert_mem

    shared, renames = set(OmegaConf.structured(BaseQueueConf).keys()), SlurmExecutor._equivalence_dict()
    kept = {k: v for k, v in params.items() if v is not None and k not in EXECUTOR_KEYS}
    out = {renames.get(k, k) if k in shared else k: v for k, v in kept.items()}
    if "mem" in out:
        out["mem"] = _convert_mem(out["mem"])
    return out


def dry_run_text(params: dict, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, sweep_dir) -> str:
    """What the dry run prints: each job's overrides and the sbatch script submitit would write for them (one job
    array for several jobs), with submitit's command line for this Python."""
    from submitit.slurm.slurm import _make_sbatch_string

    n = len(job_overrides)
    folder = Path(str(params["submitit_folder"])).expanduser().absolute()
    command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    script = _make_sbatch_string(command=command, folder=folder, map_count=n if n > 1 else None,
                                 **sbatch_parameters(params))
    what = f"one SLURM job array of {n} tasks" if n > 1 else "one SLURM job"
    lines = [f"dry run (hydra.launcher.dry_run=true): nothing submitted; the sweep would run as {what}, each job "
             f"training in {sweep_dir}/<job num>:"]
    for num, overrides in enumerate(job_overrides, start=initial_job_idx):
        lines.append(f"  job {num}{f' (array task {num - initial_job_idx})' if n > 1 else ''}: "
                     f"{' '.join(filter_overrides(overrides)) or '(no overrides)'}")
    lines += [f"sbatch script (submitit writes it under {folder.parent}):", script]
    return "\n".join(lines)
