/* kv_f16_internal.h -- half-precision K/V helpers (kv_f16.c) as the CPU backend
 * uses them: rows of binary16, float accumulation.  Not part of the cffi surface. */
#ifndef AOTX_KV_F16_INTERNAL_H
#define AOTX_KV_F16_INTERNAL_H

#include <stdint.h>

typedef struct aotx_kvh_ops {
    const char *name;                                         /* "ref" or "f16c" */
    void (*store)(uint16_t *dst, const float *src, int64_t n);  /* round to nearest even */
    void (*load)(float *dst, const uint16_t *src, int64_t n);   /* exact */
    float (*dot)(const float *q, const uint16_t *k, int64_t n);
    void (*axpy)(float *y, float c, const uint16_t *x, int64_t n);
    /* out[j] = dot(q[j], k, n), the same bits as dot */
    void (*dot4)(const float *const *q, const uint16_t *k, int64_t n, float *out);
    /* out[i][0..vd) = sum_s w[i*stride + s] * rows[s][0..vd), the same bits as axpy over s
     * from zero */
    void (*acc4)(float *const *out, const float *w, int64_t stride,
                 const uint16_t *const *rows, int32_t n_rows, int64_t vd);
} aotx_kvh_ops;

/* The path picked once (AOTX_KERNELS=ref: "ref"), or the one aotx_kv_f16_force set. */
const aotx_kvh_ops *aotx_kvh(void);

#endif
