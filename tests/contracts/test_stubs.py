"""Every compiled module ships a stub (.pyi) that declares each of its public functions and
classes (what type checkers and IDEs read)."""
import cygemm


def test_every_compiled_module_has_a_stub_naming_its_public_functions():
    import ast
    import importlib
    import importlib.machinery
    import os
    folder = os.path.dirname(cygemm.__file__)
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    modules = sorted({n.split(".")[0] for n in os.listdir(folder) if n.endswith(suffixes)})
    assert "_context" in modules and "plans" in modules     # the compiled modules, installed or built
    for name in modules:
        stub = os.path.join(folder, f"{name}.pyi")
        assert os.path.isfile(stub), f"{name}: no stub"
        declared = {n.name for n in ast.walk(ast.parse(open(stub).read()))
                    if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        mod = importlib.import_module(f"cygemm.{name}")
        public = {k for k, v in vars(mod).items() if not k.startswith("_") and callable(v)
                  and getattr(v, "__module__", None) == mod.__name__}
        assert public <= declared, f"{name}.pyi lacks {sorted(public - declared)}"
