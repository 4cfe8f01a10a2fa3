/* cygemm's grouped-GEMM kernel: write the A, B and C pointer arrays that
 * cublasGemmGroupedBatchedEx reads from device memory. Shared by cygemm/grouped_kernels.cu and
 * cygemm/grouped_kernels.pxd.
 *
 * The pointers travel by value, as the kernel's parameter (up to CYGEMM_GROUPED_PTRS_PER_LAUNCH
 * triples, 3 KiB: under the 4 KiB parameter limit), so nothing is copied from host memory: the
 * launch allocates nothing, and a captured graph bakes the pointers into its kernel node. */
#ifndef CYGEMM_GROUPED_KERNELS_H
#define CYGEMM_GROUPED_KERNELS_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CYGEMM_GROUPED_PTRS_PER_LAUNCH 128

typedef struct {
    const void* a[CYGEMM_GROUPED_PTRS_PER_LAUNCH];
    const void* b[CYGEMM_GROUPED_PTRS_PER_LAUNCH];
    void* c[CYGEMM_GROUPED_PTRS_PER_LAUNCH];
} cygemm_ptr_triples;

/* a_out[i] = src->a[i], b_out[i] = src->b[i], c_out[i] = src->c[i] for i < count (device
 * arrays of pointers), enqueued on `stream`. count 0 launches nothing; count beyond
 * CYGEMM_GROUPED_PTRS_PER_LAUNCH is cudaErrorInvalidValue. */
cudaError_t cygemm_write_pointer_table(const cygemm_ptr_triples* src, int count, const void** a_out,
                                       const void** b_out, void** c_out, cudaStream_t stream);

/* ---- cuBLASLt's grouped matmul with the group sizes on the GPU (cygemm.grouped.lt_grouped).
 *
 * One call of cuBLASLt in CUBLASLT_BATCH_MODE_GROUPED reads, per group, the A, B, C and D
 * pointers and the sizes and leading dimensions from device arrays. The mixture-of-experts GEMMs
 * derive them from the experts' row offsets, which live on the GPU: a kernel reads the offsets
 * and writes the arrays into the stream's table (below), so nothing is read back to the host. */

/* The groups one table holds: its six pointer arrays and six int32 arrays within the stream's
 * 64 KiB (cygemm_grouped_table_layout(896).bytes is 64,544). */
#define CYGEMM_LT_GROUPED_MAX_GROUPS 896

/* Which of cuBLAS's m, n, k is a group's count of rows (its offsets' difference). */
enum { CYGEMM_RAGGED_M = 0, CYGEMM_RAGGED_N = 1, CYGEMM_RAGGED_K = 2 };

/* An operand of every group: group g's matrix starts at
 * base + g * group_stride + row0 * row_stride (bytes), row0 the group's first row. */
typedef struct {
    const char* base;
    long long group_stride;
    long long row_stride;
} cygemm_grouped_operand;

/* The problem of every group in cuBLAS's (column-major) terms: the fixed sizes and leading
 * dimensions, which size is ragged, and the rows in all (offsets are clamped to [0, rows]). */
typedef struct {
    cygemm_grouped_operand a, b, d;
    /* FP8: each group's A and B scales (base + g * group_stride; base NULL: none). Where
     * scale_b_kblocks > 0, B's are DeepSeek's 1x128 token scales regrouped by
     * cygemm_group_row_scales: group g (first row lo) at base + 4 * scale_b_kblocks *
     * (round_up(lo, 4) + 4 * g). */
    cygemm_grouped_operand scale_a, scale_b;
    long long scale_b_kblocks;
    long long m, n, k;              /* the ragged one is ignored; the table holds them as int32 */
    long long lda, ldb, ldd;
    int ragged;                     /* CYGEMM_RAGGED_* */
    long long rows;                 /* T: the last offset */
} cygemm_grouped_problem;

/* Where each array lies in a table of `groups` groups: byte offsets from the table's start.
 * The pointer arrays (A, B, C, D, then the FP8 scales' A and B) are 16-byte aligned, as cuBLAS
 * requires of them; the sizes are int32 (the
 * arrays' default integer width); alpha and beta are one float each (Hopper takes one alpha and
 * beta for all groups). */
typedef struct {
    long long a, b, c, d;           /* void* [groups] */
    long long scale_a, scale_b;     /* const float* [groups] (FP8's per-group scales) */
    long long m, n, k;              /* int32 [groups] */
    long long lda, ldb, ldd;        /* int32 [groups] */
    long long alpha, beta;          /* float */
    long long bytes;                /* the table's size */
} cygemm_grouped_table;

static inline long long cygemm_align16(long long x) { return (x + 15) & ~15LL; }

static inline cygemm_grouped_table cygemm_grouped_table_layout(int groups) {
    cygemm_grouped_table t;
    long long ptrs = cygemm_align16((long long)groups * (long long)sizeof(void*));
    long long ints = cygemm_align16((long long)groups * 4);
    t.a = 0; t.b = ptrs; t.c = 2 * ptrs; t.d = 3 * ptrs;
    t.scale_a = 4 * ptrs; t.scale_b = 5 * ptrs;
    t.m = 6 * ptrs; t.n = t.m + ints; t.k = t.n + ints;
    t.lda = t.k + ints; t.ldb = t.lda + ints; t.ldd = t.ldb + ints;
    t.alpha = t.ldd + ints; t.beta = t.alpha + 16;
    t.bytes = t.beta + 16;
    return t;
}

/* Write the table of `groups` groups from the offsets (groups + 1 of them, int32 or int64 as
 * offsets_64bit says, on the device) for problem p, enqueued on `stream`. Offsets outside
 * [0, p->rows] are clamped into it and a decreasing one makes its group empty, so that wrong
 * offsets never make cuBLAS read or write outside the operands. A ragged-K group of no rows
 * gets m = n = 0 (cuBLAS writes nothing there: cygemm_zero_empty_groups zeroes its output).
 * Where p->scale_a.base (scale_b) is set, group g's scale pointer is base + g * group_stride, or
 * for regrouped token scales (p->scale_b_kblocks > 0) the start of its block (above).
 * alpha = 1, beta = 0. groups outside [1, CYGEMM_LT_GROUPED_MAX_GROUPS] is cudaErrorInvalidValue. */
cudaError_t cygemm_write_grouped_table(const void* offsets, int offsets_64bit, int groups,
                                       const cygemm_grouped_problem* p, void* table, cudaStream_t stream);

/* Zero out[g] (rows x cols elements of elem_bytes, rows row_stride bytes apart, matrices
 * group_stride bytes apart) for every group g whose offsets, clamped into [0, total_rows] as the
 * table's are, give it no rows (the weight gradient of an expert no token was routed to),
 * enqueued on `stream`. */
cudaError_t cygemm_zero_empty_groups(const void* offsets, int offsets_64bit, int groups, long long total_rows,
                                     void* out, long long group_stride, long long rows, long long cols,
                                     long long row_stride, int elem_bytes, cudaStream_t stream);

/* Regroup 1x128 token scales for the grouped matmul: src is (T, kblocks) with T contiguous (row
 * t's scale of K-block kb at src[kb * T + t], as cygemm.fp8.quantize_scaled writes them); group g's
 * rows a:b (offsets clamped as the table's are) go to dst as a (kblocks, round_up(b - a, 4)) block,
 * rows contiguous, the padding zero (the layout cuBLASLt reads a group's VEC128 scales in,
 * TransformerEngine's), starting at kblocks * (round_up(a, 4) + 4 * g) floats. dst holds
 * kblocks * (round_up(T, 4) + 4 * groups) floats; no offsets, right or wrong, write past it. */
cudaError_t cygemm_group_row_scales(const float* src, long long rows, int kblocks, const void* offsets,
                                    int offsets_64bit, int groups, float* dst, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* CYGEMM_GROUPED_KERNELS_H */
