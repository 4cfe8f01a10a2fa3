"""A pytest plugin that runs CuPy's own tests of ``cupy.cublas.gemm`` and ``cupy.matmul`` with
those two functions routed to cygemm's.

    python -m pytest -p route_cupy [--route cygemm|cupy] [--route-dtypes fdFD] FILES

(``tests/peer`` on ``PYTHONPATH``; ``scripts/peer_suites.sh`` runs CuPy v14.2.0's
``test_cublas.py`` and ``test_matmul.py`` this way.) ``--route cygemm`` (the default) sends each
call to cygemm: ``cublas.gemm(transa, transb, a, b, out, alpha, beta)`` to :func:`cygemm.gemm`,
``cupy.matmul(x1, x2, out=)`` to :func:`cygemm.matmul` (with ``math="cupy"``: TF32 only where
CuPy would use it). ``--route cupy`` sends them through the same wrappers back to CuPy's
functions: the check that the routing itself changes no result. ``--route-dtypes`` routes only
calls whose operands have these dtype characters (NumPy's: f float32, d float64, F complex64, D
complex128, e float16, ...; default: every dtype); the others go to CuPy. Calls with keywords
cygemm does not take (``dtype=``, ``casting=``) always go to CuPy. The terminal summary counts
the calls each function received, by dtype and route.
"""
import collections

_counts = collections.Counter()


def pytest_addoption(parser):
    group = parser.getgroup("route_cupy", "route CuPy's gemm and matmul to cygemm")
    group.addoption("--route", choices=("cygemm", "cupy"), default="cygemm",
                    help="where cupy.cublas.gemm and cupy.matmul calls go (default: cygemm)")
    group.addoption("--route-dtypes", default=None,
                    help="route only operands of these NumPy dtype characters, e.g. 'f' (default: all)")


def _scalar(x):
    """A host scalar of alpha/beta, which CuPy's tests also pass as 0-d NumPy or CuPy arrays."""
    return x.item() if hasattr(x, "item") else x


def _op(trans):
    """cygemm.gemm's transpose for CuPy's 'N', 'T', 'H' (or cuBLAS's 0, 1, 2)."""
    names = {"n": "N", "t": "T", "h": "H", "c": "H", 0: "N", 1: "T", 2: "H"}
    key = trans.lower() if isinstance(trans, str) else trans
    if key not in names:
        raise ValueError(f"transa/transb: expected 'N', 'T' or 'H', got {trans!r}")
    return names[key]


def pytest_configure(config):
    import cupy
    import cupy.cublas
    import cygemm
    route = config.getoption("--route")
    dtypes = config.getoption("--route-dtypes")
    cupy_gemm, cupy_matmul = cupy.cublas.gemm, cupy.matmul

    def routed(*arrays):
        return route == "cygemm" and (dtypes is None or all(x.dtype.char in dtypes for x in arrays))

    def gemm(transa, transb, a, b, out=None, alpha=1.0, beta=0.0):
        where = "cygemm" if routed(a, b) else "cupy"
        _counts[("cublas.gemm", a.dtype.name, where)] += 1
        if where == "cupy":
            return cupy_gemm(transa, transb, a, b, out=out, alpha=alpha, beta=beta)
        if out is None:
            beta = 0.0          # (as CuPy: a new out is not read)
        return cygemm.gemm(a, b, out, trans_a=_op(transa), trans_b=_op(transb), alpha=_scalar(alpha),
                           beta=_scalar(beta), math="cupy")

    def matmul(x1, x2, /, out=None, **kwargs):
        arrays = [x for x in (x1, x2) if isinstance(x, cupy.ndarray)]
        where = "cygemm" if not kwargs and len(arrays) == 2 and routed(*arrays) else "cupy"
        _counts[("matmul", "/".join(getattr(x, "dtype", type(x)).__str__() for x in (x1, x2)), where)] += 1
        if where == "cupy":
            return cupy_matmul(x1, x2, out=out, **kwargs)
        return cygemm.matmul(x1, x2, out, math="cupy")

    cupy.cublas.gemm, cupy.matmul = gemm, matmul


def pytest_terminal_summary(terminalreporter):
    if not _counts:
        terminalreporter.section("route_cupy: no call of cupy.cublas.gemm or cupy.matmul")
        return
    terminalreporter.section("route_cupy: calls received")
    per = collections.Counter()
    for (fn, dtype, where), n in sorted(_counts.items()):
        per[(fn, where)] += n
    for (fn, where), n in sorted(per.items()):
        terminalreporter.write_line(f"{fn} -> {where}: {n} calls")
    gemm = sorted((d, w, n) for (fn, d, w), n in _counts.items() if fn == "cublas.gemm")
    for dtype, where, n in gemm:
        terminalreporter.write_line(f"  cublas.gemm {dtype} -> {where}: {n}")
