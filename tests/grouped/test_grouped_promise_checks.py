"""cygemm.grouped.promise_checks: the grouped GEMMs register the exact checks of cuBLASLt's
grouped matmul with the engine at import. CPU; the checks run on the GPU in
tests/grouped/test_lt_grouped.py and tests/engine/test_ktail.py."""
from cygemm.engine import promises as _promises
from cygemm.grouped import promise_checks


def test_importing_the_feature_registers_its_checks():
    assert _promises._CHECKS["lt_grouped"] is promise_checks._check_lt_grouped
    assert _promises._CHECKS["lt_grouped_fp8"] is promise_checks._check_lt_grouped_fp8
