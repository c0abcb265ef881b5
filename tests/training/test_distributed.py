"""train.py under torchrun with 2 gloo ranks on CPU (FSDP2 and DDP): a run killed with SIGKILL (the whole process
group, as when a node dies) and resumed logs the same losses as the uninterrupted run, and 2 ranks match 1."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_train_e2e import command, data_dir, rows  # noqa: F401  (data_dir is a fixture)

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")


def process_tree(pid):
    """pid and all its descendants (torchrun starts each rank in a session of its own)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def torchrun(data, out, *extra):
    cmd = command(data, out, *extra)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *cmd[1:]]


@pytest.fixture(scope="module")
def single_run(data_dir, tmp_path_factory):  # noqa: F811
    """metrics.jsonl rows of the 8-step run on one process (run once for both strategies)."""
    out = tmp_path_factory.mktemp("single")
    res = subprocess.run(command(data_dir, out, "train.max_steps=8", "eval.per_token_loss=false"), cwd=ROOT,
                         env=ENV, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return rows(out)


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_two_ranks_kill_and_resume(data_dir, single_run, tmp_path, strategy):  # noqa: F811
    extra = (f"strategy={strategy}", "train.max_steps=8", "eval.per_token_loss=false")
    full = tmp_path / "full"
    res = subprocess.run(torchrun(data_dir, full, *extra), cwd=ROOT, env=ENV, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    reference = rows(full)
    assert [r["step"] for r in reference] == list(range(1, 9)) + [8]
    assert res.stdout.count("output dir:") == 1  # rank 0 alone prints

    killed = tmp_path / "killed"
    proc = subprocess.Popen(torchrun(data_dir, killed, *extra), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    metrics = killed / "metrics.jsonl"
    while time.time() < deadline:
        if metrics.exists() and any(json.loads(r)["step"] >= 5 for r in metrics.read_text().splitlines() if r):
            break
        assert proc.poll() is None, "run finished before it could be killed"
        time.sleep(0.01)
    for pid in process_tree(proc.pid):  # every rank and the launcher at once, as when the node dies
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    assert max(r["step"] for r in rows(killed)) < 8, "the run was not interrupted"

    res = subprocess.run(torchrun(data_dir, killed, *extra, "resume=true"), cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    resumed = rows(killed)
    assert [r["step"] for r in resumed] == [r["step"] for r in reference]
    for a, b in zip(reference, resumed):
        for key in ("loss", "grad_norm", "lr", "heldout_loss"):
            assert a.get(key) == b.get(key), (a["step"], key, a.get(key), b.get(key))

    # The same global batch on one process gives the same losses up to float32 reduction order.
    for a, b in zip(reference, single_run):
        for key in ("loss", "heldout_loss"):
            if key in a:
                assert abs(a[key] - b[key]) < 1e-4 * abs(b[key]), (a["step"], key, a[key], b[key])


def test_fsdp_prefetch_and_no_reshard_train_identically(data_dir, tmp_path):  # noqa: F811
    """strategy.fsdp_prefetch and strategy.reshard_after_forward=false change when parameters are gathered, not
    what is computed: 2 gloo ranks log the same losses and gradient norms as with FSDP2's defaults."""
    extra = ("strategy=fsdp", "train.max_steps=3", "eval.per_token_loss=false")
    logs = []
    tuned = ("strategy.fsdp_prefetch=2", "strategy.reshard_after_forward=false")
    for name, opts in (("default", ()), ("tuned", tuned)):
        res = subprocess.run(torchrun(data_dir, tmp_path / name, *extra, *opts), cwd=ROOT, env=ENV,
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
        logs.append([(r["step"], r.get("loss"), r.get("grad_norm"), r.get("heldout_loss"))
                     for r in rows(tmp_path / name)])
    assert logs[0] == logs[1] and len(logs[0]) == 4


def test_single_strategy_refuses_several_ranks(data_dir, tmp_path):  # noqa: F811
    res = subprocess.run(torchrun(data_dir, tmp_path / "x", "train.max_steps=1"), cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "strategy.name=single trains in one process" in res.stdout + res.stderr


def test_two_ranks_skip_zero_rows_each_resume_their_own_position(tmp_path):
    """data.skip_zero_rows=true on 2 ranks: each rank skips the zero rows of its own stream, so their read
    positions differ; a resume from the step-3 checkpoint restores every rank's own position and logs the
    uninterrupted run's losses exactly."""
    from test_run_safety import zero_row_data

    data = zero_row_data(tmp_path)  # train rows 2..9 of 16 are all zeros
    extra = ("strategy=ddp", "data.seq_len=32", "data.text_escape=none", "train.max_steps=6",
             "train.checkpoint_every=3", "train.micro_batch_size=4", "data.skip_zero_rows=true",
             "eval.heldout_batches=1", "eval.per_token_loss=false")
    full = tmp_path / "full"
    res = subprocess.run(torchrun(data, full, *extra), cwd=ROOT, env=ENV, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    saved = _load_state_dict_from_keys(checkpoint_id=str(full / "checkpoints" / "step_00000003"))["app"]["data"]
    positions = [(d["rank"], d["position_in_epoch"], d["zero_sequences_skipped"]) for d in saved["per_rank"]]
    assert [p[0] for p in positions] == [0, 1] and positions[0][1:] != positions[1][1:]  # the ranks drifted apart

    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_00000006")
    res = subprocess.run(torchrun(data, resumed, *extra, "resume=true"), cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "(step 3," in res.stdout
    assert [(r["step"], r.get("loss"), r.get("grad_norm"), r.get("heldout_loss")) for r in rows(resumed)] == \
        [(r["step"], r.get("loss"), r.get("grad_norm"), r.get("heldout_loss")) for r in rows(full)]
