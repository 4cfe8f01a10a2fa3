"""The documentation agrees with the code and with itself: the default streams the docstrings and
pages name, the index's summary, the offline install recipe against pyproject.toml, the words
the glossary defines, one version, and the examples' extra and --help."""
import ast
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def _read(*parts):
    """A file of the tree; the package's own files from the cygemm that is imported (CI runs these
    tests against the installed wheel, with the source package removed)."""
    if parts[0] == "cygemm":
        import cygemm
        return open(os.path.join(os.path.dirname(cygemm.__file__), *parts[1:]), encoding="utf-8").read()
    return open(os.path.join(ROOT, *parts), encoding="utf-8").read()


def _pyproject():
    try:
        import tomllib
    except ImportError:                                   # Python 3.10
        tomllib = pytest.importorskip("tomli")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _requirement_name(req):
    return re.match(r"[A-Za-z0-9_.\-]+", req).group(0).lower().replace("_", "-")


# ------------------------------------------------------------------------- default streams

@pytest.mark.parametrize("source, func", [(("cygemm", "nn", "step.py"), "compile_step"),
                                          (("cygemm", "backend", "cuda_backend.py"), "CUDABackend")])
def test_the_default_stream_is_described_as_the_code_makes_it(source, func):
    text = _read(*source)
    made = re.findall(r"cp\.cuda\.Stream\(non_blocking=(True|False)\)", text)
    assert made == ["False"], f"{'/'.join(source)}: expected one default stream, made blocking"
    doc = ast.get_docstring(next(n for n in ast.walk(ast.parse(text))
                                 if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == func))
    default = re.search(r"[Dd]efault: a new ([\w-]+) stream", doc)
    assert default and default.group(1) == "blocking", f"{func}'s docstring: {default and default.group(0)}"


@pytest.mark.parametrize("page", ["nn.rst", "backend.rst"])
def test_the_pages_call_the_default_stream_blocking(page):
    text = _read("docs", page)
    assert re.search(r"\bblocking\s+stream\b", text) and "non-blocking" not in text


# ------------------------------------------------------------------------- the index page

def test_the_index_summary_names_every_part():
    text = _read("docs", "index.rst")
    first = text.split(".. doctest::")[0]
    for part in ("FP8", "grouped", "cygemm.nn", "cygemm.backend", "matmul", "CUDA graphs"):
        assert part in first, part


# ------------------------------------------------------------------------- install.rst

def test_the_offline_recipe_installs_every_build_and_runtime_requirement():
    meta = _pyproject()
    needed = {_requirement_name(r) for r in meta["build-system"]["requires"] + meta["project"]["dependencies"]}
    text = _read("docs", "install.rst")
    recipe = text[text.index("On a machine without network"):]
    named = {_requirement_name(m) for m in re.findall(r'"([A-Za-z0-9_.\-]+[<>=][^"]*)"', recipe)}
    assert needed - named == set(), f"missing from install.rst's offline recipe: {sorted(needed - named)}"
    assert "--no-build-isolation" in recipe


def test_every_extra_is_listed_on_the_install_page():
    extras = set(_pyproject()["project"]["optional-dependencies"])
    text = _read("docs", "install.rst")
    missing = sorted(e for e in extras if f"``.[{e}]``" not in text)
    assert not missing, f"extras missing from install.rst: {missing}"


# ------------------------------------------------------------------------- words

def test_the_glossary_defines_the_words_the_pages_use_unexplained():
    text = _read("docs", "glossary.rst")
    terms = set(re.findall(r"^   (\S[^\n]*)$", text.split(".. glossary::")[1], re.M))
    assert {"route", "fixed rule", "release queue", "C++ floor"} <= terms
    assert "glossary" in _read("docs", "index.rst")


def test_the_sidebar_is_not_left_empty():
    conf = _read("docs", "conf.py")
    assert re.search(r'html_sidebars = \{"\*\*": \[\]', conf)


# ------------------------------------------------------------------------- version

def test_the_version_is_written_once():
    meta = _pyproject()
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "cygemm.__version__"}
    init = ast.parse(_read("cygemm", "__init__.py"))
    literal = [n.value.value for n in init.body if isinstance(n, ast.Assign)
               and any(getattr(t, "id", None) == "__version__" for t in n.targets)]
    # A literal: setuptools reads it without importing cygemm (which needs cuBLAS).
    assert len(literal) == 1 and re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+|rc\d+)?", literal[0])


# ------------------------------------------------------------------------- examples

EXAMPLES = sorted(f for f in os.listdir(os.path.join(ROOT, "examples")) if f.endswith(".py"))
CORE = {"cygemm", "numpy", "cupy", "cupyx", "ml_dtypes"}          # installed with cygemm
NOT_IN_THE_EXTRA = {"torch"}                                       # optional: --no-torch, or a fallback
IMPORT_TO_PACKAGE = {"sklearn": "scikit-learn"}


def _third_party_imports(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names} - CORE


def test_the_examples_extra_installs_what_the_examples_import():
    extra = {_requirement_name(r) for r in _pyproject()["project"]["optional-dependencies"]["examples"]}
    imported = set().union(*(_third_party_imports(os.path.join(ROOT, "examples", f)) for f in EXAMPLES))
    assert "sklearn" in imported                                   # the check sees the imports
    wanted = {IMPORT_TO_PACKAGE.get(n, n) for n in imported - NOT_IN_THE_EXTRA}
    assert wanted - extra == set(), f"imported by examples/ but not in the examples extra: {sorted(wanted - extra)}"


@pytest.mark.parametrize("example", EXAMPLES)
def test_each_example_help_is_whole_and_offers_only_what_exists(example):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", example), "--help"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    description = out.stdout.split("\n\n")[1]
    assert description.rstrip().endswith("."), f"{example} --help is cut: {description!r}"
    for unbuilt in ("reserved", "not built", "not implemented"):
        assert unbuilt not in out.stdout, f"{example} --help offers something unbuilt: {out.stdout}"
