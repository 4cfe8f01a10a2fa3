"""cygemm.rowmajor.promise_checks: the row-major GEMMs register the exact checks of their
promises with the engine at import (the engine never calls the public API itself). CPU; the
checks themselves run on the GPU in tests/engine/test_ktail.py and test_promises.py."""
from cygemm.engine import promises as _promises
from cygemm.rowmajor import promise_checks


def test_importing_the_feature_registers_its_checks():
    for promise, check in (("ktail_guard", promise_checks._check_ktail_guard),
                           ("batch_invariant", promise_checks._check_batch_invariant),
                           ("ktail_fixed", promise_checks._check_ktail_fixed)):
        assert _promises._CHECKS[promise] is check, promise


def test_a_check_for_an_unknown_promise_is_refused():
    import pytest
    with pytest.raises(ValueError, match="promise: expected one of"):
        _promises.register_check("fast", lambda: True)
