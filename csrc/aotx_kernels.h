/* aotx_kernels.h -- tensor types (GGUF/ggml numbering) and the matrix kernels
 * the decoder runs on.  Weights stay in their GGUF block layout (row-major,
 * one row = cols/block_size blocks).  Activations are converted once per
 * matmul by aotx_act_prepare() (F32 for F32/F16/BF16 weights, Q8_K for
 * k-quants, Q8_0 for Q4_0/Q5_0/Q8_0), then any number of threads run
 * aotx_matmul_rows() over disjoint row ranges.  Every fast kernel has a
 * portable reference (the *_ref functions) that the tests use as an oracle.
 */
#ifndef AOTX_KERNELS_H
#define AOTX_KERNELS_H

#include "aotx.h"

/* CDEF-BEGIN */
enum {
    AOTX_T_F32 = 0, AOTX_T_F16 = 1, AOTX_T_Q4_0 = 2, AOTX_T_Q5_0 = 6, AOTX_T_Q8_0 = 8,
    AOTX_T_Q4_K = 12, AOTX_T_Q5_K = 13, AOTX_T_Q6_K = 14, AOTX_T_Q8_K = 15, AOTX_T_BF16 = 30,

    AOTX_E_KERNEL_TYPE = -801,     /* tensor type not supported */
    AOTX_E_KERNEL_SHAPE = -802     /* cols not a multiple of the type's block size */
};

/* Elements per block and bytes per block of a type (0 if unsupported). */
int64_t aotx_type_block_elems(int type);
int64_t aotx_type_block_bytes(int type);
/* Bytes of one row of `cols` elements, or a negative code. */
int64_t aotx_type_row_bytes(int type, int64_t cols);

/* Dequantize n elements (n a multiple of the block size) to float. */
int aotx_dequant_row(int type, const void *src, float *dst, int64_t n);
int aotx_dequant_row_ref(int type, const void *src, float *dst, int64_t n);

/* Activation scratch for X[n_tok][cols] against weights of `type`, in bytes. */
int64_t aotx_act_bytes(int type, int64_t cols, int64_t n_tok);
/* Convert X[n_tok][cols] (row stride ldx floats) into `act`. */
int aotx_act_prepare(int type, const float *x, int64_t ldx, int64_t n_tok, int64_t cols, void *act);

/* Y[t*ldy + r] = dot(W[r, :], X[t, :]) for r in [r0, r1), t in [0, n_tok).
 * W: [rows][cols] in `type` blocks; act: from aotx_act_prepare(type, ...). */
int aotx_matmul_rows(int type, const void *w, int64_t cols, const void *act, int64_t n_tok,
                     float *y, int64_t ldy, int64_t r0, int64_t r1);
int aotx_matmul_rows_ref(int type, const void *w, int64_t cols, const void *act, int64_t n_tok,
                         float *y, int64_t ldy, int64_t r0, int64_t r1);
/* Which implementation aotx_matmul_rows picks on this CPU: "ref", "avx2", "avx512", "avx512vnni". */
const char *aotx_kernel_impl(int type);
/* CDEF-END */

#endif
