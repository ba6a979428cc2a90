/* aotx_cuda_gpu.h -- the calls that need the CUDA kernels (the .cu files of csrc/cuda).  Only a
 * build with nvcc carries them (build.py leaves this header out of cffi's declarations
 * otherwise; aotx_cuda_available() tells which build this is).
 *
 * Conventions: device pointers are plain `void *` / `float *` from aotx_cuda_malloc
 * (cudaMalloc, never managed memory); every call returns 0 or a negative code, a CUDA
 * failure mapped by aotx_cuda_error_code with the call named in aotx_cuda_last_error.
 * Kernels are queued on `stream` (NULL: the default stream) and return once launched:
 * a fault inside a kernel surfaces at the next synchronizing call (aotx_cuda_sync,
 * aotx_cuda_download) as AOTX_E_CUDA_FAULT.  docs/engine.md, "CUDA".
 */
#ifndef AOTX_CUDA_GPU_H
#define AOTX_CUDA_GPU_H

#include "aotx_cuda.h"

/* CDEF-BEGIN */
/* Devices and memory. */
int aotx_cuda_device_count(int32_t *n);
int aotx_cuda_set_device(int32_t device);
int aotx_cuda_mem_info(int64_t *free_bytes, int64_t *total_bytes);
int aotx_cuda_malloc(int64_t bytes, void **out);
int aotx_cuda_free(void *p);
int aotx_cuda_upload(void *dst, const void *src, int64_t bytes);     /* host -> device */
int aotx_cuda_download(void *dst, const void *src, int64_t bytes);   /* device -> host */
int aotx_cuda_sync(void);                                            /* the whole device */

/* Activations x[n_tok][ldx] (device floats) -> the device layout of aotx_cuda_act_bytes
 * for weights of `type` (AOTX_T_Q8_0 or AOTX_T_Q4_K); the CPU's quants and scales bit
 * for bit. */
int aotx_cuda_quantize(int32_t type, const float *x, int64_t ldx, int64_t n_tok, int64_t cols,
                       void *act, void *stream);

/* Decode matrix-vector product y[t][r] = W[r, :] . x[t, :] for t < n_tok (1..8), W in its
 * GGUF blocks (Q8_0 or Q4_K, rows x cols, 16-byte aligned), act from aotx_cuda_quantize.
 * One warp per row, weights dequantized in registers, int8 products by __dp4a, each
 * weight read once for all n_tok tokens.  Per block the integer sums are the CPU
 * reference's; Q4_K also repeats its float steps and its order of super-blocks (the
 * reference's bits); Q8_0 sums its blocks' products across the warp (another order). */
enum { AOTX_CUDA_MV_MAX_TOK = 8 };
int aotx_cuda_matvec(int32_t type, const void *w, int64_t rows, int64_t cols, const void *act,
                     int64_t n_tok, float *y, int64_t ldy, void *stream);

/* out[r][:] = x[r][:] * (1 / sqrt(mean(x[r]^2) + eps)) * w (the mean in double, as the
 * decoder's rmsnorm); in place allowed.  rows x n floats. */
int aotx_cuda_rmsnorm(float *out, const float *x, const float *w, int64_t rows, int64_t n,
                      float eps, void *stream);

/* RoPE in place on x[n_tok][n_heads][head_dim]: the first n_rot dims of each head rotate by
 * angle (pos[t] * pos_scale) * inv_freq[i], i < n_rot / 2; neox: pairs (i, i + n_rot/2),
 * else adjacent pairs (2i, 2i + 1).  pos [n_tok] int32 and inv_freq [n_rot/2] on the device. */
int aotx_cuda_rope(float *x, int64_t n_tok, int32_t n_heads, int32_t head_dim, int32_t n_rot,
                   const int32_t *pos, const float *inv_freq, float pos_scale, int32_t neox,
                   void *stream);

/* Decode attention over f16 KV pages: n sequences with one query each (their last
 * position), head h reading kv head h / (n_heads / n_kv_heads), the positions and pages
 * of the page-table mirror (aotx_cuda_pt_build, copied to the device), softmax(scale *
 * q.k) . V summed in float.  head_dim and v_dim multiples of 8 up to 256, at most 8 query
 * heads per kv head. */
typedef struct aotx_cuda_attn {
    int32_t n;                 /* sequences (mirror entries) */
    int32_t n_heads, n_kv_heads, head_dim, v_dim;
    float scale;
    aotx_cuda_kv_layout layout;   /* the layer's offsets (aotx_cuda_pt_build); elem_bytes 2 */
    const int32_t *mirror;     /* device: the mirror */
    const void *pages;         /* device: the pool's pages, layout.page_elems halves each */
    const float *q;            /* device: [n][n_heads][head_dim] */
    float *out;                /* device: [n][n_heads][v_dim] */
} aotx_cuda_attn;
int aotx_cuda_attention_decode(const aotx_cuda_attn *a, void *stream);

/* Store a decode step's K/V rows into f16 pages: row i (float, k [n][n_kv_heads * k_dim],
 * v [n][n_kv_heads * v_dim]) goes to position len - 1 of mirror entry i, rounded to
 * nearest even as the CPU's aotx_kv_f16_store (the same bits). */
typedef struct aotx_cuda_kv_rows {
    int32_t n;                 /* sequences (mirror entries) */
    int32_t n_kv_heads, k_dim, v_dim;
    aotx_cuda_kv_layout layout;   /* elem_bytes 2 */
    const int32_t *mirror;     /* device */
    void *pages;               /* device */
    const float *k, *v;        /* device */
} aotx_cuda_kv_rows;
int aotx_cuda_kv_write_decode(const aotx_cuda_kv_rows *w, void *stream);
/* CDEF-END */

#endif
