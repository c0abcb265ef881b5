"""Named sizes are data: every model config at every paper size is within 5% of its nominal size."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from count_params import MODELS, SIZES, count  # noqa: E402


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("model", MODELS)
def test_non_embedding_parameters_within_5_percent_of_nominal(model, size):
    non_embedding, total = count(model, size)
    assert abs(non_embedding / SIZES[size] - 1) < 0.05, (model, size, non_embedding)
    assert total > non_embedding


def test_head_dim_sweep_keeps_the_width():
    # The paper's 760M Transformer uses 12 heads of 128 instead of 24 of 64: same parameters.
    assert count("transformer_llama", "760m", ["model.head_dim=128"]) == count("transformer_llama", "760m")
