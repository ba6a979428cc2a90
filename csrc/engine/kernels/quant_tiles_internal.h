/* quant_tiles_internal.h -- the AVX2 register-tile kernels (quant_avx2_tiles.c)
 * as quant_x86.c's picker uses them.  Not part of the cffi surface.
 *
 * Both run every n_tok (1 included): a row's float reduction order is fixed by the
 * row and K alone (per block or sub-block in order, K slabs of 32 blocks / one
 * super-block at a time), never by how many tokens share the call or where a token
 * sits in it, so a sequence's results do not depend on the batch (batch invariance). */
#ifndef AOTX_QUANT_TILES_INTERNAL_H
#define AOTX_QUANT_TILES_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* Q8_0-activation family (Q4_1 / Q5_1: no re-blocked copies) */
enum { AOTX_TK_Q4_0 = 0, AOTX_TK_Q5_0 = 1, AOTX_TK_Q8_0 = 2, AOTX_TK_Q4_1 = 3, AOTX_TK_Q5_1 = 4 };
enum { AOTX_TK_Q4_K = 0, AOTX_TK_Q6_K = 1 };                    /* Q8_K family */

/* The aotx_mm_fn contract (aotx_kernels.h) plus the weight kind. */
void aotx_avx2_q8fam_tiles(int kind, const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act,
                           size_t as, int64_t n_tok, float *y, int64_t ldy, int64_t r0,
                           int64_t r1);
void aotx_avx2_k_tiles(int kind, const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act,
                       size_t as, int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1);

/* Bytes before a re-blocked copy's groups: a header naming its layout (quant_x86.c). */
#define AOTX_PK_HEAD 64

/* The re-blocked copies' common walk (quant_avx2_tiles.c): groups [g0, g1) of gr rows,
 * per group nb blocks of pb bytes (zeroed first: missing rows stay zeros), row r of block
 * b filled by fill(kind, gr, the block, the row's original block of bb bytes, r). */
typedef void aotx_pack_row_fn(int kind, int gr, uint8_t *o, const uint8_t *p, int r);
void aotx_pack_groups(int kind, int gr, aotx_pack_row_fn *fill, const uint8_t *w, size_t rb,
                      size_t bb, size_t pb, int64_t nb, int64_t rows, int64_t g0, int64_t g1,
                      uint8_t *dst);
/* The Q4_0 / Q5_0 copies' row filler for groups of gr rows (kind AOTX_TK_Q4_0 / _Q5_0):
 * 2 gr bytes of fp16 scales, 4 vectors of 4 gr bytes (vector n, byte 4r + i: quant 4n + i
 * in the low nibble, 4(n + 4) + i in the high one), Q5_0: 4 gr bytes of fifth bits (byte
 * 4r + i bit g: quant 4g + i's). */
void aotx_q45_pack_row(int kind, int gr, uint8_t *o, const uint8_t *p, int r);
/* The Q4_K / Q6_K copies' row filler for groups of gr rows (kind AOTX_TK_Q4_K / _Q6_K),
 * vectors of 4 gr bytes, lane r at byte 4r: Q4_K: the dwords at bytes 0, 4, 8, 12 (4
 * vectors), then the qs dwords (32); Q6_K: 2 gr bytes of fp16 d, the scale dwords at
 * 192 .. 204 (4 vectors), then per half h the dwords of ql[64h ..], ql[64h + 32 ..] and
 * qh[32h ..] (8 vectors each). */
void aotx_k_pack_row(int kind, int gr, uint8_t *o, const uint8_t *p, int r);

/* Q8_0 re-blocked copy (quant_avx2_tiles.c): groups of 8 rows, AOTX_Q8P_BLOCK bytes per
 * group and block; aotx_avx2_q8_0_pack fills groups [g0, g1) of dst (ceil(rows / 8)
 * groups of nb blocks); aotx_avx2_q8_0_packed is aotx_avx2_q8fam_tiles(Q8_0) on it (r0 a
 * multiple of 8), bit for bit. */
#define AOTX_Q8P_BLOCK 272
void aotx_avx2_q8_0_pack(const uint8_t *w, size_t rb, int64_t nb, int64_t rows, int64_t g0,
                         int64_t g1, uint8_t *dst);
void aotx_avx2_q8_0_packed(const uint8_t *pk, int64_t nb, const uint8_t *act, size_t as,
                           int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1);

/* Q4_0 / Q5_0 re-blocked copies (the same file; kind AOTX_TK_Q4_0 / AOTX_TK_Q5_0): groups
 * of 8 rows, AOTX_Q4P_BLOCK / AOTX_Q5P_BLOCK bytes per group and block (the original's
 * bytes); aotx_avx2_q45_packed is aotx_avx2_q8fam_tiles(kind) on it, bit for bit. */
#define AOTX_Q4P_BLOCK 144
#define AOTX_Q5P_BLOCK 176
void aotx_avx2_q45_pack(int kind, const uint8_t *w, size_t rb, int64_t nb, int64_t rows, int64_t g0,
                        int64_t g1, uint8_t *dst);
void aotx_avx2_q45_packed(int kind, const uint8_t *pk, int64_t nb, const uint8_t *act, size_t as,
                          int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1);

/* Q4_K / Q6_K re-blocked copies (the same file; kind AOTX_TK_Q4_K / AOTX_TK_Q6_K): groups
 * of 8 rows, AOTX_Q4KP_BLOCK / AOTX_Q6KP_BLOCK bytes per group and 256-column super-block
 * (the original's bytes); aotx_avx2_k_pack fills groups [g0, g1) of dst; aotx_avx2_k_packed
 * is aotx_avx2_k_tiles(kind) on it (r0 a multiple of 8), bit for bit. */
#define AOTX_Q4KP_BLOCK 1152
#define AOTX_Q6KP_BLOCK 1680
void aotx_avx2_k_pack(int kind, const uint8_t *w, size_t rb, int64_t nb, int64_t rows, int64_t g0,
                      int64_t g1, uint8_t *dst);
void aotx_avx2_k_packed(int kind, const uint8_t *pk, int64_t nb, const uint8_t *act, size_t as,
                        int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1);

/* Prefetch of a later chunk of weight rows while the current chunk is worked on: its
 * bytes (from next; 0 past the row range) cut into one slice of whole cache lines per
 * block of the current chunk, slice b fetched while block b is multiplied. */
typedef struct {
    const uint8_t *next;
    size_t bytes, step;
} aotx_pf_plan;

static inline aotx_pf_plan aotx_pf_span(const uint8_t *next, size_t bytes, int64_t nb) {
    aotx_pf_plan p = {next, bytes, (bytes / (size_t)nb + 63) / 64 * 64};
    return p;
}

/* rows [pa, min(pa + tr, r1)) of w (rb bytes each), over the current chunk's nb blocks */
static inline aotx_pf_plan aotx_pf_rows(const uint8_t *w, size_t rb, int64_t pa, int64_t r1,
                                        int64_t tr, int64_t nb) {
    const int64_t nn = r1 - pa < tr ? r1 - pa : tr;
    return aotx_pf_span(w + (size_t)pa * rb, nn > 0 ? (size_t)nn * rb : 0, nb);
}

/* slice b of plan pl, with _mm_prefetch's hint (a constant: _MM_HINT_T0 / _MM_HINT_T1) */
#define AOTX_PF_SLICE(pl, b, hint)                                                       \
    for (size_t o_ = 0, pf_ = (size_t)(b) * (pl).step; o_ < (pl).step && pf_ + o_ < (pl).bytes; \
         o_ += 64)                                                                      \
        _mm_prefetch((const char *)(pl).next + pf_ + o_, (hint))

#endif
