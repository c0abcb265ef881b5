"""Ops-test configuration: the ``gpu`` marker, the Triton interpreter on machines without CUDA, and the fixtures
of the interpreter tests."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must happen before triton is imported anywhere (tests/conftest.py does the same).
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    config.addinivalue_line("markers",
                            "gpu: needs a CUDA GPU (run on the device: bash benchmarks/attention/gpu_tests.sh)")


@pytest.fixture
def poison(monkeypatch):
    """Every float buffer allocated with torch.empty / empty_like during a test starts as NaN, every integer one as
    123456789 (counters and tables must be written, not found zero)."""
    empty, empty_like = torch.empty, torch.empty_like

    def poisoned(t):
        if t.dtype == torch.bool:
            return t
        return t.fill_(float("nan") if t.is_floating_point() else 123456789)

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poisoned(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poisoned(empty_like(*a, **k)))


@pytest.fixture
def big_tiles():
    """Larger interpreter tiles (fewer programs) for the longer sequences."""
    from forgetting_transformer.ops.forgetting_attention import use_options

    with use_options(triton_configs={"fwd": (64, 32, 4, 1), "dq": (32, 64, 4, 1), "dkdv": (32, 64, 4, 1)}) as o:
        yield o
