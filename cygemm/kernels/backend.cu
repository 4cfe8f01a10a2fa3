// The CUDABackend's kernels (include/cygemm/backend_kernels.h): row-wise softmax and
// log-softmax, and a stable sigmoid, in float and double.
#include "cygemm/backend_kernels.h"
#include "cygemm/warp_reduce.cuh"

namespace {

constexpr int kRowWarps = 8;                 // rows per block of the row kernels (a warp each)
constexpr int kRowMaxBlocks = 4096;
constexpr int kSigmoidThreads = 256;
constexpr long long kSigmoidMaxBlocks = 65536;   // a grid-stride loop covers the rest

// One warp per row, max subtracted: exact for logits of any finite size.
template <typename T, bool LOG>
__global__ void row_kernel(const T* x, T* y, long long rows, int cols) {
    int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (long long r = (long long)blockIdx.x * warps + warp; r < rows; r += (long long)gridDim.x * warps) {
        const T* xr = x + r * cols;
        T* yr = y + r * cols;
        T m, s;
        cygemm::warp_row_max_sumexp(xr, cols, m, s);
        T log_s = log(s);
        // (x - m) is exact for the row's largest values; subtracting log(s) after keeps their
        // small results accurate (x - (m + log s) would lose half an ulp of m).
        for (int j = lane; j < cols; j += 32) yr[j] = LOG ? (xr[j] - m) - log_s : exp(xr[j] - m) / s;
    }
}

// For x < 0, exp(x) <= 1: neither branch overflows, and both keep full relative precision.
template <typename T>
__device__ __forceinline__ T stable_sigmoid(T x) {
    if (x >= 0) return 1 / (1 + exp(-x));
    T e = exp(x);
    return e / (1 + e);
}

template <typename T>
__global__ void sigmoid_dense(const T* x, T* y, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = stable_sigmoid(x[i]);
}

template <typename T>
__global__ void sigmoid_strided(const char* x, char* y, long long n, cygemm_strided_layout layout) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        long long rest = i, xo = 0, yo = 0;
        for (int d = layout.ndim - 1; d >= 0; --d) {       // the last dimension varies fastest
            long long c = rest % layout.shape[d];
            rest /= layout.shape[d];
            xo += c * layout.x_strides[d];
            yo += c * layout.y_strides[d];
        }
        *reinterpret_cast<T*>(y + yo) = stable_sigmoid(*reinterpret_cast<const T*>(x + xo));
    }
}

template <typename T>
cudaError_t launch_row_op(cygemm_row_op_t op, const void* x, void* y, long long rows, int cols, cudaStream_t stream) {
    int blocks = (int)(rows / kRowWarps + (rows % kRowWarps != 0));
    if (blocks > kRowMaxBlocks) blocks = kRowMaxBlocks;
    const T* xt = static_cast<const T*>(x);
    T* yt = static_cast<T*>(y);
    if (op == CYGEMM_ROW_LOG_SOFTMAX)
        row_kernel<T, true><<<blocks, 32 * kRowWarps, 0, stream>>>(xt, yt, rows, cols);
    else
        row_kernel<T, false><<<blocks, 32 * kRowWarps, 0, stream>>>(xt, yt, rows, cols);
    return cudaGetLastError();
}

int sigmoid_blocks(long long n) {
    long long blocks = (n + kSigmoidThreads - 1) / kSigmoidThreads;
    return (int)(blocks < kSigmoidMaxBlocks ? blocks : kSigmoidMaxBlocks);
}

}  // namespace

extern "C" cudaError_t cygemm_row_op(cudaDataType dtype, cygemm_row_op_t op, const void* x, void* y, int64_t rows,
                                     int64_t cols, cudaStream_t stream) {
    if (rows < 0 || cols < 0 || cols > INT32_MAX || (op != CYGEMM_ROW_SOFTMAX && op != CYGEMM_ROW_LOG_SOFTMAX))
        return cudaErrorInvalidValue;
    if (dtype != CUDA_R_32F && dtype != CUDA_R_64F) return cudaErrorInvalidValue;
    if (rows == 0 || cols == 0) return cudaSuccess;
    return dtype == CUDA_R_32F ? launch_row_op<float>(op, x, y, rows, (int)cols, stream)
                               : launch_row_op<double>(op, x, y, rows, (int)cols, stream);
}

extern "C" cudaError_t cygemm_sigmoid(cudaDataType dtype, const void* x, void* y, int64_t n, cudaStream_t stream) {
    if (n < 0 || (dtype != CUDA_R_32F && dtype != CUDA_R_64F)) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    if (dtype == CUDA_R_32F)
        sigmoid_dense<float><<<sigmoid_blocks(n), kSigmoidThreads, 0, stream>>>(
            static_cast<const float*>(x), static_cast<float*>(y), n);
    else
        sigmoid_dense<double><<<sigmoid_blocks(n), kSigmoidThreads, 0, stream>>>(
            static_cast<const double*>(x), static_cast<double*>(y), n);
    return cudaGetLastError();
}

extern "C" cudaError_t cygemm_sigmoid_strided(cudaDataType dtype, const void* x, void* y, int64_t n,
                                              const cygemm_strided_layout* layout, cudaStream_t stream) {
    if (n < 0 || layout == nullptr || layout->ndim < 1 || layout->ndim > CYGEMM_SIGMOID_MAX_DIMS
        || (dtype != CUDA_R_32F && dtype != CUDA_R_64F))
        return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    const char* xb = static_cast<const char*>(x);
    char* yb = static_cast<char*>(y);
    if (dtype == CUDA_R_32F)
        sigmoid_strided<float><<<sigmoid_blocks(n), kSigmoidThreads, 0, stream>>>(xb, yb, n, *layout);
    else
        sigmoid_strided<double><<<sigmoid_blocks(n), kSigmoidThreads, 0, stream>>>(xb, yb, n, *layout);
    return cudaGetLastError();
}
