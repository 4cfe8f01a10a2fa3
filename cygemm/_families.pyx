# cython: language_level=3, boundscheck=False, wraparound=False
"""Kernel families: the kernels the determinism policies choose among.

A cuBLASLt algorithm (its CUBLASLT_ALGO_CONFIG_ID) run without splitting K (SPLITK_NUM 1) adds
each output element's K products in one order, whatever its tile, stages or swizzle: every such
kernel of one algorithm gives the same bits for the same problem, and an element's bits do not
depend on how many rows or columns the problem has. That is a family. A split of K, another
algorithm, or cublasGemmEx (which picks its kernel by the problem's size) change the order, and
with it the last bits. The tests check the property for every entry point and dtype
(tests/test_determinism.py), since cuBLASLt does not document it.

run_to_run: the family of the heuristic's first candidate for the problem (that kernel alone
where it splits K: any fixed kernel gives the same bits every run). batch_invariant: the
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


cdef int _heuristic_at(GemmContext* ctx, const ColMajorGemm* g, int64_t m, int64_t n, cudaDataType dtype,
                       cublasComputeType_t compute, cublasLtEpilogue_t epi, const void* bias, void* aux,
                       size_t ws_bytes, unsigned al_a, unsigned al_b, unsigned al_c, const GemmTypes* types,
                       cublasLtMatmulHeuristicResult_t* results) except -1:
    """The heuristic's results for g resized to m x n (same K, transposes, types, epilogue,
    alignments, workspace; unbatched): how many."""
    cdef ColMajorGemm r = g[0]
    r.m, r.n = m, n
    # Only an ld along m or n depends on them (an operand stored K-major keeps its own).
    r.lda = max(g.lda, m) if g.opa == CUBLAS_OP_N else g.lda
    r.ldb = g.ldb if g.opb == CUBLAS_OP_N else max(g.ldb, n)
    r.ldc = max(g.ldc, m)
    r.batch, r.strided_batched = 1, False
    cdef PlanData ref
    memset(&ref, 0, sizeof(ref))
    try:
        make_descriptors(&ref, &r, 1, dtype, compute, epi, bias, aux, r.ldc if aux != NULL else 0,
                         ws_bytes, al_a, al_b, al_c, types)
        return _query(ctx, &ref, results, ws_bytes)
    finally:
        free_descriptors(&ref)


cdef int _members(GemmContext* ctx, PlanData* d, const cublasLtMatmulHeuristicResult_t* results, int n,
                  int family, size_t ws_bytes) except -1:
    """Append to d.candidates the kernels of `family` among results that cublasLtMatmulAlgoCheck
    accepts for d's own problem (results found for another size): how many d then holds."""
    cdef cublasLtMatmulHeuristicResult_t check
    cdef cublasStatus_t st
    cdef int i
    for i in range(n):
        if d.n_candidates >= MAX_CANDIDATES or not in_family(&results[i].algo, family):
            continue
        memset(&check, 0, sizeof(check))
        with nogil:
            st = cublasLtMatmulAlgoCheck(ctx.lt, d.desc, d.la, d.lb, d.lc, d.ld if d.ld != NULL else d.lc,
                                         &results[i].algo, &check)
        if st == CUBLAS_STATUS_SUCCESS and check.workspaceSize <= ws_bytes:
            check.algo, check.state = results[i].algo, CUBLAS_STATUS_SUCCESS
            d.candidates[d.n_candidates] = check
            d.n_candidates += 1
    return d.n_candidates


cdef int family_candidates(GemmContext* ctx, PlanData* d, const ColMajorGemm* g, int policy,
                           cudaDataType dtype, cublasComputeType_t compute, cublasLtEpilogue_t epi,
                           const void* bias, void* aux, size_t ws_bytes, unsigned al_a, unsigned al_b,
                           unsigned al_c, const GemmTypes* types) except -1:
    cdef cublasLtMatmulHeuristicResult_t results[QUERY]
    cdef cublasLtMatmulHeuristicResult_t reference[QUERY]
    cdef int n = _query(ctx, d, results, ws_bytes), n_ref = 0, n_probe, i, family = -1
    cdef int64_t probe, small = min(g.m, g.n)
    d.n_candidates = 0
    if policy == POLICY_BATCH_INVARIANT:
        # The family: the first split-free kernel at FAMILY_ROWS x FAMILY_ROWS (not this M or N).
        n_ref = _heuristic_at(ctx, g, FAMILY_ROWS, FAMILY_ROWS, dtype, compute, epi, bias, aux, ws_bytes,
                              al_a, al_b, al_c, types, reference)
        i = _first_split_free(reference, n_ref)
        family = _config(&reference[i].algo, CUBLASLT_ALGO_CONFIG_ID) if i >= 0 else -1
    elif n > 0 and _config(&results[0].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) != 1:
        # run_to_run, where the heuristic's first splits K: that kernel alone (a fixed kernel is
        # reproducible; its split's tile-mates are not known to share its bits).
        d.family, d.candidates[0], d.n_candidates = -1, results[0], 1
        return 0
    else:
        family = _config(&results[0].algo, CUBLASLT_ALGO_CONFIG_ID) if n > 0 else -1
    d.family = family
    if family < 0:
        return 0
    for i in range(n):              # this size's own family kernels, in the heuristic's order
        if d.n_candidates < MAX_CANDIDATES and in_family(&results[i].algo, family):
            d.candidates[d.n_candidates] = results[i]
            d.n_candidates += 1
    if d.n_candidates or policy != POLICY_BATCH_INVARIANT:
        return 0
    # None offered at this size (few rows): the family's kernels the heuristic offers for the
    # nearest larger sizes of the smaller side (smaller tiles than the reference's), else the
    # reference kernel itself, where they take this problem.
    for probe in (16, 64, 256, 1024):
        if probe <= small:
            continue
        n_probe = _heuristic_at(ctx, g, probe if g.m == small else g.m, probe if g.m != small else g.n, dtype,
                                compute, epi, bias, aux, ws_bytes, al_a, al_b, al_c, types, results)
        if _members(ctx, d, results, n_probe, family, ws_bytes):
            return 0
    _members(ctx, d, reference, n_ref, family, ws_bytes)        # (the reference size's, found above)
    return 0
