// Reductions across the 32 lanes of a warp (butterfly shuffles: every lane gets the result, and
// the order of additions is the same on every call, so results are deterministic).
#ifndef CYGEMM_WARP_REDUCE_CUH
#define CYGEMM_WARP_REDUCE_CUH

namespace cygemm {

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The largest of a row's n values (m) and the sum of exp(x - m) over the row (s), each lane
// reading every 32nd value: the two passes of a softmax over one row per warp.
template <typename T>
__device__ __forceinline__ void warp_row_max_sumexp(const T* x, int n, T& m, T& s) {
    int lane = threadIdx.x % 32;
    m = x[0];
    for (int j = lane; j < n; j += 32) m = fmax(m, x[j]);
    m = warp_max(m);
    s = 0;
    for (int j = lane; j < n; j += 32) s += exp(x[j] - m);
    s = warp_sum(s);
}

}  // namespace cygemm

#endif
