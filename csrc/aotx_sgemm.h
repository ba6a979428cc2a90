/* aotx_sgemm.h -- float32 matrix products (embedding encoder, F32 weights).
 * aotx_matmul_rows(AOTX_T_F32, ...) in the kernels area calls aotx_sgemm_rows. */
#ifndef AOTX_SGEMM_H
#define AOTX_SGEMM_H

#include "aotx.h"

/* CDEF-BEGIN */
/* Y[t*ldy + r] = sum_k W[r*cols + k] * X[t*ldx + k], r in [r0, r1), t in [0, n_tok). */
void aotx_sgemm_rows(const float *w, int64_t cols, const float *x, int64_t ldx, int64_t n_tok,
                     float *y, int64_t ldy, int64_t r0, int64_t r1);
void aotx_sgemm_rows_ref(const float *w, int64_t cols, const float *x, int64_t ldx, int64_t n_tok,
                         float *y, int64_t ldy, int64_t r0, int64_t r1);
/* CDEF-END */

#endif
