"""The ``poison`` fixture's patch of torch.empty (tests/ops/poisoned.py) leaves no trace in the process."""

import torch
from torch.utils._device import _device_constructors

from poisoned import poisoned_allocations


def test_poisoning_leaves_torch_device_contexts_working():
    """torch first builds its set of factory functions under the patch (as torch.compile did in
    tests/ops/test_kernel.py): torch.device contexts still place torch.empty's tensors, during the patch and after
    it, so a later test's model built under ``torch.device("meta")`` is on meta (it came out on the CPU)."""
    _device_constructors.cache_clear()  # as in a fresh process: the set is built on its first use
    with poisoned_allocations():
        assert torch.isnan(torch.empty(3)).all()
        assert (torch.empty_like(torch.ones(2, dtype=torch.int64)) == 123456789).all()
        with torch.device("meta"):
            assert torch.empty(3).is_meta
    assert torch.empty in _device_constructors()
    with torch.device("meta"):
        assert torch.nn.Embedding(5, 4).weight.is_meta
    assert torch.get_default_device() == torch.device("cpu") and torch._C._len_torch_function_stack() == 0
