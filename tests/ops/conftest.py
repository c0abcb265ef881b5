"""Ops-test configuration: the ``gpu`` marker, the Triton interpreter on machines without CUDA, and the fixtures
of the interpreter tests."""

import os

import pytest
import torch

from poisoned import poisoned_allocations

if not torch.cuda.is_available():
    # Must happen before triton is imported anywhere (tests/conftest.py does the same).
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    config.addinivalue_line("markers",
                            "gpu: needs a CUDA GPU (run on the device: bash benchmarks/attention/gpu_tests.sh)")


@pytest.fixture
def poison():
    """Every float buffer allocated with torch.empty / empty_like during a test starts as NaN, every integer one as
    123456789 (counters and tables must be written, not found zero): tests/ops/poisoned.py."""
    with poisoned_allocations():
        yield


@pytest.fixture
def big_tiles():
    """Larger interpreter tiles (fewer programs) for the longer sequences."""
    from forgetting_transformer.ops.forgetting_attention import use_options

    with use_options(triton_configs={"fwd": (64, 32, 4, 1), "dq": (32, 64, 4, 1), "dkdv": (32, 64, 4, 1)}) as o:
        yield o
