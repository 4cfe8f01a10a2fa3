# cython: language_level=3, boundscheck=False, wraparound=False
"""What the dense layer's forward and backward share: reading their operands into the one
argument path, the workspace a call uses, its plain GEMMs, and timing its routes."""
from libc.stdint cimport int64_t

from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport cublasComputeType_t
from cygemm._types cimport MatrixView, ColMajorGemm
from cygemm._context cimport GemmContext, call_workspace
from cygemm._args cimport (CallArgs, ArgRole, args_init, add_array, expect_matrix, expect_vector,
                           expect_dtype, ARG_READ)
from cygemm._settings cimport AUTOTUNE_EXHAUSTIVE
from cygemm.plans cimport run_gemm
from cygemm.tuning cimport enqueue_fn, time_choices, enter_route_timing, leave_route_timing
from cygemm._mapping cimport is_rowmajor

cdef enum:
    ROUTE_REPS = 7          # timed rounds per route (median)


cdef MatrixView* layer_matrix(CallArgs* c, object x, str name, ArgRole role, int64_t rows, int64_t cols,
                         cudaDataType dtype, bint row_major) except NULL:
    cdef MatrixView* v = add_array(c, x, name, role, 2, 2)
    expect_matrix(v, name, rows, cols, dtype)
    if row_major and not is_rowmajor(v):
        raise ValueError(f"{name}: expected a row-major array (unit stride along the last axis, "
                         f"rows not overlapping), got element strides ({v.row_stride}, {v.col_stride})")
    return v


cdef MatrixView* layer_vector(CallArgs* c, object x, str name, ArgRole role, int64_t n,
                         cudaDataType dtype) except NULL:
    cdef MatrixView* v = add_array(c, x, name, role, 1, 2)
    expect_vector(v, x, name, n, dtype)
    return v


cdef int layer_operands(CallArgs* c, object A, object B) except -1:
    """A layer's A (M, K) and B (K, N) into c's first two slots: 2-D, one dtype, inner
    dimensions that agree."""
    args_init(c)
    cdef MatrixView* a = add_array(c, A, "A", ARG_READ, 2, 2)
    cdef MatrixView* b = add_array(c, B, "B", ARG_READ, 2, 2)
    expect_dtype(b, "B", a.dtype, "A")
    if b.rows != a.cols:
        raise ValueError(f"B: A is ({a.rows}, {a.cols}) so B must have {a.cols} rows, got ({b.rows}, {b.cols})")
    return 0


cdef int layer_workspace(CallArgs* c, object ws, MatrixView* wv, void** ptr, size_t* nbytes) except -1:
    """The caller's lt_workspace (checked with the call's other buffers) or this stream's own."""
    if wv == NULL:
        ptr[0] = call_workspace(c.ctx, c.stream)
        nbytes[0] = c.ctx.workspace_bytes
        return 0
    ptr[0] = wv.ptr
    nbytes[0] = <size_t>wv.cols
    return 0


cdef int layer_gemm(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
               cublasComputeType_t compute, float beta, int autotune) except -1:
    cdef float alpha = 1.0
    with nogil:
        run_gemm(ctx, stream, g, dtype, compute, &alpha, &beta, autotune)
    return 0


cdef int time_routes(GemmContext* ctx, cudaStream_t s, enqueue_fn enqueue, void* arg, const int* choices,
                      int n, float* ms, int autotune) except -1:
    """Time a layer's routes. auto: the plans inside each route take the heuristic's choice
    and the rounds stay within the tuning budget; exhaustive: each route's plans are timed
    too, and every round runs."""
    if autotune == AUTOTUNE_EXHAUSTIVE:
        return time_choices(ctx, s, enqueue, arg, choices, n, ROUTE_REPS, ms, 0)
    enter_route_timing()
    try:
        return time_choices(ctx, s, enqueue, arg, choices, n, ROUTE_REPS, ms, 1e30)
    finally:
        leave_route_timing()
