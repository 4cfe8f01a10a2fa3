/* The GPU side of timing candidates (cygemm/plans.pyx): a kernel that holds a stream.
 * Shared by cygemm/kernels/timing.cu (definition) and cygemm/kernels/timing.pxd (Cython). */
#ifndef CYGEMM_TIMING_H
#define CYGEMM_TIMING_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueue on `stream` one single-thread kernel that returns `nanoseconds` after it starts:
 * work enqueued behind it meanwhile then runs back to back, with no launch gaps. */
cudaError_t cygemm_hold_stream(uint64_t nanoseconds, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* CYGEMM_TIMING_H */
