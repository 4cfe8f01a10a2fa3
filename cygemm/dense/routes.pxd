# The dense layer's routes (see routes.pyx): layer.pyx reads a call into a ForwardCall or
# BackwardCall, then runs it here.
from libc.stdint cimport int64_t
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport cublasComputeType_t
from cygemm.kernels.elementwise cimport cygemm_act_t
from cygemm.engine.epilogues cimport Activation
from cygemm.engine.types cimport ColMajorGemm
from cygemm.engine.context cimport GemmContext
from cygemm.engine.settings cimport Policy

# One forward call: out = act(A @ B + bias), and Z = A @ B + bias with save_z.
ctypedef struct ForwardCall:
    GemmContext* ctx
    cudaStream_t s
    ColMajorGemm g_y            # A @ B into out
    ColMajorGemm g_z            # A @ B into z_out (save_z)
    cudaDataType dtype
    cublasComputeType_t compute
    const void* bias
    void* y
    int64_t y_ld
    void* z
    int64_t z_ld
    int64_t M
    int64_t N
    int64_t K
    const Activation* act
    cygemm_act_t code
    float slope
    bint save_z
    void* ws
    size_t ws_bytes
    Policy policy

# The backward's two GEMMs (gA = dZ @ B^T, gB = A^T @ dZ), both non-empty.
ctypedef struct BackwardCall:
    GemmContext* ctx
    cudaStream_t s
    ColMajorGemm g_a
    ColMajorGemm g_b
    cudaDataType dtype
    cublasComputeType_t compute
    float beta
    Policy policy
    int64_t M                   # the forward's sizes: A (M, K), B (K, N)
    int64_t N
    int64_t K

# The forward by its route (chosen by cygemm.engine.chooser), falling back to a plain GEMM and
# cygemm's kernel where cuBLASLt refuses.
cdef int run_forward(ForwardCall* f) except -1
# The backward's two GEMMs by their route (accumulate: beta 1, so the call may not time).
cdef int run_backward(BackwardCall* b, bint accumulate) except -1
# A plain GEMM through the plans (alpha 1).
cdef int dense_gemm(GemmContext* ctx, cudaStream_t stream, const ColMajorGemm* g, cudaDataType dtype,
                    cublasComputeType_t compute, float beta, Policy policy) except -1

# The policy of the weight gradient's GEMM: run-to-run under the batch-invariant mode (it sums
# over the batch's rows), else the call's.
cdef Policy weight_policy(Policy policy) noexcept nogil
