"""`python train.py` on the embedded corpus, shortened: prepares the corpus into a fresh cache, learns well below
the corpus's unigram entropy on held-out data, and writes the per-token-loss plot."""

import json
import os
import subprocess
import sys
from pathlib import Path

from forgetting_transformer.data import unigram_entropy

ROOT = Path(__file__).resolve().parents[2]


def test_default_config_on_the_embedded_corpus(tmp_path):
    env = dict(os.environ, FOX_CACHE_DIR=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "train.py"), f"output_dir={out}", "train.max_steps=48",
           "eval.per_token_rows=2"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert f"output dir: {out}" in res.stdout
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    data_dir = next((tmp_path / "cache").iterdir())
    entropy = unigram_entropy(data_dir, "train")
    assert 6.0 < entropy < 7.5  # 4k BPE on English books
    assert rows[-1]["heldout_loss"] < entropy - 0.4, (rows[-1], entropy)
    assert (out / "per_token_loss.png").stat().st_size > 10_000
    curve = json.loads((out / "per_token_loss.json").read_text())
    assert len(curve["loss"]) == 2048 and curve["train_len"] == 256  # evaluated beyond the training length
    assert (out / "checkpoints" / "step_00000048" / ".metadata").is_file()
