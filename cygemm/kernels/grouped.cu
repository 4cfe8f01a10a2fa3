// The pointer-table kernel of cygemm.grouped: one thread per GEMM copies its three pointers
// from the kernel's parameter (by value) into the device table cuBLAS reads.
#include "cygemm/grouped_kernels.h"

namespace {

__global__ void write_pointer_table(cygemm_ptr_triples src, int count, const void** a_out,
                                    const void** b_out, void** c_out) {
    int i = threadIdx.x;
    if (i < count) {
        a_out[i] = src.a[i];
        b_out[i] = src.b[i];
        c_out[i] = src.c[i];
    }
}

}  // namespace

// Kernel parameters are limited to 4 KiB on every GPU and toolkit cygemm builds for (CUDA 12.1
// allows more on Volta and later only): the triples and the other arguments stay under it.
static_assert(sizeof(cygemm_ptr_triples) + 3 * sizeof(void*) + sizeof(int) <= 4096,
              "pointer triples must fit the 4 KiB kernel-parameter limit");

extern "C" cudaError_t cygemm_write_pointer_table(const cygemm_ptr_triples* src, int count, const void** a_out,
                                                  const void** b_out, void** c_out, cudaStream_t stream) {
    if (count <= 0) return cudaSuccess;
    if (count > CYGEMM_GROUPED_PTRS_PER_LAUNCH) return cudaErrorInvalidValue;
    write_pointer_table<<<1, CYGEMM_GROUPED_PTRS_PER_LAUNCH, 0, stream>>>(*src, count, a_out, b_out, c_out);
    return cudaGetLastError();
}


// ---------------------------------------------------------------- the grouped matmul's table

namespace {

__device__ long long read_offset(const void* offsets, int is64, int i) {
    return is64 ? static_cast<const long long*>(offsets)[i] : static_cast<const int*>(offsets)[i];
}

__device__ void group_rows(const void* offsets, int is64, int g, long long rows, long long* lo, long long* hi) {
    long long a = read_offset(offsets, is64, g), b = read_offset(offsets, is64, g + 1);
    a = a < 0 ? 0 : (a > rows ? rows : a);
    b = b < a ? a : (b > rows ? rows : b);
    *lo = a;
    *hi = b;
}

__device__ void* operand_at(const cygemm_grouped_operand& o, int g, long long row0) {
    return const_cast<char*>(o.base) + g * o.group_stride + row0 * o.row_stride;
}

// Where group g's regrouped token scales start, in rows of K-blocks: its first row rounded up to
// 4, plus 4 for each group before it. Blocks of increasing offsets never overlap (each block's
// round_up(rows, 4) fits before the next start) and, whatever the offsets, every block ends
// within round_up(T, 4) + 4 * groups rows: wrong offsets never write past the workspace.
__device__ long long scale_rows_start(long long lo, int g) {
    return (lo + 3) / 4 * 4 + 4LL * g;
}

__global__ void write_grouped_table(const void* offsets, int is64, int groups, cygemm_grouped_problem p,
                                    char* table, cygemm_grouped_table t) {
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g == 0) {
        *reinterpret_cast<float*>(table + t.alpha) = 1.0f;
        *reinterpret_cast<float*>(table + t.beta) = 0.0f;
    }
    if (g >= groups) return;
    long long lo, hi;
    group_rows(offsets, is64, g, p.rows, &lo, &hi);
    int rows = static_cast<int>(hi - lo);
    int m = p.ragged == CYGEMM_RAGGED_M ? rows : static_cast<int>(p.m);
    int n = p.ragged == CYGEMM_RAGGED_N ? rows : static_cast<int>(p.n);
    int k = p.ragged == CYGEMM_RAGGED_K ? rows : static_cast<int>(p.k);
    if (p.ragged == CYGEMM_RAGGED_K && rows == 0) m = n = 0;
    reinterpret_cast<void**>(table + t.a)[g] = operand_at(p.a, g, lo);
    reinterpret_cast<void**>(table + t.b)[g] = operand_at(p.b, g, lo);
    void* d = operand_at(p.d, g, lo);
    reinterpret_cast<void**>(table + t.c)[g] = d;      // beta is 0: C is not read
    reinterpret_cast<void**>(table + t.d)[g] = d;
    if (p.scale_a.base != nullptr)
        reinterpret_cast<const void**>(table + t.scale_a)[g] = p.scale_a.base + g * p.scale_a.group_stride;
    if (p.scale_b.base != nullptr && p.scale_b_kblocks > 0)
        reinterpret_cast<const void**>(table + t.scale_b)[g] =
            p.scale_b.base + 4 * p.scale_b_kblocks * scale_rows_start(lo, g);
    else if (p.scale_b.base != nullptr)
        reinterpret_cast<const void**>(table + t.scale_b)[g] = p.scale_b.base + g * p.scale_b.group_stride;
    reinterpret_cast<int*>(table + t.m)[g] = m;
    reinterpret_cast<int*>(table + t.n)[g] = n;
    reinterpret_cast<int*>(table + t.k)[g] = k;
    reinterpret_cast<int*>(table + t.lda)[g] = static_cast<int>(p.lda);
    reinterpret_cast<int*>(table + t.ldb)[g] = static_cast<int>(p.ldb);
    reinterpret_cast<int*>(table + t.ldd)[g] = static_cast<int>(p.ldd);
}

// One column of blocks per group (blockIdx.y): the blocks of a group with rows return at once,
// those of an empty group zero its matrix, 16 bytes at a time where its rows allow.
__global__ void zero_empty_groups(const void* offsets, int is64, long long total_rows, char* out,
                                  long long group_stride, long long rows, long long row_bytes, long long row_stride) {
    int g = blockIdx.y;
    long long lo, hi;
    group_rows(offsets, is64, g, total_rows, &lo, &hi);     // (clamped as the table's are)
    if (hi > lo) return;
    char* base = out + g * group_stride;
    long long total = rows * row_bytes;
    long long step = static_cast<long long>(gridDim.x) * blockDim.x;
    long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    bool wide = row_bytes % 16 == 0 && row_stride % 16 == 0 && reinterpret_cast<unsigned long long>(base) % 16 == 0;
    if (wide) {
        long long per_row = row_bytes / 16;
        for (long long i = first; i < rows * per_row; i += step) {
            long long r = i / per_row, c = i % per_row;
            *reinterpret_cast<uint4*>(base + r * row_stride + c * 16) = make_uint4(0, 0, 0, 0);
        }
    } else {
        for (long long i = first; i < total; i += step) {
            long long r = i / row_bytes, c = i % row_bytes;
            base[r * row_stride + c] = 0;
        }
    }
}

}  // namespace

extern "C" cudaError_t cygemm_write_grouped_table(const void* offsets, int offsets_64bit, int groups,
                                                  const cygemm_grouped_problem* p, void* table, cudaStream_t stream) {
    if (groups < 1 || groups > CYGEMM_LT_GROUPED_MAX_GROUPS || offsets == nullptr || table == nullptr)
        return cudaErrorInvalidValue;
    cygemm_grouped_table t = cygemm_grouped_table_layout(groups);
    int threads = 128;
    write_grouped_table<<<(groups + threads - 1) / threads, threads, 0, stream>>>(
        offsets, offsets_64bit, groups, *p, static_cast<char*>(table), t);
    return cudaGetLastError();
}

extern "C" cudaError_t cygemm_zero_empty_groups(const void* offsets, int offsets_64bit, int groups,
                                                long long total_rows, void* out, long long group_stride,
                                                long long rows, long long cols, long long row_stride, int elem_bytes,
                                                cudaStream_t stream) {
    if (groups < 1 || groups > 65535 || offsets == nullptr || out == nullptr || elem_bytes <= 0)
        return cudaErrorInvalidValue;
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    long long row_bytes = cols * elem_bytes;
    long long work = rows * (row_bytes / 16 > 0 ? row_bytes / 16 : row_bytes);
    int threads = 256;
    long long blocks = (work + threads - 1) / threads;
    dim3 grid(static_cast<unsigned>(blocks < 32 ? blocks : 32), static_cast<unsigned>(groups));
    zero_empty_groups<<<grid, threads, 0, stream>>>(offsets, offsets_64bit, total_rows, static_cast<char*>(out),
                                                    group_stride, rows, row_bytes, row_stride);
    return cudaGetLastError();
}


namespace {

// One block per group: its rows' scales of every K-block, copied into its padded block.
__global__ void group_row_scales(const float* src, long long rows, int kblocks, const void* offsets, int is64,
                                 float* dst) {
    int g = blockIdx.x;
    long long lo, hi;
    group_rows(offsets, is64, g, rows, &lo, &hi);
    long long n = hi - lo, padded = (n + 3) / 4 * 4;
    float* out = dst + kblocks * scale_rows_start(lo, g);
    for (long long i = threadIdx.x; i < kblocks * padded; i += blockDim.x) {
        long long kb = i / padded, r = i % padded;
        out[i] = r < n ? src[kb * rows + lo + r] : 0.0f;
    }
}

}  // namespace

extern "C" cudaError_t cygemm_group_row_scales(const float* src, long long rows, int kblocks, const void* offsets,
                                               int offsets_64bit, int groups, float* dst, cudaStream_t stream) {
    if (groups < 1 || groups > CYGEMM_LT_GROUPED_MAX_GROUPS || kblocks < 1 || src == nullptr || dst == nullptr
        || offsets == nullptr)
        return cudaErrorInvalidValue;
    group_row_scales<<<groups, 128, 0, stream>>>(src, rows, kblocks, offsets, offsets_64bit, dst);
    return cudaGetLastError();
}
