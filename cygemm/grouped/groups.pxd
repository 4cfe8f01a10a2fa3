# The groups of one grouped call (see groups.pyx): read, mapped, checked; grouped.pyx runs them.
from libc.stdint cimport int64_t, uint32_t
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport cublasOperation_t, cublasComputeType_t
from cygemm.engine.types cimport MatrixView, ColMajorGemm
from cygemm.engine.args cimport CallArgs

# The grouped routes (cygemm.grouped.ROUTES), in the order the fixed rule prefers them.
cdef enum GroupedRoute:
    R_BATCHED = 0
    R_GROUPED = 1
    R_LOOP = 2
    R_STREAMS = 3
    N_ROUTES = 4


# The groups of one call as read and mapped (no GPU state): three views per group (A, B, out,
# as given), each group's cuBLAS arguments, the non-empty ones split by K, and what decides
# the routes.
cdef class Groups:
    cdef MatrixView* views          # views[3 i + 0, 1, 2]: As[i], Bs[i], outs[i]
    cdef ColMajorGemm* act          # groups with M, N, K > 0, in order
    cdef int64_t* act_index         # their group numbers
    cdef ColMajorGemm* zero_k       # groups with M, N > 0 and K == 0: out = beta out
    cdef int64_t n, n_act, n_zero_k
    cdef cudaDataType dtype
    cdef int itemsize
    cdef bint trans_a, trans_b
    cdef bint torch                 # some matrix is a torch tensor (the stream rule)
    cdef object offsets             # moe_gemm(_wgrad): the group offsets (names), else None
    cdef tuple roles                # with offsets: (argument, its rows per group?) for A, B, out
    cdef double macs
    cdef uint32_t align             # the smallest alignment of any active group's pointer
    cdef ColMajorGemm batched       # the strided-batched GEMM, where that route applies
    cdef object why_batched         # None: the batched route applies; else why not
    # cublasGemmGroupedBatchedEx's host arrays, n_act each (filled when that route first runs)
    cdef int* dims                  # m, n, k, lda, ldb, ldc: six arrays one after another
    cdef cublasOperation_t* ops     # opa, then opb
    cdef float* scalars             # alpha, then beta
    cdef int* ones                  # group sizes: one GEMM per group
    cdef bint host_filled
    cdef float host_alpha, host_beta


    cdef int alloc(self, int64_t n) except -1
    # The argument that group i's A (role 0), B (1) or out (2) came from: "As[3]", "x[0:5]".
    cdef str name(self, int64_t i, int role)
    # Map every group, split the non-empty ones by K, decide what the routes need.
    cdef int finish(self) except -1
    cdef object _batched(self)
    # None when `route` can run these groups, else why it cannot.
    cdef object why_not(self, int route, cublasComputeType_t compute)
    # ValueError unless every output shares memory with no input and no other output.
    cdef int check_disjoint(self) except -1
    # cublasGemmGroupedBatchedEx's host arrays (dims, ops, scalars, ones) filled for alpha and
    # beta; kept alive with the graph when `stream` is capturing.
    cdef int host_arrays(self, float alpha, float beta, cudaStream_t stream) except -1
    # The problem's key in the tuning table.
    cdef tuple key(self, cublasComputeType_t compute)


# grouped_gemm's groups: 2-D matrices of one dtype whose shapes multiply, group by group.
cdef Groups read_lists(object As, object Bs, object outs, bint trans_a, bint trans_b)
# A mixture-of-experts call's x, w (dy: wgrad) and out (dw) read into c (views 0, 1 and last),
# device offsets (not None) between b and out; layout, dtypes and shapes checked; G returned.
cdef int64_t read_moe_args(CallArgs* c, object x, object b, object offsets, object out, str layout,
                           bint wgrad) except -1
# The groups of moe_gemm (b: w) or moe_gemm_wgrad (b: dy, out: dw; wgrad), views of x, b and out
# read into c too (x, b, out: checked as a whole); group_offsets: host offsets, checked here.
cdef Groups read_moe(CallArgs* c, object x, object b, object group_offsets, object out, str layout, bint wgrad)
# ValueError unless the experts' matrices of `ov` (a batch, one per expert) share no memory.
cdef int check_experts_disjoint(const MatrixView* ov, str name) except -1
# The host offsets of G experts over T rows, checked: ValueError/TypeError naming group_offsets.
cdef list read_offsets(object group_offsets, int64_t G, int64_t T)
# Every view's device against the call's (several GPUs only), after prepare_call.
cdef int check_group_devices(CallArgs* c, Groups grp) except -1
