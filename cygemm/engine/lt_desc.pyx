# cython: language_level=3, boundscheck=False, wraparound=False
"""cuBLASLt descriptors of one plan (see lt_desc.pxd): what a plan hands
cublasLtMatmulAlgoGetHeuristic and cublasLtMatmul. Made once per plan; no GPU work."""
from libc.stdint cimport int8_t, int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

from cygemm.bindings.cudart cimport cudaDataType
from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport *
from cygemm.engine.types cimport ColMajorGemm, GemmTypes, scale_type, is_fp8_type
from cygemm.engine.errors cimport check_cublas
from cygemm.engine.launch cimport PlanData, set_scale_pointers


cdef int _set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
                   size_t size) except -1 nogil:
    return check_cublas(cublasLtMatmulDescSetAttribute(desc, attr, buf, size), "cublasLtMatmulDescSetAttribute")


cdef int _set_pref_u32(cublasLtMatmulPreference_t pref, int attr, uint32_t value) except -1:
    return check_cublas(cublasLtMatmulPreferenceSetAttribute(
        pref, <cublasLtMatmulPreferenceAttributes_t>attr, &value, sizeof(value)),
        "cublasLtMatmulPreferenceSetAttribute")


cdef int _layout(cublasLtMatrixLayout_t* layout, cudaDataType dtype, int64_t rows, int64_t cols,
                 int64_t ld, int64_t batch, int64_t stride, const char* what) except -1:
    check_cublas(cublasLtMatrixLayoutCreate(layout, dtype, rows, cols, ld), what)
    cdef int32_t count = <int32_t>batch
    if batch > 1:
        check_cublas(cublasLtMatrixLayoutSetAttribute(layout[0], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                      &count, sizeof(count)), what)
        check_cublas(cublasLtMatrixLayoutSetAttribute(layout[0], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                      &stride, sizeof(stride)), what)
    return 0


cdef int make_descriptors(PlanData* d, const ColMajorGemm* g, int64_t batch, cudaDataType dtype,
                          cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                          int64_t aux_ld, size_t ws_bytes, uint32_t al_a, uint32_t al_b, uint32_t al_c,
                          const GemmTypes* types) except -1:
    check_cublas(cublasLtMatmulDescCreate(&d.desc, compute, scale_type(compute, dtype)), "cublasLtMatmulDescCreate")
    cdef int32_t opa = g.opa, opb = g.opb
    cdef uint32_t epi32 = epi
    _set_desc(d.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa))
    _set_desc(d.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb))
    _set_desc(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi32, sizeof(epi32))
    if bias != NULL:
        _set_desc(d.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias))
    if aux != NULL:
        _set_desc(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux))
        _set_desc(d.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld))
    cdef cudaDataType a_type = dtype, b_type = dtype, c_type = dtype
    cdef int8_t fast
    cdef int32_t bias_type
    if types != NULL:
        a_type, b_type, c_type = types.a, types.b, types.c
        check_cublas(<cublasStatus_t>set_scale_pointers(d, types), "cublasLtMatmulDescSetAttribute(scales)")
        fast = 1 if types.fast_accum else 0
        if is_fp8_type(types.a) or is_fp8_type(types.b):    # (an FP8 attribute: int8 GEMMs leave it)
            _set_desc(d.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast))
        if types.a_scale_mode:          # (scalar scales are the default: older cuBLAS lacks the attribute)
            _set_desc(d.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &types.a_scale_mode, sizeof(int32_t))
        if types.b_scale_mode:
            _set_desc(d.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &types.b_scale_mode, sizeof(int32_t))
        if bias != NULL:
            bias_type = types.bias
            _set_desc(d.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type))
    _layout(&d.la, a_type, g.m if g.opa == CUBLAS_OP_N else g.k, g.k if g.opa == CUBLAS_OP_N else g.m,
            g.lda, batch, g.stride_a, "cublasLtMatrixLayoutCreate(A)")
    _layout(&d.lb, b_type, g.k if g.opb == CUBLAS_OP_N else g.n, g.n if g.opb == CUBLAS_OP_N else g.k,
            g.ldb, batch, g.stride_b, "cublasLtMatrixLayoutCreate(B)")
    _layout(&d.lc, c_type, g.m, g.n, g.ldc, batch, g.stride_c, "cublasLtMatrixLayoutCreate(C)")
    if c_type != dtype:
        _layout(&d.ld, dtype, g.m, g.n, g.ldc, batch, g.stride_c, "cublasLtMatrixLayoutCreate(D)")
    check_cublas(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate")
    cdef uint64_t ws64 = ws_bytes
    check_cublas(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws64, sizeof(ws64)), "cublasLtMatmulPreferenceSetAttribute")
    _set_pref_u32(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a)
    _set_pref_u32(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b)
    _set_pref_u32(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c)
    _set_pref_u32(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_c)
    return 0


cdef inline void _free_layout(cublasLtMatrixLayout_t* layout) noexcept nogil:
    if layout[0] != NULL:
        cublasLtMatrixLayoutDestroy(layout[0])
        layout[0] = NULL


cdef void free_descriptors(PlanData* d) noexcept nogil:
    if d.pref != NULL:
        cublasLtMatmulPreferenceDestroy(d.pref)
        d.pref = NULL
    _free_layout(&d.ld)
    _free_layout(&d.lc)
    _free_layout(&d.lb)
    _free_layout(&d.la)
    if d.desc != NULL:
        cublasLtMatmulDescDestroy(d.desc)
        d.desc = NULL


cdef str algo_hex(const cublasLtMatmulAlgo_t* algo):
    return (<const char*>algo)[:sizeof(cublasLtMatmulAlgo_t)].hex()


cdef bint algo_from_hex(object text, cublasLtMatmulAlgo_t* algo) except -1:
    try:
        raw = bytes.fromhex(text)
    except (TypeError, ValueError):
        return False
    if len(raw) != sizeof(cublasLtMatmulAlgo_t):
        return False
    memcpy(algo, <const char*>raw, sizeof(cublasLtMatmulAlgo_t))
    return True
