# cuBLASLt (cublasLt.h) as cygemm uses it: matmul descriptors, layouts,
# preferences, heuristics, algorithm configs, the epilogues of a dense layer and FP8's scale
# attributes; at the end, what 13.10 added after 13.1 (grouped matmul, batch invariance).
# Every function is nogil and returns cublasStatus_t.
from libc.stdint cimport uint64_t
from cygemm.bindings.cudart cimport cudaStream_t, cudaDataType
from cygemm.bindings.cublas cimport cublasStatus_t, cublasComputeType_t

cdef extern from "cublasLt.h" nogil:
    ctypedef void* cublasLtHandle_t 'cublasLtHandle_t'
    ctypedef void* cublasLtMatmulDesc_t 'cublasLtMatmulDesc_t'
    ctypedef void* cublasLtMatrixLayout_t 'cublasLtMatrixLayout_t'
    ctypedef void* cublasLtMatmulPreference_t 'cublasLtMatmulPreference_t'

    ctypedef struct cublasLtMatmulAlgo_t:
        uint64_t data[8]

    ctypedef struct cublasLtMatmulHeuristicResult_t:
        cublasLtMatmulAlgo_t algo
        size_t workspaceSize
        cublasStatus_t state
        float wavesCount

    ctypedef enum cublasLtMatmulDescAttributes_t:
        CUBLASLT_MATMUL_DESC_COMPUTE_TYPE
        CUBLASLT_MATMUL_DESC_SCALE_TYPE
        CUBLASLT_MATMUL_DESC_TRANSA
        CUBLASLT_MATMUL_DESC_TRANSB
        CUBLASLT_MATMUL_DESC_POINTER_MODE   # (int32_t: a cublasLtPointerMode_t)
        CUBLASLT_MATMUL_DESC_EPILOGUE
        CUBLASLT_MATMUL_DESC_BIAS_POINTER
        CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE
        CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER
        CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD
        CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE
        CUBLASLT_MATMUL_DESC_A_SCALE_POINTER
        CUBLASLT_MATMUL_DESC_B_SCALE_POINTER
        CUBLASLT_MATMUL_DESC_D_SCALE_POINTER
        CUBLASLT_MATMUL_DESC_AMAX_D_POINTER
        CUBLASLT_MATMUL_DESC_FAST_ACCUM
        CUBLASLT_MATMUL_DESC_A_SCALE_MODE   # (int32_t: a cublasLtMatmulMatrixScale_t)
        CUBLASLT_MATMUL_DESC_B_SCALE_MODE

    ctypedef enum cublasLtMatrixLayoutAttribute_t:
        CUBLASLT_MATRIX_LAYOUT_TYPE
        CUBLASLT_MATRIX_LAYOUT_ORDER
        CUBLASLT_MATRIX_LAYOUT_ROWS
        CUBLASLT_MATRIX_LAYOUT_COLS
        CUBLASLT_MATRIX_LAYOUT_LD
        CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT
        CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET
        CUBLASLT_MATRIX_LAYOUT_BATCH_MODE   # (uint32_t: a cublasLtBatchMode_t, below)

    ctypedef enum cublasLtPointerMode_t:
        CUBLASLT_POINTER_MODE_HOST
        CUBLASLT_POINTER_MODE_DEVICE

    ctypedef enum cublasLtMatmulPreferenceAttributes_t:
        CUBLASLT_MATMUL_PREF_SEARCH_MODE
        CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES

    ctypedef enum cublasLtEpilogue_t:
        CUBLASLT_EPILOGUE_DEFAULT
        CUBLASLT_EPILOGUE_RELU
        CUBLASLT_EPILOGUE_RELU_AUX
        CUBLASLT_EPILOGUE_BIAS
        CUBLASLT_EPILOGUE_RELU_BIAS
        CUBLASLT_EPILOGUE_RELU_AUX_BIAS
        CUBLASLT_EPILOGUE_DRELU
        CUBLASLT_EPILOGUE_DRELU_BGRAD
        CUBLASLT_EPILOGUE_GELU
        CUBLASLT_EPILOGUE_GELU_AUX
        CUBLASLT_EPILOGUE_GELU_BIAS
        CUBLASLT_EPILOGUE_GELU_AUX_BIAS
        CUBLASLT_EPILOGUE_DGELU
        CUBLASLT_EPILOGUE_DGELU_BGRAD
        CUBLASLT_EPILOGUE_BGRADA
        CUBLASLT_EPILOGUE_BGRADB

    cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle)
    cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle)
    size_t cublasLtGetVersion()

    cublasStatus_t cublasLtMatmulDescCreate(
        cublasLtMatmulDesc_t* desc, cublasComputeType_t computeType, cudaDataType scaleType)
    cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc)
    cublasStatus_t cublasLtMatmulDescSetAttribute(
        cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t size)

    cublasStatus_t cublasLtMatrixLayoutCreate(
        cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows, uint64_t cols, long long ld)
    cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout)
    cublasStatus_t cublasLtMatrixLayoutSetAttribute(
        cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const void* buf, size_t size)

    cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref)
    cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
    cublasStatus_t cublasLtMatmulPreferenceSetAttribute(
        cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
        const void* buf, size_t size)

    cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
        cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
        cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
        cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
        cublasLtMatmulPreference_t pref, int requestedAlgoCount,
        cublasLtMatmulHeuristicResult_t* results, int* returnAlgoCount)

    # What identifies a kernel family (see cygemm.engine.families): the algorithm and its split of K;
    # its other members differ in tile and custom option.
    ctypedef enum cublasLtMatmulAlgoConfigAttributes_t:
        CUBLASLT_ALGO_CONFIG_ID
        CUBLASLT_ALGO_CONFIG_TILE_ID
        CUBLASLT_ALGO_CONFIG_SPLITK_NUM
        CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION
        CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID   # (uint16_t)
    ctypedef enum cublasLtMatmulAlgoCapAttributes_t:
        CUBLASLT_ALGO_CAP_TILE_IDS
        CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX
    enum: CUBLASLT_MATMUL_TILE_END
    cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(
        const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
        size_t sizeInBytes, size_t* sizeWritten)
    cublasStatus_t cublasLtMatmulAlgoConfigSetAttribute(
        cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, const void* buf,
        size_t sizeInBytes)
    cublasStatus_t cublasLtMatmulAlgoCapGetAttribute(
        const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoCapAttributes_t attr, void* buf,
        size_t sizeInBytes, size_t* sizeWritten)
    cublasStatus_t cublasLtMatmulAlgoCheck(
        cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
        cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
        cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
        const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result)
    cublasStatus_t cublasLtMatmul(
        cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
        const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
        const void* B, cublasLtMatrixLayout_t Bdesc,
        const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc,
        void* D, cublasLtMatrixLayout_t Ddesc,
        const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspaceSizeInBytes,
        cudaStream_t stream)


# ---------------------------------------------------------------- added after cuBLAS 13.1
# What cublasLt.h 13.10 declares and 13.1's does not: the grouped matmul (sizes, leading
# dimensions and matrices read from device arrays), the batch-invariance attribute, and the
# heuristic and check that know the stream. cygemm builds against any 13.x header, so these are
# not taken from it: the values are 13.10's (the names drop "CUBLAS", so that a 13.10 header's
# own enumerators do not clash with them), and the functions are resolved from the loaded
# library when first used (cygemm.engine.lt_features), so that any 13.x library imports.
cdef enum:
    # cublasLtMatrixLayoutAttribute_t
    LT_GROUPED_MATRIX_LAYOUT_ROWS_ARRAY = 9
    LT_GROUPED_MATRIX_LAYOUT_COLS_ARRAY = 10
    LT_GROUPED_MATRIX_LAYOUT_LD_ARRAY = 11
    LT_GROUPED_MATRIX_LAYOUT_ROWS_COLS_ARRAY_INTEGER_WIDTH = 12   # int32_t: a cublasLtIntegerWidth_t
    LT_GROUPED_MATRIX_LAYOUT_LD_ARRAY_INTEGER_WIDTH = 13
    # cublasLtBatchMode_t
    LT_BATCH_MODE_STRIDED = 0
    LT_BATCH_MODE_POINTER_ARRAY = 1
    LT_BATCH_MODE_GROUPED = 2
    # cublasLtIntegerWidth_t (the default is 32)
    LT_INTEGER_WIDTH_32 = 0
    LT_INTEGER_WIDTH_64 = 1
    # cublasLtMatmulDescAttributes_t
    LT_MATMUL_DESC_ALPHA_BATCH_STRIDE = 39      # int64_t
    LT_MATMUL_DESC_BETA_BATCH_STRIDE = 40       # int64_t
    LT_MATMUL_DESC_BATCH_INVARIANCE_FLAGS = 41  # int32_t: a cublasLtMatmulBatchInvarianceFlags_t
    # cublasLtMatmulBatchInvarianceFlags_t
    LT_BATCH_INVARIANCE_DISABLED = 0x0
    LT_BATCH_INVARIANCE_ALIGN_2B = 0x1
    LT_BATCH_INVARIANCE_ALIGN_4B = 0x2
    LT_BATCH_INVARIANCE_ALIGN_8B = 0x3
    LT_BATCH_INVARIANCE_ALIGN_16B = 0x4
    LT_BATCH_INVARIANCE_AUTO = 0x8
    LT_BATCH_INVARIANCE_UNSET = 0x8000
    # cublasLtMatmulPreferenceAttributes_t: the grouped heuristic's hints. The header calls them
    # uint32_t; cuBLASLt 13.10 accepts them only as 8 bytes (tests/bindings: 4 bytes is refused).
    LT_MATMUL_PREF_GROUPED_AVERAGE_REDUCTION_DIM = 13
    LT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_ROWS = 14
    LT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_COLS = 15
    # cublasLtMatmulMatrixScale_t, beyond 13.1's
    LT_MATMUL_MATRIX_SCALE_PER_BATCH_SCALAR_32F = 6
    LT_MATMUL_MATRIX_SCALE_VEC128_MN_K4_UE8M0 = 12
    LT_MATMUL_MATRIX_SCALE_VEC32_MN_K4_UE8M0 = 13

# The functions, as pointers to what the loaded library exports (NULL where it does not).
ctypedef cublasStatus_t (*cublasLtGroupedMatrixLayoutCreate_fn)(
    cublasLtMatrixLayout_t* matLayout, cudaDataType type, int groupCount, const void* rows_array,
    const void* cols_array, const void* ld_array) noexcept nogil
ctypedef cublasStatus_t (*cublasLtMatmulAlgoGetHeuristicForStream_fn)(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t pref, int requestedAlgoCount, cublasLtMatmulHeuristicResult_t* results,
    int* returnAlgoCount, cudaStream_t stream) noexcept nogil
ctypedef cublasStatus_t (*cublasLtMatmulAlgoCheckForStream_fn)(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result, cudaStream_t stream) noexcept nogil
