/* aotx_sgemm.h -- float32 matrix products (embedding encoder, F32 weights).
 * aotx_matmul_rows(AOTX_T_F32, ...) in the kernels area calls aotx_sgemm_rows.
 * W is [rows][cols] row-major (row r at w + r*cols), X is [n_tok][ldx]; any number
 * of threads may call it on disjoint row ranges.  No allocation. */
#ifndef AOTX_SGEMM_H
#define AOTX_SGEMM_H

#include "aotx.h"

/* CDEF-BEGIN */
/* Y[t*ldy + r] = sum_k W[r*cols + k] * X[t*ldx + k], r in [r0, r1), t in [0, n_tok). */
void aotx_sgemm_rows(const float *w, int64_t cols, const float *x, int64_t ldx, int64_t n_tok,
                     float *y, int64_t ldy, int64_t r0, int64_t r1);
void aotx_sgemm_rows_ref(const float *w, int64_t cols, const float *x, int64_t ldx, int64_t n_tok,
                         float *y, int64_t ldy, int64_t r0, int64_t r1);
/* The implementation aotx_sgemm_rows runs: "ref", "avx2" or "avx512" (AOTX_KERNELS=ref: "ref"). */
const char *aotx_sgemm_impl(void);
/* Cap it at "ref", "avx2", "avx512" or "auto" (tests and benchmarks only: not safe
 * while other threads run it); AOTX_E_UNSUPPORTED if the CPU lacks that level. */
int aotx_sgemm_force(const char *impl);
/* CDEF-END */

#endif
