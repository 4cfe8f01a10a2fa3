"""GPU tests carry @pytest.mark.gpu and skip, with the reason, where no CUDA GPU is usable."""
import functools

import pytest


@functools.lru_cache(maxsize=None)
def gpu_unavailable_reason():
    try:
        import cupy
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device, no cupy
        return f"no usable CUDA GPU here ({type(exc).__name__}: {exc})"
    return None if n > 0 else "no CUDA GPU here (0 devices)"


def pytest_collection_modifyitems(config, items):
    reason = gpu_unavailable_reason()
    for item in items:
        if reason and "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))
        if not reason and "nogpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="checks the no-GPU error path; a GPU is present"))
