"""cached_loss: the per-token loss through the paged cache equals the model's full forward; with ACP eviction the
cache keeps fewer keys and the loss moves by no more than the dropped attention mass allows."""

import pytest
import torch

from inference_models import LOCAL, VARIANTS, tiny
from forgetting_transformer.inference.scoring import cached_loss


@pytest.mark.parametrize("name", ["fox_pro_rope_gqa", "fox_llama", "transformer_pro_gqa"])
@pytest.mark.parametrize("chunk", [1, 37, 300])
def test_cached_loss_equals_the_full_forward(name, chunk):
    model = tiny(VARIANTS[name])
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 97, (2, 150), generator=g), torch.randint(0, 97, (2, 150), generator=g)
    loss, stats = cached_loss(model, x, y, chunk=chunk, block_size=16)
    torch.testing.assert_close(loss, model(x, y), rtol=1e-6, atol=1e-6)
    assert stats["kept"].min() == 150  # every key kept


def test_eviction_keeps_fewer_keys_and_changes_the_loss_by_little():
    model = tiny(LOCAL)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randint(0, 97, (2, 400), generator=g), torch.randint(0, 97, (2, 400), generator=g)
    full = model(x, y)
    loss, stats = cached_loss(model, x, y, chunk=50, block_size=16, acp_eviction=True)
    assert stats["kept"].max() < 200  # the fast heads dropped most of their 400 keys
    assert stats["bytes_in_use"] < stats["pool_bytes"] / 2  # released blocks
    # at most eps = e^-10 of any attention row is dropped, in each of 2 layers: the loss moves far less than 1e-3
    assert (loss - full).abs().max() < 1e-3
    # a threshold that drops keys with much of the mass changes the loss: the comparison above can fail
    coarse, _ = cached_loss(model, x, y, chunk=50, block_size=16, acp_eviction=True, eviction_threshold=-0.5)
    assert (coarse - full).abs().max() > 1e-2


def test_bad_arguments_name_the_argument():
    model = tiny(VARIANTS["fox_pro"])
    x = torch.zeros(1, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="chunk must be"):
        cached_loss(model, x, x, chunk=0)
    with pytest.raises(ValueError, match="input_ids and labels"):
        cached_loss(model, x, x[:, :4], chunk=4)
    with pytest.raises(ValueError, match="needs a forget gate"):
        cached_loss(tiny(VARIANTS["transformer_llama"]), x, x, chunk=4, acp_eviction=True)
