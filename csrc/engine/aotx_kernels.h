/* aotx_kernels.h -- tensor types (GGUF/ggml numbering) and the matrix kernels
 * the decoder runs on.  Weights stay in their GGUF block layout (row-major,
 * one row = cols/block_size blocks; the one exception: the re-blocked copy of a
 * Q8_0 / Q5_0 / Q4_0 / Q4_K / Q6_K matrix for the AVX2 tiles, aotx_pack below).  Activations are
 * converted once per matmul by aotx_act_prepare() (F32 for F32/F16/BF16 weights,
 * Q8_K32 for k-quants and IQ4_XS, Q8_0 for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL), then any number of threads run
 * aotx_matmul_rows() over disjoint row ranges.  Every fast kernel has a
 * portable reference (the *_ref functions) that the tests use as an oracle.
 *
 * Fast kernels compute the same per-block integer sums as the reference; only
 * the order of float additions may differ (k-quants: the batch-invariant fast paths
 * repeat the reference's float steps too, so they equal it bit for bit; see
 * aotx_block_q8_k32).  AOTX_KERNELS=ref in the environment (read once) forces the
 * reference everywhere.
 *
 * Buffers: W as mapped from the GGUF (2-byte aligned at least; tensor data is
 * 32-aligned); act and X 4-byte aligned (64 recommended).  No call allocates;
 * aotx_matmul_rows with n_tok > 1 uses up to 68 KiB of the caller's stack (16-row
 * chunks unpacked / transposed once, then reused for every token).  The reference and
 * AVX2 kernels are batch invariant (a token's results do not depend on n_tok, its
 * position or the row range); the AVX-512 ones only with aotx_kernel_invariant(1) /
 * AOTX_INVARIANT=1, else with n_tok > 1 the float results of different blocks may be
 * summed in another order than with n_tok == 1 (the per-block integer sums are the same).
 * Same act for all weights of one family: a Q8_0-family act serves Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0 and IQ4_NL weights of the same cols; a Q8_K32 act serves Q2_K, Q3_K, Q4_K,
 * Q5_K, Q6_K and IQ4_XS.
 */
#ifndef AOTX_KERNELS_H
#define AOTX_KERNELS_H

#include "aotx.h"

/* CDEF-BEGIN */
enum {
    AOTX_T_F32 = 0, AOTX_T_F16 = 1, AOTX_T_Q4_0 = 2, AOTX_T_Q4_1 = 3, AOTX_T_Q5_0 = 6,
    AOTX_T_Q5_1 = 7, AOTX_T_Q8_0 = 8, AOTX_T_Q2_K = 10, AOTX_T_Q3_K = 11, AOTX_T_Q4_K = 12,
    AOTX_T_Q5_K = 13, AOTX_T_Q6_K = 14, AOTX_T_Q8_K = 15, AOTX_T_IQ4_NL = 20, AOTX_T_IQ4_XS = 23,
    AOTX_T_BF16 = 30,

    AOTX_E_KERNEL_TYPE = -801,     /* tensor type not supported */
    AOTX_E_KERNEL_SHAPE = -802     /* cols not a multiple of the type's block size */
};

/* The ggml name of a tensor type ("Q4_1", "IQ4_XS", ...; NULL for a number ggml does not
 * name), and the names of the types the matrix kernels run, comma-separated. */
const char *aotx_type_name(int type);
const char *aotx_kernel_types(void);
/* Elements per block and bytes per block of a type (0 if unsupported). */
int64_t aotx_type_block_elems(int type);
int64_t aotx_type_block_bytes(int type);
/* Bytes of one row of `cols` elements, or a negative code. */
int64_t aotx_type_row_bytes(int type, int64_t cols);

/* Dequantize n elements (n a multiple of the block size) to float. */
int aotx_dequant_row(int type, const void *src, float *dst, int64_t n);
int aotx_dequant_row_ref(int type, const void *src, float *dst, int64_t n);

/* Activation scratch for X[n_tok][cols] against weights of `type`, in bytes
 * (or a negative code).  Token t's prepared row starts at t * aotx_act_bytes(type, cols, 1). */
int64_t aotx_act_bytes(int type, int64_t cols, int64_t n_tok);
/* Convert X[n_tok][cols] (row stride ldx floats) into `act`. */
int aotx_act_prepare(int type, const float *x, int64_t ldx, int64_t n_tok, int64_t cols, void *act);

/* Y[t*ldy + r] = dot(W[r, :], X[t, :]) for r in [r0, r1), t in [0, n_tok).
 * W: [rows][cols] in `type` blocks; act: from aotx_act_prepare(type, ...).
 * With n_tok > 1, ldy must be >= r1. */
int aotx_matmul_rows(int type, const void *w, int64_t cols, const void *act, int64_t n_tok,
                     float *y, int64_t ldy, int64_t r0, int64_t r1);
int aotx_matmul_rows_ref(int type, const void *w, int64_t cols, const void *act, int64_t n_tok,
                         float *y, int64_t ldy, int64_t r0, int64_t r1);
/* Which implementation aotx_matmul_rows picks on this CPU: "ref", "avx2", "avx512", "avx512vnni". */
const char *aotx_kernel_impl(int type);
/* Same for aotx_dequant_row. */
const char *aotx_dequant_impl(int type);
/* Re-pick the kernels for every type, capped at `impl` ("ref", "avx2", "avx512vnni"
 * or "auto" = the best this CPU runs).  For tests and benchmarks: not safe while
 * other threads run kernels.  AOTX_E_UNSUPPORTED if the CPU lacks that level. */
int aotx_kernel_force(const char *impl);
/* Batch invariance: with it, a token's results are bit-identical whatever else shares the
 * call (n_tok, its position) and however rows are split (one reduction order per row).
 * The reference and AVX2 kernels always are; the AVX-512 ones only in this mode (~10%
 * slower single-token decode).  On by AOTX_INVARIANT=1 in the environment (read once);
 * aotx_kernel_invariant(on) switches it (tests, benchmarks: not while kernels run). */
int aotx_kernel_invariant(int on);
/* A re-blocked copy of a Q8_0 / Q5_0 / Q4_0 / Q4_K / Q6_K matrix for the AVX2 tiles (the
 * output head, the body's projections): rows in groups of 8, each group's blocks (k-quants:
 * 256-column super-blocks; cols a multiple of the type's block) one sequential stream
 * of the original's bytes, no transpose or unpacking of scales per call.  Bytes it takes
 * (0: no copy for this type, or the kernels picked now do not use one); fill rows
 * [r0, r1) (r0 a multiple of 8) of it from W; aotx_matmul_rows(type, W, ...) on it, bit
 * for bit (r0 a multiple of 8), or AOTX_E_UNSUPPORTED when the kernels picked now are not
 * the ones it serves (run W). */
int64_t aotx_packed_bytes(int32_t type, int64_t rows, int64_t cols);
int aotx_pack(int32_t type, const void *w, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
              void *dst);
int aotx_matmul_packed(int32_t type, const void *pk, int64_t cols, const void *act, int64_t n_tok,
                       float *y, int64_t ldy, int64_t r0, int64_t r1);
/* 1 when the kernels this process runs now are batch invariant. */
int aotx_kernel_is_invariant(void);
/* CDEF-END */

/* ---- GGUF block layouts (public facts of the ggml formats; little-endian) ----
 * fp16 fields are IEEE binary16 bit patterns. */
#define AOTX_QK 32      /* elements per Q4_0 / Q5_0 / Q8_0 block */
#define AOTX_QK_K 256   /* elements per k-quant super-block */

typedef struct {        /* value = d * (q - 8); q = low nibble of qs[j] (j<16) or high nibble of qs[j-16] */
    uint16_t d;
    uint8_t qs[16];
} aotx_block_q4_0;
typedef struct {        /* value = d * (q - 16); q = nibble as Q4_0 | bit j of qh (u32 LE) << 4 */
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
} aotx_block_q5_0;
typedef struct {        /* value = d * qs[j] */
    uint16_t d;
    int8_t qs[32];
} aotx_block_q8_0;
typedef struct {        /* value = d * q + m; q as Q4_0's nibbles (unsigned, no offset) */
    uint16_t d;
    uint16_t m;
    uint8_t qs[16];
} aotx_block_q4_1;
typedef struct {        /* value = d * q + m; q = Q4_1's nibble | bit j of qh (u32 LE) << 4 */
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[16];
} aotx_block_q5_1;
typedef struct {        /* value = d * aotx_iq4nl_values[q]; q as Q4_0's nibbles */
    uint16_t d;
    uint8_t qs[16];
} aotx_block_iq4_nl;
/* The IQ4_NL / IQ4_XS codebook: 16 non-uniform int8 levels (public GGUF fact). */
static const int8_t aotx_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};
typedef struct {        /* 16 groups of 16: value = d*(sc_g & 15)*q - dmin*(sc_g >> 4), q 2 bits */
    uint8_t scales[16];
    uint8_t qs[64];     /* element 128h + 32k + l: bits 2k of qs[32h + l] */
    uint16_t d;
    uint16_t dmin;
} aotx_block_q2_k;
typedef struct {        /* 16 groups of 16: value = d * (sc_g - 32) * q, q = 2 low bits -
                         * 4 * (bit clear in hmask), in [-4, 3]; sc_g 6 bits packed */
    uint8_t hmask[32];  /* element 32i + l: bit i of hmask[l] */
    uint8_t qs[64];     /* as Q2_K's */
    uint8_t scales[12]; /* sc_g: bits 4(g/8).. of byte g%8 (4), bits 2(g/4).. of byte 8+g%4 (2) */
    uint16_t d;
} aotx_block_q3_k;
typedef struct {        /* 8 sub-blocks of 32: value = d * (ls_j - 32) * aotx_iq4nl_values[q] */
    uint16_t d;
    uint16_t scales_h;  /* bits 2j, 2j+1: ls_j's high 2 bits */
    uint8_t scales_l[4];/* nibble j of the 4 bytes (low first): ls_j's low 4 bits */
    uint8_t qs[128];    /* sub-block j: 16 bytes at 16j, low nibbles elements 0..15 */
} aotx_block_iq4_xs;
typedef struct {        /* 8 sub-blocks of 32: value = d*sc[j]*q - dmin*m[j] (6-bit sc/m packed) */
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qs[128];    /* [4 pairs][32]: low nibbles = sub-block 2p, high = 2p+1 */
} aotx_block_q4_k;
typedef struct {        /* as Q4_K with a 5th bit: bit j of qh[l] for sub-block j, element l */
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
} aotx_block_q5_k;
typedef struct {        /* 16 groups of 16: value = d * scales[g] * (q - 32), q 6 bits */
    uint8_t ql[128];    /* [2 halves][64] */
    uint8_t qh[64];     /* [2 halves][32], 2 bits per 32-element quarter */
    int8_t scales[16];
    uint16_t d;
} aotx_block_q6_k;
typedef struct {        /* ggml's Q8_K (a tensor type here; not our activation format) */
    float d;
    int8_t qs[256];
    int16_t bsums[16];  /* sum of each 16 consecutive qs */
} aotx_block_q8_k;

/* Our activation layout for Q4_K / Q5_K / Q6_K products, "Q8_K32" (in memory only, never
 * on disk): per 256 values, Q8_K's int8 quants and 16-sums but one float scale per 32
 * values, so that one outlier coarsens only its 32 values (ffn_down's input gelu(g) * up
 * has such outliers: per 256 they were the largest error of the whole forward pass).
 * Each 32-block is quantized exactly as a Q8_0-family block (d = max|x| / 127, q =
 * round-half-even(x / d)), so x ~= d[j] * qs[32j + l].
 *
 * The products, per row and token, per super-block i in order (fma = one rounding; the
 * reference does these float steps and the batch-invariant fast kernels repeat them, so
 * they give its bits):
 *   Q4_K / Q5_K (w = d*sc_j*q - dmin*m_j): S_j = sum_32 q * x_q (int), then
 *     F = 0; for j < 8: F = fma(float(sc_j * S_j), d[j], F)      (sc_j * S_j < 2^24: exact)
 *     G = 0; for j < 8: G = fma(float(m_j), dm[j], G)
 *     r = fma(F, d_w, -(G * dmin_w))
 *     y = r for the first super-block, y + r for each later one;
 *   Q6_K (w = d*sc_g*(q - 32), 16 groups of 16): T_j = sum over the 32 values of sc_g *
 *     (q - 32) * x_q (int, |T_j| < 2^24: exact in float), then
 *     F = 0; for j < 8: F = fma(float(T_j), d[j], F)
 *     y = F * d_w for the first super-block, fma(F, d_w, y) for each later one;
 *   Q2_K / Q3_K / IQ4_XS (w = d * sc_g * q - dmin * m_g over groups g of 16; IQ4_XS: both
 *     groups of a 32-block share ls_j - 32, q its codebook level; Q3_K, IQ4_XS: no mins):
 *     S_g = sum_16 q * x_q, T_j = sc_2j * S_2j + sc_2j+1 * S_2j+1, M_j = m_2j * bsums[2j]
 *     + m_2j+1 * bsums[2j+1] (ints), then
 *     F = 0; for j < 8: F = fma(float(T_j), d[j], F)
 *     G = 0; for j < 8: G = fma(float(M_j), d[j], G)       (Q2_K only)
 *     r = fma(F, d_w, -(G * dmin_w)) (Q2_K), F * d_w (Q3_K, IQ4_XS)
 *     y = r for the first super-block, y + r for each later one.
 *   Their fast kernels compute the same integers but sum the float terms per sub-block lane
 *   (an ulp-level difference, batch invariant all the same). */
typedef struct {
    int8_t qs[256];     /* x_q in [-127, 127] */
    float d[8];         /* scale of each 32 values */
    float dm[8];        /* d[j] * (bsums[2j] + bsums[2j + 1]) (rounded once): the mins' term */
    int16_t bsums[16];  /* sum of each 16 consecutive qs (Q6_K's -32 offset) */
} aotx_block_q8_k32;

/* Our activation layout for Q4_0/Q5_0/Q8_0 products (and Q4_1/Q5_1/IQ4_NL: in memory only,
 * never on disk): per token, ceil(nb/2) pairs of 32-element blocks, 128 bytes a pair:
 *   bytes   0..63   xu[64]: x_q + 128 as uint8 (x_q in [-127, 127]), blocks 2p, 2p+1
 *   bytes  64..127  float dx[16]: block 2p's scale 8 times, then block 2p+1's 8 times
 * x ~= dx * x_q.  An odd last block leaves the pair's second half as x_q = 0, dx = 0.
 * Per block (the reference's float steps; the fast kernels sum in another order):
 *   Q4_0 / Q5_0 / Q8_0 / IQ4_NL (w = d_w * v): S = sum v * x_q, y += d_w * dx * S;
 *   Q4_1 / Q5_1 (w = d_w * q + m_w): S = sum q * x_q, X = sum x_q (no per-block sum is
 *   stored: the kernels take it from the quants), y += d_w * dx * S + m_w * dx * X.
 * The kernels load 64 quants and 16 per-lane scales with one load each. */
#define AOTX_ACT8_PAIR_BYTES 128
static inline const uint8_t *aotx_act8_xu(const uint8_t *row, int64_t blk) {
    return row + (blk >> 1) * AOTX_ACT8_PAIR_BYTES + (blk & 1) * 32;
}
static inline const float *aotx_act8_dx(const uint8_t *row, int64_t blk) {
    return (const float *)(row + (blk >> 1) * AOTX_ACT8_PAIR_BYTES + 64 + (blk & 1) * 32);
}

AOTX_STATIC_ASSERT(sizeof(aotx_block_q4_0) == 18, "q4_0 block is 18 bytes");
AOTX_STATIC_ASSERT(sizeof(aotx_block_q5_0) == 22, "q5_0 block is 22 bytes");
AOTX_STATIC_ASSERT(sizeof(aotx_block_q8_0) == 34, "q8_0 block is 34 bytes");
AOTX_STATIC_ASSERT(sizeof(aotx_block_q4_1) == 20, "q4_1 block is 20 bytes");
AOTX_STATIC_ASSERT(sizeof(aotx_block_q5_1) == 24, "q5_1 block is 24 bytes");
AOTX_STATIC_ASSERT(sizeof(aotx_block_iq4_nl) == 18, "iq4_nl block is 18 bytes");
AOTX_STATIC_ASSERT(sizeof(aotx_block_q2_k) == 84, "q2_k block is 84 bytes");
AOTX_STATIC_ASSERT(sizeof(aotx_block_q3_k) == 110, "q3_k block is 110 bytes");
AOTX_STATIC_ASSERT(sizeof(aotx_block_iq4_xs) == 136, "iq4_xs block is 136 bytes");
AOTX_STATIC_ASSERT(sizeof(aotx_block_q4_k) == 144, "q4_k block is 144 bytes");
AOTX_STATIC_ASSERT(sizeof(aotx_block_q5_k) == 176, "q5_k block is 176 bytes");
AOTX_STATIC_ASSERT(sizeof(aotx_block_q6_k) == 210, "q6_k block is 210 bytes");
AOTX_STATIC_ASSERT(sizeof(aotx_block_q8_k) == 292, "q8_k block is 292 bytes");
AOTX_STATIC_ASSERT(sizeof(aotx_block_q8_k32) == 352, "q8_k32 block is 352 bytes");

/* ---- internal to quant*.c (not part of the cffi surface) ---- */
/* A matmul kernel: W rows [r0, r1) (row_bytes apart) against n_tok prepared
 * activation rows (act_stride bytes apart). Arguments already validated. */
typedef void (*aotx_mm_fn)(const uint8_t *w, size_t row_bytes, int64_t nb, const uint8_t *act,
                           size_t act_stride, int64_t n_tok, float *y, int64_t ldy, int64_t r0,
                           int64_t r1);
/* A dequantizer of nb blocks. */
typedef void (*aotx_dq_fn)(const uint8_t *src, float *dst, int64_t nb);
/* Activation quantizers of one row (Q8_0-family pairs / Q8_K32 blocks); the fast ones
 * produce the same bytes as quant.c's. */
typedef void (*aotx_act8_fn)(const float *x, int64_t cols, uint8_t *out);
typedef void (*aotx_act8k_fn)(const float *x, int64_t cols, aotx_block_q8_k32 *out);

/* quant_x86.c: the fastest kernels up to max_level this CPU runs for `type`
 * (NULL outputs when none). */
void aotx_x86_pick_act(int max_level, aotx_act8_fn *q8_0, aotx_act8k_fn *q8_k);
enum { AOTX_LEVEL_REF = 0, AOTX_LEVEL_AVX2 = 1, AOTX_LEVEL_AVX512VNNI = 2 };
/* The highest level this CPU runs. */
int aotx_x86_level(void);
/* invariant: batch-invariant kernels even where they cost speed (AVX-512: n_tok == 1 in
 * the tiles' float order); the AVX2 and reference kernels always are. */
void aotx_x86_pick(int type, int max_level, int invariant, aotx_mm_fn *mm, const char **mm_name,
                   aotx_dq_fn *dq, const char **dq_name);

static inline float aotx_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    union { uint32_t u; float f; } v;
    if (exp == 0) {
        v.f = (float)man * 0x1p-24f;      /* zero or subnormal: exact */
        v.u |= sign;
        return v.f;
    }
    if (exp == 31)
        bits = sign | 0x7f800000u | (man << 13);
    else
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    v.u = bits;
    return v.f;
}

/* Q3_K group g's 6-bit scale minus 32; IQ4_XS sub-block j's ls_j - 32 */
static inline int aotx_q3k_scale(const uint8_t *scales, int g) {
    int lo = (scales[g % 8] >> (4 * (g / 8))) & 0x0f, hi = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
    return (lo | hi << 4) - 32;
}
static inline int aotx_iq4xs_scale(const aotx_block_iq4_xs *b, int j) {
    return (((b->scales_l[j / 2] >> (4 * (j % 2))) & 0x0f) | ((b->scales_h >> (2 * j)) & 3) << 4) - 32;
}

static inline float aotx_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}

#endif
