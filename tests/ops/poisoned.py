"""The ``poison`` fixture's patch (tests/ops/conftest.py), as a context manager its own test can enter too."""

import contextlib

import torch
from torch.utils._device import _device_constructors


@contextlib.contextmanager
def poisoned_allocations():
    """Within: every float buffer allocated with torch.empty / empty_like starts as NaN, every integer one as
    123456789 (counters and tables must be written, not found zero).

    ``torch.device`` contexts and ``torch.set_default_device`` tell factory functions by a set that torch builds on
    its first use and keeps for the process (``torch.utils._device._device_constructors``; torch.compile's tracing
    is one such use). Built while torch.empty is patched, it would hold the wrapper instead of torch.empty, which
    then ignores ``with torch.device("meta")`` for the rest of the process: models built for ``parallelize()`` came
    out on the CPU in a later test file. So the set is built from the real functions before patching them, and
    rebuilt after restoring them."""
    empty, empty_like = torch.empty, torch.empty_like

    def poisoned(t):
        if t.dtype == torch.bool:
            return t
        return t.fill_(float("nan") if t.is_floating_point() else 123456789)

    _device_constructors()
    torch.empty = lambda *a, **k: poisoned(empty(*a, **k))
    torch.empty_like = lambda *a, **k: poisoned(empty_like(*a, **k))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like
        _device_constructors.cache_clear()
