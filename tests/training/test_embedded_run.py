"""`python train.py` on the embedded corpus, shortened: prepares the corpus into a fresh cache, learns below the
unigram entropy of the held-out tokens over the whole held-out split (no context-free model does better), and
writes the per-token-loss plot."""

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
    # the held-out tokens' own unigram entropy bounds any context-free model's loss on them from below (6.42 here;
    # 48 steps reach 6.34 over the whole split, both books)
    floor = unigram_entropy(data_dir, "heldout")
    assert rows[-1]["heldout_loss"] < floor - 0.05, (rows[-1], floor)
    # by default the held-out loss covers the whole held-out split, and says so
    assert (rows[-1]["heldout_rows"], rows[-1]["heldout_split_rows"], rows[-1]["heldout_tokens"]) == (57, 57, 116736)
    assert (f"held-out loss {rows[-1]['heldout_loss']:.4f} over all 57 rows × 2,048 tokens of heldout.zarr "
            "(116,736 tokens)") in res.stdout
    assert (out / "per_token_loss.png").stat().st_size > 10_000
    curve = json.loads((out / "per_token_loss.json").read_text())
    assert len(curve["loss"]) == 2048 and curve["train_len"] == 256  # evaluated beyond the training length
    assert (out / "checkpoints" / "step_00000048" / ".metadata").is_file()
