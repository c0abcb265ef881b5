"""The SLURM sweep launcher without a cluster: ``hydra.launcher.dry_run=true`` prints the job array's sbatch script
(the one a submission writes) and submits nothing; sbatch failing, or missing from the PATH, is one ``error:`` line
naming it and the dry-run command. Stand-in ``sbatch``/``srun`` scripts record what would have been submitted."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ["hydra/launcher=slurm", "optim.lr=1e-3,2e-3", "hydra.launcher.partition=gpu", "hydra.launcher.mem_gb=64"]


def fake_slurm(bin_dir: Path, capture: Path) -> None:
    """``sbatch`` copies the script it is given to ``capture`` and fails as when no controller answers."""
    bin_dir.mkdir()
    scripts = {"sbatch": f'cp "$1" {capture}\necho "sbatch: error: Batch job submission failed: Unable to contact '
                         'slurm controller (connect failure)" >&2\nexit 1\n',
               "srun": "exit 0\n"}
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)


def train_py(*args, path: Path):
    env = dict(os.environ, PATH=f"{path}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_dry_run_prints_the_script_a_submission_writes_and_sbatch_failing_is_one_line(tmp_path):
    capture, bin_dir = tmp_path / "submitted.sh", tmp_path / "bin"
    fake_slurm(bin_dir, capture)
    sweep = tmp_path / "sweep"
    dry = train_py(*SWEEP, f"hydra.sweep.dir={sweep}", "hydra.launcher.dry_run=true", path=bin_dir)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert not capture.exists() and not (sweep / ".submitit").exists()  # nothing submitted, no job files
    head, script = dry.stdout.split("sbatch script", 1)
    assert "nothing submitted" in head and "one SLURM job array of 2 tasks" in head
    assert "job 0 (array task 0): optim.lr=0.001" in head and "job 1 (array task 1): optim.lr=0.002" in head
    for line in ("#SBATCH --array=0-1%2", "#SBATCH --partition=gpu", "#SBATCH --mem=64GB", "#SBATCH --time=1440",
                 "#SBATCH --gpus-per-node=1", "#SBATCH --signal=USR2@120", f"#SBATCH --output={sweep}/.submitit/"):
        assert line in script, line
    printed = script.split("\n", 1)[1]  # after the "sbatch script (...):" line

    real = train_py(*SWEEP, f"hydra.sweep.dir={sweep}", path=bin_dir)
    assert real.returncode == 1
    assert capture.read_text() == printed.rstrip("\n") + "\n"  # the dry run showed what sbatch was given
    last = real.stderr.strip().splitlines()[-1]
    assert last.startswith("error: sbatch failed (sbatch: error: Batch job submission failed: Unable to contact "
                           "slurm controller (connect failure)): is a SLURM cluster reachable"), last
    assert last.endswith(f"hydra.sweep.dir={sweep} hydra.launcher.dry_run=true"), last
    assert "Traceback" not in real.stderr


def test_no_sbatch_on_the_path_is_one_line_naming_the_dry_run(tmp_path, monkeypatch, capsys):
    from hydra_plugins.fox_slurm_launcher import SlurmLauncher

    monkeypatch.setenv("PATH", str(tmp_path))  # neither sbatch nor srun
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setattr(sys, "argv", ["train.py", "-m", "hydra/launcher=slurm", "optim.lr=1e-3"])
    launcher = SlurmLauncher(submitit_folder=str(tmp_path / ".submitit" / "%j"))
    with pytest.raises(SystemExit) as exit_info:
        launcher.launch([["optim.lr=1e-3"]], initial_job_idx=0)
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        "error: sbatch and srun not found on the PATH: this machine cannot submit to a SLURM cluster. The dry run "
        "prints the sbatch script and submits nothing: python train.py -m hydra/launcher=slurm optim.lr=1e-3 "
        "hydra.launcher.dry_run=true\n")
    assert not (tmp_path / ".submitit").exists()


WITHOUT_SUBMITIT = ("import runpy, sys\n"
                    "sys.modules['hydra_plugins.hydra_submitit_launcher'] = None  # as where it is not installed\n")


def test_without_the_slurm_packages_hydra_loads_the_plugin_quietly_and_the_launcher_names_them(tmp_path):
    scan = WITHOUT_SUBMITIT + ("import warnings\nwarnings.simplefilter('error')\n"
                               "from hydra.core.plugins import Plugins\nfrom hydra.plugins.launcher import Launcher\n"
                               "print(sorted(p.__name__ for p in Plugins.instance().discover(Launcher)))\n")
    found = subprocess.run([sys.executable, "-c", scan], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr[-3000:]  # no "Error importing 'hydra_plugins.fox_slurm_launcher'"
    assert "SlurmLauncher" in found.stdout

    sweep = WITHOUT_SUBMITIT + (f"sys.argv = ['train.py', '-m', *{SWEEP!r}, 'hydra.sweep.dir={tmp_path}']\n"
                                f"runpy.run_path({str(ROOT / 'train.py')!r}, run_name='__main__')\n")
    run = subprocess.run([sys.executable, "-c", sweep], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert "hydra/launcher=slurm needs the packages hydra-submitit-launcher and submitit" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and not list(tmp_path.iterdir())  # nothing launched
