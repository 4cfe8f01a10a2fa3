// Runs a CUDA kernel's source on the CPU, so that its index arithmetic, staging and launch logic
// are tested where there is no GPU (tests/kernels/emulator.py compiles a kernel file with this
// header in front, its launches rewritten to cuda_on_cpu::launch).
//
// Each block's threads are fibers (ucontext) of one OS thread, run in turn: a thread runs until
// it reaches a barrier or returns; no thread passes a __syncthreads() before every thread of the
// block that has not returned reaches it, nor a warp-wide operation (the tensor cores' mma)
// before every thread of its warp does; threads that wait for each other at different barriers
// end the launch with cudaErrorLaunchFailure. Blocks take turns among four legal schedules (every
// thread a step in order; each warp alone up to the block's next barrier, forward, in reverse, or
// warps and threads in a seeded pseudo-random order).
// Blocks run one after another, each on shared memory
// refilled with 0xFF bytes (a NaN in every floating-point type), so a value read before it was
// staged shows in the result; each static __shared__ variable is refilled so too, when the
// block's first thread reaches its declaration. Asynchronous copies to shared memory (a kernel's cp.async, through
// the CYGEMM_CUDA_ON_CPU branch of its copy helpers) land as late as they may, when their thread
// waits for them (a read before the wait sees the old bytes), or as early, when issued (a buffer
// still being read by other threads is overwritten): cuda_on_cpu_copies_land. What this cannot show:
// warp-synchronous code beyond __shfl_xor_sync, the memory model between blocks, speed.
#ifndef CYGEMM_CUDA_ON_CPU_H
#define CYGEMM_CUDA_ON_CPU_H
#define CYGEMM_CUDA_ON_CPU 1             // (kernel files' copy helpers take the emulator's branch)

#include <cuda_runtime_api.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <tuple>
#include <vector>

// The kernel language's qualifiers mean nothing here; its builtins are plain globals that the
// scheduler sets before it switches to a thread. Every variable here is static: two builds loaded
// in one process (a kernel file with and without a macro) keep their own.
#undef __global__
#undef __shared__
#undef __launch_bounds__
#undef __align__
#define __global__
#define __shared__ static           // (blocks run one at a time: one copy serves each in turn)
#define __launch_bounds__(...)
#define __align__(n)

static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;

inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return unsigned(((unsigned long long)a * b) >> 32);
}
// The fast-math intrinsics, as IEEE operations: the GPU's approximations differ in the last bits
// (a kernel using them promises no bits, and its tests compare within a tolerance).
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return std::exp(x); }
static int min(int a, int b) { return a < b ? a : b; }
static int max(int a, int b) { return a > b ? a : b; }

namespace cuda_on_cpu {

constexpr size_t SHARED_BYTES = 48 << 10;      // what a block may take without opting in
constexpr size_t STACK_BYTES = 128 << 10;

// The dynamic shared memory (a kernel's `extern __shared__ T name[]` is rewritten to point here).
alignas(16) static unsigned char shared[SHARED_BYTES];
// The static __shared__ variables this block has filled (a declaration `__shared__ T name...;` is
// rewritten to a static followed by fresh_static_shared(name)).
static std::vector<const void*> filled_statics;

// The first thread of a block to reach a static __shared__ declaration fills the variable with
// 0xFF bytes, as the dynamic buffer is for each block: what an earlier block left there never
// shows as a value this block staged. (Every thread passes its declaration before any use.)
inline void fresh_static_shared(void* p, size_t bytes) {
    if (std::find(filled_statics.begin(), filled_statics.end(), p) != filled_statics.end()) return;
    filled_statics.push_back(p);
    std::memset(p, 0xFF, bytes);
}

static int sm_count = 4;                        // what the device reports (cuda_on_cpu_set_sm_count)
static cudaError_t last_error = cudaSuccess;
static long long launches = 0;
constexpr int SCHEDULES = 4;                    // the block schedules launches take turns among
inline unsigned warps_of(unsigned threads) { return (threads + 31) / 32; }
static long long async_copies = 0;             // cp.async copies issued, all launches
static bool copies_land_at_issue = false;      // else when waited for

struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
};

enum State { RUNNING, AT_BLOCK, AT_WARP, DONE };

struct Fiber {
    ucontext_t context;
    State state = RUNNING;
    int site = 0;                               // the line of the __syncthreads() it waits at
    std::vector<Copy> open;                     // asynchronous copies not yet committed
    std::deque<std::vector<Copy>> groups;       // committed groups, oldest first
    std::unique_ptr<unsigned char[]> stack{new unsigned char[STACK_BYTES]};    // (not zeroed: it is a stack)
};
static std::vector<Fiber> fibers;               // one a thread, kept from launch to launch

static ucontext_t scheduler;
static Fiber* running = nullptr;

inline void yield(State at) {
    running->state = at;
    swapcontext(&running->context, &scheduler);
}

// cp.async (16 bytes), cp.async.commit_group, cp.async.wait_group n.
inline void async_copy(void* dst, const void* src, size_t bytes) {
    ++async_copies;
    if (copies_land_at_issue) std::memcpy(dst, src, bytes);
    else running->open.push_back({dst, src, bytes});
}
inline void async_commit() {
    running->groups.push_back(std::move(running->open));
    running->open.clear();
}
inline void async_wait(size_t newest_left) {
    while (running->groups.size() > newest_left) {
        for (const Copy& c : running->groups.front()) std::memcpy(c.dst, c.src, c.bytes);
        running->groups.pop_front();
    }
}

}  // namespace cuda_on_cpu

// A barrier knows its call site: threads of a block that wait at different __syncthreads() end
// the launch with a failure (CUDA requires every thread of the block to reach the same one).
inline void block_barrier(int site) {
    cuda_on_cpu::running->site = site;
    cuda_on_cpu::yield(cuda_on_cpu::AT_BLOCK);
}
#define __syncthreads() block_barrier(__LINE__)

namespace cuda_on_cpu {

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: d += a b over the warp, each thread holding
// the fragments of the PTX ISA's layout (groupID = lane / 4, t = lane % 4: a's registers (g, 2t),
// (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8), two values each along K; b's (2t, g), (2t + 8, g)
// along K; d's (g, 2t) and (g + 8, 2t), two along N). Sums in fp32, K in order (the tensor cores'
// order is their own).
struct MmaSlot {
    uint32_t a[4], b[2];
};
static MmaSlot mma_slots[1024];

template <bool BF16>
inline float half_bits(uint32_t reg, int high) {
    const unsigned short bits = (unsigned short)(high ? reg >> 16 : reg & 0xFFFF);
    if constexpr (BF16) {
        __nv_bfloat16_raw r;
        r.x = bits;
        return __bfloat162float(__nv_bfloat16(r));
    } else {
        __half_raw r;
        r.x = bits;
        return __half2float(__half(r));
    }
}

template <bool BF16>
inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned lane = t % 32, base = t - lane;
    for (int r = 0; r < 4; ++r) mma_slots[t].a[r] = a[r];
    for (int r = 0; r < 2; ++r) mma_slots[t].b[r] = b[r];
    yield(AT_WARP);                                 // (every thread's fragments are in)
    auto A = [&](int row, int col) {                // the lane and register holding A(row, col)
        const MmaSlot& s = mma_slots[base + (row % 8) * 4 + (col % 8) / 2];
        return half_bits<BF16>(s.a[(row >= 8) + 2 * (col >= 8)], col % 2);
    };
    auto B = [&](int row, int col) {
        const MmaSlot& s = mma_slots[base + col * 4 + (row % 8) / 2];
        return half_bits<BF16>(s.b[row >= 8], row % 2);
    };
    const int g = int(lane / 4), t2 = int(lane % 4) * 2;
    for (int i = 0; i < 4; ++i) {
        const int row = g + (i >= 2 ? 8 : 0), col = t2 + (i & 1);
        for (int kk = 0; kk < 16; ++kk) d[i] = std::fma(A(row, kk), B(kk, col), d[i]);
    }
    yield(AT_WARP);                                 // (every thread has read them)
}

// __shfl_xor_sync over the warp: every thread of the warp deposits its value and waits at the
// warp's barrier (as the GPU's full-mask shuffle requires all 32 lanes), then reads its partner's;
// a partner lane that has returned gives all-ones bits (a NaN), so a shuffle past the live lanes
// shows. Values of up to 8 bytes.
struct ShuffleSlot {
    uint64_t bits;
    bool in;
};
static ShuffleSlot shuffle_slots[1024];

template <typename T>
inline T shfl_xor(T v, int lane_mask) {
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes here");
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned lane = t % 32, base = t - lane;
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    shuffle_slots[t] = {bits, true};
    yield(AT_WARP);                                 // (every lane's value is in)
    const ShuffleSlot& from = shuffle_slots[base + ((lane ^ unsigned(lane_mask)) & 31u)];
    uint64_t got = from.in ? from.bits : ~uint64_t(0);
    T r;
    std::memcpy(&r, &got, sizeof(T));
    yield(AT_WARP);                                 // (every lane has read)
    shuffle_slots[t].in = false;
    return r;
}

template <typename Kernel, typename Args>
struct Body {
    Kernel kernel;
    const Args* args;
    static void enter(unsigned lo, unsigned hi) {
        auto* self = reinterpret_cast<Body*>((uintptr_t(hi) << 32) | lo);
        std::apply(self->kernel, *self->args);
        yield(DONE);
    }
};

// kernel<<<grid, block, smem, stream>>>(args...): every block of the grid, in order, now.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t, Args&&... args) {
    const unsigned threads = block.x * block.y * block.z;
    if (threads == 0 || threads > 1024 || smem > SHARED_BYTES || grid.x == 0 || grid.y == 0 || grid.z == 0) {
        last_error = cudaErrorInvalidValue;
        return;
    }
    ++launches;
    using Tuple = std::tuple<std::decay_t<Params>...>;
    const Tuple values(std::forward<Args>(args)...);
    using Kernel = void (*)(Params...);
    Body<Kernel, Tuple> body{kernel, &values};
    if (fibers.size() < threads) fibers.resize(threads);
    gridDim = grid;
    blockDim = block;
    // Launches take turns between the grid in order and in reverse (blocks may run in any order).
    const unsigned long long n_blocks = (unsigned long long)grid.x * grid.y * grid.z;
    for (unsigned long long i = 0; i < n_blocks; ++i) {
                const unsigned long long b = launches % 2 ? n_blocks - 1 - i : i;
                const unsigned bx = unsigned(b % grid.x), by = unsigned(b / grid.x % grid.y),
                               bz = unsigned(b / grid.x / grid.y);
                blockIdx = uint3{bx, by, bz};
                std::memset(shared, 0xFF, SHARED_BYTES);
                filled_statics.clear();
                for (unsigned t = 0; t < threads; ++t) {
                    Fiber& f = fibers[t];
                    f.state = RUNNING;
                    f.open.clear();             // (copies never waited for never land)
                    f.groups.clear();
                    getcontext(&f.context);
                    f.context.uc_stack.ss_sp = f.stack.get();
                    f.context.uc_stack.ss_size = STACK_BYTES;
                    f.context.uc_link = nullptr;
                    const uintptr_t self = reinterpret_cast<uintptr_t>(&body);
                    makecontext(&f.context, reinterpret_cast<void (*)()>(&Body<Kernel, Tuple>::enter), 2,
                                unsigned(self & 0xFFFFFFFFu), unsigned(self >> 32));
                }
                // Each thread that may run runs to its next barrier or its end; then the warps all of
                // whose live threads wait at a warp-wide operation go on, else the block if all of its
                // live threads wait at __syncthreads(), else they wait for each other: a failure.
                // Blocks take turns among four legal schedules (SCHEDULES): every thread a step in
                // thread order; or each warp alone, as far as it goes before the block's next
                // barrier, warps and their threads in order, in reverse or in a seeded random order.
                // The warp-at-a-time ones show a read that a missing barrier lets another warp
                // overwrite first.
                const unsigned warps = (threads + 31) / 32;
                const int schedule = int((launches + bx + by + bz) % SCHEDULES);
                const bool reverse = schedule == 2;
                // Schedule 3: warps, and the threads of each, in a seeded pseudo-random order (a
                // permutation per block, from the launch and block numbers).
                std::vector<unsigned> order(threads), warp_order(warps_of(threads));
                for (unsigned t = 0; t < threads; ++t) order[t] = t;
                for (unsigned w = 0; w < warp_order.size(); ++w) warp_order[w] = w;
                if (schedule == 3) {
                    uint64_t seed = 0x9E3779B97F4A7C15ull * uint64_t(launches + 1) + 0x632BE59BD9B4E019ull *
                                    uint64_t(1 + bx + grid.x * (by + grid.y * bz));
                    auto next = [&seed](unsigned bound) {
                        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                        return unsigned((seed >> 33) % bound);
                    };
                    for (unsigned w = unsigned(warp_order.size()); w > 1; --w)
                        std::swap(warp_order[w - 1], warp_order[next(w)]);
                    for (unsigned lo = 0; lo < threads; lo += 32) {
                        const unsigned hi = std::min(threads, lo + 32);
                        for (unsigned j = hi - lo; j > 1; --j) std::swap(order[lo + j - 1], order[lo + next(j)]);
                    }
                }
                auto step = [&](unsigned t) {
                    Fiber& f = fibers[t];
                    if (f.state != RUNNING) return;
                    threadIdx = uint3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                    running = &f;
                    swapcontext(&scheduler, &f.context);
                };
                auto warp_waits = [&](unsigned w) {     // every live thread of w at a warp-wide operation
                    bool any = false;
                    for (unsigned t = 32 * w; t < threads && t < 32 * w + 32; ++t) {
                        if (fibers[t].state == DONE) continue;
                        if (fibers[t].state != AT_WARP) return false;
                        any = true;
                    }
                    return any;
                };
                for (;;) {
                    if (schedule == 0) {
                        for (unsigned t = 0; t < threads; ++t) step(t);
                    } else {
                        for (unsigned i = 0; i < warps; ++i) {
                            const unsigned w = reverse ? warps - 1 - i : warp_order[i];
                            const unsigned lo = 32 * w, hi = std::min(threads, lo + 32);
                            for (;;) {
                                for (unsigned j = lo; j < hi; ++j) step(reverse ? hi - 1 - (j - lo) : order[j]);
                                if (!warp_waits(w)) break;
                                for (unsigned t = lo; t < hi; ++t)
                                    if (fibers[t].state == AT_WARP) fibers[t].state = RUNNING;
                            }
                        }
                    }
                    bool released = false, live = false, all_at_block = true;
                    for (unsigned w = 0; w < warps; ++w) {
                        bool any = false, all_at_warp = true;
                        for (unsigned t = 32 * w; t < threads && t < 32 * w + 32; ++t) {
                            const State st = fibers[t].state;
                            if (st == DONE) continue;
                            any = live = true;
                            all_at_warp = all_at_warp && st == AT_WARP;
                            all_at_block = all_at_block && st == AT_BLOCK;
                        }
                        if (any && all_at_warp) {
                            released = true;
                            for (unsigned t = 32 * w; t < threads && t < 32 * w + 32; ++t)
                                if (fibers[t].state == AT_WARP) fibers[t].state = RUNNING;
                        }
                    }
                    if (!live) break;
                    if (released) continue;
                    int site = -1;
                    for (unsigned t = 0; t < threads && all_at_block; ++t) {
                        if (fibers[t].state != AT_BLOCK) continue;
                        if (site >= 0 && fibers[t].site != site) all_at_block = false;    // two barriers
                        site = fibers[t].site;
                    }
                    if (!all_at_block) {
                        last_error = cudaErrorLaunchFailure;
                        running = nullptr;
                        return;
                    }
                    for (unsigned t = 0; t < threads; ++t)
                        if (fibers[t].state == AT_BLOCK) fibers[t].state = RUNNING;
                }
            }
    running = nullptr;
}

}  // namespace cuda_on_cpu

template <typename T>
inline T __shfl_xor_sync(unsigned /*mask: the full warp, as the kernels pass*/, T v, int lane_mask, int = 32) {
    return cuda_on_cpu::shfl_xor(v, lane_mask);
}
// Atomics: threads run one at a time and never between a read and its write here.
inline int atomicMax(int* p, int v) { const int old = *p; if (v > old) *p = v; return old; }
inline int atomicOr(int* p, int v) { const int old = *p; *p = old | v; return old; }
inline unsigned atomicAdd(unsigned* p, unsigned v) { const unsigned old = *p; *p = old + v; return old; }
inline float atomicAdd(float* p, float v) { const float old = *p; *p = old + v; return old; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __fdiv_rn(float a, float b) { return a / b; }
using std::isinf;
using std::isnan;
using std::isfinite;
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline void __threadfence() {}
template <typename T>
inline T __ldg(const T* p) { return *p; }
inline float cospif(float x) { return float(std::cos(M_PI * double(x))); }
inline float sinpif(float x) { return float(std::sin(M_PI * double(x))); }

// The runtime calls the kernel files make, answered here (no CUDA runtime is linked; one
// translation unit includes this).
extern "C" {
cudaError_t cudaGetLastError(void) {
    const cudaError_t e = cuda_on_cpu::last_error;
    cuda_on_cpu::last_error = cudaSuccess;
    return e;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
    std::memset(p, value, bytes);
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
    *device = cuda_on_cpu::sm_count & 63;      // (each SM count its own device: kernel files cache a device's)
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
    switch (attr) {                             // (a Hopper GPU of sm_count SMs)
        case cudaDevAttrMultiProcessorCount: *value = cuda_on_cpu::sm_count; return cudaSuccess;
        case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
        case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
        default: return cudaErrorInvalidValue;
    }
}
}

#endif  // CYGEMM_CUDA_ON_CPU_H
