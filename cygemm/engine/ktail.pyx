# cython: language_level=3, boundscheck=False, wraparound=False
"""The K-tail guard: no GEMM cygemm runs leaves part of K out of its sums.

cuBLASLt's split-K kernels hand K to the splits in whole blocks of ``block_k`` (the depth of one
stage, 64 for the bf16/fp16 kernels of cuBLAS 13.1 on Hopper). With ``q = K // block_k`` and
``t = K % block_k``, a split count ``s`` with ``t != 0``, ``q % s == 0`` and ``s > t`` gives every
split ``q / s`` whole blocks and the last ``t`` products of K to none: C misses them, with no
error. On an H200 with cuBLAS 13.1 the detector (A zero but its first and last columns, B ones,
C must be 2) found 351 of 38,400 shapes wrong through cublasGemmEx (bf16 and fp16, NN and TN,
K = 64q + t deep); cuBLASLt's first heuristic choice was wrong on exactly the same shapes, every
wrong shape met the rule, and no float32 shape was wrong (benchmarks/ktail_probe.cu).

The guard, in the one place each kind of GEMM is enqueued:

- A bfloat16 or float16 cuBLASLt algorithm (every plan's candidates, tuned choices read from a
  tuning file) whose split of K the rule flags for *any* block of K from 8 to 256 is given the
  nearest smaller split count the rule clears and cuBLASLt accepts: the same kernel, nearly the
  same time. Where none is accepted, the candidate is dropped. (float32 is left as cuBLAS
  chooses: never wrong in the sweeps, and a TF32 kernel given another split crashed in cuBLAS.)
- cublasGemmEx chooses its kernel inside cuBLAS, where nothing can be read; its choice is the
  kernel cuBLASLt's heuristic puts first (measured: the same wrong shapes, the same times). So
  a problem whose first kernel the rule flags does not run through cublasGemmEx: the plain path
  runs its guarded cuBLASLt plan instead, and any other cublasGemmEx call (fallbacks, batches
  cuBLASLt is not asked about) runs K's largest multiple of 256 with the workspace and the rest
  of K without one (cuBLAS splits K only into its workspace), accumulated with beta = 1.

Everywhere the rule does not flag, the same kernels run as without the guard: the same bits and
time. The rule rests on observed cuBLAS behaviour, so on a cuBLAS version this release was not
verified on the guard checks itself the first time it acts (cygemm.engine.promises).

The defect is NVIDIA bug 6580689 (algorithm 66's split-K kernels, since cuBLAS 12.6.3), fixed in
13.8.0.4 by NVIDIA's release notes. On a cuBLASLt from 13.8.1 on (cublasLtGetVersion cannot tell
13.8.0's builds apart), the first time the guard would act it runs the detector once with the
guard standing down (promise "ktail_fixed"): exact, and the guard stands down for the process
(ktail_possible is then False everywhere, at no cost); not exact, and it acts as on 13.1.
"""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

from cygemm.bindings.cudart cimport cudaDataType, CUDA_R_16F, CUDA_R_16BF
from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport *
from cygemm.engine.types cimport ColMajorGemm, scale_type, pointer_alignment, lt_batch_ok
from cygemm.engine.dtypes cimport ktail_covers
from cygemm.engine.context cimport GemmContext
from cygemm.engine.errors cimport check_cublas

cdef bint _enabled = True
# Whether cuBLAS's own fix holds (the guard stands down): 0 not asked yet, 1 it holds, -1 the
# guard acts. While the fix's check runs, the guard stands down in the checking thread alone.
cdef int _fixed = 0
cdef extern from *:
    """
    static __thread int cg_ktail_unguarded = 0;
    """
    int cg_ktail_unguarded
import os as _os
# CYGEMM_KTAIL_MOVE=0: a flagged candidate is dropped rather than given a safe split (diagnostics).
cdef bint _move_splits = _os.environ.get("CYGEMM_KTAIL_MOVE", "1") != "0"
cdef dict _verdicts = {}        # problem -> whether cublasGemmEx's kernel drops part of K


def set_enabled(bint on):
    """Turn the guard on or off (off: what cuBLAS alone returns; for the sweep and tests). Plans
    made before keep their kernels: clear them (cygemm.engine.plans.clear_plan_cache) to re-decide."""
    global _enabled
    _enabled = on
    _verdicts.clear()


def _forget_verdicts():
    """Forget the cached cublasGemmEx verdicts (tests: the next problem asks cuBLASLt again)."""
    _verdicts.clear()


def enabled():
    return _enabled


cdef bint split_drops(int64_t k, int splits) noexcept nogil:
    cdef int64_t bk = 8, q, t
    if splits <= 1:
        return False
    while bk <= KTAIL_GRAIN:
        q, t = k // bk, k % bk
        if t != 0 and q % splits == 0 and splits > t:
            return True
        bk *= 2
    return False


cdef bint ktail_possible(int64_t k) noexcept nogil:
    # Some split s >= 2 the rule flags exists for some block: s > t and s | q, e.g. s = q > t.
    cdef int64_t bk = 8, q, t
    if not _enabled or _fixed == 1 or cg_ktail_unguarded or k % KTAIL_GRAIN == 0:
        return False
    while bk <= KTAIL_GRAIN:
        q, t = k // bk, k % bk
        if t != 0 and q >= 2 and q > t:
            return True
        bk *= 2
    return False


cdef int _splits(const cublasLtMatmulAlgo_t* algo) noexcept nogil:
    cdef int32_t v = 1
    cdef size_t written = 0
    if cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &v, sizeof(v),
                                            &written) != CUBLAS_STATUS_SUCCESS:
        return 1
    return v


cdef bint _accepts(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                   cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                   cublasLtMatmulAlgo_t* algo, int32_t splits, size_t ws_bytes, size_t* ws_needed) noexcept nogil:
    cdef cublasLtMatmulAlgo_t trial = algo[0]
    cdef cublasLtMatmulHeuristicResult_t check
    if cublasLtMatmulAlgoConfigSetAttribute(&trial, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                            sizeof(splits)) != CUBLAS_STATUS_SUCCESS:
        return False
    if cublasLtMatmulAlgoCheck(lt, desc, la, lb, lc, ld if ld != NULL else lc, &trial,
                               &check) != CUBLAS_STATUS_SUCCESS or check.workspaceSize > ws_bytes:
        return False
    if _splits(&trial) != splits:
        return False
    algo[0] = trial
    ws_needed[0] = check.workspaceSize
    return True


cdef int make_safe(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                   cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                   cublasLtMatmulAlgo_t* algo, cudaDataType dtype, int64_t k, size_t ws_bytes,
                   size_t* ws_needed) except -2:
    cdef int s = _splits(algo), cand
    if not guarded_type(dtype) or not ktail_possible(k) or not split_drops(k, s):
        return 0
    if _stands_down():
        return 0
    _require_checked()
    if not _move_splits:
        return -1
    # Fewer splits only, the nearest first: the same kernel's speed, and no more workspace. (More
    # splits than cuBLASLt offered crashed inside cuBLASLt for a TF32 kernel, 512 x 512 x 8208.)
    for cand in range(s - 1, 1, -1):
        if not split_drops(k, cand) and _accepts(lt, desc, la, lb, lc, ld, algo, cand, ws_bytes, ws_needed):
            return 1
    return -1


cdef bint _stands_down() except -1:
    """Whether cuBLAS's own fix holds, so the guard stands down: asked the first time the guard
    would act, on a cuBLASLt whose notes name the fix, by the detector with the guard off."""
    global _fixed, cg_ktail_unguarded
    if cg_ktail_unguarded:
        return True
    if _fixed == 0:
        from cygemm.engine import lt_features
        from cygemm.engine import promises as _promises
        if lt_features.feature_gate("ktail_fixed") is not None:
            _fixed = -1
        else:
            cg_ktail_unguarded = 1          # (the check's GEMMs, on this thread, run unguarded)
            try:
                holds = _promises.holds("ktail_fixed")
            finally:
                cg_ktail_unguarded = 0
            _fixed = 1 if holds else -1
            if not holds:
                _verdicts.clear()
    return _fixed == 1


def stands_down():
    """Whether the guard stands down because cuBLAS's own fix was confirmed (None: not asked
    yet; it is asked the first time the guard would act)."""
    return None if _fixed == 0 else _fixed == 1


def _forget_fix():
    """Test hook: ask again whether cuBLAS's fix holds the next time the guard would act."""
    global _fixed
    _fixed = 0
    _verdicts.clear()


cdef int _require_checked() except -1:
    from cygemm.engine import promises as _promises
    _promises.require("ktail_guard")
    return 0


cdef bint guarded_type(cudaDataType dtype) noexcept nogil:
    # The defect was measured in bfloat16 and float16 only (0 of 12,800 float32 shapes, TF32 or
    # strict, and the FP8 kernels, wrong); a TF32 split changed by the guard crashed inside cuBLAS
    # (512 x 512 x 8208), so the guard acts on the 16-bit types, where it was measured.
    return ktail_covers(dtype)         # (the table's ktail field)


cdef bint gemmex_drops(GemmContext* ctx, const ColMajorGemm* g, cudaDataType dtype,
                       cublasComputeType_t compute) except -1 nogil:
    if not guarded_type(dtype) or not ktail_possible(g.k):
        return False
    with gil:
        return _verdict(ctx, g, dtype, compute)


cdef bint _verdict(GemmContext* ctx, const ColMajorGemm* g, cudaDataType dtype,
                   cublasComputeType_t compute) except -1:
    cdef int64_t batch = g.batch if g.strided_batched else 1
    key = (ctx.device, dtype, compute, g.opa, g.opb, g.m, g.n, g.k, g.lda, g.ldb, g.ldc, batch,
           g.stride_a if batch > 1 else 0, g.stride_b if batch > 1 else 0, g.stride_c if batch > 1 else 0,
           pointer_alignment(g.a), pointer_alignment(g.b), pointer_alignment(g.c), ctx.workspace_bytes)
    found = _verdicts.get(key)
    if found is not None:
        return found
    cdef bint drops
    if batch > 1 and not lt_batch_ok(g):
        drops = True            # (cuBLASLt is not asked about broadcast batches: split K safely)
    else:
        drops = split_drops(g.k, _first_splits(ctx, g, batch, dtype, compute))
    if drops and _stands_down():
        drops = False
    elif drops:
        _require_checked()
    if len(_verdicts) > 4096:
        _verdicts.clear()
    _verdicts[key] = drops
    return drops


cdef int _first_splits(GemmContext* ctx, const ColMajorGemm* g, int64_t batch, cudaDataType dtype,
                       cublasComputeType_t compute) except -1:
    """SPLITK_NUM of cuBLASLt's first heuristic choice for the problem as cublasGemmEx sees it
    (its handle's workspace, the operands' alignment); 1 where it has none."""
    cdef cublasLtMatmulDesc_t desc = NULL
    cdef cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL
    cdef cublasLtMatmulPreference_t pref = NULL
    cdef cublasLtMatmulHeuristicResult_t first
    cdef int found = 0, splits = 1
    cdef int32_t opa = g.opa, opb = g.opb
    cdef uint64_t ws = ctx.workspace_bytes
    try:
        check_cublas(cublasLtMatmulDescCreate(&desc, compute, scale_type(compute, dtype)), "cublasLtMatmulDescCreate")
        check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)),
                     "cublasLtMatmulDescSetAttribute")
        check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)),
                     "cublasLtMatmulDescSetAttribute")
        _layout(&la, dtype, g.m if g.opa == CUBLAS_OP_N else g.k, g.k if g.opa == CUBLAS_OP_N else g.m,
                g.lda, batch, g.stride_a)
        _layout(&lb, dtype, g.k if g.opb == CUBLAS_OP_N else g.n, g.n if g.opb == CUBLAS_OP_N else g.k,
                g.ldb, batch, g.stride_b)
        _layout(&lc, dtype, g.m, g.n, g.ldc, batch, g.stride_c)
        check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate")
        check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &ws, sizeof(ws)), "cublasLtMatmulPreferenceSetAttribute")
        _align(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, g.a)
        _align(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, g.b)
        _align(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, g.c)
        _align(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, g.c)
        with nogil:
            if cublasLtMatmulAlgoGetHeuristic(ctx.lt, desc, la, lb, lc, lc, pref, 1, &first,
                                              &found) == CUBLAS_STATUS_SUCCESS and found > 0:
                splits = _splits(&first.algo)
    finally:
        if pref != NULL:
            cublasLtMatmulPreferenceDestroy(pref)
        if la != NULL:
            cublasLtMatrixLayoutDestroy(la)
        if lb != NULL:
            cublasLtMatrixLayoutDestroy(lb)
        if lc != NULL:
            cublasLtMatrixLayoutDestroy(lc)
        if desc != NULL:
            cublasLtMatmulDescDestroy(desc)
    return splits


cdef int _layout(cublasLtMatrixLayout_t* layout, cudaDataType dtype, int64_t rows, int64_t cols, int64_t ld,
                 int64_t batch, int64_t stride) except -1:
    cdef int32_t count = <int32_t>batch
    check_cublas(cublasLtMatrixLayoutCreate(layout, dtype, rows, cols, ld), "cublasLtMatrixLayoutCreate")
    if batch > 1:
        check_cublas(cublasLtMatrixLayoutSetAttribute(layout[0], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                      &count, sizeof(count)), "cublasLtMatrixLayoutSetAttribute")
        check_cublas(cublasLtMatrixLayoutSetAttribute(layout[0], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                      &stride, sizeof(stride)), "cublasLtMatrixLayoutSetAttribute")
    return 0


cdef int _align(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* p) except -1:
    cdef uint32_t al = pointer_alignment(p)
    check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al)),
                 "cublasLtMatmulPreferenceSetAttribute")
    return 0


def _rule(int64_t k, int splits):
    """(ktail_possible(k), split_drops(k, splits)) with the guard on: for the CPU tests of the rule."""
    return bool(ktail_possible(k)) if _enabled else None, bool(split_drops(k, splits))
