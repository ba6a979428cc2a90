/* cuda_matvec.cu -- activation quantization and the decode matrix-vector products
 * (Q8_0, Q4_K) on the device.  The float steps named in aotx_kernels.h are spelled with
 * __fmul_rn / __fadd_rn / fmaf so that nvcc fuses nothing the CPU reference does not. */
#include "cuda_internal.cuh"

#define AOTX_ALIGN 256

static_assert(sizeof(aotx_block_q8_k32) == 352, "Q8_K32 is the CPU's layout");
static_assert(sizeof(aotx_block_q4_k) == 144 && sizeof(aotx_block_q8_0) == 34,
              "GGUF block sizes");

/* ------------------------------------------------------------ quantization */

/* One warp per 32 values: d = max|x| / 127, q = round-half-even(x / d) in [-127, 127], the
 * CPU's quant_group (quant.c); returns q, and d in *d on every lane. */
__device__ __forceinline__ int quant32(float x, float *d) {
    float amax = fabsf(x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float dd = __fdiv_rn(amax, 127.0f);
    float id = dd > 0.0f ? __fdiv_rn(1.0f, dd) : 0.0f;
    float v = __fmul_rn(x, id);
    v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
    *d = dd;
    return __float2int_rn(v);
}

/* Q8_0 family: warp w = block (t, b) of nb per token. */
__global__ void quant_q8_0_kernel(const float *__restrict__ x, int64_t ldx, int64_t n_tok,
                                  int64_t cols, int8_t *__restrict__ q, float *__restrict__ d) {
    const int64_t nb = cols / 32;
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= n_tok * nb) return;
    const int64_t t = warp / nb, b = warp % nb;
    float dd;
    int qv = quant32(x[t * ldx + b * 32 + lane], &dd);
    q[t * cols + b * 32 + lane] = (int8_t)qv;
    if (lane == 0) d[t * nb + b] = dd;
}

/* Q8_K32: warp w = the 32-value part j of super-block (t, i). */
__global__ void quant_q8_k32_kernel(const float *__restrict__ x, int64_t ldx, int64_t n_tok,
                                    int64_t cols, aotx_block_q8_k32 *__restrict__ out) {
    const int64_t nbk = cols / 256;
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= n_tok * nbk * 8) return;
    const int64_t t = warp / (nbk * 8), i = (warp / 8) % nbk;
    const int j = (int)(warp % 8);
    float dd;
    int qv = quant32(x[t * ldx + i * 256 + j * 32 + lane], &dd);
    aotx_block_q8_k32 *blk = out + t * nbk + i;
    blk->qs[32 * j + lane] = (int8_t)qv;
    int s16 = qv;   /* the 16-sums: lanes 0..15 and 16..31 */
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) s16 += __shfl_xor_sync(0xffffffffu, s16, o);
    int s32 = s16 + __shfl_xor_sync(0xffffffffu, s16, 16);
    if (lane == 0) {
        blk->bsums[2 * j] = (int16_t)s16;
        blk->d[j] = dd;
        blk->dm[j] = __fmul_rn(dd, (float)s32);
    }
    if (lane == 16) blk->bsums[2 * j + 1] = (int16_t)s16;
}

extern "C" int aotx_cuda_quantize(int32_t type, const float *x, int64_t ldx, int64_t n_tok,
                                  int64_t cols, void *act, void *stream) {
    int64_t bytes = aotx_cuda_act_bytes(type, cols, n_tok);
    if (bytes < 0) return (int)bytes;
    if (n_tok == 0 || cols == 0) return AOTX_OK;
    if (!x || !act || ldx < cols) return AOTX_E_INVALID_ARGUMENT;
    const int threads = 256;
    const int64_t warps = type == AOTX_T_Q8_0 ? n_tok * (cols / 32) : n_tok * (cols / 256) * 8;
    const int64_t blocks = (warps * 32 + threads - 1) / threads;
    if (type == AOTX_T_Q8_0) {
        int8_t *q = (int8_t *)act;
        float *d = (float *)((char *)act + (n_tok * cols + AOTX_ALIGN - 1) / AOTX_ALIGN * AOTX_ALIGN);
        quant_q8_0_kernel<<<(unsigned)blocks, threads, 0, aotx_stream(stream)>>>(x, ldx, n_tok,
                                                                                cols, q, d);
        return aotx_cuda_launched("quant_q8_0_kernel");
    }
    quant_q8_k32_kernel<<<(unsigned)blocks, threads, 0, aotx_stream(stream)>>>(
        x, ldx, n_tok, cols, (aotx_block_q8_k32 *)act);
    return aotx_cuda_launched("quant_q8_k32_kernel");
}

/* ------------------------------------------------------------ Q8_0 x Q8_0 */

#define MV_WARPS 4   /* rows per block: one warp each */

/* Lane l takes blocks l, l + 32, ...: the 32 weight quants (2-byte aligned in the 34-byte
 * block) as 8 dwords, 8 __dp4a against the token's quants, then (d_w * d_x) * sum as the
 * reference; the blocks' products are summed per lane, then across the warp. */
template <int NT>
__global__ void __launch_bounds__(MV_WARPS * 32)
matvec_q8_0_kernel(const uint8_t *__restrict__ w, int64_t rows, int64_t cols,
                   const int8_t *__restrict__ xq, const float *__restrict__ xd,
                   float *__restrict__ y, int64_t ldy) {
    const int64_t r = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const int64_t nb = cols / 32;
    const uint16_t *row = (const uint16_t *)(w + r * nb * 34);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int64_t b = lane; b < nb; b += 32) {
        const uint16_t *blk = row + b * 17;
        const float dw = __half2float(__ushort_as_half(blk[0]));
        int wq[8];
#pragma unroll
        for (int k = 0; k < 8; k++) wq[k] = (int)((uint32_t)blk[1 + 2 * k] | (uint32_t)blk[2 + 2 * k] << 16);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const int4 *xv = (const int4 *)(xq + t * cols + b * 32);
            const int4 x0 = xv[0], x1 = xv[1];
            int s = __dp4a(wq[0], x0.x, 0);
            s = __dp4a(wq[1], x0.y, s);
            s = __dp4a(wq[2], x0.z, s);
            s = __dp4a(wq[3], x0.w, s);
            s = __dp4a(wq[4], x1.x, s);
            s = __dp4a(wq[5], x1.y, s);
            s = __dp4a(wq[6], x1.z, s);
            s = __dp4a(wq[7], x1.w, s);
            acc[t] = __fadd_rn(acc[t], __fmul_rn(__fmul_rn(dw, xd[t * nb + b]), (float)s));
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = warp_sum(acc[t]);
        if (lane == 0) y[t * ldy + r] = v;
    }
}

/* ------------------------------------------------------------ Q4_K x Q8_K32 */

__device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* A warp per row, 4 super-blocks in flight: lanes 8g..8g+7 take super-block i0 + g, lane
 * c = lane % 8 its quant bytes 16c..16c+15 (pair c / 2: sub-block 2(c/2) in the low
 * nibbles, 2(c/2) + 1 in the high ones, values 16(c%2)..+15).  Sub-block sums S_j are
 * exact integers; the group's lanes then repeat the reference's float steps for their
 * super-block (aotx_kernels.h, aotx_block_q8_k32) and lane 0 adds the super-blocks' r in
 * order: the reference's bits. */
template <int NT>
__global__ void __launch_bounds__(MV_WARPS * 32)
matvec_q4_k_kernel(const uint8_t *__restrict__ w, int64_t rows, int64_t cols,
                   const aotx_block_q8_k32 *__restrict__ act, float *__restrict__ y,
                   int64_t ldy) {
    const int64_t r = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31, g = lane >> 3, c = lane & 7, p = c >> 1, h = c & 1;
    if (r >= rows) return;
    const int64_t nb = cols / 256;
    const uint8_t *row = w + r * nb * 144;
    float sum[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) sum[t] = 0.0f;
    for (int64_t i0 = 0; i0 < nb; i0 += 4) {
        const int64_t i = i0 + g;
        const bool live = i < nb;
        const uint8_t *blk = row + (live ? i : 0) * 144;
        uint4 wv = make_uint4(0, 0, 0, 0);
        float dw = 0.0f, dmin = 0.0f;
        int sc[8], mn[8];
        if (live) {
            wv = *(const uint4 *)(blk + 16 + 16 * c);
            dw = __half2float(__ushort_as_half(*(const uint16_t *)blk));
            dmin = __half2float(__ushort_as_half(*(const uint16_t *)(blk + 2)));
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            sc[j] = mn[j] = 0;
            if (live) scale_min_k4(j, blk + 4, &sc[j], &mn[j]);
        }
        const uint32_t wl[4] = {wv.x & 0x0f0f0f0fu, wv.y & 0x0f0f0f0fu, wv.z & 0x0f0f0f0fu,
                                wv.w & 0x0f0f0f0fu};
        const uint32_t wh[4] = {(wv.x >> 4) & 0x0f0f0f0fu, (wv.y >> 4) & 0x0f0f0f0fu,
                                (wv.z >> 4) & 0x0f0f0f0fu, (wv.w >> 4) & 0x0f0f0f0fu};
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const aotx_block_q8_k32 *x = act + t * nb + (live ? i : 0);
            int slo = 0, shi = 0;
            if (live) {
                const int4 xl = *(const int4 *)(x->qs + 64 * p + 16 * h);
                const int4 xh = *(const int4 *)(x->qs + 64 * p + 32 + 16 * h);
                slo = __dp4a((int)wl[0], xl.x, slo);
                slo = __dp4a((int)wl[1], xl.y, slo);
                slo = __dp4a((int)wl[2], xl.z, slo);
                slo = __dp4a((int)wl[3], xl.w, slo);
                shi = __dp4a((int)wh[0], xh.x, shi);
                shi = __dp4a((int)wh[1], xh.y, shi);
                shi = __dp4a((int)wh[2], xh.z, shi);
                shi = __dp4a((int)wh[3], xh.w, shi);
            }
            slo += __shfl_xor_sync(0xffffffffu, slo, 1);   /* both halves of the pair */
            shi += __shfl_xor_sync(0xffffffffu, shi, 1);
            float f = 0.0f, gm = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) {   /* S_j from the group's lane 2(j/2) */
                const int src = (lane & ~7) | (2 * (j >> 1));
                const int s = __shfl_sync(0xffffffffu, (j & 1) ? shi : slo, src);
                if (live) {
                    f = fmaf((float)(sc[j] * s), x->d[j], f);
                    gm = fmaf((float)mn[j], x->dm[j], gm);
                }
            }
            const float rr = live ? fmaf(f, dw, -__fmul_rn(gm, dmin)) : 0.0f;
#pragma unroll
            for (int k = 0; k < 4; k++) {   /* in super-block order */
                const float rk = __shfl_sync(0xffffffffu, rr, 8 * k);
                if (lane == 0 && i0 + k < nb) sum[t] = (i0 + k == 0) ? rk : __fadd_rn(sum[t], rk);
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < NT; t++) y[t * ldy + r] = sum[t];
    }
}

template <int NT>
static int launch_matvec(int32_t type, const void *w, int64_t rows, int64_t cols,
                         const void *act, int64_t n_tok, float *y, int64_t ldy, cudaStream_t s) {
    const unsigned blocks = (unsigned)((rows + MV_WARPS - 1) / MV_WARPS);
    if (type == AOTX_T_Q8_0) {
        const int8_t *xq = (const int8_t *)act;
        const float *xd = (const float *)((const char *)act +
                                          (n_tok * cols + AOTX_ALIGN - 1) / AOTX_ALIGN * AOTX_ALIGN);
        matvec_q8_0_kernel<NT><<<blocks, MV_WARPS * 32, 0, s>>>((const uint8_t *)w, rows, cols,
                                                                 xq, xd, y, ldy);
        return aotx_cuda_launched("matvec_q8_0_kernel");
    }
    matvec_q4_k_kernel<NT><<<blocks, MV_WARPS * 32, 0, s>>>(
        (const uint8_t *)w, rows, cols, (const aotx_block_q8_k32 *)act, y, ldy);
    return aotx_cuda_launched("matvec_q4_k_kernel");
}

extern "C" int aotx_cuda_matvec(int32_t type, const void *w, int64_t rows, int64_t cols,
                                const void *act, int64_t n_tok, float *y, int64_t ldy,
                                void *stream) {
    int64_t bytes = aotx_cuda_act_bytes(type, cols, n_tok);
    if (bytes < 0) return (int)bytes;
    if (rows < 0 || n_tok < 0 || n_tok > AOTX_CUDA_MV_MAX_TOK || (n_tok > 1 && ldy < rows))
        return AOTX_E_INVALID_ARGUMENT;
    if (rows == 0 || n_tok == 0 || cols == 0) return AOTX_OK;
    if (!w || !act || !y || ((uintptr_t)w & 15) || ((uintptr_t)act & 15))
        return AOTX_E_INVALID_ARGUMENT;
    cudaStream_t s = aotx_stream(stream);
    switch (n_tok) {
    case 1: return launch_matvec<1>(type, w, rows, cols, act, n_tok, y, ldy, s);
    case 2: return launch_matvec<2>(type, w, rows, cols, act, n_tok, y, ldy, s);
    case 3: return launch_matvec<3>(type, w, rows, cols, act, n_tok, y, ldy, s);
    case 4: return launch_matvec<4>(type, w, rows, cols, act, n_tok, y, ldy, s);
    case 5: return launch_matvec<5>(type, w, rows, cols, act, n_tok, y, ldy, s);
    case 6: return launch_matvec<6>(type, w, rows, cols, act, n_tok, y, ldy, s);
    case 7: return launch_matvec<7>(type, w, rows, cols, act, n_tok, y, ldy, s);
    default: return launch_matvec<8>(type, w, rows, cols, act, n_tok, y, ldy, s);
    }
}
