"""The package's layers (CPU, source only): no import cycle among the modules, the engine names
no feature, the bindings and kernel declarations name nothing of cygemm above them, each module
links the kernel files it launches, the row-major mapping is pure, and no module is over 500
lines."""
import ast
import glob
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PACKAGE = os.path.join(ROOT, "cygemm")
if not os.path.isfile(os.path.join(ROOT, "setup.py")) or not os.path.isdir(PACKAGE):
    pytest.skip("needs the source tree (setup.py and cygemm/ beside tests/)", allow_module_level=True)

NAMED = re.compile(r"^\s*(?:from|cimport|import)\s+cygemm\.([\w.]+)")
FROM_PACKAGE = re.compile(r"^\s*from\s+cygemm(\.engine)?\s+c?import\s+\(?([\w ,]+)")


def compiled_modules():
    """{module: [kernel, ...]}: every .pyx under cygemm/ and the kernel files its "# kernels:" line
    names (what setup.py builds)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(PACKAGE, "**", "*.pyx"), recursive=True)):
        name = os.path.relpath(path, PACKAGE)[:-4].replace(os.sep, ".")
        line = re.search(r"^# kernels: ([\w ]+)$", open(path).read(), re.M)
        found[name] = line.group(1).split() if line else []
    return found


def named_modules(path):
    """(line number, module) for every cygemm module a source file cimports or imports."""
    found = []
    for number, line in enumerate(open(path), 1):
        m = NAMED.match(line)
        if m:
            found.append((number, m.group(1)))
        m = FROM_PACKAGE.match(line)
        if m:
            prefix = "engine." if m.group(1) else ""
            if prefix:
                found = [f for f in found if f != (number, "engine")]      # (the package, not a module)
            names = [part.split(" as ")[0].strip() for part in m.group(2).split(",")]
            found += [(number, prefix + name) for name in names if name]
    return found


MODULES = compiled_modules()


def test_each_kernel_file_is_linked_where_it_is_launched():
    """A module that declares a kernel file's launchers (cimports cygemm.kernels.<name>'s
    functions) names it on its "# kernels:" line, and every kernel file is linked somewhere:
    setup.py links what the lines name, so a missing line is an undefined symbol at import."""
    kernels = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(PACKAGE, "kernels", "*.cu"))}
    named = {k for ks in MODULES.values() for k in ks}
    assert named <= kernels, named - kernels
    assert kernels <= named, f"kernel files no module links: {kernels - named}"
    launcher = re.compile(r"^\s*from\s+cygemm\.kernels\.(\w+)\s+cimport\s+\(?([^)]*?)\)?$", re.M | re.S)
    for module, ks in MODULES.items():
        text = open(os.path.join(PACKAGE, *module.split(".")) + ".pyx").read()
        for kernel, names in launcher.findall(text):
            calls = [n.strip() for n in names.replace("\n", " ").split(",") if n.strip().startswith("cygemm_")]
            if kernel in kernels and any(re.search(rf"\b{n}\(", text) for n in calls):
                assert kernel in ks, f"{module} launches {kernel}.cu's functions without '# kernels: {kernel}'"


@pytest.mark.parametrize("folder", ["bindings", "kernels"])
def test_bindings_and_kernel_declarations_name_only_the_bindings(folder):
    for path in glob.glob(os.path.join(PACKAGE, folder, "*.pxd")):
        for number, name in named_modules(path):
            assert name.startswith("bindings."), f"{path}:{number} names cygemm.{name}"


def test_the_row_major_mapping_is_pure():
    names = {name for _, name in named_modules(os.path.join(PACKAGE, "engine", "mapping.pyx"))}
    names |= {name for _, name in named_modules(os.path.join(PACKAGE, "engine", "mapping.pxd"))}
    assert names <= {"engine.types", "bindings.cublas", "bindings.cudart"}, names


# One concern per file matters more than a line count: these hold one concern that needs more.
LONGER = {
    os.path.join("engine", "tuning.pyx"): 750,     # timing candidates and keeping what won: the tuned table
    os.path.join("engine", "arrays.pyx"): 680,     # reading device arrays and describe_*'s layouts: the one reader
    os.path.join("engine", "context.pyx"): 630,    # a thread's handles and every workspace: its own, a capture's, given
    os.path.join("engine", "plans.pyx"): 530,      # a thread's plans: their cache (and its CPU test hook)
}


def test_no_module_is_over_500_lines():
    sources = [p for ext in ("pyx", "py") for p in glob.glob(os.path.join(PACKAGE, "**", f"*.{ext}"), recursive=True)]
    assert len(sources) > 30
    long = {rel: n for p in sources
            if (n := sum(1 for _ in open(p))) > LONGER.get(rel := os.path.relpath(p, PACKAGE), 500)}
    assert not long, long


def test_every_cublas_gemm_is_enqueued_in_one_module_behind_the_k_tail_guard():
    """cublasGemmEx / cublasGemmStridedBatchedEx and cublasLtMatmul run from cygemm/engine/launch.pyx
    alone, where the K-tail guard (cygemm/engine/ktail.pyx) sees every call; the grouped route's
    cublasGemmGroupedBatchedEx too."""
    import re
    calls = re.compile(r"\b(cublasGemmEx|cublasGemmEx_64|cublasGemmStridedBatchedEx|cublasGemmStridedBatchedEx_64"
                       r"|cublasLtMatmul|cublasGemmGroupedBatchedEx|cublasGemmBatchedEx|cublasSgemm\w*)\(")
    found = {}
    for path in glob.glob(os.path.join(PACKAGE, "**", "*.pyx"), recursive=True):
        code = "\n".join(line.split("#")[0] for line in open(path))
        code = re.sub(r'"""(.|\n)*?"""', "", code)
        if calls.search(code):
            found[os.path.relpath(path, PACKAGE)] = sorted(set(calls.findall(code)))
    assert set(found) == {os.path.join("engine", "launch.pyx")}, found
    launch = open(os.path.join(PACKAGE, "engine", "launch.pyx")).read()
    assert "gemmex_drops(" in launch and "ktail_possible(" in launch
    plans = open(os.path.join(PACKAGE, "engine", "plans.pyx")).read()
    assert "make_safe(" in plans and "gemmex_drops(" in plans


def test_the_top_of_the_package_shows_its_layers_in_at_most_21_entries():
    """ls cygemm: the package files, bindings/, kernels/, engine/, the features, nn/, backend/,
    and the two frameworks' integrations, autograd/ (torch) and jax/ (build outputs aside);
    every private engine module is under engine/."""
    ignored = (".c", ".cpp", ".so", ".pyd")
    entries = sorted(n for n in os.listdir(PACKAGE) if n != "__pycache__" and not n.endswith(ignored)
                     and not n.endswith(".egg-info"))
    assert len(entries) <= 21, entries
    assert {"bindings", "kernels", "engine", "nn", "backend", "capi.pxd"} <= set(entries)
    private = [n for n in entries if n.startswith("_") and n not in ("__init__.py", "__main__.py")]
    assert not private, f"private modules outside engine/: {private}"


def _calls(name):
    """The .pyx files (relative to cygemm/) whose code, comments and docstrings aside, calls `name`."""
    call = re.compile(rf"\b{name}\(")
    found = set()
    for path in glob.glob(os.path.join(PACKAGE, "**", "*.pyx"), recursive=True):
        code = "\n".join(line.split("#")[0] for line in open(path))
        code = re.sub(r'"""(.|\n)*?"""', "", code)
        code = re.sub(rf"cdef [\w ]+\b{name}\(", "", code)        # its definition
        if call.search(code):
            found.add(os.path.relpath(path, PACKAGE))
    return found


def test_one_chooser_claims_timing():
    """Every decision (a plan's candidate, a feature's route) is made by engine/chooser.pyx's
    choose, the one caller of single flight's claim."""
    assert _calls("claim_tuning") == {os.path.join("engine", "chooser.pyx")}
    assert _calls("choose") == {os.path.join("engine", f) for f in ("plans.pyx", "chooser.pyx")}


def test_one_execute_runs_plans():
    """A plan runs in engine/execute.pyx alone (with its refusal policy); engine/candidates.pyx
    runs candidates only to time them."""
    assert _calls("plan_run") == {os.path.join("engine", f) for f in ("execute.pyx", "candidates.pyx")}
    assert _calls("execute_plan") == {os.path.join("engine", "execute.pyx")}


def test_one_call_preparation():
    """Every entry point prepares its call by engine/args.pyx's prepare_call (check_overlaps is its
    first step, for calls whose overlaps were settled apart)."""
    defined = set()
    for path in glob.glob(os.path.join(PACKAGE, "**", "*.pyx"), recursive=True):
        for line in open(path):
            m = re.match(r"cdef \w+ ((?:prepare|resolve)_\w*call)\(", line)
            if m:
                defined.add((os.path.relpath(path, PACKAGE), m.group(1)))
    assert defined == {(os.path.join("engine", "args.pyx"), "prepare_call")}, defined


TESTS = os.path.join(ROOT, "tests")
# The features whose modules each have a test file of their name in tests/<package>/; where the
# name is another folder's already (test file names are unique), test_<package>_<module>.py.
FEATURES = ("rowmajor", "dense", "fp8", "grouped")


def _modules(package):
    folder = os.path.join(PACKAGE, package)
    return sorted({f.split(".")[0] for f in os.listdir(folder) if f.endswith((".pyx", ".py"))
                   and not f.startswith("__")})


def test_the_tests_mirror_the_engine():
    """Every engine module has tests/engine/test_<module>.py."""
    missing = [f"tests/engine/test_{m}.py" for m in _modules("engine")
               if not os.path.isfile(os.path.join(TESTS, "engine", f"test_{m}.py"))]
    assert not missing, f"engine modules without their test file: {missing}"


@pytest.mark.parametrize("package", FEATURES)
def test_the_tests_mirror_each_feature(package):
    names = {f for _, _, files in os.walk(TESTS) for f in files}
    missing = []
    for m in _modules(package):
        own = os.path.join(TESTS, package, f"test_{m}.py")
        if os.path.isfile(own):
            continue
        # A name another folder's test file has (test files share one namespace): test_<package>_<m>.py.
        clashes = sum(1 for folder, _, files in os.walk(TESTS) if f"test_{m}.py" in files)
        if not (clashes and os.path.isfile(os.path.join(TESTS, package, f"test_{package}_{m}.py"))):
            missing.append(own)
    assert not missing, f"{package} modules without their test file: {missing}"
    assert len(names) > 50


def test_every_subpackage_is_one_the_wheel_lists():
    """pyproject.toml lists the packages the wheel holds (no discovery): a subpackage missing
    there would be missing from every install but an editable one."""
    import tomllib
    listed = set(tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["tool"]["setuptools"]["packages"])
    found = {"cygemm." + os.path.relpath(folder, PACKAGE).replace(os.sep, ".") if folder != PACKAGE else "cygemm"
             for folder, _, files in os.walk(PACKAGE) if "__init__.py" in files}
    assert found == listed, (sorted(found - listed), sorted(listed - found))


def test_no_test_folder_takes_the_name_of_a_package_the_tests_import():
    """tests/ is on sys.path while pytest runs (its conftest.py), so a folder there named like
    an optional dependency is a namespace package that ``import jax`` finds where JAX is not
    installed: pytest.importorskip("jax") then imports the folder instead of skipping. (The
    tests of cygemm.jax are in tests/jax_ffi for that reason.)"""
    taken = {"jax", "jaxlib", "torch", "cupy", "numpy", "ml_dtypes", "hypothesis", "cygemm"}
    assert not taken & set(os.listdir(TESTS)), sorted(taken & set(os.listdir(TESTS)))


@pytest.mark.parametrize("package", ["nn", "backend", "kernels"])
def test_the_applications_and_kernels_have_their_test_folders(package):
    folder = os.path.join(TESTS, package)
    assert os.path.isdir(folder) and any(f.startswith("test_") for f in os.listdir(folder)), folder


def test_the_kernels_c_headers_live_at_the_top_of_the_tree_and_get_include_names_them():
    """The design card's layout: include/cygemm/ beside setup.py, cygemm/ and tests/; the
    build, the emulator and a Cython consumer (get_include()) find the headers there."""
    import cygemm
    top = os.path.join(ROOT, "include", "cygemm")
    headers = sorted(os.listdir(top))
    assert "kernels.h" in headers and len(headers) >= 10, headers
    assert not os.path.exists(os.path.join(ROOT, "cygemm", "kernels", "include")), "the headers moved back into cygemm/"
    found = [os.path.realpath(d) for d in cygemm.get_include()
             if os.path.isfile(os.path.join(d, "cygemm", "kernels.h"))]
    assert found == [os.path.realpath(os.path.join(ROOT, "include"))], cygemm.get_include()


# ---- layers that hold, read in every source (.py too), imports inside functions included

PUBLIC = {"", "fp8", "dense", "graph", "tuning", "typing", "gemm_ops", "elementwise", "plans", "grouped", "rowmajor",
          "capi"}
EVERY_NAME = re.compile(r"^\s*(?:from\s+cygemm((?:\.\w+)*)\s+c?import\s+\(?([\w ,]+)"
                        r"|(?:c?import)\s+cygemm((?:\.\w+)*))")


def _names_in(path):
    """(line, dotted module) for each cygemm module a source names: `from cygemm.x import y`
    names x.y where y is a module of x's, else x; `import cygemm` names the package ("")."""
    found = []
    for number, line in enumerate(open(path), 1):
        m = EVERY_NAME.match(line)
        if not m:
            continue
        if m.group(3) is not None:
            found.append((number, m.group(3).lstrip(".")))
            continue
        base = m.group(1).lstrip(".")
        for part in m.group(2).split(","):
            name = part.split(" as ")[0].strip()
            sub = os.path.join(PACKAGE, *(base.split(".") if base else []), name)
            is_module = os.path.isdir(sub) or any(os.path.isfile(sub + ext) for ext in (".py", ".pyx", ".pxd"))
            found.append((number, f"{base}.{name}".lstrip(".") if is_module else base))
    return found


def _sources(folder):
    return sorted(p for ext in ("py", "pyx", "pxd") for p in glob.glob(os.path.join(PACKAGE, folder, "**", f"*.{ext}"),
                                                                        recursive=True))


def test_the_engine_never_names_a_feature_or_the_public_api():
    above = [f"{os.path.relpath(p, PACKAGE)}:{n} names cygemm.{name}" for p in _sources("engine")
             for n, name in _names_in(p) if name.split(".")[0] not in ("engine", "bindings", "kernels")]
    assert not above, above


@pytest.mark.parametrize("package", ["nn", "backend"])
def test_the_applications_use_the_public_api_only(package):
    private = [f"{os.path.relpath(p, PACKAGE)}:{n} names cygemm.{name}" for p in _sources(package)
               for n, name in _names_in(p)
               if name.split(".")[0] not in PUBLIC | {package} and name != f"kernels.{package}"]
    assert not private, private


def test_no_import_cycle_among_the_modules_lazy_imports_included():
    modules = {}
    for path in _sources(""):
        rel = os.path.relpath(path, PACKAGE).rsplit(".", 1)[0].replace(os.sep, ".")
        rel = rel[:-len(".__init__")] if rel.endswith("__init__") else rel
        modules.setdefault(rel, set()).update(name for _, name in _names_in(path))
    graph = {m: {n for n in names if n in modules and n != m and not m.startswith(n + ".")
                 and not n.startswith(m + ".")} for m, names in modules.items()}
    # (a package and its own modules may name each other: __init__ gathers them)
    state, cycles = {}, []

    def visit(m, path):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_one_size_rule():
    """A problem is large from the autotune_min_macs option on, decided by engine/chooser.pyx's
    is_large alone (worth_timing and the fixed rules ask it); tuning only reports the option."""
    readers = {os.path.relpath(p, PACKAGE) for p in _sources("")
               if ".autotune_min_macs" in open(p).read()}
    assert readers == {os.path.join("engine", f) for f in ("chooser.pyx", "settings.pyx", "tuning.pyx")}, readers
    assert _calls("is_large") >= {os.path.join("engine", "execute.pyx"), os.path.join("dense", "routes.pyx")}
    chooser = open(os.path.join(PACKAGE, "engine", "chooser.pyx")).read()
    assert chooser.count(".autotune_min_macs") == 1


def test_a_batch_is_taken_apart_in_one_place():
    """The batches run a matrix at a time (a plain GEMM's and the int8 GEMM's) take matrix i by
    engine/execute.pyx's nth_matrix alone: no other code adds i times a batch stride."""
    stride_math = re.compile(r"\bi \* g\.stride_[abc]\b")
    found = {os.path.relpath(p, PACKAGE) for p in _sources("") if stride_math.search(open(p).read())}
    assert found == {os.path.join("engine", "execute.pyx")}, found
    assert _calls("nth_matrix") == {os.path.join("engine", "execute.pyx")}
    assert open(os.path.join(PACKAGE, "engine", "execute.pyx")).read().count("* g.stride_") == 3
