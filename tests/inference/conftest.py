import pytest

from inference_models import three_prompts


@pytest.fixture
def prompts():
    return three_prompts()
