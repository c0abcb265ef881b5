"""train.py end to end in subprocesses: a run killed with SIGKILL and resumed logs the same losses as an
uninterrupted run; checkpoints, metrics.jsonl, held-out loss and the per-token-loss plot are written."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
VOCAB, DOC_LEN = 64, 256  # of the markov_data_dir fixture (tests/conftest.py)


@pytest.fixture(scope="module")
def data_dir(markov_data_dir):
    return markov_data_dir


def command(data_dir, out, *extra):
    return [
        sys.executable, str(ROOT / "train.py"), f"output_dir={out}", "data=longcrawl64", f"data.data_dir={data_dir}",
        "data.seq_len=128", f"data.vocab_size={VOCAB}", "data.bos_id=0", "model.n_layers=2", "model.d_model=64",
        "model.head_dim=32", "train.batch_size=8", "train.micro_batch_size=4", "train.log_every=1",
        "train.checkpoint_every=4", "optim.lr=3e-3", "schedule.warmup_tokens=2048", "schedule.total_tokens=12288",
        "eval.heldout_batches=2", "eval.per_token_rows=4", "eval.window=11", *extra,
    ]


def run(cmd, env=None):
    env = dict(env or os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def rows(out):
    return [json.loads(r) for r in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def test_kill_and_resume_reproduces_the_uninterrupted_losses(data_dir, tmp_path):
    full = tmp_path / "full"
    res = run(command(data_dir, full))
    assert res.returncode == 0, res.stderr[-3000:]
    reference = rows(full)
    train_rows = [r for r in reference if "loss" in r]
    assert [r["step"] for r in train_rows] == list(range(1, 13))
    assert train_rows[-1]["loss"] < train_rows[0]["loss"] - 0.5  # it learns
    for key in ("loss", "grad_norm", "lr", "tokens_per_s", "tflops", "mfu", "memory_gib", "gpu_elsewhere_gib"):
        assert key in train_rows[0]
    assert train_rows[0]["gpu_elsewhere_gib"] is None  # a CPU run has no GPU to share
    assert reference[-1]["heldout_loss"] < np.log(VOCAB)
    assert (full / "per_token_loss.png").stat().st_size > 10_000
    assert len(json.loads((full / "per_token_loss.json").read_text())["loss"]) == DOC_LEN
    assert sorted(p.name for p in (full / "checkpoints").iterdir()) == ["step_00000008", "step_00000012"]

    # Same run, killed with SIGKILL after step 5 (checkpoint at step 4), then resumed.
    killed = tmp_path / "killed"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(command(data_dir, killed), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 240
    while time.time() < deadline:
        metrics = killed / "metrics.jsonl"
        if metrics.exists() and any(json.loads(r)["step"] >= 5 for r in metrics.read_text().splitlines() if r):
            break
        assert proc.poll() is None, "run finished before it could be killed:\n" + proc.stdout.read()[-3000:]
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    last_before_kill = max(r["step"] for r in rows(killed))
    assert last_before_kill < 12, "the run was not interrupted"

    res = run(command(data_dir, killed, "resume=true"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from" in res.stdout
    resumed = rows(killed)
    assert [r["step"] for r in resumed] == [r["step"] for r in reference]  # no duplicated or missing rows
    for a, b in zip(reference, resumed):
        for key in ("loss", "grad_norm", "lr", "heldout_loss"):
            assert a.get(key) == b.get(key), (a["step"], key, a.get(key), b.get(key))  # exactly equal


def test_refuses_to_overwrite_a_run_without_resume(data_dir, tmp_path):
    out = tmp_path / "run"
    assert run(command(data_dir, out, "train.max_steps=4", "eval.per_token_loss=false")).returncode == 0
    res = run(command(data_dir, out, "train.max_steps=4"))
    assert res.returncode != 0 and "pass resume=true" in res.stderr


def test_bad_config_value_fails_naming_the_key(data_dir, tmp_path):
    res = run(command(data_dir, tmp_path / "x", "optim.lr=-0.1"))
    assert res.returncode != 0 and "optim.lr=-0.1" in res.stderr


def test_missing_data_dir_fails_clearly(tmp_path):
    res = run(command(tmp_path / "nowhere", tmp_path / "x"))
    assert res.returncode != 0 and "nowhere" in res.stderr and "train.zarr" in res.stderr


def test_wandb_offline_logs_locally_and_resumes_the_same_run(data_dir, tmp_path):
    out = tmp_path / "run"
    extra = ("wandb.mode=offline", "train.max_steps=2", "eval.per_token_loss=false")
    res = run(command(data_dir, out, *extra), env=dict(os.environ, WANDB_SILENT="true"))
    assert res.returncode == 0, res.stderr[-3000:]
    run_id = (out / "wandb_id.txt").read_text().strip()
    runs = list((out / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))
    res = run(command(data_dir, out, *extra[:1], "train.max_steps=3", "resume=true", "eval.per_token_loss=false"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out / "wandb_id.txt").read_text().strip() == run_id


def test_sigusr1_checkpoints_exits_75_and_resume_matches(data_dir, tmp_path):
    full = tmp_path / "full"
    assert run(command(data_dir, full, "eval.per_token_loss=false")).returncode == 0
    out = tmp_path / "preempted"
    proc = subprocess.Popen(command(data_dir, out, "eval.per_token_loss=false"), cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 2):
        assert proc.poll() is None
        time.sleep(0.01)
    proc.send_signal(signal.SIGUSR1)
    log = proc.communicate(timeout=120)[0]
    assert proc.returncode == 75, log[-2000:]
    stopped = max(r["step"] for r in rows(out))
    assert stopped < 12 and f"stopping on signal {int(signal.SIGUSR1)} after step {stopped}" in log
    assert (out / "checkpoints" / f"step_{stopped:08d}").is_dir()  # checkpoint of the step it stopped at
    res = run(command(data_dir, out, "eval.per_token_loss=false", "resume=true"))
    assert res.returncode == 0 and f"(step {stopped}," in res.stdout
    assert [(r["step"], r.get("loss"), r.get("heldout_loss")) for r in rows(out)] == \
        [(r["step"], r.get("loss"), r.get("heldout_loss")) for r in rows(full)]
