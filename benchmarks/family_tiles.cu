// Every split-free configuration of a batch-invariant family, enumerated rather than taken from
// the heuristic's list: for one problem (x (M, K) @ w.T, w (N, K)) in bf16 and TF32, the family
// is the algorithm of the first split-free kernel at M = 4096. Each configuration of that
// algorithm (tile x stages x custom option x cluster shape x swizzle, SPLITK_NUM 1) that
// cublasLtMatmulAlgoCheck accepts at M is run: whether its rows are bitwise those of the
// reference kernel at M = 4096 ("same"), and its time (CUDA events, median of 15), against the
// fastest of the heuristic's first 8 kernels at that M (what determinism="off" can reach).
// Measures cuBLASLt's behaviour for cygemm.engine.families; it is not part of the benchmark suite.
//   nvcc -std=c++17 -O2 benchmarks/family_tiles.cu -o family_tiles -lcublasLt && ./family_tiles
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <chrono>
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
static int cfg(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t at) {
  int32_t v = 0; size_t n; cublasLtMatmulAlgoConfigGetAttribute(&a, at, &v, at >= CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID ? 2 : 4, &n); return v; }
template <class T> static void set(cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t at, T v) {
  cublasLtMatmulAlgoConfigSetAttribute(&a, at, &v, sizeof v); }

static bool run(Prob& p, const cublasLtMatmulAlgo_t* algo, const void* A, const void* B, void* C, float* ms, int reps) {
  float one = 1, zero = 0; cublasLtMatmulHeuristicResult_t r;
  if (cublasLtMatmulAlgoCheck(lt, p.d, p.a, p.b, p.c, p.c, algo, &r) != CUBLAS_STATUS_SUCCESS || r.workspaceSize > WS) return false;
  if (cublasLtMatmul(lt, p.d, &one, A, p.a, B, p.b, &zero, C, p.c, C, p.c, algo, ws, WS, 0) != CUBLAS_STATUS_SUCCESS) return false;
  if (ms) {
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1); std::vector<float> t;
    for (int i = 0; i < 3; ++i) cublasLtMatmul(lt, p.d, &one, A, p.a, B, p.b, &zero, C, p.c, C, p.c, algo, ws, WS, 0);
    for (int i = 0; i < reps; ++i) { cudaEventRecord(e0); cublasLtMatmul(lt, p.d, &one, A, p.a, B, p.b, &zero, C, p.c, C, p.c, algo, ws, WS, 0); cudaEventRecord(e1); cudaEventSynchronize(e1); float x; cudaEventElapsedTime(&x, e0, e1); t.push_back(x); }
    std::sort(t.begin(), t.end()); *ms = t[t.size() / 2];
    cudaEventDestroy(e0); cudaEventDestroy(e1);
  }
  return cudaDeviceSynchronize() == cudaSuccess;
}

struct Found { float ms; bool same; int tile, stages, custom, cluster, swz; };

int main(int argc, char** argv) {
  // argv[1]: which of the four problems (digits 0-3, default all); argv[2..]: the Ms (default 1 16 128 1024)
  const char* which = argc > 1 ? argv[1] : "0123";
  std::vector<int> Ms; for (int i = 2; i < argc; ++i) Ms.push_back(atoi(argv[i]));
  if (Ms.empty()) Ms = {1, 16, 128, 1024};
  CK(cublasLtCreate(&lt)); CK(cudaMalloc(&ws, WS));
  struct Kind { const char* name; cudaDataType t; cublasComputeType_t ct; size_t sz; int NK; } kinds[] = {
    {"bf16", CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2, 4096}, {"tf32", CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 4, 4096},
    {"bf16", CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2, 8192}, {"tf32", CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 4, 8192}};
  for (int ki = 0; ki < 4; ++ki) {
    auto& kd = kinds[ki];
    if (!strchr(which, '0' + ki)) continue;
    int N = kd.NK, K = kd.NK, MR = 4096;
    size_t nA = (size_t)K * N, nB = (size_t)K * MR, nC = (size_t)N * MR;
    void *A, *B, *C, *Cr; CK(cudaMalloc(&A, nA * kd.sz)); CK(cudaMalloc(&B, nB * kd.sz)); CK(cudaMalloc(&C, nC * kd.sz)); CK(cudaMalloc(&Cr, nC * kd.sz));
    std::vector<unsigned char> h(std::max(nA, nB) * kd.sz); srand(1);
    for (void* dst : {A, B}) {
      size_t n = dst == A ? nA : nB;
      for (size_t i = 0; i < n; ++i) { float v = (rand() / (float)RAND_MAX) * 2 - 1; if (kd.sz == 2) ((__nv_bfloat16*)h.data())[i] = __float2bfloat16(v); else ((float*)h.data())[i] = v; }
      CK(cudaMemcpy(dst, h.data(), n * kd.sz, cudaMemcpyHostToDevice));
    }
    Prob ref = make(kd.t, kd.ct, MR, N, K); cublasLtMatmulHeuristicResult_t res[32]; int found = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(lt, ref.d, ref.a, ref.b, ref.c, ref.c, ref.p, 32, res, &found));
    int ri = -1; for (int i = 0; i < found; ++i) if (cfg(res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) == 1) { ri = i; break; }
    cublasLtMatmulAlgo_t fam = res[ri].algo;
    if (!run(ref, &fam, A, B, Cr, nullptr, 0)) { printf("reference refused\n"); return 1; }
    drop(ref);
    std::vector<unsigned char> hr(nC * kd.sz), hc(nC * kd.sz);
    CK(cudaMemcpy(hr.data(), Cr, hr.size(), cudaMemcpyDeviceToHost));
    uint32_t tiles[1024], stages[256]; size_t wr = 0; int nt = 0, ns = 0, cmax = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&fam, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, sizeof tiles, &wr) == 0) nt = wr / 4;
    if (cublasLtMatmulAlgoCapGetAttribute(&fam, CUBLASLT_ALGO_CAP_STAGES_IDS, stages, sizeof stages, &wr) == 0) ns = wr / 4;
    cublasLtMatmulAlgoCapGetAttribute(&fam, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &cmax, sizeof cmax, &wr);
    printf("== %s N=K=%d: family algo %d (ref tile %d stages %d custom %d cluster %d swz %d); caps: %d tiles, %d stages, custom 0..%d\n",
           kd.name, N, cfg(fam, CUBLASLT_ALGO_CONFIG_ID), cfg(fam, CUBLASLT_ALGO_CONFIG_TILE_ID), cfg(fam, CUBLASLT_ALGO_CONFIG_STAGES_ID),
           cfg(fam, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION), cfg(fam, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), cfg(fam, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING), nt, ns, cmax);
    // No tile list (the algorithm does not publish one): every tile id is tried.
    bool scan = nt == 0;
    if (scan) { for (int t = 1; t < CUBLASLT_MATMUL_TILE_END && t < 1024; ++t) tiles[nt++] = t; }
    if (ns == 0) { stages[0] = cfg(fam, CUBLASLT_ALGO_CONFIG_STAGES_ID); ns = 1; }
    const uint16_t clusters[] = {0, 2, 3, 5, 6};
    if (scan) cmax = std::min(cmax, 7);
    for (int M : Ms) {
      Prob p = make(kd.t, kd.ct, M, N, K); int f = 0; float best = 1e9; int bi = -1;
      CK(cublasLtMatmulAlgoGetHeuristic(lt, p.d, p.a, p.b, p.c, p.c, p.p, 8, res, &f));
      for (int i = 0; i < f; ++i) { float ms; if (run(p, &res[i].algo, A, B, C, &ms, 15) && ms < best) { best = ms; bi = i; } }
      printf("M=%d off (fastest of heuristic's %d): %.4f ms algo %d split %d tile %d\n", M, f, best, cfg(res[bi].algo, CUBLASLT_ALGO_CONFIG_ID),
             cfg(res[bi].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), cfg(res[bi].algo, CUBLASLT_ALGO_CONFIG_TILE_ID));
      std::vector<Found> ok; int tried = 0, accepted = 0, nsame = 0;
      cudaEvent_t h0, h1; cudaEventCreate(&h0); cudaEventCreate(&h1); double check_us = 0;
      for (int ti = 0; ti < nt; ++ti) for (int si = 0; si < ns; ++si) for (int c = 0; c <= cmax; ++c) for (uint16_t cl : clusters) for (uint32_t sw = 0; sw < 2; ++sw) {
        cublasLtMatmulAlgo_t a = fam; ++tried;
        set<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID, tiles[ti]); set<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, stages[si]);
        set<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, c); set<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cl);
        set<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, sw); set<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 1);
        set<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, 0);
        cublasLtMatmulHeuristicResult_t r;
        auto c0 = std::chrono::steady_clock::now();
        bool acc = cublasLtMatmulAlgoCheck(lt, p.d, p.a, p.b, p.c, p.c, &a, &r) == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= WS;
        check_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count();
        if (!acc) continue;
        ++accepted; float ms;
        if (!run(p, &a, A, B, C, &ms, 7)) continue;
        size_t bytes = (size_t)N * M * kd.sz; CK(cudaMemcpy(hc.data(), C, bytes, cudaMemcpyDeviceToHost));
        bool same = memcmp(hc.data(), hr.data(), bytes) == 0; nsame += same;
        ok.push_back({ms, same, (int)tiles[ti], (int)stages[si], c, cl, (int)sw});
      }
      std::sort(ok.begin(), ok.end(), [](const Found& x, const Found& y) { return x.ms < y.ms; });
      printf("  tried %d, accepted %d, ran %zu, same %d; checks took %.1f ms\n", tried, accepted, ok.size(), nsame, check_us / 1e3);
      for (size_t i = 0; i < ok.size() && i < 6; ++i)
        printf("  %.4f ms (%.2fx off) %s tile %d stages %d custom %d cluster %d swz %d\n", ok[i].ms, ok[i].ms / best, ok[i].same ? "same" : "DIFF",
               ok[i].tile, ok[i].stages, ok[i].custom, ok[i].cluster, ok[i].swz);
      std::vector<int> seen;          // each tile's fastest configuration
      printf("  by tile:");
      for (auto& o : ok) if (std::find(seen.begin(), seen.end(), o.tile) == seen.end()) { seen.push_back(o.tile); printf(" %d:%.4f(c%d,cl%d)", o.tile, o.ms, o.custom, o.cluster); }
      printf("\n");
      for (auto& o : ok) if (!o.same) { printf("  first DIFF: %.4f ms tile %d stages %d custom %d cluster %d\n", o.ms, o.tile, o.stages, o.custom, o.cluster); break; }
      drop(p);
    }
    cudaFree(A); cudaFree(B); cudaFree(C); cudaFree(Cr);
  }
  return 0;
}
