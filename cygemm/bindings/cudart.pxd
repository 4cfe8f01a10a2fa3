# The CUDA runtime as cygemm uses it (cuda_runtime_api.h, library_types.h).
# Only what the library calls; every function is nogil and returns its status.
from libc.stdint cimport int64_t

cdef extern from "cuda_runtime_api.h" nogil:
    ctypedef int cudaError_t
    ctypedef void* cudaStream_t 'cudaStream_t'
    ctypedef void* cudaEvent_t 'cudaEvent_t'
    ctypedef void* cudaGraph_t 'cudaGraph_t'
    ctypedef void* cudaGraphExec_t 'cudaGraphExec_t'
    ctypedef void* cudaUserObject_t 'cudaUserObject_t'
    ctypedef void (*cudaHostFn_t)(void*) noexcept nogil

    cdef enum cudaStreamCaptureStatus:   # a C enum, no typedef
        cudaStreamCaptureStatusNone
        cudaStreamCaptureStatusActive
        cudaStreamCaptureStatusInvalidated

    cdef enum cudaStreamCaptureMode:   # a C enum, no typedef
        cudaStreamCaptureModeGlobal
        cudaStreamCaptureModeThreadLocal
        cudaStreamCaptureModeRelaxed

    cdef enum cudaDriverEntryPointQueryResult:   # a C enum, no typedef
        cudaDriverEntryPointSuccess

    cdef enum cudaMemoryType:   # a C enum, no typedef
        cudaMemoryTypeUnregistered
        cudaMemoryTypeHost
        cudaMemoryTypeDevice
        cudaMemoryTypeManaged

    cdef enum cudaDeviceAttr:   # a C enum, no typedef
        cudaDevAttrL2CacheSize
        cudaDevAttrComputeCapabilityMajor
        cudaDevAttrComputeCapabilityMinor
        cudaDevAttrMultiProcessorCount

    cdef struct cudaDeviceProp:   # only the fields cygemm reads; the header has the rest
        char name[256]

    cdef struct cudaPointerAttributes:   # a C struct, no typedef
        cudaMemoryType type
        int device
        void* devicePointer
        void* hostPointer

    const char* cudaGetErrorName(cudaError_t error)
    const char* cudaGetErrorString(cudaError_t error)
    cudaError_t cudaGetLastError()
    cudaError_t cudaGetDevice(int* device)
    cudaError_t cudaSetDevice(int device)
    cudaError_t cudaGetDeviceCount(int* count)
    cudaError_t cudaRuntimeGetVersion(int* version)
    cudaError_t cudaDriverGetVersion(int* version)
    cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device)
    cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device)
    cudaError_t cudaMalloc(void** ptr, size_t size)
    cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream)
    cdef enum cudaMemcpyKind:   # a C enum, no typedef
        cudaMemcpyDeviceToHost
    cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind)
    cudaError_t cudaStreamSynchronize(cudaStream_t stream)
    cudaError_t cudaFree(void* ptr)
    cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr)
    cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* device)
    cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status)
    # CUDA 13's signature; the outputs after id_out may be NULL.
    cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                         unsigned long long* id_out, cudaGraph_t* graph_out,
                                         const void** deps_out, const void** edges_out, size_t* n_deps_out)
    cudaError_t cudaDeviceSynchronize()
    cudaError_t cudaUserObjectCreate(cudaUserObject_t* obj, void* ptr, cudaHostFn_t destroy,
                                     unsigned int initial_refcount, unsigned int flags)
    cudaError_t cudaUserObjectRelease(cudaUserObject_t obj, unsigned int count)
    cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, cudaUserObject_t obj, unsigned int count,
                                          unsigned int flags)
    enum: cudaUserObjectNoDestructorSync
    enum: cudaGraphUserObjectMove
    cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** func, unsigned int version,
                                                 unsigned long long flags,
                                                 cudaDriverEntryPointQueryResult* status)
    cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode)
    cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph)
    cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode)
    cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags)
    cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
    cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
    cudaError_t cudaGraphDestroy(cudaGraph_t graph)
    cudaError_t cudaGraphGetNodes(cudaGraph_t graph, void** nodes, size_t* num_nodes)
    # edge_data: cudaGraphEdgeData* (NULL: not wanted)
    cudaError_t cudaGraphGetEdges(cudaGraph_t graph, void** from_, void** to, void* edge_data, size_t* num_edges)
    cudaError_t cudaEventCreate(cudaEvent_t* event)
    cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags)
    cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags)
    cudaError_t cudaStreamDestroy(cudaStream_t stream)
    cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
    cudaError_t cudaEventDestroy(cudaEvent_t event)
    cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
    cudaError_t cudaEventSynchronize(cudaEvent_t event)
    cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end)

    enum: cudaSuccess
    enum: cudaEventDisableTiming
    enum: cudaStreamNonBlocking
    enum: cudaEnableDefault
    enum: cudaErrorStreamCaptureUnsupported
    enum: cudaErrorNoDevice
    enum: cudaErrorInsufficientDriver


cdef extern from "library_types.h" nogil:
    ctypedef enum cudaDataType 'cudaDataType':
        CUDA_R_16F
        CUDA_R_16BF
        CUDA_R_32F
        CUDA_R_64F
        CUDA_C_32F
        CUDA_C_64F
        CUDA_R_8I
        CUDA_R_32I
        CUDA_R_64I
        CUDA_R_8U
        CUDA_R_8F_E4M3
        CUDA_R_8F_E5M2
