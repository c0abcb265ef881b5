import pytest

from inference_models import three_prompts


@pytest.fixture(autouse=True)
def every_test_on_one_thread(one_thread):
    """Every test here runs on one intra-op thread (the shared ``one_thread`` fixture)."""


@pytest.fixture
def prompts():
    return three_prompts()
