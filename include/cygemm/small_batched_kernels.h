/* cygemm's batched GEMM of small matrices: C[i] = alpha op(A[i]) op(B[i]) + beta C[i] over a
 * strided batch, column-major as cuBLAS's cublasGemmStridedBatchedEx takes it (any leading
 * dimensions and batch strides, 0 broadcasting an operand). Each block stages whole matrices of
 * A and B in shared memory, then each thread computes a few elements of one C, adding the K
 * products in order k = 0, 1, ...: every matrix alone, in one fixed order, whatever the batch,
 * the grid or the tile. Shared by cygemm/kernels/small_batched.cu, its .pxd and the probe
 * (benchmarks/small_batched_probe.cu). */
#ifndef CYGEMM_SMALL_BATCHED_KERNELS_H
#define CYGEMM_SMALL_BATCHED_KERNELS_H

#include <cuda_runtime_api.h>
#include <library_types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Operations as cuBLAS numbers them: 0 none, 1 transpose, 2 conjugate transpose. */
typedef struct {
    cudaDataType dtype;         /* CUDA_R_32F, R_16F, R_16BF, R_64F, C_32F, C_64F */
    int opa, opb;
    long long m, n, k;
    const void* a;
    long long lda, stride_a;
    const void* b;
    long long ldb, stride_b;
    void* c;
    long long ldc, stride_c;
    long long batch;
    double alpha_re, alpha_im, beta_re, beta_im;
} cygemm_small_batched_args;

/* How a launch splits the work: each thread's tile of C (CYGEMM_SMALL_TILE_*), threads a block,
 * the shared memory a block stages matrices in (bytes), padding, and stages. The scalar tiles read
 * shared memory one value at a time; the vector tile (V x V, V = 16 bytes over the accumulation
 * type's size: 4 for float32 and the 16-bit types, 2 for float64 and complex64, 1 for complex128)
 * 16 bytes at a time, for m, n and k that are multiples of V (cygemm_small_batched_vector_fits).
 * pad 1: the scalar tiles (even K) pad the K-contiguous operands' columns to K + 1 in shared
 * memory; the vector tile stages both operands K-major, the relaid ones padded by V. pad 0: every
 * operand staged as stored. Two candidates under measurement, compiled only where the file is
 * built with CYGEMM_SMALL_BATCHED_CANDIDATES (the probe, the CPU tests): the vector tile unpadded
 * (each operand read along its contiguous index; elsewhere it is padded whatever pad says), and
 * stages 2, where a block copies its next matrices (cp.async) while it computes on the ones
 * before, wherever every operand not broadcast is a run copied as it is (contiguous, on 16 bytes,
 * not padded, not conjugated) and a matrix of each fits; elsewhere one stage. */
enum {
    CYGEMM_SMALL_TILE_1X1 = 0, CYGEMM_SMALL_TILE_2X2 = 1, CYGEMM_SMALL_TILE_4X4 = 2, CYGEMM_SMALL_TILE_VECTOR = 3,
    CYGEMM_SMALL_TILE_MMA = 4,  /* a candidate: the 16-bit types on the tensor cores (cygemm_small_batched_mma_fits) */
    CYGEMM_SMALL_TILES = 5
};
typedef struct {
    int tile;
    int threads;
    int smem_bytes;
    int pad;
    int stages;
} cygemm_small_batched_shape;

/* Whether the kernel takes the problem: its dtype, operations, sizes (one matrix of A and B
 * fits the shared memory) and 32-bit sizes within a block. 1 or 0. */
int cygemm_small_batched_fits(const cygemm_small_batched_args* args);

/* Whether the vector tile takes it too: it fits, and m, n, k are multiples of V. 1 or 0. */
int cygemm_small_batched_vector_fits(const cygemm_small_batched_args* args);

/* Whether the tensor-core tile takes it: built with CYGEMM_SMALL_BATCHED_CANDIDATES, a GPU of compute
 * capability 8.0 or newer, float16 or bfloat16, m, n, k multiples of 16, 8, 16. 1 or 0. */
int cygemm_small_batched_mma_fits(const cygemm_small_batched_args* args);

/* The launch shape of the measured rule (benchmarks/small_batched_probe.cu on an H200). */
cygemm_small_batched_shape cygemm_small_batched_rule(const cygemm_small_batched_args* args);

/* Enqueue the GEMMs on `stream` with the rule's shape (cygemm_small_batched) or a given one
 * (cygemm_small_batched_shaped, for the probe). cudaErrorInvalidValue for a problem that does
 * not fit, or a shape out of range; else the launch's error. Allocates nothing. */
cudaError_t cygemm_small_batched(const cygemm_small_batched_args* args, cudaStream_t stream);
cudaError_t cygemm_small_batched_shaped(const cygemm_small_batched_args* args, cygemm_small_batched_shape shape,
                                        cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* CYGEMM_SMALL_BATCHED_KERNELS_H */
