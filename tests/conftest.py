"""GPU tests carry @pytest.mark.gpu and skip, with the reason, where no CUDA GPU is usable;
tests that need several GPUs carry @pytest.mark.multigpu and skip where there is one."""
import functools
import os
import tempfile

import pytest

# Tuning is kept in the user's cache folder by default: the tests keep theirs in a file of
# their own (a test that checks the default sets its own environment), so that no run
# depends on an earlier one, or on the user's.
os.environ["CYGEMM_TUNING_CACHE"] = os.path.join(tempfile.mkdtemp(prefix="cygemm-tests-"), "tuning.jsonl")


@functools.lru_cache(maxsize=None)
def gpu_unavailable_reason():
    import cygemm
    reason = cygemm.gpu_unavailable_reason()
    if reason:
        return reason
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CuPy missing or broken: GPU tests use it for arrays
        return f"CuPy cannot use the GPU ({type(exc).__name__}: {exc})"
    return None


@functools.lru_cache(maxsize=None)
def multigpu_unavailable_reason():
    reason = gpu_unavailable_reason()
    if reason:
        return reason
    import cygemm
    n = cygemm.device_count()
    return None if n >= 2 else f"needs two GPUs; this machine has {n}"


def pytest_collection_modifyitems(config, items):
    reason = gpu_unavailable_reason()
    for item in items:
        if reason and "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))
        elif "multigpu" in item.keywords and multigpu_unavailable_reason():
            item.add_marker(pytest.mark.skip(reason=multigpu_unavailable_reason()))
        if not reason and "nogpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="checks the no-GPU error path; a GPU is present"))


def pytest_terminal_summary(terminalreporter):
    """The skips, one line per reason (pytest's -rs gives one per test location)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons = {}
    for report in skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] = reasons.get(reason.removeprefix("Skipped: "), 0) + 1
    terminalreporter.section("skipped, by reason")
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{n:5d}  {reason}")


@pytest.fixture(autouse=True)
def _no_capture_left_known_open(request):
    """A GPU test that leaves a capture known open to cygemm (a raw capture with no cygemm call on
    its stream after it) holds every later test's releases: it errors here, by name, and the
    captures are forgotten so that the tests after it run as they would alone."""
    yield
    if "gpu" not in request.keywords or gpu_unavailable_reason():
        return
    from cygemm.engine import release
    left = release.forget_open_captures()
    if left:
        pytest.fail(f"{request.node.nodeid} left {left} capture(s) known open to cygemm: call cygemm on the "
                    "capture's stream after it ends (or use cygemm.graph.capture)", pytrace=False)
