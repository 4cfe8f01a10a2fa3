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
family of the same problem at FAMILY_ROWS x FAMILY_ROWS, the same for every M (and N). Each size
takes the family's kernels the heuristic offers for it (or for the nearest larger sizes), the
reference kernel, and the reference kernel retiled: every tile the algorithm lists (or, for an
algorithm that lists none, every tile id, where the problem has few rows) with each custom
option cublasLtMatmulAlgoCheck accepts. The heuristic offers split kernels where few rows
leave the GPU idle; a small split-free tile of the family fills it as well (bf16, 1 x 4096 x
4096 on an H200: 64 x 8 runs 0.89x the heuristic's fastest split kernel, with the rows of every
other size). Timing picks among them: every member gives the same bits.

Timing a new size's members takes tens of milliseconds (H200, bf16, N = 14336, K = 4096: 30-90
ms), and a server meets every batch size. Sizes whose M and N round up to the same powers of two
form a bucket: the first size of a bucket times every member and keeps its fastest four for the
bucket (in the tuning table, kind "gemm", the key bucket_key); a later size of the bucket times
only those (that cublasLtMatmulAlgoCheck accepts for it), within 12 ms. Any member gives the
same bits, so this changes speed only. (The winner alone, reused, cost up to 1.4x: a member
fast at 256 rows was not at 200.)
"""
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t
from libc.stdlib cimport malloc, free
from libc.string cimport memset, memcmp
from libc.math cimport ceilf

from cygemm.bindings.cublas cimport *
from cygemm.bindings.cublaslt cimport *
from cygemm.engine.settings cimport DETERMINISM_BATCH_INVARIANT
from cygemm.engine.lt_desc cimport make_descriptors, free_descriptors, algo_from_hex
from cygemm.engine.launch cimport PLAN_CANDIDATES
from cygemm.engine.dtypes cimport type_size

cdef enum:
    FAMILY_ROWS = 4096      # the reference problem's M and N (batch-invariant families)
    QUERY = 32              # heuristic results asked for when looking for a family's kernels
    OWN_MEMBERS = 8         # of those, the family's kernels a plan keeps (the rest: retiled)
    SCAN_ROWS = 256         # every tile id is tried only where min(M, N) is at most this
    MAX_TILES = 1024        # tile ids looked at (cuBLASLt 13.1 has 807)


cdef int _config(const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr) noexcept nogil:
    cdef int32_t v = -2
    cdef size_t written = 0
    if cublasLtMatmulAlgoConfigGetAttribute(algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS:
        return -2
    return v


cdef bint in_family(const cublasLtMatmulAlgo_t* algo, int family) noexcept nogil:
    if family == FAMILY_CUBLAS:
        return True
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


cdef int _alignment_class(const ColMajorGemm* g, const GemmTypes* types, unsigned al_a, unsigned al_b,
                           unsigned al_c, int itemsize) noexcept nogil:
    """cuBLASLt's batch-invariance class for the call's operands: the largest of 2, 4, 8, 16 bytes
    that divides every pointer and every leading dimension in bytes (-1: none, e.g. 1-byte
    types at odd addresses). The class must be the same for every call whose rows are to
    agree: slices of one array at one start share it."""
    cdef int64_t a = 16, v[6]
    cdef int i
    if types != NULL:           # (mixed storage types, FP8: the families keep them)
        return -1
    v[0], v[1], v[2] = al_a, al_b, al_c
    v[3], v[4], v[5] = g.lda * itemsize, g.ldb * itemsize, g.ldc * itemsize
    for i in range(6):
        v[i] = v[i] & -v[i]     # (the largest power of two dividing it)
        if 0 < v[i] < a:
            a = v[i]
    if a >= 16:
        return LT_BATCH_INVARIANCE_ALIGN_16B
    if a >= 8:
        return LT_BATCH_INVARIANCE_ALIGN_8B
    if a >= 4:
        return LT_BATCH_INVARIANCE_ALIGN_4B
    if a >= 2:
        return LT_BATCH_INVARIANCE_ALIGN_2B
    return -1


def _alignment_class_of(int64_t lda, int64_t ldb, int64_t ldc, unsigned al_a, unsigned al_b, unsigned al_c,
                        int itemsize):
    """The batch-invariance class (cublasLtMatmulBatchInvarianceFlags_t) for leading dimensions
    and pointer alignments: for the CPU tests of the rule; -1 where none fits."""
    cdef ColMajorGemm g
    g.lda, g.ldb, g.ldc = lda, ldb, ldc
    return _alignment_class(&g, NULL, al_a, al_b, al_c, itemsize)


cdef bint _cublas_invariant(GemmContext* ctx, PlanData* d, const ColMajorGemm* g, const GemmTypes* types,
                            unsigned al_a, unsigned al_b, unsigned al_c, size_t ws_bytes) except -1:
    """cuBLASLt's own batch invariance (CUBLASLT_MATMUL_DESC_BATCH_INVARIANCE_FLAGS, cuBLASLt
    13.10): the flag with the operands' alignment class on d's descriptor, then the heuristic's
    candidates under it (every one keeps each row's bits whatever the rows, by cuBLAS's promise;
    the first-use check of "batch_invariant" tests it on unverified versions). False where no
    class fits or the library refuses the flag."""
    cdef int32_t flags = _alignment_class(g, types, al_a, al_b, al_c, type_size(d.dtype))
    cdef cublasLtMatmulHeuristicResult_t results[QUERY]
    cdef int n, i
    if flags < 0:
        return False
    if cublasLtMatmulDescSetAttribute(d.desc, <cublasLtMatmulDescAttributes_t>LT_MATMUL_DESC_BATCH_INVARIANCE_FLAGS,
                                      &flags, sizeof(flags)) != CUBLAS_STATUS_SUCCESS:
        return False
    n = _query(ctx, d, results, ws_bytes)
    d.family = FAMILY_CUBLAS
    for i in range(min(n, <int>PLAN_CANDIDATES)):
        d.candidates[i] = results[i]
    d.n_candidates = min(n, <int>PLAN_CANDIDATES)
    return True


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
        if d.n_candidates >= PLAN_CANDIDATES or not in_family(&results[i].algo, family) or _held(d, &results[i].algo):
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


cdef bint _held(const PlanData* d, const cublasLtMatmulAlgo_t* algo) noexcept nogil:
    cdef int i
    for i in range(d.n_candidates):
        if memcmp(&d.candidates[i].algo, algo, sizeof(cublasLtMatmulAlgo_t)) == 0:
            return True
    return False


ctypedef struct _Retiled:
    cublasLtMatmulHeuristicResult_t result
    float rounds        # ceil(waves): how many times the GPU fills (-1: taken)


cdef int _retiled(GemmContext* ctx, PlanData* d, const cublasLtMatmulAlgo_t* ref, int64_t small,
                  size_t ws_bytes) except -1:
    """Append to d.candidates the reference kernel `ref` with another tile and custom option
    (split-free, the same algorithm: the same family), each that cublasLtMatmulAlgoCheck accepts
    for d's problem; where there are more than d holds, those that fill the GPU the fewest
    times (cuBLASLt's wavesCount), then the most of it, then in the order tried."""
    cdef uint32_t tiles[MAX_TILES]
    cdef size_t written = 0
    cdef int32_t custom_max = 0, custom, ref_custom = _config(ref, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION)
    cdef int nt = 0, i, j, c, n = 0
    cdef uint32_t tile
    cdef cublasLtMatmulAlgo_t a
    cdef cublasLtMatmulHeuristicResult_t check
    cdef int32_t split_free = 1
    if cublasLtMatmulAlgoCapGetAttribute(ref, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, sizeof(tiles),
                                         &written) == CUBLAS_STATUS_SUCCESS and written <= sizeof(tiles):
        nt = <int>(written // sizeof(uint32_t))
    if nt == 0 and small <= SCAN_ROWS:     # an algorithm that lists no tiles: every id is tried
        for i in range(1, min(<int>CUBLASLT_MATMUL_TILE_END, <int>MAX_TILES)):
            tiles[nt] = <uint32_t>i
            nt += 1
    if nt == 0:
        return d.n_candidates
    cublasLtMatmulAlgoCapGetAttribute(ref, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max,
                                      sizeof(custom_max), &written)
    cdef _Retiled* found = <_Retiled*>malloc(<size_t>nt * (custom_max + 2) * sizeof(_Retiled))
    if found == NULL:
        raise MemoryError()
    try:
        with nogil:
            for i in range(nt):
                for c in range(-1, custom_max + 1):     # the reference's option first
                    if c == ref_custom:
                        continue
                    custom = ref_custom if c < 0 else c
                    a = ref[0]
                    tile = tiles[i]
                    cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile))
                    cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof(custom))
                    cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split_free,
                                                         sizeof(split_free))
                    memset(&check, 0, sizeof(check))
                    if (cublasLtMatmulAlgoCheck(ctx.lt, d.desc, d.la, d.lb, d.lc, d.ld if d.ld != NULL else d.lc,
                                                &a, &check) != CUBLAS_STATUS_SUCCESS
                            or check.workspaceSize > ws_bytes or _held(d, &a)):
                        continue
                    check.algo, check.state = a, CUBLAS_STATUS_SUCCESS
                    found[n].result = check
                    found[n].rounds = ceilf(check.wavesCount) if check.wavesCount > 0 else 1e30
                    n += 1
            while d.n_candidates < PLAN_CANDIDATES:
                j = -1
                for i in range(n):
                    if found[i].rounds >= 0 and (j < 0 or found[i].rounds < found[j].rounds or (
                            found[i].rounds == found[j].rounds
                            and found[i].result.wavesCount > found[j].result.wavesCount)):
                        j = i
                if j < 0:
                    break
                d.candidates[d.n_candidates] = found[j].result
                d.n_candidates += 1
                found[j].rounds = -1        # (taken)
    finally:
        free(found)
    return d.n_candidates


cdef int family_candidates(GemmContext* ctx, PlanData* d, const ColMajorGemm* g, int determinism,
                           cudaDataType dtype, cublasComputeType_t compute, cublasLtEpilogue_t epi,
                           const void* bias, void* aux, size_t ws_bytes, unsigned al_a, unsigned al_b,
                           unsigned al_c, const GemmTypes* types, object bucket_choice=None) except -1:
    cdef cublasLtMatmulHeuristicResult_t results[QUERY]
    cdef cublasLtMatmulHeuristicResult_t reference[QUERY]
    cdef int n, n_ref = 0, n_probe, i, ref = -1, family = -1
    cdef int64_t probe, small = min(g.m, g.n)
    d.n_candidates = 0
    if determinism == DETERMINISM_BATCH_INVARIANT and d.cublas_invariance:
        if _cublas_invariant(ctx, d, g, types, al_a, al_b, al_c, ws_bytes):
            return 0
        d.cublas_invariance = False         # (no alignment class fits: the families keep it)
    n = _query(ctx, d, results, ws_bytes)
    if determinism == DETERMINISM_BATCH_INVARIANT:
        # The family: the first split-free kernel at FAMILY_ROWS x FAMILY_ROWS (not this M or N).
        n_ref = _heuristic_at(ctx, g, FAMILY_ROWS, FAMILY_ROWS, dtype, compute, epi, bias, aux, ws_bytes,
                              al_a, al_b, al_c, types, reference)
        ref = _first_split_free(reference, n_ref)
        family = _config(&reference[ref].algo, CUBLASLT_ALGO_CONFIG_ID) if ref >= 0 else -1
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
    if determinism == DETERMINISM_BATCH_INVARIANT and _bucket_member(ctx, d, bucket_choice, family, ws_bytes):
        return 0
    for i in range(n):              # this size's own family kernels, in the heuristic's order
        if d.n_candidates < OWN_MEMBERS and in_family(&results[i].algo, family):
            d.candidates[d.n_candidates] = results[i]
            d.n_candidates += 1
    if determinism != DETERMINISM_BATCH_INVARIANT:
        return 0
    # Few rows: where this size's first kernels split K, the same rows against a wider problem
    # (the larger side 2x, 4x) leave no SM idle, and the heuristic offers the small split-free
    # tiles that fill the GPU here too (bf16, 1 x 4096 x 4096 on an H200: 64 x 8, 0.89x the
    # fastest split kernel), then the nearest larger sizes of the smaller side.
    for probe in (2, 4):
        if small > SCAN_ROWS:
            break
        n_probe = _heuristic_at(ctx, g, g.m * probe if g.m != small else g.m, g.n * probe if g.m == small else g.n,
                                dtype, compute, epi, bias, aux, ws_bytes, al_a, al_b, al_c, types, results)
        _members(ctx, d, results, n_probe, family, ws_bytes)
    for probe in (16, 64, 256, 1024):
        if d.n_candidates or probe <= small:
            continue
        n_probe = _heuristic_at(ctx, g, probe if g.m == small else g.m, probe if g.m != small else g.n, dtype,
                                compute, epi, bias, aux, ws_bytes, al_a, al_b, al_c, types, results)
        _members(ctx, d, results, n_probe, family, ws_bytes)
    # Then the reference kernel itself and retiled, where they take this problem.
    _members(ctx, d, &reference[ref], 1, family, ws_bytes)
    _retiled(ctx, d, &reference[ref].algo, small, ws_bytes)
    return 0


cdef int64_t _power_of_two_at_least(int64_t x) noexcept nogil:
    cdef int64_t b = 1
    while b < x:
        b <<= 1
    return b


cdef tuple bucket_key(tuple key):
    # (key: dtype, compute, epi, opa, opb, m, n, k, lda, ldb, ldc, aux_ld, ...: plans._key_tuple)
    return (key[:5] + (_power_of_two_at_least(key[5]), _power_of_two_at_least(key[6]), key[7])
            + key[11:] + ("bucket",))


cdef bint _bucket_member(GemmContext* ctx, PlanData* d, object record, int family, size_t ws_bytes) except -1:
    """Whether the bucket's fastest members (a tuning record's "members") took d's problem: then d
    holds those cublasLtMatmulAlgoCheck accepts, to be timed briefly (d.shared)."""
    cdef cublasLtMatmulHeuristicResult_t kept
    if not isinstance(record, dict) or record.get("route") != "cublasLt":
        return False
    members = record.get("members")
    for algo in (members if isinstance(members, list) else [record.get("algo")]):
        memset(&kept, 0, sizeof(kept))
        if algo_from_hex(algo, &kept.algo):
            _members(ctx, d, &kept, 1, family, ws_bytes)
    d.shared = d.n_candidates > 0
    return d.shared
