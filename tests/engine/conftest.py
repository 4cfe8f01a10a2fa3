"""What the engine's GPU tests share."""
import pytest

from tuning_util import isolated_tuning


@pytest.fixture
def gpu(request):
    """CuPy, bound as the test module's ``cp`` (its helpers read that name); the tuning table kept
    in this process only; options, forced routes and the table restored after. A module whose
    GPU tests need another setup defines its own ``gpu``."""
    request.module.cp = pytest.importorskip("cupy")
    with isolated_tuning():
        yield
