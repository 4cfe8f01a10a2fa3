"""Every compiled module ships a stub (.pyi) that declares each of its public functions and
classes (what type checkers and IDEs read)."""
import pytest
import cygemm


def test_every_compiled_module_has_a_stub_naming_its_public_functions():
    import ast
    import importlib
    import importlib.machinery
    import os
    root = os.path.dirname(cygemm.__file__)
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    modules = sorted({os.path.relpath(os.path.join(folder, n.split(".")[0]), root)
                      for folder, _, names in os.walk(root) for n in names if n.endswith(suffixes)})
    # The compiled modules, installed or built, those of the subpackages too.
    assert {"engine/context", "engine/plans", "nn/_kernels", "backend/_kernels"} <= set(modules)
    for name in modules:
        stub = os.path.join(root, f"{name}.pyi")
        assert os.path.isfile(stub), f"{name}: no stub"
        declared = {n.name for n in ast.walk(ast.parse(open(stub).read()))
                    if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        mod = importlib.import_module("cygemm." + name.replace("/", "."))
        public = {k for k, v in vars(mod).items() if not k.startswith("_") and callable(v)
                  and getattr(v, "__module__", None) == mod.__name__}
        assert public <= declared, f"{name}.pyi lacks {sorted(public - declared)}"


def test_a_type_checker_finds_cygemm_and_its_stubs(tmp_path):
    """mypy, run away from the source tree on code that uses cygemm, finds the installed package
    (the README's install is an editable install in compat mode: a .pth entry type checkers
    follow) and its stubs."""
    import subprocess
    import sys
    pytest.importorskip("mypy", reason="mypy is not installed (it is not a test dependency)")
    (tmp_path / "uses_cygemm.py").write_text("import cygemm\nreveal_type(cygemm.matmul)\n")
    p = subprocess.run([sys.executable, "-m", "mypy", "uses_cygemm.py", "--no-incremental"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert "Cannot find implementation or library stub" not in p.stdout, p.stdout
    assert "CudaArrayInterface" in p.stdout, p.stdout + p.stderr      # the stub's signature, not Any
