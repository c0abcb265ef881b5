"""Ops-test configuration: the ``gpu`` marker, and the Triton interpreter on machines without CUDA."""

import os

import torch

if not torch.cuda.is_available():
    # Must happen before triton is imported anywhere (tests/conftest.py does the same).
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    config.addinivalue_line("markers",
                            "gpu: needs a CUDA GPU (run on the device: bash benchmarks/attention/gpu_tests.sh)")
