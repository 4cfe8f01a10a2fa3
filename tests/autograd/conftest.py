import pytest


@pytest.fixture
def cuda():
    """Skips a test where torch has no CUDA GPU (torch itself: each module imports it or skips)."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU for torch")
