"""cygemm.fused, the dense layer's old name: a deprecated alias of cygemm.dense (CPU)."""
import importlib
import sys

import pytest


def test_importing_the_alias_warns_and_gives_the_dense_layers_own_objects():
    import cygemm.dense as dense
    sys.modules.pop("cygemm.fused", None)           # a fresh import: the warning comes at import
    with pytest.warns(DeprecationWarning, match="cygemm.dense"):
        fused = importlib.import_module("cygemm.fused")
    for name in fused.__all__:
        assert getattr(fused, name) is getattr(dense, name), name
    assert set(fused.FORWARD_ROUTES) == {"epilogue", "gelu_aux", "bias_epilogue_kernel", "gemm_kernel"}
    assert set(fused.BACKWARD_ROUTES) == {"serial", "branches"}


def test_the_package_attribute_loads_the_alias_on_first_use():
    import cygemm
    sys.modules.pop("cygemm.fused", None)
    cygemm.__dict__.pop("fused", None)
    with pytest.warns(DeprecationWarning):
        assert cygemm.fused.forward_into is cygemm.dense.forward_into


def test_the_package_itself_does_not_import_the_alias():
    import subprocess
    code = "import sys, cygemm, cygemm.gemm_ops, cygemm.nn; print('cygemm.fused' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
