"""Every compiled module ships a stub (.pyi) that declares each of its public functions and
classes (what type checkers and IDEs read)."""
import importlib.util

import pytest
import cygemm
from cygemm.__main__ import OPTIONAL_MODULES

# The compiled modules of an optional dependency's subpackage are checked where it is installed
# (CI runs this file again with torch and JAX).
_MISSING = tuple(m.replace("cygemm.", "").replace(".", "/") + "/" for m, dep in OPTIONAL_MODULES.items()
                 if importlib.util.find_spec(dep) is None)


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
    for name in (m for m in modules if not m.startswith(_MISSING)):
        stub = os.path.join(root, f"{name}.pyi")
        assert os.path.isfile(stub), f"{name}: no stub"
        declared = {n.name for n in ast.walk(ast.parse(open(stub).read()))
                    if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        mod = importlib.import_module("cygemm." + name.replace("/", "."))
        public = {k for k, v in vars(mod).items() if not k.startswith("_") and callable(v)
                  and getattr(v, "__module__", None) == mod.__name__}
        assert public <= declared, f"{name}.pyi lacks {sorted(public - declared)}"


def test_a_type_checker_finds_cygemm_and_its_stubs_and_checks_calls_by_them(tmp_path):
    """mypy, run away from the source tree, finds the package however it is installed (the
    README's editable install in compat mode, a plain editable install with MYPYPATH, a wheel)
    and its stubs; the typical calls of typical_calls.py pass, under --strict too, and each call
    of wrong_calls.py is refused."""
    import os
    import shutil
    import subprocess
    import sys
    pytest.importorskip("mypy", reason="mypy is not installed (it is in the test extra: pip install -e '.[test]')")
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("typical_calls.py", "wrong_calls.py"):
        shutil.copy(os.path.join(here, name), tmp_path / name)
    (tmp_path / "reveal.py").write_text("import cygemm\nreveal_type(cygemm.matmul)\n")
    env = dict(os.environ)
    # A plain editable install (pip install -e .) imports cygemm through an import hook that type
    # checkers do not run: they find the checkout through MYPYPATH, as docs/install.rst says.
    # (mypy refuses site-packages there: an installed wheel is found without it.)
    parent = os.path.dirname(os.path.dirname(os.path.abspath(cygemm.__file__)))
    if os.path.basename(parent) not in ("site-packages", "dist-packages"):
        env["MYPYPATH"] = parent
    # As docs/install.rst advises for that path: mypy reports on the user's files, not cygemm's
    # own (an installed package is silent so already).
    (tmp_path / "mypy.ini").write_text("[mypy]\n\n[mypy-cygemm.*]\nfollow_imports = silent\n")
    run = lambda *args: subprocess.run([sys.executable, "-m", "mypy", *args, "--no-incremental", "--no-error-summary"],
                                       cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    p = run("typical_calls.py", "wrong_calls.py", "reveal.py")
    lines = p.stdout.splitlines()
    assert not any("Cannot find implementation or library stub" in l for l in lines), p.stdout
    assert any("CudaArrayInterface" in l for l in lines if l.startswith("reveal.py")), p.stdout + p.stderr
    assert [l for l in lines if l.startswith("typical_calls.py")] == []
    strict = run("--strict", "typical_calls.py")
    assert strict.stdout.splitlines() == [], strict.stdout
    wrong = [n for n, l in enumerate(open(tmp_path / "wrong_calls.py"), 1) if l.rstrip().endswith("# WRONG")]
    flagged = {int(l.split(":")[1]) for l in lines if l.startswith("wrong_calls.py") and ": error:" in l}
    assert flagged == set(wrong), p.stdout


# ------------------------------------------------------------------ stubs agree with the code

_KINDS = {"posonly": "POSITIONAL_ONLY", "arg": "POSITIONAL_OR_KEYWORD", "vararg": "VAR_POSITIONAL",
          "kwonly": "KEYWORD_ONLY", "kwarg": "VAR_KEYWORD"}
_NONE = object()            # no default
_CYTHON_TYPES = r"(?:bint|str|int|double|float|object|long|list|tuple|dict)"


def _ast_params(args):
    """[(name, kind, default AST or _NONE)] of an ast.arguments."""
    import ast
    pos = args.posonlyargs + args.args
    defaults = [_NONE] * (len(pos) - len(args.defaults)) + list(args.defaults)
    out = [(p.arg, _KINDS["posonly" if i < len(args.posonlyargs) else "arg"], defaults[i])
           for i, p in enumerate(pos)]
    if args.vararg:
        out.append((args.vararg.arg, _KINDS["vararg"], _NONE))
    out += [(p.arg, _KINDS["kwonly"], _NONE if d is None else d) for p, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        out.append((args.kwarg.arg, _KINDS["kwarg"], _NONE))
    return [(n, k, d if d is _NONE else ast.literal_eval(d) if not (isinstance(d, ast.Constant) and d.value is ...)
             else ...) for n, k, d in out]


def _runtime_params(obj):
    import inspect
    sig = inspect.signature(obj)
    return [(p.name, p.kind.name, _NONE if p.default is inspect.Parameter.empty else p.default)
            for p in sig.parameters.values()]


def _source_params(pyx, cls, method):
    """The parameters of `def method` of `cdef class cls` in a .pyx (for cdef classes, whose
    __init__ has no runtime signature), read by Python's parser once the C types are dropped."""
    import ast
    import re
    text = open(pyx).read()
    body = text[text.index(f"cdef class {cls}"):]
    m = re.search(rf"\n    def {method}\((.*?)\):\n", body, re.S)
    params = re.sub(rf"\b{_CYTHON_TYPES}\s+(?=\w+\s*[=,)\n])", "", m.group(1) + ")")[:-1]
    return _ast_params(ast.parse(f"def f({params}): pass").body[0].args)


def _disagreements(where, stub, runtime, overloaded):
    """Names and kinds equal; every default the stub gives, the runtime has (and equal where the
    stub spells it); a default the runtime has, the stub gives too (an overload may require it)."""
    if [p[:2] for p in stub] != [p[:2] for p in runtime]:
        return [f"{where}: stub parameters {[p[:2] for p in stub]}, runtime {[p[:2] for p in runtime]}"]
    bad = []
    for (name, _, sd), (_, _, rd) in zip(stub, runtime):
        if sd is not _NONE and (rd is _NONE or (sd is not ... and (sd != rd or type(sd) is not type(rd)))):
            bad.append(f"{where}: {name}: stub default {sd!r}, runtime {'none' if rd is _NONE else repr(rd)}")
        if sd is _NONE and rd is not _NONE and not overloaded:
            bad.append(f"{where}: {name}: the stub has no default, the runtime {rd!r}")
    return bad


def _compiled_modules():
    import importlib.machinery
    import os
    root = os.path.dirname(cygemm.__file__)
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return root, sorted({os.path.relpath(os.path.join(folder, n.split(".")[0]), root)
                         for folder, _, names in os.walk(root) for n in names if n.endswith(suffixes)})


def test_every_stub_signature_is_the_codes():
    """Each public function and method a stub declares has the runtime's parameters: names,
    kinds and defaults (cdef classes' __init__ read from their .pyx, where the source is here).
    set_options(**changes) may spell its keywords out: exactly the options."""
    import ast
    import importlib
    import os
    from cygemm.engine import settings
    root, modules = _compiled_modules()
    bad, checked = [], 0
    for name in (m for m in modules if not m.startswith(_MISSING)):
        mod = importlib.import_module("cygemm." + name.replace("/", "."))
        tree = ast.parse(open(os.path.join(root, f"{name}.pyi")).read())
        overloaded = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                      and any(getattr(d, "id", None) == "overload" for d in n.decorator_list)}
        for node in tree.body:
            pairs = []
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                pairs.append((node.name, node, getattr(mod, node.name)))
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                cls = getattr(mod, node.name)
                for m in node.body:
                    if (isinstance(m, ast.FunctionDef) and (m.name == "__init__" or not m.name.startswith("_"))
                            and not any(getattr(d, "id", None) == "property" for d in m.decorator_list)):
                        pairs.append((f"{node.name}.{m.name}", m, getattr(cls, m.name)))
            for where, fn, runtime in pairs:
                stub = _ast_params(fn.args)
                try:
                    actual = _runtime_params(runtime)
                except (TypeError, ValueError):
                    actual = None
                if actual is None or [p[1] for p in actual] == ["POSITIONAL_ONLY", "VAR_POSITIONAL", "VAR_KEYWORD"]:
                    pyx = os.path.join(root, f"{name}.pyx")
                    if not os.path.isfile(pyx):
                        continue            # (an installed wheel: checked in the source tree)
                    actual = _source_params(pyx, where.split(".")[0], fn.name)
                if where == "set_options":
                    assert [p[0] for p in stub] == list(settings.DEFAULTS), [p[0] for p in stub]
                    assert actual == [("changes", "VAR_KEYWORD", _NONE)], actual
                    checked += 1
                    continue
                bad += _disagreements(f"{name}.{where}", stub, actual, fn.name in overloaded)
                checked += 1
    assert checked > 60, checked
    assert not bad, "\n".join(bad)
