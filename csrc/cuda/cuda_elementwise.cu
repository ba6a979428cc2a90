/* cuda_elementwise.cu -- RMSNorm and RoPE on the device, the decoder's formulas
 * (model_fwd.c: rmsnorm, rope_tables / rope_apply) with their float steps spelled out. */
#include "cuda_internal.cuh"

#define NORM_THREADS 256

/* A block per row: the sum of squares in double (as the decoder), then x * r * w. */
__global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_kernel(float *__restrict__ out, const float *__restrict__ x, const float *__restrict__ w,
               int64_t n, float eps) {
    __shared__ double part[NORM_THREADS / 32];
    const float *xr = x + (int64_t)blockIdx.x * n;
    float *yr = out + (int64_t)blockIdx.x * n;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += NORM_THREADS) ss += (double)xr[i] * (double)xr[i];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    double tot = 0.0;
#pragma unroll
    for (int k = 0; k < NORM_THREADS / 32; k++) tot += part[k];
    const float r = (float)(1.0 / sqrt(tot / (double)n + (double)eps));
    for (int64_t i = threadIdx.x; i < n; i += NORM_THREADS) yr[i] = __fmul_rn(__fmul_rn(xr[i], r), w[i]);
}

extern "C" int aotx_cuda_rmsnorm(float *out, const float *x, const float *w, int64_t rows,
                                 int64_t n, float eps, void *stream) {
    if (rows < 0 || n < 0 || rows > INT32_MAX) return AOTX_E_INVALID_ARGUMENT;
    if (rows == 0 || n == 0) return AOTX_OK;
    if (!out || !x || !w) return AOTX_E_INVALID_ARGUMENT;
    rmsnorm_kernel<<<(unsigned)rows, NORM_THREADS, 0, aotx_stream(stream)>>>(out, x, w, n, eps);
    return aotx_cuda_launched("rmsnorm_kernel");
}

/* A thread per (token, head, pair i). */
__global__ void rope_kernel(float *__restrict__ x, int64_t n_tok, int32_t n_heads,
                            int32_t head_dim, int32_t n_rot, const int32_t *__restrict__ pos,
                            const float *__restrict__ inv_freq, float pos_scale, int32_t neox) {
    const int32_t half = n_rot / 2;
    const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n_tok * n_heads * half) return;
    const int64_t t = k / ((int64_t)n_heads * half);
    const int32_t hh = (int32_t)((k / half) % n_heads), i = (int32_t)(k % half);
    const float p = __fmul_rn((float)pos[t], pos_scale);
    const float ang = __fmul_rn(p, inv_freq[i]);
    float s, c;
    sincosf(ang, &s, &c);
    float *v = x + (t * n_heads + hh) * (int64_t)head_dim;
    const int32_t ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
    const float a = v[ia], b = v[ib];
    v[ia] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[ib] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}

extern "C" int aotx_cuda_rope(float *x, int64_t n_tok, int32_t n_heads, int32_t head_dim,
                              int32_t n_rot, const int32_t *pos, const float *inv_freq,
                              float pos_scale, int32_t neox, void *stream) {
    if (n_tok < 0 || n_heads < 0 || head_dim < 0 || n_rot < 0 || n_rot > head_dim || (n_rot & 1))
        return AOTX_E_INVALID_ARGUMENT;
    const int64_t total = n_tok * n_heads * (int64_t)(n_rot / 2);
    if (total == 0) return AOTX_OK;
    if (!x || !pos || !inv_freq) return AOTX_E_INVALID_ARGUMENT;
    const int threads = 256;
    rope_kernel<<<(unsigned)((total + threads - 1) / threads), threads, 0, aotx_stream(stream)>>>(
        x, n_tok, n_heads, head_dim, n_rot, pos, inv_freq, pos_scale, neox);
    return aotx_cuda_launched("rope_kernel");
}
