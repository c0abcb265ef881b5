"""The evaluation passes of training/evaluate.py: the held-out loss says what it covers (all of the split by
default, the last batch partial; or its first rows), and both passes print progress lines inside a slow batch."""

import time

import pytest
import torch

from forgetting_transformer.data import LongCrawl64Dataset, read_rows
from forgetting_transformer.training.evaluate import HeldoutLoss, heldout_loss, per_token_loss
from tests.inference.inference_models import tiny

VOCAB = 64  # of the markov_data_dir fixture: heldout.zarr holds 4 rows of 256 tokens


@pytest.fixture
def model():
    return tiny({}, dtype=torch.float32)


def heldout(markov_data_dir, batch_size):
    return LongCrawl64Dataset(markov_data_dir / "heldout.zarr", 64, batch_size, shuffle=False, vocab_size=VOCAB,
                              bos_id=0)


def test_the_held_out_loss_covers_every_row_by_default_and_says_what_it_covers(markov_data_dir, model):
    cpu = torch.device("cpu")
    data = heldout(markov_data_dir, 6)  # 16 sequences of 64 tokens: batches of 6, 6 and 4
    whole = heldout_loss(model, data, None, device=cpu, progress=False)
    x, y = read_rows(markov_data_dir / "heldout.zarr", [0, 1, 2, 3], 256, vocab_size=VOCAB, bos_id=0)
    with torch.no_grad():
        expected = model(x.reshape(16, 64), y.reshape(16, 64)).double().mean().item()  # the rows' 64-token chunks
    assert whole.loss == pytest.approx(expected, rel=1e-6)
    assert whole.text() == (f"held-out loss {whole.loss:.4f} over all 4 rows × 256 tokens of heldout.zarr "
                            "(1,024 tokens)")
    assert whole.record() == {"heldout_loss": whole.loss, "heldout_rows": 4, "heldout_split_rows": 4,
                              "heldout_tokens": 1024}
    part = heldout_loss(model, data, 1, device=cpu, progress=False)  # 6 chunks of 64 tokens: a row and a half
    assert part.text() == (f"held-out loss {part.loss:.4f} over the first 1.5 of 4 rows × 256 tokens of heldout.zarr "
                           "(384 of 1,024 tokens)")
    assert part.record()["heldout_rows"] == 1.5 and part.record()["heldout_tokens"] == 384
    assert HeldoutLoss(5.0, 128, 256, 57, 2048, "heldout.zarr").text() == (
        "held-out loss 5.0000 over the first 16 of 57 rows × 2,048 tokens of heldout.zarr (32,768 of 116,736 tokens)")
    with pytest.raises(ValueError, match=r"eval.heldout_batches=4 exceeds the 3 batches of 6 sequences of 64 tokens"):
        heldout_loss(model, data, 4, device=cpu, progress=False)


def test_a_slow_batch_prints_progress_lines_naming_it(markov_data_dir, model, monkeypatch, capsys):
    monkeypatch.setenv("FOX_PROGRESS_SECONDS", "0.1")
    model.blocks[0].register_forward_pre_hook(lambda module, args: time.sleep(0.35))  # a batch of ~0.4 s
    heldout_loss(model, heldout(markov_data_dir, 8), None, device=torch.device("cpu"))
    x, y = read_rows(markov_data_dir / "heldout.zarr", [0, 3], 256, vocab_size=VOCAB, bos_id=0)
    per_token_loss(model, x, y, batch_size=2, device=torch.device("cpu"))
    lines = capsys.readouterr().err.splitlines()
    # lines come while the first batch runs (none is done yet) and name it
    assert any(line.startswith("held-out loss: 0/2 batch (0%) | -- batch/s | batch 1 of 2 (8 × 64 tokens) for ")
               for line in lines), lines
    assert any(line.startswith("held-out loss: 1/2 batch (50%) | ") and "| batch 2 of 2 (8 × 64 tokens) for " in line
               for line in lines), lines
    assert any(line.startswith("per-token loss: 0/1 batch (0%) | -- batch/s | batch 1 of 1 (2 rows × 256 tokens) "
                               "for ") for line in lines), lines
    assert lines[-1].startswith("per-token loss: 1/1 batch (100%) | ") and " for " not in lines[-1]


def test_per_row_band_means_match_a_float64_reference(markov_data_dir, model):
    from forgetting_transformer.training.evaluate import band_means

    x, y = read_rows(markov_data_dir / "heldout.zarr", [0, 1, 3], 256, vocab_size=VOCAB, bos_id=0)
    curve, bands = per_token_loss(model, x, y, batch_size=2, device=torch.device("cpu"), band=96, progress=False)
    with torch.no_grad():
        ref = model.double()(x, y).double()  # (3, 256): every row's loss at every position
    model.float()
    assert bands.shape == (3, 3)  # bands of 96, 96 and the last 64 positions
    for k, (a, b) in enumerate(((0, 96), (96, 192), (192, 256))):
        assert torch.allclose(torch.from_numpy(bands[:, k]), ref[:, a:b].mean(1), atol=1e-4)
    assert torch.allclose(torch.from_numpy(curve), ref.mean(0), atol=1e-4)
    assert per_token_loss(model, x, y, batch_size=2, device=torch.device("cpu"), progress=False).shape == (256,)
    with pytest.raises(ValueError, match="band must be >= 1"):
        band_means(ref, 0)
