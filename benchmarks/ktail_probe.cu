// Which GEMMs of cuBLAS drop the end of K, and what a guard against it costs: measured from C++
// before the guard was written (cygemm/_ktail.pyx), on the GPU at hand and the cuBLAS it loads.
//
// The detector needs no tolerance: A (M x K, row-major) is zero but for its first and last
// columns, which are 1, and B (K x N) is all ones, so every element of C = A @ B is exactly 2. A
// kernel that never adds the last element of K returns 1 there.
//
// For each shape (cuBLAS's column-major view of a row-major call: m = N, n = M, k = K) it runs
//   E  cublasGemmEx with a 32 MiB workspace (what cygemm's handle has),
//   Z  cublasGemmEx with no workspace,
//   L  cuBLASLt's first heuristic choice (32 MiB), whose SPLITK_NUM / ALGO_ID / STAGES_ID it reads,
//   G  the guard's form of E: K's largest multiple of 256 with the workspace, then the rest of K
//      without one (beta 1), so that no split-K kernel sees a K its blocks do not divide,
// and counts the wrong elements of each. Then it times E, Z, G and L, LG (the guard's form of L)
// on the shapes E got wrong and on a few it got right, each as a CUDA graph of 20 calls.
//   nvcc -std=c++17 -O2 -arch=sm_90 benchmarks/ktail_probe.cu -o ktail_probe -lcublas -lcublasLt
//   ./ktail_probe [quick]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#define CK(x) do { long e_ = (long)(x); if (e_ != 0) { printf("ERR %s = %ld at %d\n", #x, e_, __LINE__); exit(1);} } while (0)

static cublasHandle_t blas;
static cublasLtHandle_t lt;
static void* ws;
static const size_t WS = 32u << 20;
static int* d_bad;

struct Dt { const char* name; cudaDataType t; cublasComputeType_t c; int size; };
static const Dt DTS[] = {{"bf16", CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2}, {"fp16", CUDA_R_16F, CUBLAS_COMPUTE_32F, 2},
                         {"tf32", CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 4}, {"fp32", CUDA_R_32F, CUBLAS_COMPUTE_32F, 4}};

template <class T> __device__ float tof(T v) { return (float)v; }
template <> __device__ float tof<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ float tof<__half>(__half v) { return __half2float(v); }
template <class T> __device__ T fromf(float v) { return (T)v; }
template <> __device__ __nv_bfloat16 fromf<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __half fromf<__half>(float v) { return __float2half(v); }

// The detector's A as cuBLAS's second operand: K x M column-major, ld >= K; ones at k = 0, K - 1.
template <class T> __global__ void fill_a(T* a, long k, long ld, long cols) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < ld * cols; i += (long)gridDim.x * blockDim.x) {
    long r = i % ld; a[i] = fromf<T>((r == 0 || r == k - 1) ? 1.f : 0.f);
  }
}
template <class T> __global__ void fill(T* a, long n, float v) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) a[i] = fromf<T>(v);
}
template <class T> __global__ void count_bad(const T* c, long m, long n, long ld, int* bad) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < m * n; i += (long)gridDim.x * blockDim.x)
    if (tof<T>(c[(i / m) * ld + i % m]) != 2.f) atomicAdd(bad, 1);
}

static void launch_fill_a(const Dt& d, void* a, long k, long ld, long cols) {
  if (d.size == 2 && d.t == CUDA_R_16BF) fill_a<<<1024, 256>>>((__nv_bfloat16*)a, k, ld, cols);
  else if (d.size == 2) fill_a<<<1024, 256>>>((__half*)a, k, ld, cols);
  else fill_a<<<1024, 256>>>((float*)a, k, ld, cols);
}
static void launch_fill(const Dt& d, void* a, long n, float v) {
  if (d.t == CUDA_R_16BF) fill<<<1024, 256>>>((__nv_bfloat16*)a, n, v);
  else if (d.size == 2) fill<<<1024, 256>>>((__half*)a, n, v);
  else fill<<<1024, 256>>>((float*)a, n, v);
}
static int bad_of(const Dt& d, void* c, long m, long n, long ld) {
  CK(cudaMemset(d_bad, 0, 4));
  if (d.t == CUDA_R_16BF) count_bad<<<256, 256>>>((__nv_bfloat16*)c, m, n, ld, d_bad);
  else if (d.size == 2) count_bad<<<256, 256>>>((__half*)c, m, n, ld, d_bad);
  else count_bad<<<256, 256>>>((float*)c, m, n, ld, d_bad);
  int h; CK(cudaMemcpy(&h, d_bad, 4, cudaMemcpyDeviceToHost)); return h;
}

struct Gemm {   // column-major: C (m x n) = op(A) (m x k) op(B) (k x n); B is always op N here
  const Dt* d; cublasOperation_t opa; long m, n, k, lda, ldb, ldc; const char* a; const char* b; char* c;
  const char* a_at(long k0) const { return a + (opa == CUBLAS_OP_N ? k0 * lda : k0) * d->size; }
  const char* b_at(long k0) const { return b + k0 * d->size; }
};

static cublasStatus_t gemmex(const Gemm& g, long k0, long kn, float beta, bool with_ws) {
  float one = 1;
  if (with_ws) CK(cublasSetWorkspace(blas, ws, WS)); else CK(cublasSetWorkspace(blas, nullptr, 0));
  return cublasGemmEx(blas, g.opa, CUBLAS_OP_N, g.m, g.n, kn, &one, g.a_at(k0), g.d->t, g.lda, g.b_at(k0), g.d->t,
                      g.ldb, &beta, g.c, g.d->t, g.ldc, g.d->c, CUBLAS_GEMM_DEFAULT);
}
static void guarded_gemmex(const Gemm& g) {
  long head = g.k - g.k % 256;
  if (head == 0 || head == g.k) { CK(gemmex(g, 0, g.k, 0, true)); return; }
  CK(gemmex(g, 0, head, 0, true));
  CK(gemmex(g, head, g.k - head, 1, false));
}

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr; cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo; size_t wsz = 0; bool ok = false;
  int algo_id = -1, splitk = 0, stages = 0, tile = 0, scheme = 0;
  void make(const Gemm& g, long kn, size_t ws_limit) {
    cublasOperation_t opb = CUBLAS_OP_N;
    CK(cublasLtMatmulDescCreate(&desc, g.d->c, CUDA_R_32F));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &g.opa, sizeof g.opa));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (g.opa == CUBLAS_OP_N) CK(cublasLtMatrixLayoutCreate(&la, g.d->t, g.m, kn, g.lda));
    else CK(cublasLtMatrixLayoutCreate(&la, g.d->t, kn, g.m, g.lda));
    CK(cublasLtMatrixLayoutCreate(&lb, g.d->t, kn, g.n, g.ldb));
    CK(cublasLtMatrixLayoutCreate(&lc, g.d->t, g.m, g.n, g.ldc));
    cublasLtMatmulPreference_t p; CK(cublasLtMatmulPreferenceCreate(&p));
    CK(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_limit, sizeof ws_limit));
    cublasLtMatmulHeuristicResult_t r; int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, p, 1, &r, &found) == CUBLAS_STATUS_SUCCESS && found) {
      ok = true; algo = r.algo; wsz = r.workspaceSize; size_t n;
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &algo_id, 4, &n);
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, 4, &n);
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, 4, &n);
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, 4, &n);
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, 4, &n);
    }
    cublasLtMatmulPreferenceDestroy(p);
  }
  cublasStatus_t run(const Gemm& g, long k0, float beta) {
    float one = 1;
    return cublasLtMatmul(lt, desc, &one, g.a_at(k0), la, g.b_at(k0), lb, &beta, g.c, lc, g.c, lc, &algo, ws, WS, 0);
  }
  ~LtPlan() { if (desc) { cublasLtMatmulDescDestroy(desc); cublasLtMatrixLayoutDestroy(la);
                          cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(lc); } }
};

template <class F> static float graph_us(F f, int reps = 20) {   // GPU time per call, median of 7 graph launches
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cublasSetStream(blas, s));
  f(); CK(cudaStreamSynchronize(s));
  cudaGraph_t gr; cudaGraphExec_t ex;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < reps; ++i) f();
  CK(cudaStreamEndCapture(s, &gr)); CK(cudaGraphInstantiate(&ex, gr, 0));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1); std::vector<float> t;
  for (int i = 0; i < 9; ++i) {
    cudaEventRecord(e0, s); CK(cudaGraphLaunch(ex, s)); cudaEventRecord(e1, s); CK(cudaEventSynchronize(e1));
    float x; cudaEventElapsedTime(&x, e0, e1); if (i >= 2) t.push_back(x * 1000 / reps);
  }
  std::sort(t.begin(), t.end());
  cudaGraphExecDestroy(ex); cudaGraphDestroy(gr); cudaEventDestroy(e0); cudaEventDestroy(e1);
  CK(cublasSetStream(blas, 0)); cudaStreamDestroy(s);
  return t[t.size() / 2];
}

// LtPlan::run with the stream of a capture: cublasLtMatmul takes it per call.
static cudaStream_t cur_stream() { cudaStream_t s; cublasGetStream(blas, &s); return s; }

int main(int argc, char** argv) {
  bool quick = argc > 1 && !strcmp(argv[1], "quick");
  CK(cublasCreate(&blas)); CK(cublasLtCreate(&lt));
  CK(cudaMalloc(&ws, WS)); CK(cudaMalloc(&d_bad, 4));
  int ver = 0; cublasGetVersion(blas, &ver);
  printf("cuBLAS %d, cuBLASLt %zu\n", ver, cublasLtGetVersion());
  const long MAXK = 65536 + 64, MAXM = 512, MAXN = 1024, PAD = 8;
  void *A, *B, *C;
  CK(cudaMalloc(&A, MAXM * (MAXK + PAD) * 4)); CK(cudaMalloc(&B, (MAXN + PAD) * (MAXK + PAD) * 4));
  CK(cudaMalloc(&C, (MAXN + PAD) * MAXM * 4));
  std::vector<long> qs = {128, 192, 256, 384, 512, 640, 768, 1000};
  std::vector<long> ts = {1, 2, 4, 7, 8, 16, 24, 33, 40, 0};
  std::vector<long> Ms = {1, 8, 16, 32, 64, 128, 256, 512};
  std::vector<long> Ns = {64, 128, 256, 512, 1024};
  if (quick) { qs = {384, 512}; ts = {8, 0}; Ms = {16, 64, 256}; Ns = {256, 1024}; }
  struct Bad { const Dt* d; int layout, pad; long M, N, K; };
  std::vector<Bad> wrong_e;
  for (const Dt& d : DTS) for (int layout = 0; layout < 2; ++layout) for (int pad = 0; pad < 2; ++pad) {
    if (layout == 1 && pad == 1) continue;
    long shapes = 0, e_bad = 0, z_bad = 0, l_bad = 0, g_bad = 0, l_split_tail = 0, rule = 0, rule_hit = 0,
         e_bad_l_flag = 0, e_ok_l_flag = 0, l_bad_unflagged = 0;
    launch_fill(d, B, (MAXN + PAD) * (MAXK + PAD), 1.f);
    for (long q : qs) for (long t : ts) {
      long K = 64 * q + t;
      for (long M : Ms) {
        // second operand: the row-major A (M x K) read as K x M, ld K (+ pad)
        long ldb = K + (pad ? 1 : 0);
        launch_fill_a(d, A, K, ldb, M);
        for (long N : Ns) {
          // NN: B (K x N row-major) is N x K column-major, ld N; TN (x @ w.T): w (N x K) is K x N, op T, ld K
          Gemm g{&d, layout ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, layout ? K : N + (pad ? 1 : 0), ldb, N,
                 (const char*)B, (const char*)A, (char*)C};
          ++shapes;
          CK(gemmex(g, 0, K, 0, true)); int eb = bad_of(d, C, N, M, N);
          CK(gemmex(g, 0, K, 0, false)); int zb = bad_of(d, C, N, M, N);
          guarded_gemmex(g); int gb = bad_of(d, C, N, M, N);
          LtPlan p; p.make(g, K, WS); int lb = 0; bool flag = false;
          if (p.ok) { CK(p.run(g, 0, 0)); lb = bad_of(d, C, N, M, N);
                      flag = p.splitk > 1 && K % 256 != 0;
                      bool r = p.splitk > 1 && t != 0 && (K / 64) % p.splitk == 0 && p.splitk > t;
                      rule += r; rule_hit += r && lb; l_bad_unflagged += lb && !flag; }
          e_bad += eb > 0; z_bad += zb > 0; g_bad += gb > 0; l_bad += lb > 0; l_split_tail += flag;
          e_bad_l_flag += eb && flag; e_ok_l_flag += !eb && flag;
          if (eb) wrong_e.push_back({&d, layout, pad, M, N, K});
          if (eb || lb || gb || zb)
            printf("  wrong %s %s%s M=%ld N=%ld K=%ld (K%%64=%ld): E %d Z %d G %d L %d [lt algo %d splitk %d stages %d tile %d scheme %d]\n",
                   d.name, layout ? "TN" : "NN", pad ? " ld+1" : "", M, N, K, K % 64, eb, zb, gb, lb, p.algo_id,
                   p.splitk, p.stages, p.tile, p.scheme);
        }
      }
    }
    printf("%s %s%s: %ld shapes; wrong: GemmEx %ld, GemmEx no ws %ld, guarded %ld, Lt first %ld; Lt splits a K "
           "not a multiple of 256 on %ld (of them GemmEx wrong %ld, right %ld); Lt wrong but unflagged %ld; "
           "rule (q%%s==0, s>t) %ld, of which Lt wrong %ld\n",
           d.name, layout ? "TN" : "NN", pad ? " ld+1" : "", shapes, e_bad, z_bad, g_bad, l_bad, l_split_tail,
           e_bad_l_flag, e_ok_l_flag, l_bad_unflagged, rule, rule_hit);
    fflush(stdout);
  }
  // Costs: on the shapes GemmEx got wrong (up to 24) and a few deep-K shapes it got right.
  std::vector<Bad> timed(wrong_e.begin(), wrong_e.begin() + std::min<size_t>(wrong_e.size(), 24));
  for (long M : {1L, 16L, 64L, 256L}) for (long N : {256L, 1024L}) timed.push_back({&DTS[0], 0, 0, M, N, 32776});
  timed.push_back({&DTS[0], 0, 0, 64, 4096, 8200}); timed.push_back({&DTS[0], 1, 0, 4096, 4096, 4100});
  printf("\ntimes (us per call, GPU, graph of 20): E GemmEx | Z no ws | G guarded | L Lt first | LG Lt guarded\n");
  for (const Bad& b : timed) {
    const Dt& d = *b.d;
    long K = b.K, ldb = K + (b.pad ? 1 : 0);
    void *Ab = A, *Bb = B, *Cb = C;
    if (b.M > MAXM || b.N > MAXN) { CK(cudaMalloc(&Ab, b.M * (ldb) * 4)); CK(cudaMalloc(&Bb, b.N * (K + 8) * 4));
                                    CK(cudaMalloc(&Cb, b.N * b.M * 4)); }
    launch_fill(d, Bb, (b.N + 8) * (K + 8), 1.f); launch_fill_a(d, Ab, K, ldb, b.M);
    Gemm g{&d, b.layout ? CUBLAS_OP_T : CUBLAS_OP_N, b.N, b.M, K, b.layout ? K : b.N + (b.pad ? 1 : 0), ldb, b.N,
           (const char*)Bb, (const char*)Ab, (char*)Cb};
    float e = graph_us([&] { CK(gemmex(g, 0, K, 0, true)); });
    float z = graph_us([&] { CK(gemmex(g, 0, K, 0, false)); });
    float gg = graph_us([&] { guarded_gemmex(g); });
    int gb = bad_of(d, Cb, b.N, b.M, b.N);
    LtPlan p; p.make(g, K, WS);
    long head = K - K % 256;
    LtPlan ph, pt; ph.make(g, head, WS); pt.make(g, K - head, 0);
    float l = -1, lg = -1; int lgb = -1;
    if (p.ok) l = graph_us([&] { float one = 1, zero = 0; CK(cublasLtMatmul(lt, p.desc, &one, g.a, p.la, g.b, p.lb, &zero, g.c, p.lc,
                                                            g.c, p.lc, &p.algo, ws, WS, cur_stream())); });
    if (ph.ok && pt.ok && head > 0) {
      auto f = [&] { float one = 1, zero = 0;
        CK(cublasLtMatmul(lt, ph.desc, &one, g.a, ph.la, g.b, ph.lb, &zero, g.c, ph.lc, g.c, ph.lc, &ph.algo, ws, WS, cur_stream()));
        CK(cublasLtMatmul(lt, pt.desc, &one, g.a_at(head), pt.la, g.b_at(head), pt.lb, &one, g.c, pt.lc, g.c, pt.lc,
                          &pt.algo, nullptr, 0, cur_stream())); };
      lg = graph_us(f); lgb = bad_of(d, Cb, b.N, b.M, b.N);
    }
    printf("  %s %s%s M=%ld N=%ld K=%ld: E %.2f Z %.2f (%.2fx) G %.2f (%.3fx, wrong %d) | L %.2f [splitk %d] LG %.2f "
           "(%.3fx of L, wrong %d) [head splitk %d, tail splitk %d]\n",
           d.name, b.layout ? "TN" : "NN", b.pad ? " ld+1" : "", b.M, b.N, K, e, z, z / e, gg, gg / e, gb, l,
           p.splitk, lg, lg / l, lgb, ph.splitk, pt.splitk);
    if (Ab != A) { cudaFree(Ab); cudaFree(Bb); cudaFree(Cb); }
  }
  CK(cudaDeviceSynchronize());
  printf("done\n");
  return 0;
}
