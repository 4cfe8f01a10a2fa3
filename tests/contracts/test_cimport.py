"""examples/cython_consumer, a separate Cython extension that cimports cygemm's nogil C API,
compiles against the installed cygemm (CI too) and computes right on a GPU. The docs' "From
Cython" page shows these files themselves."""
import os
import re
import shutil
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "cython_consumer")


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


@pytest.mark.parametrize("name", ["consumer.pyx", "setup.py"])
def test_the_docs_show_the_example_files_themselves(name):
    page = open(os.path.join(EXAMPLE, "..", "..", "docs", "cython.rst")).read()
    assert f".. literalinclude:: ../examples/cython_consumer/{name}" in page


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
            "from cygemm import _context, plans\n"
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
