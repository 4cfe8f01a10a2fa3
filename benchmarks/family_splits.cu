// What a batch-invariant GEMM can run: for one problem (x (M, 4096) @ w.T, w (4096, 4096), bf16
// and TF32), over M in {1, 16, 128, 1024, 4096}:
//  - the heuristic's first kernel and the kernels of the reference family (the algorithm of the
//    first split-free kernel at M = 4096) it offers at each M, with their split of K;
//  - each split kernel offered at M = 1, 16 or 128, run at every M: whether its rows are bitwise
//    those of M = 4096 ("same"), and its time (CUDA events, median of 20);
//  - the reference kernel itself with a split of K forced (2..16, each reduction scheme).
// Measures cuBLASLt's behaviour for cygemm._families; it is not part of the benchmark suite.
//   nvcc -std=c++17 -O2 benchmarks/family_splits.cu -o family_splits -lcublasLt && ./family_splits
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#define CK(x) do { auto e_ = (x); if ((int)e_ != 0) { printf("ERR %s = %d at %d\n", #x, (int)e_, __LINE__); exit(1);} } while (0)

static cublasLtHandle_t lt;
static void* ws; static const size_t WS = 32u << 20;
struct Prob { cublasLtMatmulDesc_t d; cublasLtMatrixLayout_t a, b, c; cublasLtMatmulPreference_t p; };

static Prob make(cudaDataType t, cublasComputeType_t ct, int M, int N, int K) {
  Prob p; cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CK(cublasLtMatmulDescCreate(&p.d, ct, CUDA_R_32F));
  CK(cublasLtMatmulDescSetAttribute(p.d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CK(cublasLtMatmulDescSetAttribute(p.d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  CK(cublasLtMatrixLayoutCreate(&p.a, t, K, N, K));
  CK(cublasLtMatrixLayoutCreate(&p.b, t, K, M, K));
  CK(cublasLtMatrixLayoutCreate(&p.c, t, N, M, N));
  CK(cublasLtMatmulPreferenceCreate(&p.p));
  size_t w = WS; CK(cublasLtMatmulPreferenceSetAttribute(p.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &w, sizeof w));
  return p;
}
static void drop(Prob& p) { cublasLtMatmulDescDestroy(p.d); cublasLtMatrixLayoutDestroy(p.a); cublasLtMatrixLayoutDestroy(p.b); cublasLtMatrixLayoutDestroy(p.c); cublasLtMatmulPreferenceDestroy(p.p); }
static int cfg(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t at) { int32_t v = -9; size_t n; cublasLtMatmulAlgoConfigGetAttribute(&a, at, &v, sizeof v, &n); return v; }

static bool run(Prob& p, cublasLtMatmulAlgo_t* algo, const void* A, const void* B, void* C, float* ms, int reps) {
  float one = 1, zero = 0; cublasLtMatmulHeuristicResult_t r;
  if (cublasLtMatmulAlgoCheck(lt, p.d, p.a, p.b, p.c, p.c, algo, &r) != CUBLAS_STATUS_SUCCESS || r.workspaceSize > WS) return false;
  if (cublasLtMatmul(lt, p.d, &one, A, p.a, B, p.b, &zero, C, p.c, C, p.c, algo, ws, WS, 0) != CUBLAS_STATUS_SUCCESS) return false;
  if (ms) {
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1); std::vector<float> t;
    for (int i = 0; i < 3; ++i) cublasLtMatmul(lt, p.d, &one, A, p.a, B, p.b, &zero, C, p.c, C, p.c, algo, ws, WS, 0);
    for (int i = 0; i < reps; ++i) { cudaEventRecord(e0); cublasLtMatmul(lt, p.d, &one, A, p.a, B, p.b, &zero, C, p.c, C, p.c, algo, ws, WS, 0); cudaEventRecord(e1); cudaEventSynchronize(e1); float x; cudaEventElapsedTime(&x, e0, e1); t.push_back(x); }
    std::sort(t.begin(), t.end()); *ms = t[t.size() / 2];
  }
  CK(cudaDeviceSynchronize());
  return true;
}

// Run `algo` at M = 4096 (into Cr), then at every M of MS: time, and whether the rows are those of
// M = 4096. Prints after `label`; "refused" where cuBLASLt does not take it.
static void sweep(const char* label, cublasLtMatmulAlgo_t algo, cudaDataType t, cublasComputeType_t ct, size_t sz,
                  int N, int K, const int* Ms, int nM, const void* A, const void* B, void* C, void* Cr) {
  printf("%s:", label);
  Prob big = make(t, ct, 4096, N, K);
  bool ok = run(big, &algo, A, B, Cr, nullptr, 0);
  drop(big);
  if (!ok) { printf(" refused at M=4096\n"); return; }
  std::vector<unsigned char> hr((size_t)N * 4096 * sz), hc((size_t)N * 4096 * sz);
  CK(cudaMemcpy(hr.data(), Cr, hr.size(), cudaMemcpyDeviceToHost));
  for (int j = 0; j < nM; ++j) {
    int M = Ms[j]; Prob p = make(t, ct, M, N, K); float ms;
    if (!run(p, &algo, A, B, C, &ms, 20)) { printf("  M=%d refused", M); drop(p); continue; }
    size_t bytes = (size_t)N * M * sz; CK(cudaMemcpy(hc.data(), C, bytes, cudaMemcpyDeviceToHost));
    printf("  M=%d %.4f ms %s", M, ms, memcmp(hc.data(), hr.data(), bytes) == 0 ? "same" : "DIFF");
    drop(p);
  }
  printf("\n");
}

int main() {
  CK(cublasLtCreate(&lt)); CK(cudaMalloc(&ws, WS));
  const int K = 4096, N = 4096, MS[] = {1, 16, 128, 1024, 4096};
  struct Kind { const char* name; cudaDataType t; cublasComputeType_t ct; size_t sz; } kinds[] = {
    {"bf16", CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2}, {"tf32", CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 4}};
  for (auto& kd : kinds) {
    size_t nA = (size_t)K * N, nB = (size_t)K * 4096, nC = (size_t)N * 4096;
    void *A, *B, *C, *Cr; CK(cudaMalloc(&A, nA * kd.sz)); CK(cudaMalloc(&B, nB * kd.sz)); CK(cudaMalloc(&C, nC * kd.sz)); CK(cudaMalloc(&Cr, nC * kd.sz));
    std::vector<unsigned char> h(std::max(nA, nB) * kd.sz); srand(1);
    for (size_t i = 0; i < nA; ++i) { float v = (rand() / (float)RAND_MAX) * 2 - 1; if (kd.sz == 2) ((__nv_bfloat16*)h.data())[i] = __float2bfloat16(v); else ((float*)h.data())[i] = v; }
    CK(cudaMemcpy(A, h.data(), nA * kd.sz, cudaMemcpyHostToDevice));
    for (size_t i = 0; i < nB; ++i) { float v = (rand() / (float)RAND_MAX) * 2 - 1; if (kd.sz == 2) ((__nv_bfloat16*)h.data())[i] = __float2bfloat16(v); else ((float*)h.data())[i] = v; }
    CK(cudaMemcpy(B, h.data(), nB * kd.sz, cudaMemcpyHostToDevice));
    // Reference family: the first split-free candidate at M = 4096.
    Prob ref = make(kd.t, kd.ct, 4096, N, K); cublasLtMatmulHeuristicResult_t res[32]; int found = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(lt, ref.d, ref.a, ref.b, ref.c, ref.c, ref.p, 32, res, &found));
    int ri = -1; for (int i = 0; i < found; ++i) if (cfg(res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) == 1) { ri = i; break; }
    cublasLtMatmulAlgo_t fam = res[ri].algo; int famid = cfg(fam, CUBLASLT_ALGO_CONFIG_ID);
    printf("== %s: reference algo %d tile %d stages %d\n", kd.name, famid, cfg(fam, CUBLASLT_ALGO_CONFIG_TILE_ID), cfg(fam, CUBLASLT_ALGO_CONFIG_STAGES_ID));
    // Per M: heuristic's first (and its split), and for small-tile family members found at M=16 / 64.
    for (int M : MS) {
      Prob p = make(kd.t, kd.ct, M, N, K); int f = 0;
      CK(cublasLtMatmulAlgoGetHeuristic(lt, p.d, p.a, p.b, p.c, p.c, p.p, 32, res, &f));
      float ms0; run(p, &res[0].algo, A, B, C, &ms0, 20);
      printf("M=%5d first: algo %d split %d red %d tile %d  %.4f ms\n", M, cfg(res[0].algo, CUBLASLT_ALGO_CONFIG_ID), cfg(res[0].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), cfg(res[0].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), cfg(res[0].algo, CUBLASLT_ALGO_CONFIG_TILE_ID), ms0);
      for (int i = 0; i < f; ++i) if (cfg(res[i].algo, CUBLASLT_ALGO_CONFIG_ID) == famid) printf("   family member %d: split %d red %d tile %d\n", i, cfg(res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), cfg(res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), cfg(res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID));
      drop(p);
    }
    // Split kernels offered at M = 1, 16 and 128, each run at every M: invariance and time.
    for (int M0 : {1, 16, 128}) {
      Prob p0 = make(kd.t, kd.ct, M0, N, K); int f0 = 0; cublasLtMatmulHeuristicResult_t r0[32];
      CK(cublasLtMatmulAlgoGetHeuristic(lt, p0.d, p0.a, p0.b, p0.c, p0.c, p0.p, 32, r0, &f0)); drop(p0);
      for (int i = 0; i < f0; ++i) {
        int sp = cfg(r0[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
        if (sp == 1) continue;
        char label[128];
        snprintf(label, sizeof label, "from M=%d #%d algo %d split %d red %d tile %d", M0, i,
                 cfg(r0[i].algo, CUBLASLT_ALGO_CONFIG_ID), sp, cfg(r0[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                 cfg(r0[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID));
        sweep(label, r0[i].algo, kd.t, kd.ct, kd.sz, N, K, MS, 5, A, B, C, Cr);
      }
    }
    // The reference kernel with a split of K forced.
    const int splits[] = {1, 2, 4, 8, 16};
    const uint32_t schemes[] = {1, 2, 4};
    for (int S : splits) for (uint32_t sch : schemes) {
      if (S == 1 && sch != 1) continue;
      cublasLtMatmulAlgo_t a = fam; int32_t s32 = S; uint32_t rs = S == 1 ? 0 : sch;
      cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &s32, sizeof s32);
      cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &rs, sizeof rs);
      char label[64];
      snprintf(label, sizeof label, "reference with split %d scheme %u", S, rs);
      sweep(label, a, kd.t, kd.ct, kd.sz, N, K, MS, 5, A, B, C, Cr);
    }
    drop(ref); cudaFree(A); cudaFree(B); cudaFree(C); cudaFree(Cr);
  }
  return 0;
}
