"""Runs are never silently wrong (train.py in subprocesses, CPU): a used run dir is refused unless resumed or
overwritten, a failed start leaves no run dir (nor, failing at its first batch, anything that blocks its rerun), a
resume falls back from a damaged checkpoint and keeps metrics.jsonl matching the state it resumed from, a
non-finite gradient stops or skips the update and never reaches a checkpoint, user errors print their message
without a traceback, and train.log holds the console."""

import math
import os
import shutil

import pytest
import torch

from forgetting_transformer.training.checkpoint import TrainState, checkpoint_dirs, params_finite, save_checkpoint
from test_train_e2e import command, rows, run

SHORT = ("eval.per_token_loss=false",)


def losses(out):
    return [(r["step"], r.get("loss"), r.get("heldout_loss")) for r in rows(out)]


def test_a_used_run_dir_is_refused_and_overwrite_replaces_it(markov_data_dir, tmp_path):
    out = tmp_path / "run"
    assert run(command(markov_data_dir, out, "train.max_steps=2", *SHORT)).returncode == 0
    shutil.rmtree(out / "checkpoints")  # an earlier run without checkpoints still owns the dir
    res = run(command(markov_data_dir, out, "train.max_steps=3", *SHORT))
    assert res.returncode != 0 and "already holds another run" in res.stderr and "overwrite=true" in res.stderr
    assert "Traceback" not in res.stderr and [r[0] for r in losses(out)] == [1, 2, 2]  # untouched
    res = run(command(markov_data_dir, out, "train.max_steps=3", "overwrite=true", *SHORT))
    assert res.returncode == 0, res.stderr[-2000:]
    assert [r[0] for r in losses(out)] == [1, 2, 3, 3]  # the new run's rows only


def test_a_failed_start_leaves_no_run_dir_and_no_traceback(markov_data_dir, tmp_path):
    out = tmp_path / "bad"
    res = run(command(markov_data_dir, out, "optim.lr=-0.1"))
    assert res.returncode == 1 and res.stderr.strip().splitlines()[-1].startswith("error: invalid config: optim.lr")
    assert "Traceback" not in res.stderr and not out.exists()
    res = run(command(tmp_path / "no_data", out))
    assert res.returncode == 1 and "train.zarr" in res.stderr and "Traceback" not in res.stderr
    assert not out.exists()
    full = run(command(markov_data_dir, out, "optim.lr=-0.1"), env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    assert full.returncode != 0 and "Traceback" in full.stderr


def test_resume_without_a_checkpoint_starts_over_with_a_clean_log(markov_data_dir, tmp_path):
    ref = tmp_path / "ref"
    assert run(command(markov_data_dir, ref, "train.max_steps=3", *SHORT)).returncode == 0
    out = tmp_path / "run"
    assert run(command(markov_data_dir, out, "train.max_steps=3", *SHORT)).returncode == 0
    shutil.rmtree(out / "checkpoints")  # as if killed before its first checkpoint
    res = run(command(markov_data_dir, out, "train.max_steps=3", "resume=true", *SHORT))
    assert res.returncode == 0 and "no checkpoint in" in res.stdout
    assert losses(out) == losses(ref)  # steps 1, 2, 3 once, not 1, 2, 3, 1, 2, 3


def test_resume_of_a_finished_run_is_idempotent(markov_data_dir, tmp_path):
    out = tmp_path / "run"
    assert run(command(markov_data_dir, out, "train.max_steps=4", *SHORT)).returncode == 0
    before = losses(out)
    res = run(command(markov_data_dir, out, "train.max_steps=4", "resume=true", *SHORT))
    assert res.returncode == 0 and losses(out) == before and sum(r[2] is not None for r in before) == 1


def test_resume_falls_back_from_a_damaged_checkpoint(markov_data_dir, tmp_path):
    ref = tmp_path / "ref"
    assert run(command(markov_data_dir, ref, *SHORT)).returncode == 0
    out = tmp_path / "run"
    assert run(command(markov_data_dir, out, "train.max_steps=8", *SHORT)).returncode == 0
    newest = out / "checkpoints" / "step_00000008"
    shard = max((p for p in newest.iterdir() if p.suffix == ".distcp"), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # truncated shard
    res = run(command(markov_data_dir, out, "resume=true", *SHORT))
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"checkpoint {newest} does not load" in res.stdout and "step_00000004: the newer" in res.stdout
    assert losses(out) == losses(ref)  # steps 5.. redone from step 4: the uninterrupted run's numbers


def test_no_loadable_checkpoint_names_every_one_tried(markov_data_dir, tmp_path):
    out = tmp_path / "run"
    assert run(command(markov_data_dir, out, "train.max_steps=8", *SHORT)).returncode == 0
    for ckpt in checkpoint_dirs(out / "checkpoints"):
        (ckpt / ".metadata").unlink()
    res = run(command(markov_data_dir, out, "resume=true", *SHORT))
    assert res.returncode != 0 and "step_00000004" in res.stderr and "step_00000008" in res.stderr
    assert "no checkpoint under" in res.stderr


def test_a_nonfinite_gradient_stops_the_run_before_any_bad_checkpoint(markov_data_dir, tmp_path):
    out = tmp_path / "run"
    res = run(command(markov_data_dir, out, "optim.lr=1e30", "schedule.warmup_tokens=0", *SHORT))
    assert res.returncode == 1 and "error: gradient norm is nan at step" in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "the update was not applied" in res.stderr
    assert checkpoint_dirs(out / "checkpoints") == []  # stopped at step 2, before any checkpoint
    assert "error: gradient norm is nan" in (out / "train.log").read_text()
    assert [r[0] for r in losses(out)] == [1]  # the diverged step 2 logs no row


def test_nonfinite_skip_drops_the_update_and_goes_on(markov_data_dir, tmp_path):
    out = tmp_path / "run"
    res = run(command(markov_data_dir, out, "optim.lr=1e30", "schedule.warmup_tokens=0", "train.nonfinite=skip",
                      *SHORT))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "update skipped (train.nonfinite=skip)" in res.stdout
    assert [r[0] for r in losses(out)][-1] == 12


def test_save_checkpoint_refuses_nonfinite_weights(tmp_path):
    model = torch.nn.Linear(3, 2)
    state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1), data=_NoData(), step=5)
    assert params_finite(model)
    save_checkpoint(state, tmp_path / "ckpt", keep=2)
    with torch.no_grad():
        model.weight[0, 1] = math.inf
    assert not params_finite(model)
    state.step = 6
    with pytest.raises(FloatingPointError, match="NaN or inf at step 6.*step_00000005"):
        save_checkpoint(state, tmp_path / "ckpt", keep=2)
    assert [p.name for p in checkpoint_dirs(tmp_path / "ckpt")] == ["step_00000005"]


class _NoData:
    def state_dict(self):
        return {"position": 0}

    def load_state_dict(self, sd):
        pass


def test_train_log_holds_the_console(markov_data_dir, tmp_path):
    out = tmp_path / "run"
    res = run(command(markov_data_dir, out, "train.max_steps=3", *SHORT))
    assert res.returncode == 0
    log = (out / "train.log").read_text()
    for line in res.stdout.splitlines():
        assert line in log, line
    assert "output dir:" in log and "step 3 | loss" in log and "done in" in log
    res = run(command(markov_data_dir, out, "train.max_steps=4", "resume=true", *SHORT))
    log = (out / "train.log").read_text()
    assert log.count("output dir:") == 2 and "resumed from" in log  # the resumed run continues its own log


def zero_row_data(d):
    """A data dir whose train rows 2..9 are entirely token 0 (as a broken mirror zero-fills them)."""
    import json

    import numpy as np
    import zarr

    rng = np.random.default_rng(0)
    for split, n in (("train", 16), ("heldout", 4)):
        data = rng.integers(1, 64, size=(n, 64)).astype(np.uint16)
        if split == "train":
            data[2:10] = 0
        arr = zarr.create_array(store=str(d / f"{split}.zarr"), shape=data.shape, dtype=data.dtype, chunks=(1, 64),
                                zarr_format=3, config={"write_empty_chunks": True})
        arr[...] = data
    (d / "meta.json").write_text(json.dumps({"vocab_size": 64, "bos_id": 0, "doc_len": 64, "dtype": "uint16"}))
    return d


def test_zero_rows_stop_the_run_unless_skipped(tmp_path):
    """A data error at the first batch stops the run (its train.log says why) and leaves nothing that blocks the
    corrected run in the same directory, which replaces that attempt's config.yaml and train.log."""
    data = zero_row_data(tmp_path)
    out = tmp_path / "run"
    args = ("data.seq_len=32", "data.text_escape=none", "train.max_steps=6", "eval.heldout_batches=1", *SHORT)
    res = run(command(data, out, *args))
    assert res.returncode == 1 and "entirely token id 0" in res.stderr and "data.skip_zero_rows=true" in res.stderr
    assert "entirely token id 0" in (out / "train.log").read_text()  # the run's log says why
    assert sorted(p.name for p in out.iterdir()) == [".hydra", ".lock", "config.yaml", "train.log"]
    res = run(command(data, out, *args, "data.skip_zero_rows=true"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert [r[0] for r in losses(out)][-2:] == [6, 6]
    assert "entirely token id 0" not in (out / "train.log").read_text()  # the failed attempt's log is replaced
    assert "skip_zero_rows: true" in (out / "config.yaml").read_text()


def test_a_user_error_drops_the_model_before_the_process_group(markov_data_dir, tmp_path, monkeypatch):
    """A user error raised while the phases hold a model: by the time the process group is destroyed the model
    has been collected (in a multi-rank run DDP's reducer, alive at that point, could hang gloo's teardown)."""
    import weakref

    from hydra import compose, initialize_config_dir

    from forgetting_transformer.config import register_configs
    from forgetting_transformer.training import run as run_module

    register_configs()
    configs = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")
    with initialize_config_dir(config_dir=configs, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "data=longcrawl64", f"data.data_dir={markov_data_dir}", "data.vocab_size=64", "data.bos_id=0",
            f"output_dir={tmp_path / 'run'}", "strategy.device=cpu"])
    alive_at_shutdown, held = [], []

    def phases(cfg, ctx):
        model = torch.nn.Linear(4, 4)
        held.append(weakref.ref(model))
        raise ValueError("a bad value in the data")

    monkeypatch.setattr(run_module, "shutdown", lambda: alive_at_shutdown.append(held[0]() is not None))
    with pytest.raises(ValueError, match="a bad value"):
        run_module.run_in_dir(cfg, phases)
    assert alive_at_shutdown == [False]
