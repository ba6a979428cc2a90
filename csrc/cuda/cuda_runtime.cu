/* cuda_runtime.cu -- devices and memory (aotx_cuda_gpu.h), and the check that the
 * error numbers cuda_host.c maps are the runtime's. */
#include "cuda_internal.cuh"

static_assert(cudaSuccess == 0 && cudaErrorInvalidValue == 1 && cudaErrorMemoryAllocation == 2 &&
              cudaErrorInitializationError == 3 && cudaErrorInvalidConfiguration == 9,
              "cudaError_t numbering (cuda_host.c)");
static_assert(cudaErrorStubLibrary == 34 && cudaErrorInsufficientDriver == 35 &&
              cudaErrorCallRequiresNewerDriver == 36 && cudaErrorInvalidDeviceFunction == 98 &&
              cudaErrorNoDevice == 100 && cudaErrorInvalidDevice == 101,
              "cudaError_t numbering (cuda_host.c)");
static_assert(cudaErrorInvalidKernelImage == 200 && cudaErrorNoKernelImageForDevice == 209 &&
              cudaErrorInvalidPtx == 218 && cudaErrorUnsupportedPtxVersion == 222,
              "cudaError_t numbering (cuda_host.c)");
static_assert(cudaErrorIllegalAddress == 700 && cudaErrorLaunchOutOfResources == 701 &&
              cudaErrorLaunchTimeout == 702 && cudaErrorAssert == 710 &&
              cudaErrorHardwareStackError == 714 && cudaErrorIllegalInstruction == 715 &&
              cudaErrorMisalignedAddress == 716 && cudaErrorInvalidAddressSpace == 717 &&
              cudaErrorInvalidPc == 718 && cudaErrorLaunchFailure == 719,
              "cudaError_t numbering (cuda_host.c)");
static_assert(cudaErrorSystemDriverMismatch == 803 && cudaErrorCompatNotSupportedOnDevice == 804,
              "cudaError_t numbering (cuda_host.c)");

extern "C" int aotx_cuda_device_count(int32_t *n) {
    if (!n) return AOTX_E_INVALID_ARGUMENT;
    int c = 0;
    AOTX_CU(cudaGetDeviceCount(&c));
    *n = c;
    return AOTX_OK;
}

extern "C" int aotx_cuda_set_device(int32_t device) {
    if (device < 0) return AOTX_E_INVALID_ARGUMENT;
    AOTX_CU(cudaSetDevice(device));
    return AOTX_OK;
}

extern "C" int aotx_cuda_mem_info(int64_t *free_bytes, int64_t *total_bytes) {
    if (!free_bytes || !total_bytes) return AOTX_E_INVALID_ARGUMENT;
    size_t f = 0, t = 0;
    AOTX_CU(cudaMemGetInfo(&f, &t));
    *free_bytes = (int64_t)f;
    *total_bytes = (int64_t)t;
    return AOTX_OK;
}

extern "C" int aotx_cuda_malloc(int64_t bytes, void **out) {
    if (!out || bytes < 1) return AOTX_E_INVALID_ARGUMENT;
    *out = NULL;
    AOTX_CU(cudaMalloc(out, (size_t)bytes));
    return AOTX_OK;
}

extern "C" int aotx_cuda_free(void *p) {
    AOTX_CU(cudaFree(p));
    return AOTX_OK;
}

extern "C" int aotx_cuda_upload(void *dst, const void *src, int64_t bytes) {
    if (bytes < 0 || (bytes > 0 && (!dst || !src))) return AOTX_E_INVALID_ARGUMENT;
    if (bytes) AOTX_CU(cudaMemcpy(dst, src, (size_t)bytes, cudaMemcpyHostToDevice));
    return AOTX_OK;
}

extern "C" int aotx_cuda_download(void *dst, const void *src, int64_t bytes) {
    if (bytes < 0 || (bytes > 0 && (!dst || !src))) return AOTX_E_INVALID_ARGUMENT;
    if (bytes) AOTX_CU(cudaMemcpy(dst, src, (size_t)bytes, cudaMemcpyDeviceToHost));
    return AOTX_OK;
}

extern "C" int aotx_cuda_sync(void) {
    AOTX_CU(cudaDeviceSynchronize());
    return AOTX_OK;
}
