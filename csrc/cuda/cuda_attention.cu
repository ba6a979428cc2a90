/* cuda_attention.cu -- decode attention over f16 KV pages addressed through the
 * page-table mirror (aotx_cuda.h), GQA: a block per (sequence, kv head) runs the query
 * heads that share the kv head, so each K/V row is read once for all of them; and the
 * decode step's K/V writes into those pages. */
#include "cuda_internal.cuh"

#define ATT_WARPS 4
#define ATT_MAX_DIM 256   /* head_dim, v_dim: 8 halves per lane */

/* 8 halves (16 bytes) to floats. */
__device__ __forceinline__ void load8(const __half *p, float *o) {
    const uint4 u = *(const uint4 *)p;
    const __half2 *h = (const __half2 *)&u;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 f = __half22float2(h[k]);
        o[2 * k] = f.x;
        o[2 * k + 1] = f.y;
    }
}

/* Warp w takes positions lo + w, lo + w + ATT_WARPS, ... with an online softmax per query
 * head; lane c holds dims 8c..8c+7 of q, K and V.  The warps' (max, sum, acc) merge at the
 * end through shared memory.  G = query heads per kv head, up to MAXG. */
template <int MAXG>
__global__ void __launch_bounds__(ATT_WARPS * 32)
attn_decode_kernel(aotx_cuda_attn a) {
    __shared__ float s_m[ATT_WARPS][MAXG], s_l[ATT_WARPS][MAXG];
    __shared__ float s_acc[ATT_WARPS][MAXG][ATT_MAX_DIM];
    const int seq = blockIdx.x, kvh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int G = a.n_heads / a.n_kv_heads, hd = a.head_dim, vd = a.v_dim;
    const int32_t *e = a.mirror + 4 * seq;
    const int32_t len = e[0], lo = e[1], page0 = e[2];
    const int32_t *ids = a.mirror + e[3];
    const aotx_cuda_kv_layout L = a.layout;
    const __half *pages = (const __half *)a.pages;
    const bool kl = lane * 8 < hd, vl = lane * 8 < vd;

    float q[MAXG][8], acc[MAXG][8], m[MAXG], l[MAXG];
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) q[g][k] = acc[g][k] = 0.0f;
        if (g < G && kl) {
            const float *qp = a.q + ((int64_t)seq * a.n_heads + kvh * G + g) * hd + lane * 8;
#pragma unroll
            for (int k = 0; k < 8; k++) q[g][k] = qp[k];
        }
    }
    for (int32_t s = lo + warp; s < len; s += ATT_WARPS) {
        const int64_t page = ids[s / L.page_tokens - page0];
        const int64_t slot = s % L.page_tokens;
        const __half *base = pages + page * L.page_elems;
        float kf[8], vf[8];
#pragma unroll
        for (int k = 0; k < 8; k++) kf[k] = vf[k] = 0.0f;
        if (kl) load8(base + L.k_off + slot * L.k_tok + (int64_t)kvh * hd + lane * 8, kf);
        if (vl) load8(base + L.v_off + slot * L.v_tok + (int64_t)kvh * vd + lane * 8, vf);
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
            if (g >= G) break;
            float d = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) d = fmaf(q[g][k], kf[k], d);
            const float score = a.scale * warp_sum(d);
            const float mn = fmaxf(m[g], score);
            const float corr = expf(m[g] - mn), pr = expf(score - mn);
            l[g] = fmaf(l[g], corr, pr);
#pragma unroll
            for (int k = 0; k < 8; k++) acc[g][k] = fmaf(acc[g][k], corr, pr * vf[k]);
            m[g] = mn;
        }
    }
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
        if (g >= G) break;
        if (lane == 0) {
            s_m[warp][g] = m[g];
            s_l[warp][g] = l[g];
        }
        if (vl) {
#pragma unroll
            for (int k = 0; k < 8; k++) s_acc[warp][g][lane * 8 + k] = acc[g][k];
        }
    }
    __syncthreads();
    for (int k = threadIdx.x; k < G * vd; k += ATT_WARPS * 32) {
        const int g = k / vd, dd = k % vd;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) mx = fmaxf(mx, s_m[w][g]);
        float num = 0.0f, den = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) {
            if (s_m[w][g] == -INFINITY) continue;   /* a warp that saw no position */
            const float c = expf(s_m[w][g] - mx);
            num = fmaf(s_acc[w][g][dd], c, num);
            den = fmaf(s_l[w][g], c, den);
        }
        a.out[((int64_t)seq * a.n_heads + kvh * G + g) * vd + dd] = num / den;
    }
}

extern "C" int aotx_cuda_attention_decode(const aotx_cuda_attn *a, void *stream) {
    if (!a || a->n < 0 || a->n_heads < 1 || a->n_kv_heads < 1 || a->n_heads % a->n_kv_heads ||
        a->head_dim < 8 || a->head_dim > ATT_MAX_DIM || a->head_dim % 8 || a->v_dim < 8 ||
        a->v_dim > ATT_MAX_DIM || a->v_dim % 8 || a->layout.elem_bytes != 2 ||
        a->layout.page_tokens < 1 || a->n_kv_heads > 65535)
        return AOTX_E_INVALID_ARGUMENT;
    const int G = a->n_heads / a->n_kv_heads;
    if (G > 8) return AOTX_E_UNSUPPORTED;
    if (a->n == 0) return AOTX_OK;
    if (!a->mirror || !a->pages || !a->q || !a->out) return AOTX_E_INVALID_ARGUMENT;
    const dim3 grid((unsigned)a->n, (unsigned)a->n_kv_heads);
    cudaStream_t s = aotx_stream(stream);
    if (G == 1) attn_decode_kernel<1><<<grid, ATT_WARPS * 32, 0, s>>>(*a);
    else if (G == 2) attn_decode_kernel<2><<<grid, ATT_WARPS * 32, 0, s>>>(*a);
    else if (G <= 4) attn_decode_kernel<4><<<grid, ATT_WARPS * 32, 0, s>>>(*a);
    else attn_decode_kernel<8><<<grid, ATT_WARPS * 32, 0, s>>>(*a);
    return aotx_cuda_launched("attn_decode_kernel");
}

/* A block per sequence: its K and V rows of position len - 1, every kv head, as halves. */
__global__ void kv_write_decode_kernel(aotx_cuda_kv_rows w) {
    const int seq = blockIdx.x;
    const int32_t *e = w.mirror + 4 * seq;
    const int32_t pos = e[0] - 1, page0 = e[2];
    const aotx_cuda_kv_layout L = w.layout;
    const int64_t page = w.mirror[e[3] + pos / L.page_tokens - page0];
    const int64_t slot = pos % L.page_tokens;
    __half *base = (__half *)w.pages + page * L.page_elems;
    const int64_t nk = (int64_t)w.n_kv_heads * w.k_dim, nv = (int64_t)w.n_kv_heads * w.v_dim;
    for (int64_t i = threadIdx.x; i < nk; i += blockDim.x)
        base[L.k_off + slot * L.k_tok + i] = __float2half_rn(w.k[seq * nk + i]);
    for (int64_t i = threadIdx.x; i < nv; i += blockDim.x)
        base[L.v_off + slot * L.v_tok + i] = __float2half_rn(w.v[seq * nv + i]);
}

extern "C" int aotx_cuda_kv_write_decode(const aotx_cuda_kv_rows *w, void *stream) {
    if (!w || w->n < 0 || w->n_kv_heads < 1 || w->k_dim < 1 || w->v_dim < 1 ||
        w->layout.elem_bytes != 2 || w->layout.page_tokens < 1 ||
        (int64_t)w->n_kv_heads * w->k_dim != w->layout.k_tok ||
        (int64_t)w->n_kv_heads * w->v_dim != w->layout.v_tok)
        return AOTX_E_INVALID_ARGUMENT;
    if (w->n == 0) return AOTX_OK;
    if (!w->mirror || !w->pages || !w->k || !w->v) return AOTX_E_INVALID_ARGUMENT;
    kv_write_decode_kernel<<<(unsigned)w->n, 128, 0, aotx_stream(stream)>>>(*w);
    return aotx_cuda_launched("kv_write_decode_kernel");
}
