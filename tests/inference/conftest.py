import pytest
import torch

from inference_models import three_prompts


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: the models here are tiny, and on a loaded machine two threads of one op wait on each
    other for the cores other processes hold."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def prompts():
    return three_prompts()
