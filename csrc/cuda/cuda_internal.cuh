/* cuda_internal.cuh -- shared by the CUDA sources of csrc/cuda: the C headers (as C),
 * the check of a CUDA call and of a launch. */
#ifndef AOTX_CUDA_INTERNAL_CUH
#define AOTX_CUDA_INTERNAL_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "aotx_cuda_gpu.h"
#include "aotx_kernels.h"
}

/* Return the mapped code of a failed CUDA call, naming it for aotx_cuda_last_error.  The
 * runtime also keeps the error as this thread's "last error": reset it, or the next
 * launch check (aotx_cuda_launched) would report it again (a sticky fault stays). */
#define AOTX_CU(call)                                                                   \
    do {                                                                                \
        cudaError_t e_ = (call);                                                        \
        if (e_ != cudaSuccess) {                                                        \
            (void)cudaGetLastError();                                                   \
            return aotx_cuda_fail(#call, (int)e_, cudaGetErrorName(e_),                 \
                                  cudaGetErrorString(e_));                              \
        }                                                                               \
    } while (0)

/* After a launch: the configuration error, if any (a fault inside the kernel surfaces
 * at the next synchronizing call). */
static inline int aotx_cuda_launched(const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return AOTX_OK;
    return aotx_cuda_fail(kernel, (int)e, cudaGetErrorName(e), cudaGetErrorString(e));
}

static inline cudaStream_t aotx_stream(void *s) { return (cudaStream_t)s; }

/* Sum over a warp (every lane gets it). */
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#endif
