# cython: language_level=3, boundscheck=False, wraparound=False
"""Kernel families: the kernels the determinism policies choose among.

A cuBLASLt algorithm (its CUBLASLT_ALGO_CONFIG_ID) run without splitting K (SPLITK_NUM 1) adds
each output element's K products in one order, whatever its tile, stages or swizzle: every such
kernel of one algorithm gives the same bits for the same problem, and an element's bits do not
depend on how many rows or columns the problem has. That is a family. A split of K, another
algorithm, or cublasGemmEx (which picks its kernel by the problem's size) change the order, and
with it the last bits. The tests check the property for every entry point and dtype
(tests/test_determinism.py), since cuBLASLt does not document it.

run_to_run: the family of the problem's own first split-free candidate. batch_invariant: the
family of the same problem at FAMILY_ROWS x FAMILY_ROWS, the same for every M (and N); each size
takes the family's kernels the heuristic offers for it, else the reference kernel itself.
Timing may then pick any member: the bits are the same.
"""
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memset

from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport *
from cygemm._settings cimport POLICY_BATCH_INVARIANT
from cygemm._lt_desc cimport make_descriptors, free_descriptors

cdef enum:
    FAMILY_ROWS = 4096      # the reference problem's M and N (batch-invariant families)
    QUERY = 32              # heuristic results asked for when looking for a family's kernels
    MAX_CANDIDATES = 8      # what PlanData.candidates holds


cdef int _config(const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr) noexcept nogil:
    cdef int32_t v = -2
    cdef size_t written = 0
    if cublasLtMatmulAlgoConfigGetAttribute(algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS:
        return -2
    return v


cdef bint in_family(const cublasLtMatmulAlgo_t* algo, int family) noexcept nogil:
    return (family >= 0 and _config(algo, CUBLASLT_ALGO_CONFIG_ID) == family
            and _config(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) == 1)


cdef int _query(GemmContext* ctx, PlanData* d, cublasLtMatmulHeuristicResult_t* out, size_t ws_bytes) except -1:
    """The heuristic's results for d's problem that fit the workspace, in its order."""
    cdef int found = 0, i, n = 0
    cdef cublasStatus_t st
    with nogil:
        st = cublasLtMatmulAlgoGetHeuristic(ctx.lt, d.desc, d.la, d.lb, d.lc, d.ld if d.ld != NULL else d.lc,
                                            d.pref, QUERY, out, &found)
    if st != CUBLAS_STATUS_SUCCESS:
        return 0
    for i in range(found):
        if out[i].state == CUBLAS_STATUS_SUCCESS and out[i].workspaceSize <= ws_bytes:
            out[n] = out[i]
            n += 1
    return n


cdef int _first_split_free(const cublasLtMatmulHeuristicResult_t* results, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        if _config(&results[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) == 1:
            return i
    return -1


cdef int _reference(GemmContext* ctx, const ColMajorGemm* g, cudaDataType dtype, cublasComputeType_t compute,
                    cublasLtEpilogue_t epi, const void* bias, void* aux, size_t ws_bytes, unsigned al_a,
                    unsigned al_b, unsigned al_c, const GemmTypes* types,
                    cublasLtMatmulHeuristicResult_t* kernel) except -2:
    """The batch-invariant family of g: the first split-free kernel the heuristic gives for the
    same problem at FAMILY_ROWS x FAMILY_ROWS, unbatched (its algorithm id; -1 if none)."""
    cdef ColMajorGemm r = g[0]
    r.m = r.n = FAMILY_ROWS
    r.lda = FAMILY_ROWS if g.opa == CUBLAS_OP_N else g.lda      # only an M-major ld depends on M
    r.ldb = g.ldb if g.opb == CUBLAS_OP_N else FAMILY_ROWS
    r.ldc = FAMILY_ROWS
    r.batch, r.strided_batched = 1, False
    cdef PlanData ref
    cdef cublasLtMatmulHeuristicResult_t results[QUERY]
    cdef int n = 0, i
    memset(&ref, 0, sizeof(ref))
    try:
        make_descriptors(&ref, &r, 1, dtype, compute, epi, bias, aux, FAMILY_ROWS if aux != NULL else 0,
                         ws_bytes, al_a, al_b, al_c, types)
        n = _query(ctx, &ref, results, ws_bytes)
    finally:
        free_descriptors(&ref)
    i = _first_split_free(results, n)
    if i < 0:
        return -1
    kernel[0] = results[i]
    return _config(&results[i].algo, CUBLASLT_ALGO_CONFIG_ID)


cdef int family_candidates(GemmContext* ctx, PlanData* d, const ColMajorGemm* g, int64_t batch, int policy,
                           cudaDataType dtype, cublasComputeType_t compute, cublasLtEpilogue_t epi,
                           const void* bias, void* aux, int64_t aux_ld, size_t ws_bytes, unsigned al_a,
                           unsigned al_b, unsigned al_c, const GemmTypes* types) except -1:
    cdef cublasLtMatmulHeuristicResult_t results[QUERY]
    cdef cublasLtMatmulHeuristicResult_t reference, check
    cdef int n = _query(ctx, d, results, ws_bytes), i, family = -1, kept = 0
    cdef cublasStatus_t st
    if policy == POLICY_BATCH_INVARIANT:
        family = _reference(ctx, g, dtype, compute, epi, bias, aux, ws_bytes, al_a, al_b, al_c, types, &reference)
    else:
        i = _first_split_free(results, n)
        family = _config(&results[i].algo, CUBLASLT_ALGO_CONFIG_ID) if i >= 0 else -1
    d.family = family
    for i in range(n):
        if kept < MAX_CANDIDATES and in_family(&results[i].algo, family):
            d.candidates[kept] = results[i]
            kept += 1
    if kept == 0 and family >= 0 and policy == POLICY_BATCH_INVARIANT:
        # None offered at this size: the reference kernel, where it takes this problem.
        memset(&check, 0, sizeof(check))
        with nogil:
            st = cublasLtMatmulAlgoCheck(ctx.lt, d.desc, d.la, d.lb, d.lc, d.ld if d.ld != NULL else d.lc,
                                         &reference.algo, &check)
        if st == CUBLAS_STATUS_SUCCESS and check.workspaceSize <= ws_bytes:
            check.algo, check.state = reference.algo, CUBLAS_STATUS_SUCCESS
            d.candidates[0] = check
            kept = 1
    d.n_candidates = kept
    return 0
