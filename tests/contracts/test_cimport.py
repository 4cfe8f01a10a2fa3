"""examples/cython_consumer, a separate Cython extension that cimports cygemm's nogil C API
through cygemm/capi.pxd alone, compiles against the installed cygemm (CI too) and computes
right on a GPU. The docs' "From Cython" page shows these files themselves."""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
EXAMPLE = os.path.join(ROOT, "examples", "cython_consumer")

# The cimport contract: what cygemm/capi.pxd promises to other Cython code, every name it
# exports and no other (test_capi_pxd_declares_the_contract checks equality: a name added to
# capi.pxd is added here, and so to the check that each one cimports).
CAPI_NAMES = {"GemmContext", "current_context", "gemm_rowmajor", "gemm_rowmajor_strided_batched",
              "scaled_gemm_rowmajor", "cudaStream_t", "cudaDataType", "CUDA_R_16F", "CUDA_R_16BF",
              "CUDA_R_32F", "CUDA_R_64F", "CUDA_C_32F", "CUDA_C_64F", "CUDA_R_8F_E4M3", "CUDA_R_8F_E5M2",
              "cublasComputeType_t",
              "CUBLAS_COMPUTE_16F", "CUBLAS_COMPUTE_32F", "CUBLAS_COMPUTE_32F_PEDANTIC",
              "CUBLAS_COMPUTE_32F_FAST_16F", "CUBLAS_COMPUTE_32F_FAST_16BF", "CUBLAS_COMPUTE_32F_FAST_TF32",
              "CUBLAS_COMPUTE_64F", "cublasOperation_t", "CUBLAS_OP_N", "CUBLAS_OP_T",
              "CYGEMM_ACT_NONE", "CYGEMM_ACT_RELU", "CYGEMM_ACT_GELU",
              "SCALE_TENSOR", "SCALE_OUTER", "SCALE_1X128", "SCALE_128X128", "stream_from_object", "check_cuda"}


def _cimports(path, bound=False):
    """{module: names} of a Cython file's `from M cimport a, b` and `cimport M` statements: the
    names as M defines them, or with `bound` the names they are bound to in the file (b for
    `a as b`; for `cimport M [as N]`, N or M's first part, under M)."""
    text = re.sub(r"#[^\n]*", "", open(path).read())            # comments out
    found = {}
    pick = (lambda n: n.split(" as ")[-1].strip()) if bound else (lambda n: n.split(" as ")[0].strip())
    for module, names in re.findall(r"^\s*from\s+([\w.]+)\s+cimport\s+(\([^)]*\)|[^\n]+)", text, re.M):
        found.setdefault(module, set()).update(pick(n) for n in names.strip("()").split(",") if n.strip())
    for modules in re.findall(r"^\s*cimport\s+([^\n]+)", text, re.M):
        for m in modules.split(","):
            name = m.split(" as ")[0].strip()
            found.setdefault(name, set())
            if bound:
                found[name].add(m.split(" as ")[1].strip() if " as " in m else name.split(".")[0])
    return found


@pytest.fixture(scope="module")
def consumer(tmp_path_factory):
    d = tmp_path_factory.mktemp("cython_consumer")
    for name in ("consumer.pyx", "setup.py", "check.py"):
        shutil.copy(os.path.join(EXAMPLE, name), d)
    proc = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=d,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sys.path.insert(0, str(d))
    try:
        import consumer
        import check
        yield consumer, check
    finally:
        sys.path.remove(str(d))


def test_consumer_compiles_against_get_include_and_imports(consumer):
    mod, _ = consumer
    assert mod.sgemm.__doc__.startswith("C (m, n) = alpha") and callable(mod.sgemm_batched)


def test_the_consumer_cimports_only_the_contract():
    """cygemm.capi and libc, nothing else: no private module of cygemm."""
    found = _cimports(os.path.join(EXAMPLE, "consumer.pyx"))
    assert "cygemm.capi" in found, found
    others = {m for m in found if m != "cygemm.capi" and m.split(".")[0] != "libc"}
    assert not others, f"consumer.pyx cimports {sorted(others)} besides cygemm.capi and libc"


def test_capi_pxd_declares_the_contract():
    """capi.pxd exports exactly CAPI_NAMES: its names are those its cimports bind (it declares
    nothing of its own, which is checked too), none missing and none beyond the contract."""
    import cygemm                   # the installed contract (CI: the wheel's, the source package removed)
    path = os.path.join(os.path.dirname(cygemm.__file__), "capi.pxd")
    code = re.sub(r"#[^\n]*", "", open(path).read())
    own = re.findall(r"^\s*(?:cdef|cpdef|ctypedef|DEF|include)\b[^\n]*", code, re.M)
    assert not own, f"cygemm/capi.pxd declares names itself (not only cimports), which this test does not read: {own}"
    exported = set().union(*_cimports(path, bound=True).values())
    assert exported == CAPI_NAMES, (f"cygemm/capi.pxd lacks {sorted(CAPI_NAMES - exported)}; exports beyond the "
                                    f"contract: {sorted(exported - CAPI_NAMES)}")


def test_every_contract_name_cimports_from_capi(tmp_path):
    """Cython accepts `from cygemm.capi cimport X` for each name (re-exported by capi.pxd's own
    cimports), and the generated module loads nothing named cygemm.capi (there is none)."""
    import cygemm
    src = tmp_path / "uses_capi.pyx"
    src.write_text(f"from cygemm.capi cimport {', '.join(sorted(CAPI_NAMES))}\n")
    includes = [arg for folder in cygemm.get_include() for arg in ("-I", folder)]
    proc = subprocess.run([sys.executable, "-m", "cython", "-3", *includes, str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    generated = (tmp_path / "uses_capi.c").read_text()
    assert 'PyImport_ImportModule("cygemm.capi")' not in generated
    assert 'PyImport_ImportModule("cygemm.rowmajor.gemm")' in generated      # where the functions live


@pytest.mark.parametrize("path", ["../examples/cython_consumer/consumer.pyx", "../examples/cython_consumer/setup.py",
                                  "_generated/capi.pxd"])
def test_the_docs_show_the_example_files_and_the_contract_themselves(path):
    """The page includes the files themselves (capi.pxd as docs/conf.py copies it from the
    installed cygemm)."""
    page = open(os.path.join(ROOT, "docs", "cython.rst")).read()
    assert f".. literalinclude:: {path}" in page
    conf = open(os.path.join(ROOT, "docs", "conf.py")).read()
    assert 'os.path.dirname(cygemm.__file__), "capi.pxd")' in conf.replace("_os.", "os.")


@pytest.mark.gpu
def test_consumer_computes_gemm_and_batched_gemm(consumer):
    _, check = consumer
    assert check.main() == 0


@pytest.mark.gpu
def test_the_c_api_alone_runs_with_the_options_loaded(consumer):
    """A process that only calls the nogil C API still runs with the options (they are loaded
    when its first context is made): a small GEMM is not planned, and eight stream
    workspaces are kept, as the defaults say."""
    folder = os.path.dirname(consumer[0].__file__)
    code = (f"import sys; sys.path.insert(0, {folder!r})\n"
            "import cupy as cp, consumer, cygemm\n"
            "A, B, C = (cp.ones((16, 16), cp.float32) for _ in range(3))\n"
            "for _ in range(3):\n"
            "    s = cp.cuda.Stream(non_blocking=True)\n"
            "    consumer.sgemm(A.data.ptr, B.data.ptr, C.data.ptr, 16, 16, 16, 1.0, 0.0, s.ptr)\n"
            "    s.synchronize()\n"
            "from cygemm import plans\nfrom cygemm.engine import context as _context\n"
            "info = _context.context_info()\n"
            "print(plans.plan_cache_size(), info['eager_workspaces'], info['max_eager_workspaces'], float(C[0, 0]))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["0", "3", "8", "16.0"], p.stdout


@pytest.mark.nogpu
def test_the_consumer_check_says_plainly_that_it_needs_a_gpu(consumer, capsys):
    _, check = consumer
    assert check.main() == 0
    assert "consumer built and imported; needs a GPU to run" in capsys.readouterr().out
