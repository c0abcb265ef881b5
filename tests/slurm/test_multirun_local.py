"""Hydra multirun without SLURM (the basic launcher): every job trains in its own sweep subdir, which becomes its
output_dir, unless output_dir is given on the command line (then that is used, e.g. swept explicitly)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC_LEN = 256


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    import zarr

    d = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    for name, n in (("train.zarr", 8), ("heldout.zarr", 2)):
        arr = zarr.create_array(str(d / name), shape=(n, DOC_LEN), chunks=(1, DOC_LEN), dtype="uint16")
        arr[:] = rng.integers(1, 64, size=(n, DOC_LEN))
    return d


def multirun(data_dir, *overrides):
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=basic", "data=longcrawl64",
           f"data.data_dir={data_dir}", "data.seq_len=64", "data.vocab_size=64", "data.bos_id=0", "model.n_layers=1",
           "model.d_model=32", "model.head_dim=16", "train.batch_size=4", "train.micro_batch_size=4",
           "train.log_every=1", "train.max_steps=2", "eval.heldout_batches=1", "eval.per_token_loss=false",
           *overrides]
    res = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def test_each_sweep_job_gets_its_own_output_dir(data_dir, tmp_path):
    sweep = tmp_path / "sweep"
    multirun(data_dir, f"hydra.sweep.dir={sweep}", "optim.lr=1e-3,2e-3")
    assert (sweep / "multirun.yaml").exists()
    for num, lr in ((0, 0.001), (1, 0.002)):
        out = sweep / str(num)
        config = (out / "config.yaml").read_text()
        assert f"output_dir: {out}\n" in config and f"lr: {lr}\n" in config
        rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2, 2] and "heldout_loss" in rows[-1]
        assert (out / "checkpoints" / "step_00000002").is_dir()
        assert (out / ".hydra" / "overrides.yaml").exists()


def test_an_explicit_output_dir_wins_in_multirun(data_dir, tmp_path):
    sweep, a, b = tmp_path / "sweep", tmp_path / "a", tmp_path / "b"
    multirun(data_dir, f"hydra.sweep.dir={sweep}", f"output_dir={a},{b}")
    for out in (a, b):
        assert (out / "checkpoints" / "step_00000002").is_dir()
    assert not (sweep / "0" / "metrics.jsonl").exists()
