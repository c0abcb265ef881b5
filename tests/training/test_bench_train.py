"""scripts/bench_train.py's SDPA pin (the rest of the script needs a GPU: docs/benchmarks.md)."""


import pytest
import torch

from tests.script_modules import load_script

bench_train = load_script("bench_train")
_pin_sdpa, _sdpa_choice = bench_train._pin_sdpa, bench_train._sdpa_choice

FLAGS = ("flash_sdp_enabled", "cudnn_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled")


@pytest.fixture
def restore_sdpa_flags():
    saved = {f: getattr(torch.backends.cuda, f)() for f in FLAGS}
    yield
    for f, on in saved.items():
        getattr(torch.backends.cuda, "enable_" + f.removesuffix("_enabled"))(on)


def test_pin_leaves_only_the_named_backend(restore_sdpa_flags):
    before = {f: getattr(torch.backends.cuda, f)() for f in FLAGS}
    _pin_sdpa("default")
    assert {f: getattr(torch.backends.cuda, f)() for f in FLAGS} == before
    _pin_sdpa("flash")
    assert [getattr(torch.backends.cuda, f)() for f in FLAGS] == [True, False, False, False]
    assert _sdpa_choice(1, 2, 64, 16, "cpu") == "flash_attention"  # what the dispatcher picks, by name
    _pin_sdpa("cudnn")
    assert [getattr(torch.backends.cuda, f)() for f in FLAGS] == [False, True, False, False]
    with pytest.raises(ValueError, match="--sdpa='flex'"):
        _pin_sdpa("flex")
