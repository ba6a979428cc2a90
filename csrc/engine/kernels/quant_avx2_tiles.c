/* quant_avx2_tiles.c -- AVX2 + FMA register tiles for Q4_0 / Q5_0 / Q8_0 (x Q8_0
 * activations) and Q4_K / Q6_K (x Q8_K32), every n_tok.  Compiled under its own
 * `#pragma GCC target`; quant_x86.c picks them when the CPU runs AVX2 (and the cap
 * allows no more).
 *
 * Lanes = rows: a chunk of 8 weight rows is transposed once per K slab into one
 * 256-bit vector per 4 quants (dword g of each row in lane r), and a token's
 * activation quants are broadcast 4 at a time, so that maddubs (unsigned weight x
 * signed activation, pairs summed in int16) + madd(1) give all 8 rows' sums at once.
 * Per block and token the float work is one conversion and one FMA for 8 rows.
 *   Q4_0 / Q5_0: u = the raw quant (0..15 / 0..31); four maddubs are summed in int16
 *     (|sum| <= 8 * 31 * 127 < 32768) and the offset comes back as a per-token seed
 *     -c * sum(x_q), c = 8 / 16: the block's integer sum is the reference's exactly.
 *     Q4_1 / Q5_1 likewise with c = 0, and per block and token one more FMA adds
 *     m_w * (d_x * sum x_q), the mins' term.
 *   Q8_0 tiles: int16 pairs, no sign step: each row's dword g (quants 4g .. 4g + 3) is
 *     sign-extended into two int16-pair lanes (4g, 4g + 2) and (4g + 1, 4g + 3), the
 *     activation staged as int16 in the same pair order, so one madd (|pair| <= 2 * 128 *
 *     127) + one add per 2 quants x 8 rows (the sign trick costs a psignb on the same
 *     ports per 4 quants); n_tok == 1 runs q8_0_rows1 (maddubs(|w|, sign(x_q, w)), rows as
 *     stored): the same exact integer block sums, so the same bits.
 *   Q4_K: per 32-element sub-block 8 maddubs in int16 (<= 16 * 15 * 127), times its
 *     scale by madd: sc_j * S_j exact in int32, converted (exact, < 2^24) and scaled by the
 *     activation's own d[j] (Q8_K32: one scale per 32 values) in an FMA chain; the mins
 *     as a float chain of m_j * dm[j] (dm[j] = d[j] * the 32 quants' sum, in the act).
 *   Q6_K: per 16-element sub-block two int16 pairs of maddubs (<= 4 * 63 * 127), times
 *     the int8 scale by madd, two per 32 values; the -32 offset as 32 (sc, sc) . (bsum,
 *     bsum) (madd): T_j exact in int32, then the same FMA chain with d[j].
 * Reduction order per row (the same for every n_tok and every token position):
 *   Q8_0 family: f = fma(sum_b, d_w * d_x, f) over the blocks of each K slab of 32
 *     blocks in order; y = f for the first slab, y + f for each later one.
 *   k-quants: per super-block in order, per 32-value sub-block in order within it (see
 *     ktile_dot: the reference's float steps, so the reference's bits); Q6_K with n_tok
 *     == 1 runs q6_k_row1, rows as stored with the same integer sums and float steps.
 * The Q8_0 output head can also run from a re-blocked copy made at load
 * (aotx_avx2_q8_0_pack: the tile's int8 layout stored once, 8 rows per sequential
 * stream), the Q8_0 tile's integer sums and float steps again: the same bits.
 */
#include "aotx_kernels.h"
#include "quant_tiles_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#define AI static inline __attribute__((always_inline))
/* tile_act is called from several instantiations with constant kinds;
 * GCC 12's -O3 clones of tile_act specialised on the seed constant (tile_act.constprop.N)
 * wrote the tile buffer at wrong addresses once q45_packed also called it (the Q4_0 /
 * Q5_0 tiles returned ~1e32; tests/test_kernels.py caught it): no clones. */
#define NOCLONE __attribute__((noinline, noclone))
#define TR 8                /* rows per tile: the 8 int32 lanes */
#define TT 4                /* tokens per tile (16 vector registers) */
#define KB 32               /* blocks per K slab (1024 columns) */
#define ACTB (20 * 1024)    /* bytes of signed activation quants per slab */
#define PFC 2               /* weight prefetch distance in 8-row chunks */
#define PFT 6               /* the same for q8fam_tiles, into L2 (_MM_HINT_T1): the prefetches
                             * come in a burst per chunk, and to L1 they stall (measured: +10-20%
                             * at 8 tokens on the 262144-row head) */
#define KSL 8               /* super-blocks per scale staging slab */
#define HAS_MIN(kind) ((kind) == AOTX_TK_Q4_1 || (kind) == AOTX_TK_Q5_1)
#define HAS_QH(kind) ((kind) == AOTX_TK_Q5_0 || (kind) == AOTX_TK_Q5_1)
/* byte offsets in a block of the nibbles and of the fifth bits */
#define QS_OFF(kind) \
    ((kind) == AOTX_TK_Q5_0 ? 6 : (kind) == AOTX_TK_Q4_1 ? 4 : (kind) == AOTX_TK_Q5_1 ? 8 : 2)
#define QH_OFF(kind) ((kind) == AOTX_TK_Q5_1 ? 4 : 2)
#define SEED_C(kind) ((kind) == AOTX_TK_Q5_0 ? 16 : (kind) == AOTX_TK_Q4_0 ? 8 : 0)

typedef struct {
    __m256i q[KB][8];       /* [block][dword g] lane r: 4 unsigned quants of row r */
    __m256i s[KB][8];       /* Q8_0: the signed weights (their signs) */
    __m256 dw[KB];          /* [block] weight scales per row */
    __m256 mw[KB];          /* [block] Q4_1 / Q5_1 mins per row */
    union {
        int8_t xq[ACTB];        /* [token][block][32] signed x_q (Q4_0 / Q5_0) */
        int16_t x16[ACTB];      /* Q8_0: [token][block][32] x_q as int16, in pair order */
    };
    int32_t sd[ACTB / 32];  /* [token][block] seed -c * sum x_q */
    float dx[ACTB / 32];    /* [token][block] activation scale */
    float dxs[ACTB / 32];   /* [token][block] dx * sum x_q (Q4_1 / Q5_1's mins' term) */
} tiles8;                   /* ~68 KiB, on the caller's stack */

AI __m256i row_mask(int nr) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* y[(t0 + t) * ldy + r] = f[t][r] (+= with accum) for t < nt, r < nr (<= TR rows). */
AI void store_tile(__m256 *f, int nt, float *y, int64_t t0, int64_t ldy, int nr, int accum) {
    const __m256i m = row_mask(nr);
    for (int t = 0; t < nt; t++) {
        float *yt = y + (t0 + t) * ldy;
        if (nr == TR) {
            if (accum) f[t] = _mm256_add_ps(f[t], _mm256_loadu_ps(yt));
            _mm256_storeu_ps(yt, f[t]);
        } else {
            if (accum) f[t] = _mm256_add_ps(f[t], _mm256_maskload_ps(yt, m));
            _mm256_maskstore_ps(yt, m, f[t]);
        }
    }
}

AI __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Lane r = the dword at base + vidx[r] (rows rb apart: one gather, no staging). */
AI __m256i gather4(const uint8_t *base, __m256i vidx) {
    return _mm256_i32gather_epi32((const int *)(const void *)base, vidx, 1);
}

/* The low (hi = 0) or high (hi = 1) fp16 of each dword lane, as float. */
AI __m256 half_to_ps(__m256i g, int hi) {
    const __m256i pick = hi ? _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1,
                                               2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1)
                            : _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                               0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i p = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(g, pick), 0x08);
    return _mm256_cvtph_ps(_mm256_castsi256_si128(p));
}

/* Byte offsets of the chunk's rows from row 0 (missing rows repeat row 0). */
AI __m256i row_index(size_t rb, int64_t nr) {
    int32_t ix[TR];
    for (int r = 0; r < TR; r++) ix[r] = r < nr ? (int32_t)((size_t)r * rb) : 0;
    return _mm256_loadu_si256((const __m256i *)ix);
}

/* out[g] lane r = dword g of the 16 bytes at rows[r] + off (g < 4). */
AI void tr8x4(const uint8_t *const *rows, size_t off, __m256i *out) {
    __m256i z[4];
    for (int i = 0; i < 4; i++)
        z[i] = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(rows[i] + off))),
            _mm_loadu_si128((const __m128i *)(rows[i + 4] + off)), 1);
    /* z[i] = [row i | row i + 4]: a 4x4 dword transpose in each 128-bit half */
    __m256i t0 = _mm256_unpacklo_epi32(z[0], z[1]), t1 = _mm256_unpackhi_epi32(z[0], z[1]);
    __m256i t2 = _mm256_unpacklo_epi32(z[2], z[3]), t3 = _mm256_unpackhi_epi32(z[2], z[3]);
    out[0] = _mm256_unpacklo_epi64(t0, t2);
    out[1] = _mm256_unpackhi_epi64(t0, t2);
    out[2] = _mm256_unpacklo_epi64(t1, t3);
    out[3] = _mm256_unpackhi_epi64(t1, t3);
}

AI uint16_t ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* the fp16 scales at byte off of rows[0..7], as floats (gathered by inserts: staged
 * through memory by scalar stores they cost a failed store-to-load forwarding) */
AI __m256 rows_dw(const uint8_t *const *rows, size_t off) {
    return _mm256_cvtph_ps(_mm_setr_epi16(
        (short)ld16(rows[0] + off), (short)ld16(rows[1] + off), (short)ld16(rows[2] + off),
        (short)ld16(rows[3] + off), (short)ld16(rows[4] + off), (short)ld16(rows[5] + off),
        (short)ld16(rows[6] + off), (short)ld16(rows[7] + off)));
}

AI uint32_t ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ------------------------------------------------------- Q4_0 / Q5_0 / Q8_0 */

/* The slab's activations: tokens [0, ts) x blocks [k0, k0 + kn). */
NOCLONE static void tile_act(const uint8_t *act, size_t as, int64_t ts, int64_t k0, int64_t kn, int32_t c,
                     int q8, tiles8 *tb) {
    const __m256i c80 = _mm256_set1_epi8((char)0x80);
    for (int64_t t = 0; t < ts; t++) {
        const uint8_t *row = act + (size_t)t * as;
        for (int64_t b = 0; b < kn; b++) {
            __m256i xu = _mm256_loadu_si256((const __m256i *)aotx_act8_xu(row, k0 + b));
            __m256i s4 = _mm256_sad_epu8(xu, _mm256_setzero_si256());  /* sum (x_q + 128) */
            __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
            int32_t sum = (int32_t)(_mm_cvtsi128_si32(s2) + _mm_extract_epi32(s2, 2)) - 32 * 128;
            const __m256i xs = _mm256_xor_si256(xu, c80);
            if (q8) {  /* Q8_0: see tile_weights' int16 pairs */
                /* dword 2g + 0 = (x[4g], x[4g + 2]), dword 2g + 1 = (x[4g + 1], x[4g + 3]) */
                const __m256i ev = _mm256_srai_epi16(_mm256_slli_epi16(xs, 8), 8);
                const __m256i od = _mm256_srai_epi16(xs, 8);
                /* ev dword g = (x[4g], x[4g+2]); interleave dwords of ev and od */
                int16_t *o = tb->x16 + (t * kn + b) * 32;
                const __m256i lo = _mm256_unpacklo_epi32(ev, od), hi = _mm256_unpackhi_epi32(ev, od);
                _mm256_storeu_si256((__m256i *)o, _mm256_permute2x128_si256(lo, hi, 0x20));
                _mm256_storeu_si256((__m256i *)(o + 16), _mm256_permute2x128_si256(lo, hi, 0x31));
            } else {
                _mm256_storeu_si256((__m256i *)(tb->xq + (t * kn + b) * 32), xs);
            }
            tb->sd[t * kn + b] = -c * sum;
            tb->dx[t * kn + b] = *aotx_act8_dx(row, k0 + b);
            tb->dxs[t * kn + b] = tb->dx[t * kn + b] * (float)sum;
        }
    }
}

/* Rows rows[0..7] (pointers to each row's block k0), kn blocks: transpose into tb. */
static void tile_weights(int kind, size_t bbytes, const uint8_t *const *rows, int64_t kn,
                         const uint8_t *next, size_t next_bytes, tiles8 *tb) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), c10 = _mm256_set1_epi8(0x10);
    const __m256i rep0 = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                                          0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    const __m256i bit_lo = _mm256_set1_epi32(0x08040201), bit_hi = _mm256_set1_epi32((int)0x80402010u);
    const aotx_pf_plan pl = aotx_pf_span(next, next_bytes, kn);
    for (int64_t b = 0; b < kn; b++) {
        const size_t off = (size_t)b * bbytes;
        AOTX_PF_SLICE(pl, b, _MM_HINT_T1);
        /* the rows' scales (and Q5_0 high bits) gathered by inserts (rows_dw) */
        tb->dw[b] = rows_dw(rows, off);
        if (HAS_MIN(kind)) tb->mw[b] = rows_dw(rows, off + 2);
        __m256i *q = tb->q[b];
        if (kind == AOTX_TK_Q8_0) {
            __m256i *s = tb->s[b];
            __m256i t8[8];
            tr8x4(rows, off + 2, t8);
            tr8x4(rows, off + 18, t8 + 4);
            /* int16 pairs per row lane: q[g] = (w[4g], w[4g + 2]), s[g] = (w[4g + 1], w[4g + 3]) */
            for (int g = 0; g < 8; g++) {
                q[g] = _mm256_srai_epi16(_mm256_slli_epi16(t8[g], 8), 8);
                s[g] = _mm256_srai_epi16(t8[g], 8);
            }
            continue;
        }
        /* packed byte j: low nibble = element j, high = element j + 16 */
        __m256i p[4];
        tr8x4(rows, off + QS_OFF(kind), p);
        for (int g = 0; g < 4; g++) {
            q[g] = _mm256_and_si256(p[g], m4);
            q[g + 4] = _mm256_and_si256(_mm256_srli_epi16(p[g], 4), m4);
        }
        if (HAS_QH(kind)) {
            /* byte i of dword g (element 4g + i) gets bit 4g + i of the row's qh:
             * byte g / 2 of qh, bit 4 (g & 1) + i */
            const size_t ho = off + QH_OFF(kind);
            const __m256i h = _mm256_setr_epi32(
                (int)ld32(rows[0] + ho), (int)ld32(rows[1] + ho), (int)ld32(rows[2] + ho),
                (int)ld32(rows[3] + ho), (int)ld32(rows[4] + ho), (int)ld32(rows[5] + ho),
                (int)ld32(rows[6] + ho), (int)ld32(rows[7] + ho));
            for (int g = 0; g < 8; g++) {
                __m256i rep = _mm256_shuffle_epi8(h, _mm256_add_epi8(rep0, _mm256_set1_epi8((char)(g / 2))));
                const __m256i bits = (g & 1) ? bit_hi : bit_lo;
                __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(rep, bits), bits);
                q[g] = _mm256_or_si256(q[g], _mm256_and_si256(set, c10));
            }
        }
    }
}

/* One tile: 8 rows (lanes) x nt tokens over the slab's kn blocks, y rows [0, nr). */
AI void tile_dot(int kind, const tiles8 *tb, int64_t kn, int64_t t0, int nt, float *y, int64_t ldy,
                 int nr, int accum) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 f[TT];
    for (int t = 0; t < nt; t++) f[t] = _mm256_setzero_ps();
    const size_t ts = (size_t)kn * 32;  /* bytes between two tokens' quants */
    for (int64_t b = 0; b < kn; b++) {
        const int8_t *xq = tb->xq + (t0 * kn + b) * 32;
        __m256i a[TT];
        for (int t = 0; t < nt; t++) a[t] = _mm256_set1_epi32(tb->sd[(t0 + t) * kn + b]);
        if (kind == AOTX_TK_Q8_0) {
            /* int16 x int16 pairs (|pair| <= 2 * 128 * 127): one madd + one add per
             * 2 quants x 8 rows, no sign step; x16 holds the pairs in the same order */
            const int16_t *x16 = tb->x16 + (t0 * kn + b) * 32;
            for (int g = 0; g < 8; g++) {
                const __m256i we = _mm256_load_si256(&tb->q[b][g]);
                const __m256i wo = _mm256_load_si256(&tb->s[b][g]);
                for (int t = 0; t < nt; t++) {
                    const int16_t *xt = x16 + t * ts + 4 * g;
                    a[t] = _mm256_add_epi32(a[t], _mm256_madd_epi16(we, bcast4((const int8_t *)xt)));
                    a[t] = _mm256_add_epi32(a[t], _mm256_madd_epi16(wo, bcast4((const int8_t *)(xt + 2))));
                }
            }
        } else {
            /* per half block: 4 maddubs summed in int16 (exact, see the header), written
             * out with constant bounds: GCC 12 made early exits and spills of the loops */
            for (int h = 0; h < 2; h++) {
                const __m256i *wq = tb->q[b] + 4 * h;
                const __m256i w0 = _mm256_load_si256(wq), w1 = _mm256_load_si256(wq + 1);
                const __m256i w2 = _mm256_load_si256(wq + 2), w3 = _mm256_load_si256(wq + 3);
                for (int t = 0; t < nt; t++) {
                    const int8_t *xt = xq + t * ts + 16 * h;
                    __m256i s = _mm256_maddubs_epi16(w0, bcast4(xt));
                    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w1, bcast4(xt + 4)));
                    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w2, bcast4(xt + 8)));
                    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w3, bcast4(xt + 12)));
                    a[t] = _mm256_add_epi32(a[t], _mm256_madd_epi16(s, ones));
                }
            }
        }
        const __m256 dw = tb->dw[b];
        for (int t = 0; t < nt; t++)
            f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[t]),
                                   _mm256_mul_ps(dw, _mm256_set1_ps(tb->dx[(t0 + t) * kn + b])), f[t]);
        if (HAS_MIN(kind))
            for (int t = 0; t < nt; t++)
                f[t] = _mm256_fmadd_ps(tb->mw[b], _mm256_set1_ps(tb->dxs[(t0 + t) * kn + b]), f[t]);
    }
    store_tile(f, nt, y, t0, ldy, nr, accum);
}

/* Tokens [0, ts) of a staged chunk in groups of TT (constant nt per instantiation). */
AI void tile_tokens(int kind, const tiles8 *tb, int64_t kn, int64_t ts, float *yc, int64_t ldy,
                    int nr, int accum) {
    for (int64_t tg = 0; tg < ts; tg += TT) {
        switch (ts - tg < TT ? ts - tg : TT) {
        case 4: tile_dot(kind, tb, kn, tg, 4, yc, ldy, nr, accum); break;
        case 3: tile_dot(kind, tb, kn, tg, 3, yc, ldy, nr, accum); break;
        case 2: tile_dot(kind, tb, kn, tg, 2, yc, ldy, nr, accum); break;
        default: tile_dot(kind, tb, kn, tg, 1, yc, ldy, nr, accum); break;
        }
    }
}

AI void q8fam_tiles(int kind, const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act,
                    size_t as, int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    tiles8 tiles, *tb = &tiles;
    const size_t bbytes = rb / (size_t)nb;
    const int32_t c = SEED_C(kind);
    for (int64_t k0 = 0; k0 < nb; k0 += KB) {
        const int64_t kn = nb - k0 < KB ? nb - k0 : KB;
        const int64_t ts_max = ACTB / (kn * 32);
        for (int64_t s0 = 0; s0 < n_tok; s0 += ts_max) {
            const int64_t ts = n_tok - s0 < ts_max ? n_tok - s0 : ts_max;
            tile_act(act + (size_t)s0 * as, as, ts, k0, kn, c, kind == AOTX_TK_Q8_0, tb);
            for (int64_t rc = r0; rc < r1; rc += TR) {
                const int64_t nr = r1 - rc < TR ? r1 - rc : TR;
                const uint8_t *rows[TR];
                for (int r = 0; r < TR; r++)  /* missing rows repeat the first */
                    rows[r] = w + (size_t)(rc + (r < nr ? r : 0)) * rb + (size_t)k0 * bbytes;
                const int64_t pa = rc + PFT * TR;
                const int64_t nn = r1 - pa < TR ? r1 - pa : TR;
                tile_weights(kind, bbytes, rows, kn, w + (size_t)pa * rb + (size_t)k0 * bbytes,
                             nn > 0 ? (size_t)nn * rb : 0, tb);
                const int accum = k0 > 0;
                float *yc = y + s0 * ldy + rc;
                if (kind == AOTX_TK_Q8_0) tile_tokens(AOTX_TK_Q8_0, tb, kn, ts, yc, ldy, (int)nr, accum);
                else if (HAS_MIN(kind))  /* Q4_1, Q5_1: one dot */
                    tile_tokens(AOTX_TK_Q4_1, tb, kn, ts, yc, ldy, (int)nr, accum);
                else tile_tokens(AOTX_TK_Q4_0, tb, kn, ts, yc, ldy, (int)nr, accum);  /* Q4_0, Q5_0: one dot */
            }
        }
    }
}

/* lane r = the sum of v[r]'s 8 lanes (exact: integer adds in any order) */
AI __m256i reduce8(const __m256i *v) {
    __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
    __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67);
    /* a = [row 0..3 low-half sums | row 0..3 high-half sums], b the same for rows 4..7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}


/* n_tok == 1 for Q8_0 (the output head of a decode step): 8 rows straight from memory,
 * no transpose.  Per row and block maddubs(|w|, sign(x_q, w)) + madd(1) leave 8 partial
 * sums, which a hadd tree reduces into lanes = rows: the tile's exact block sums, then
 * the tile's float steps in the tile's order (K slabs of KB blocks), so the results
 * are bit for bit those of q8fam_tiles at any n_tok. */
static void q8_0_rows1(const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act, float *y,
                       int64_t r0, int64_t r1) {
    const __m256i c80 = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    const size_t bb = sizeof(aotx_block_q8_0);
    for (int64_t rc = r0; rc < r1; rc += TR) {
        const int64_t nr = r1 - rc < TR ? r1 - rc : TR;
        const uint8_t *rows[TR];
        for (int r = 0; r < TR; r++) rows[r] = w + (size_t)(rc + (r < nr ? r : 0)) * rb;
        /* the chunk PFC chunks ahead, spread over this chunk's blocks, into L2 (measured
         * ~10% faster than into L1 on the head) */
        const aotx_pf_plan pl = aotx_pf_rows(w, rb, rc + PFC * TR, r1, TR, nb);
        float *yc = y + rc;
        for (int64_t k0 = 0; k0 < nb; k0 += KB) {
            const int64_t ke = nb - k0 < KB ? nb : k0 + KB;
            __m256 f = _mm256_setzero_ps();
            for (int64_t b = k0; b < ke; b++) {
                AOTX_PF_SLICE(pl, b, _MM_HINT_T1);
                const __m256i xs = _mm256_xor_si256(
                    _mm256_loadu_si256((const __m256i *)aotx_act8_xu(act, b)), c80);
                const size_t off = (size_t)b * bb;
                __m256i v[TR];
                for (int r = 0; r < TR; r++) {
                    const __m256i wv = _mm256_loadu_si256((const __m256i *)(rows[r] + off + 2));
                    v[r] = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xs, wv)), ones);
                }
                const __m256 dw = rows_dw(rows, off);
                f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(v)),
                                    _mm256_mul_ps(dw, _mm256_set1_ps(*aotx_act8_dx(act, b))), f);
            }
            store_tile(&f, 1, yc, 0, 0, (int)nr, k0 > 0);
        }
    }
}

/* n_tok == 1 for Q4_0 / Q5_0 (decode: attn_q/k/v, ffn_gate/up): 8 rows straight from
 * memory, no transpose, no staging, two rows per vector: [row a | row b] quants 0..15 in
 * one vector and 16..31 in another (nibbles, Q5_0's fifth bit from qh), against the
 * activation's [x 0..15 | x 0..15] and [x 16..31 | x 16..31]; maddubs (|pair| <= 2 * 31
 * * 127, two summed in int16) + madd(1), a hadd tree into lanes = rows, plus the tile's
 * seed -c * sum x_q: the tile's exact block sums; then the tile's float steps in the
 * tile's order (K slabs of KB blocks), so the bits of q8fam_tiles at any n_tok. */
AI void q45_rows1(int kind, const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act, float *y,
                  int64_t r0, int64_t r1) {
    const __m256i c80 = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    const __m256i m4 = _mm256_set1_epi8(0x0f), c10 = _mm256_set1_epi8(0x10);
    /* qh of row a in bytes 0..3, of row b in bytes 4..7 of each 128-bit lane: quant e of
     * the low (high) vector gets byte e / 8 (2 + e / 8) of its row's qh, then bit e % 8 */
    const __m256i rlo = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5);
    const __m256i rhi = _mm256_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                                         6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const int32_t c = SEED_C(kind);
    const size_t bb = kind == AOTX_TK_Q5_0   ? sizeof(aotx_block_q5_0)
                      : kind == AOTX_TK_Q4_1 ? sizeof(aotx_block_q4_1)
                      : kind == AOTX_TK_Q5_1 ? sizeof(aotx_block_q5_1)
                                             : sizeof(aotx_block_q4_0);
    const size_t qoff = QS_OFF(kind), hoff = QH_OFF(kind);
    for (int64_t rc = r0; rc < r1; rc += TR) {
        const int64_t nr = r1 - rc < TR ? r1 - rc : TR;
        const uint8_t *rows[TR];
        for (int r = 0; r < TR; r++) rows[r] = w + (size_t)(rc + (r < nr ? r : 0)) * rb;
        const aotx_pf_plan pl = aotx_pf_rows(w, rb, rc + PFC * TR, r1, TR, nb);
        float *yc = y + rc;
        for (int64_t k0 = 0; k0 < nb; k0 += KB) {
            const int64_t ke = nb - k0 < KB ? nb : k0 + KB;
            __m256 f = _mm256_setzero_ps();
            for (int64_t b = k0; b < ke; b++) {
                AOTX_PF_SLICE(pl, b, _MM_HINT_T1);
                const __m256i xu = _mm256_loadu_si256((const __m256i *)aotx_act8_xu(act, b));
                const __m256i xs = _mm256_xor_si256(xu, c80);
                const __m256i xlo = _mm256_permute2x128_si256(xs, xs, 0x00);
                const __m256i xhi = _mm256_permute2x128_si256(xs, xs, 0x11);
                const __m256i s4 = _mm256_sad_epu8(xu, _mm256_setzero_si256());  /* sum (x_q + 128) */
                const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
                const int32_t sum = (int32_t)(_mm_cvtsi128_si32(s2) + _mm_extract_epi32(s2, 2)) - 32 * 128;
                const size_t off = (size_t)b * bb;
                __m256i v[TR / 2];
                for (int k = 0; k < TR / 2; k++) {
                    const uint8_t *pa_ = rows[2 * k] + off, *pb_ = rows[2 * k + 1] + off;
                    const __m256i raw = _mm256_loadu2_m128i((const __m128i *)(pb_ + qoff),
                                                            (const __m128i *)(pa_ + qoff));
                    __m256i lo = _mm256_and_si256(raw, m4);
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                    if (HAS_QH(kind)) {
                        uint32_t qa, qb;
                        memcpy(&qa, pa_ + hoff, 4);
                        memcpy(&qb, pb_ + hoff, 4);
                        const __m256i h = _mm256_set1_epi64x((long long)((uint64_t)qb << 32 | qa));
                        const __m256i hl = _mm256_and_si256(_mm256_shuffle_epi8(h, rlo), bit);
                        const __m256i hh = _mm256_and_si256(_mm256_shuffle_epi8(h, rhi), bit);
                        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(hl, bit), c10));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(hh, bit), c10));
                    }
                    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo),
                                                       _mm256_maddubs_epi16(hi, xhi));
                    v[k] = _mm256_madd_epi16(p, ones);  /* lanes 0..3 row 2k, 4..7 row 2k + 1 */
                }
                /* [r0 r2 r4 r6 | r1 r3 r5 r7] -> lanes = rows */
                const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
                const __m256i a = _mm256_add_epi32(_mm256_set1_epi32(-c * sum),
                                                   _mm256_permutevar8x32_epi32(h, order));
                const __m256 dw = rows_dw(rows, off);
                const float dx = *aotx_act8_dx(act, b);
                f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), f);
                if (HAS_MIN(kind))  /* tile_act's dx * sum and tile_dot's FMA */
                    f = _mm256_fmadd_ps(rows_dw(rows, off + 2), _mm256_set1_ps(dx * (float)sum), f);
            }
            store_tile(&f, 1, yc, 0, 0, (int)nr, k0 > 0);
        }
    }
}

void aotx_avx2_q8fam_tiles(int kind, const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act,
                           size_t as, int64_t n_tok, float *y, int64_t ldy, int64_t r0,
                           int64_t r1) {
/* the 4-bit kinds: q45_rows1 at one token, the tiles at more (the same bits) */
#define Q45_CASE(K)                                                                             \
    case K:                                                                                     \
        if (n_tok == 1) q45_rows1(K, w, rb, nb, act, y, r0, r1);                                \
        else q8fam_tiles(K, w, rb, nb, act, as, n_tok, y, ldy, r0, r1);                         \
        break;
    switch (kind) {  /* one instantiation per kind: the kind folds into constants */
    Q45_CASE(AOTX_TK_Q4_0)
    Q45_CASE(AOTX_TK_Q5_0)
    Q45_CASE(AOTX_TK_Q4_1)
    Q45_CASE(AOTX_TK_Q5_1)
#undef Q45_CASE
    default:
        if (n_tok == 1) q8_0_rows1(w, rb, nb, act, y, r0, r1);
        else q8fam_tiles(AOTX_TK_Q8_0, w, rb, nb, act, as, n_tok, y, ldy, r0, r1);
        break;
    }
}

/* ------------------------------------------- Q8_0 re-blocked (packed) copy */

/* Layout (aotx_avx2_q8_0_pack): groups of 8 rows (lanes), per group nb blocks of
 * AOTX_Q8P_BLOCK bytes: the 8 rows' fp16 scales, then 16 x 16 bytes, vector v = 2g + e
 * (g < 8, e < 2) holding per row lane r the bytes w_r[4g + e], w_r[4g + 2 + e]: one
 * vpmovsxbw gives tile_weights' int16 pair vector (e = 0: q[g], e = 1: s[g]) with no
 * transpose, and a group's blocks are one sequential stream.  Missing rows of the last
 * group are zeros.  Same bytes as the original, rearranged. */
#define PKG 8               /* packed groups ahead to prefetch */
#define PFH _MM_HINT_T1

void aotx_pack_groups(int kind, int gr, aotx_pack_row_fn *fill, const uint8_t *w, size_t rb,
                      size_t bb, size_t pb, int64_t nb, int64_t rows, int64_t g0, int64_t g1,
                      uint8_t *dst) {
    for (int64_t g = g0; g < g1; g++) {
        uint8_t *o = dst + (size_t)g * (size_t)nb * pb;
        for (int64_t b = 0; b < nb; b++, o += pb) {
            memset(o, 0, pb);
            for (int r = 0; r < gr && g * gr + r < rows; r++)
                fill(kind, gr, o, w + (size_t)(g * gr + r) * rb + (size_t)b * bb, r);
        }
    }
}

static void q8p_row(int kind, int gr, uint8_t *o, const uint8_t *p, int r) {
    (void)kind; (void)gr;
    memcpy(o + 2 * r, p, 2);
    for (int v = 0; v < 16; v++) {
        const int gg = v >> 1, e = v & 1;
        o[16 + 16 * v + 2 * r] = p[2 + 4 * gg + e];
        o[16 + 16 * v + 2 * r + 1] = p[2 + 4 * gg + 2 + e];
    }
}

void aotx_avx2_q8_0_pack(const uint8_t *w, size_t rb, int64_t nb, int64_t rows, int64_t g0,
                         int64_t g1, uint8_t *dst) {
    aotx_pack_groups(AOTX_TK_Q8_0, TR, q8p_row, w, rb, sizeof(aotx_block_q8_0), AOTX_Q8P_BLOCK, nb,
                     rows, g0, g1, dst);
}

/* tile_act's Q8_0 staging, block-major: x16[(b * ts + t) * 32], dx[b * ts + t] (the tokens
 * of a block at fixed offsets from one pointer). */
static void pk_act(const uint8_t *act, size_t as, int64_t ts, int64_t k0, int64_t kn, tiles8 *tb) {
    const __m256i c80 = _mm256_set1_epi8((char)0x80);
    for (int64_t t = 0; t < ts; t++) {
        const uint8_t *row = act + (size_t)t * as;
        for (int64_t b = 0; b < kn; b++) {
            const __m256i xs = _mm256_xor_si256(
                _mm256_loadu_si256((const __m256i *)aotx_act8_xu(row, k0 + b)), c80);
            const __m256i ev = _mm256_srai_epi16(_mm256_slli_epi16(xs, 8), 8);
            const __m256i od = _mm256_srai_epi16(xs, 8);
            int16_t *o = tb->x16 + (b * ts + t) * 32;
            const __m256i lo = _mm256_unpacklo_epi32(ev, od), hi = _mm256_unpackhi_epi32(ev, od);
            _mm256_storeu_si256((__m256i *)o, _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256((__m256i *)(o + 16), _mm256_permute2x128_si256(lo, hi, 0x31));
            tb->dx[b * ts + t] = *aotx_act8_dx(row, k0 + b);
        }
    }
}

/* tile_dot (Q8_0) on a packed group pb (its block k0 first): the same exact integer
 * block sums, the same float steps in the same order, so the same bits. */
AI void pk_dot(const uint8_t *pb, const uint8_t *pf, const tiles8 *tb, int64_t kn, int64_t ts,
               int64_t t0, int nt, float *y, int64_t ldy, int nr, int accum) {
    __m256 f[TT];
    for (int t = 0; t < nt; t++) f[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < kn; b++, pb += AOTX_Q8P_BLOCK) {
        if (pf) {  /* spread over the blocks: a burst of prefetches stalls on fill buffers */
            for (int o = 0; o < AOTX_Q8P_BLOCK; o += 64) _mm_prefetch((const char *)pf + o, PFH);
            pf += AOTX_Q8P_BLOCK;
        }
        const int16_t *x16 = tb->x16 + (b * ts + t0) * 32;
        __m256i a[TT];
        for (int t = 0; t < nt; t++) a[t] = _mm256_setzero_si256();  /* Q8_0: seed 0 */
        for (int g = 0; g < 8; g++) {
            const __m256i we = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(pb + 16 + 32 * g)));
            const __m256i wo = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(pb + 32 + 32 * g)));
            for (int t = 0; t < nt; t++) {
                const int16_t *xt = x16 + t * 32 + 4 * g;
                a[t] = _mm256_add_epi32(a[t], _mm256_madd_epi16(we, bcast4((const int8_t *)xt)));
                a[t] = _mm256_add_epi32(a[t], _mm256_madd_epi16(wo, bcast4((const int8_t *)(xt + 2))));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)pb));
        for (int t = 0; t < nt; t++)
            f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[t]),
                                   _mm256_mul_ps(dw, _mm256_set1_ps(tb->dx[b * ts + t0 + t])), f[t]);
    }
    store_tile(f, nt, y, t0, ldy, nr, accum);
}

/* pk_dot for 8 tokens: the weights widened once for all 8 (the int32 sums in 8
 * registers), the float sums in memory; per token the same steps as pk_dot.  The integer
 * part is written out in asm: per 4 quants x 8 rows x 8 tokens two vpmovsxbw, then per
 * token two broadcasts, two vpmaddwd and two vpaddd, no register copies or spills (what
 * GCC 12 made of the intrinsics had both: measured ~7% slower on the 262144-row head).
 * The integer adds are exact (|sum| <= 32 * 128 * 127), so their order is free. */
AI void pk_dot8(const uint8_t *pb, const uint8_t *pf, const tiles8 *tb, int64_t kn, int64_t ts,
                int64_t t0, float *y, int64_t ldy, int nr, int accum) {
    __m256 f[8];
    for (int t = 0; t < 8; t++) f[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < kn; b++, pb += AOTX_Q8P_BLOCK) {
        if (pf) {
            for (int o = 0; o < AOTX_Q8P_BLOCK; o += 64) _mm_prefetch((const char *)pf + o, PFH);
            pf += AOTX_Q8P_BLOCK;
        }
        const int16_t *x16 = tb->x16 + (b * ts + t0) * 32;
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int g = 0; g < 8; g++) {
            const uint8_t *wp = pb + 16 + 32 * g;
            const int16_t *xp = x16 + 4 * g;
#define PKT(A, T, R0, R1) \
                "vpbroadcastd " #T "*64(%[xp]), %%ymm" #R0 "\n\t" \
                "vpbroadcastd " #T "*64+4(%[xp]), %%ymm" #R1 "\n\t" \
                "vpmaddwd %%ymm8, %%ymm" #R0 ", %%ymm" #R0 "\n\t" \
                "vpmaddwd %%ymm9, %%ymm" #R1 ", %%ymm" #R1 "\n\t" \
                "vpaddd %%ymm" #R0 ", %[" #A "], %[" #A "]\n\t" \
                "vpaddd %%ymm" #R1 ", %[" #A "], %[" #A "]\n\t"
            __asm__("vpmovsxbw (%[wp]), %%ymm8\n\t"
                    "vpmovsxbw 16(%[wp]), %%ymm9\n\t"
                    PKT(a0, 0, 10, 11) PKT(a1, 1, 12, 13) PKT(a2, 2, 14, 15) PKT(a3, 3, 10, 11)
                    PKT(a4, 4, 12, 13) PKT(a5, 5, 14, 15) PKT(a6, 6, 10, 11) PKT(a7, 7, 12, 13)
                    : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4),
                      [a5] "+x"(a5), [a6] "+x"(a6), [a7] "+x"(a7)
                    : [wp] "r"(wp), [xp] "r"(xp), "m"(*(const uint8_t(*)[32])wp),
                      "m"(*(const int16_t(*)[8 * 32])xp)
                    : "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
#undef PKT
        }
        const __m256i a[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
        const __m256 dw = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)pb));
        for (int t = 0; t < 8; t++)
            f[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[t]),
                                   _mm256_mul_ps(dw, _mm256_set1_ps(tb->dx[b * ts + t0 + t])), f[t]);
    }
    store_tile(f, 8, y, t0, ldy, nr, accum);
}

#define PCASE(n) case n: pk_dot(pb, tg == 0 && pf + kn * AOTX_Q8P_BLOCK <= end ? pf : NULL, tb, kn, ts, tg, \
                                   n, yc, ldy, (int)nr, accum); break;

void aotx_avx2_q8_0_packed(const uint8_t *pk, int64_t nb, const uint8_t *act, size_t as,
                           int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    tiles8 tiles, *tb = &tiles;
    const size_t gbytes = (size_t)nb * AOTX_Q8P_BLOCK;
    for (int64_t k0 = 0; k0 < nb; k0 += KB) {
        const int64_t kn = nb - k0 < KB ? nb - k0 : KB;
        const int64_t ts_max = ACTB / (kn * 32);
        for (int64_t s0 = 0; s0 < n_tok; s0 += ts_max) {
            const int64_t ts = n_tok - s0 < ts_max ? n_tok - s0 : ts_max;
            pk_act(act + (size_t)s0 * as, as, ts, k0, kn, tb);
            const uint8_t *end = pk + (size_t)((r1 + TR - 1) / TR) * gbytes;
            for (int64_t rc = r0; rc < r1; rc += TR) {
                const int64_t nr = r1 - rc < TR ? r1 - rc : TR;
                const uint8_t *pb = pk + (size_t)(rc / TR) * gbytes + (size_t)k0 * AOTX_Q8P_BLOCK;
                const uint8_t *pf = pb + PKG * gbytes;
                const int accum = k0 > 0;
                float *yc = y + s0 * ldy + rc;
                int64_t tg = 0;
                for (; ts - tg >= 8; tg += 8)
                    pk_dot8(pb, tg == 0 && pf + kn * AOTX_Q8P_BLOCK <= end ? pf : NULL, tb, kn, ts, tg,
                            yc, ldy, (int)nr, accum);
                for (; tg < ts; tg += TT) {
                    switch (ts - tg < TT ? ts - tg : TT) {
                    PCASE(4) PCASE(3) PCASE(2) default: PCASE(1)
                    }
                }
            }
        }
    }
}
#undef PCASE

/* ----------------------------------------- Q4_0 / Q5_0 re-blocked (packed) copy */

/* Layout (aotx_avx2_q45_pack): groups of 8 rows (lanes), per group nb blocks of
 * AOTX_Q5P_BLOCK (Q5_0) / AOTX_Q4P_BLOCK (Q4_0) bytes, as many as the original's:
 *   [0, 16)    the 8 rows' fp16 scales;
 *   [16, 144)  4 x 32 bytes: vector n, byte 4r + i = quant 4n + i of row r in the low
 *              nibble, quant 4(n + 4) + i in the high one (the tile's q[n] and q[n + 4]
 *              are one and and one shift + and away);
 *   [144, 176) Q5_0: the fifth bits, byte 4r + i bit g = that of quant 4g + i of row r
 *              (q[g] takes it by one shift, and, or: bit g moved to bit 4 in each byte).
 * Missing rows of the last group are zeros.  Same bits of information, rearranged. */
#define Q45P_NIB 16
#define Q45P_HI 144

AI size_t q45p_block(int kind) {
    return kind == AOTX_TK_Q5_0 ? AOTX_Q5P_BLOCK : AOTX_Q4P_BLOCK;
}

/* Row r of a group of gr rows (8: this file's copy; 16: quant_x86.c's VNNI copy): scales
 * at 2r, nibble vectors of 4 gr bytes from 2 gr, the fifth-bit plane after them (18 gr). */
void aotx_q45_pack_row(int kind, int gr, uint8_t *o, const uint8_t *p, int r) {
    const int q5 = kind == AOTX_TK_Q5_0;
    const size_t qoff = q5 ? 6 : 2, nib = 2 * (size_t)gr, vec = 4 * (size_t)gr;
    const uint32_t qh = q5 ? ld32(p + 2) : 0;
    uint8_t u[32];
    for (int j = 0; j < 16; j++) {
        u[j] = (uint8_t)(p[qoff + j] & 15);
        u[j + 16] = (uint8_t)(p[qoff + j] >> 4);
    }
    memcpy(o + 2 * r, p, 2);
    for (int n = 0; n < 4; n++)
        for (int i = 0; i < 4; i++)
            o[nib + vec * (size_t)n + 4 * (size_t)r + (size_t)i] = (uint8_t)(u[4 * n + i] | u[4 * (n + 4) + i] << 4);
    if (!q5) return;
    for (int i = 0; i < 4; i++) {
        uint8_t hb = 0;
        for (int gg = 0; gg < 8; gg++) hb |= (uint8_t)(((qh >> (4 * gg + i)) & 1u) << gg);
        o[nib + 4 * vec + 4 * (size_t)r + (size_t)i] = hb;
    }
}

void aotx_avx2_q45_pack(int kind, const uint8_t *w, size_t rb, int64_t nb, int64_t rows, int64_t g0,
                        int64_t g1, uint8_t *dst) {
    const size_t bb = kind == AOTX_TK_Q5_0 ? sizeof(aotx_block_q5_0) : sizeof(aotx_block_q4_0);
    aotx_pack_groups(kind, TR, aotx_q45_pack_row, w, rb, bb, q45p_block(kind), nb, rows, g0, g1, dst);
}

/* bit g of each byte of H moved to bit 4 (g a constant after inlining) */
AI __m256i q45p_bit(__m256i H, int g) {
    switch (g) {
    case 0: return _mm256_slli_epi16(H, 4);
    case 1: return _mm256_slli_epi16(H, 3);
    case 2: return _mm256_slli_epi16(H, 2);
    case 3: return _mm256_slli_epi16(H, 1);
    case 4: return H;
    case 5: return _mm256_srli_epi16(H, 1);
    case 6: return _mm256_srli_epi16(H, 2);
    default: return _mm256_srli_epi16(H, 3);
    }
}

/* The tile's weight vectors q[4h .. 4h + 3] of packed block pb (tile_weights' values). */
AI void q45p_half(int kind, const uint8_t *pb, int h, __m256i *w) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), c10 = _mm256_set1_epi8(0x10);
    for (int k = 0; k < 4; k++) {
        const __m256i p = _mm256_loadu_si256((const __m256i *)(pb + Q45P_NIB + 32 * k));
        w[k] = _mm256_and_si256(h ? _mm256_srli_epi16(p, 4) : p, m4);
    }
    if (kind == AOTX_TK_Q5_0) {
        const __m256i H = _mm256_loadu_si256((const __m256i *)(pb + Q45P_HI));
        for (int k = 0; k < 4; k++)
            w[k] = _mm256_or_si256(w[k], _mm256_and_si256(q45p_bit(H, 4 * h + k), c10));
    }
}

AI void q45p_prefetch(const uint8_t *pf, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)pf + o, PFH);
}

/* n_tok == 1 on a packed group: tile_dot (Q4_0 / Q5_0, one token) with its weight
 * vectors made in registers from the stream: the same integer sums and float steps. */
AI void q45p_dot1(int kind, const uint8_t *pb, const uint8_t *pf, const tiles8 *tb, int64_t kn,
                  float *y, int nr, int accum) {
    const __m256i ones = _mm256_set1_epi16(1);
    const size_t bb = q45p_block(kind);
    __m256 f = _mm256_setzero_ps();
    for (int64_t b = 0; b < kn; b++, pb += bb) {
        if (pf) {
            q45p_prefetch(pf, bb);
            pf += bb;
        }
        const int8_t *xq = tb->xq + b * 32;
        __m256i a = _mm256_set1_epi32(tb->sd[b]);
        for (int h = 0; h < 2; h++) {
            __m256i w[4];
            q45p_half(kind, pb, h, w);
            const int8_t *xt = xq + 16 * h;
            __m256i s = _mm256_maddubs_epi16(w[0], bcast4(xt));
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[1], bcast4(xt + 4)));
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[2], bcast4(xt + 8)));
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[3], bcast4(xt + 12)));
            a = _mm256_add_epi32(a, _mm256_madd_epi16(s, ones));
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)pb));
        f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), _mm256_mul_ps(dw, _mm256_set1_ps(tb->dx[b])), f);
    }
    store_tile(&f, 1, y, 0, 0, nr, accum);
}

/* n_tok > 1: a packed group's blocks [0, kn) into tb as tile_weights leaves them. */
AI void q45p_weights(int kind, const uint8_t *pb, const uint8_t *pf, int64_t kn, tiles8 *tb) {
    const size_t bb = q45p_block(kind);
    for (int64_t b = 0; b < kn; b++, pb += bb) {
        if (pf) {
            q45p_prefetch(pf, bb);
            pf += bb;
        }
        tb->dw[b] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)pb));
        q45p_half(kind, pb, 0, tb->q[b]);
        q45p_half(kind, pb, 1, tb->q[b] + 4);
    }
}

AI void q45_packed(int kind, const uint8_t *pk, int64_t nb, const uint8_t *act, size_t as,
                   int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    tiles8 tiles, *tb = &tiles;
    const size_t bb = q45p_block(kind), gbytes = (size_t)nb * bb;
    const int32_t c = kind == AOTX_TK_Q5_0 ? 16 : 8;
    const uint8_t *end = pk + (size_t)((r1 + TR - 1) / TR) * gbytes;
    for (int64_t k0 = 0; k0 < nb; k0 += KB) {
        const int64_t kn = nb - k0 < KB ? nb - k0 : KB;
        const int64_t ts_max = ACTB / (kn * 32);
        for (int64_t s0 = 0; s0 < n_tok; s0 += ts_max) {
            const int64_t ts = n_tok - s0 < ts_max ? n_tok - s0 : ts_max;
            tile_act(act + (size_t)s0 * as, as, ts, k0, kn, c, 0, tb);
            for (int64_t rc = r0; rc < r1; rc += TR) {
                const int64_t nr = r1 - rc < TR ? r1 - rc : TR;
                const uint8_t *pb = pk + (size_t)(rc / TR) * gbytes + (size_t)k0 * bb;
                const uint8_t *pf = pb + PKG * gbytes;
                if (pf + (size_t)kn * bb > end) pf = NULL;
                const int accum = k0 > 0;
                float *yc = y + s0 * ldy + rc;
                if (ts == 1) {
                    q45p_dot1(kind, pb, pf, tb, kn, yc, (int)nr, accum);
                    continue;
                }
                q45p_weights(kind, pb, pf, kn, tb);
                tile_tokens(AOTX_TK_Q4_0, tb, kn, ts, yc, ldy, (int)nr, accum);  /* Q4_0, Q5_0: one dot */
            }
        }
    }
}

void aotx_avx2_q45_packed(int kind, const uint8_t *pk, int64_t nb, const uint8_t *act, size_t as,
                          int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    if (kind == AOTX_TK_Q5_0) q45_packed(AOTX_TK_Q5_0, pk, nb, act, as, n_tok, y, ldy, r0, r1);
    else q45_packed(AOTX_TK_Q4_0, pk, nb, act, as, n_tok, y, ldy, r0, r1);
}

/* ----------------------------------------------------------- Q4_K / Q6_K */

typedef struct {
    __m256i q[64];                  /* [element dword][row lane] unsigned quants */
    __m256i sc[KSL][16];            /* [sb][sub-block] (sc, sc) int16 pairs per row */
    __m256i mm[KSL][8];             /* [sb][32-block] Q6_K (-2 sc_2j, -2 sc_2j+1) int16 pairs per row */
    __m256 mf[KSL][8];              /* [sb][sub-block] Q4_K m per row, as float */
    __m256 d[KSL];                  /* [sb] d per row */
    __m256 dmin[KSL];               /* [sb] Q4_K dmin per row */
} ktiles8;                          /* ~12 KiB */

/* Q6_K scales of slab entry i from lane vectors: S[a] lane r = row r's dword at byte
 * 192 + 4a (its int8 scales 4a .. 4a + 3), d = row r's d. */
AI void k6_scales_set(ktiles8 *kb, int64_t i, const __m256i *S, __m256 d) {
    const __m256i lo16 = _mm256_set1_epi32(0xffff);
    for (int a = 0; a < 4; a++) {
        __m256i sc[4];  /* the four int8 scales of this dword, sign-extended */
        for (int c = 0; c < 4; c++) {
            sc[c] = _mm256_srai_epi32(_mm256_sllv_epi32(S[a], _mm256_set1_epi32(24 - 8 * c)), 24);
            kb->sc[i][4 * a + c] = _mm256_or_si256(_mm256_and_si256(sc[c], lo16),
                                                   _mm256_slli_epi32(sc[c], 16));
        }
        /* (-2 sc, -2 sc') pairs: madd with (16 bsum, 16 bsum') (both fit int16) is the
         * -32 offset of a 32-value sub-block, exact */
        const __m256i z = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) sc[c] = _mm256_sub_epi32(z, _mm256_add_epi32(sc[c], sc[c]));
        kb->mm[i][2 * a] = _mm256_or_si256(_mm256_and_si256(sc[0], lo16), _mm256_slli_epi32(sc[1], 16));
        kb->mm[i][2 * a + 1] = _mm256_or_si256(_mm256_and_si256(sc[2], lo16),
                                               _mm256_slli_epi32(sc[3], 16));
    }
    kb->d[i] = d;
}

/* Q4_K scales of slab entry i from lane vectors: lane r of G / Q0 / Q1 / Q2 = row r's
 * dword at byte 0 (d, dmin) / 4 / 8 / 12. */
AI void k4_scales_set(ktiles8 *kb, int64_t i, __m256i G, __m256i Q0, __m256i Q1, __m256i Q2) {
    kb->d[i] = half_to_ps(G, 0);
    kb->dmin[i] = half_to_ps(G, 1);
    const __m256i c3f = _mm256_set1_epi8(0x3f), c0f = _mm256_set1_epi8(0x0f), c30 = _mm256_set1_epi8(0x30);
    /* the 6-bit packing: sc[j] / m[j] (j < 4) in bytes of Q0 / Q1; sc[j + 4] and
     * m[j + 4] take their low nibble from Q2 and their top two bits from Q0 / Q1 */
    const __m256i sv[2] = {
        _mm256_and_si256(Q0, c3f),
        _mm256_or_si256(_mm256_and_si256(Q2, c0f), _mm256_and_si256(_mm256_srli_epi32(Q0, 2), c30))};
    const __m256i mv[2] = {
        _mm256_and_si256(Q1, c3f),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(Q2, 4), c0f),
                        _mm256_and_si256(_mm256_srli_epi32(Q1, 2), c30))};
    const __m256i ff = _mm256_set1_epi32(0xff);
    for (int j = 0; j < 8; j++) {
        const __m128i sh = _mm_cvtsi32_si128(8 * (j & 3));
        __m256i sc = _mm256_and_si256(_mm256_srl_epi32(sv[j >> 2], sh), ff);
        __m256i m = _mm256_and_si256(_mm256_srl_epi32(mv[j >> 2], sh), ff);
        kb->sc[i][j] = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));
        kb->mf[i][j] = _mm256_cvtepi32_ps(m);
    }
}

/* Scales of the chunk's rows (row r at rows[0] + vidx[r], each at super-block k0),
 * super-blocks [0, kn): gathered per super-block, unpacked in vectors. */
static void ktile_scales(int kind, const uint8_t *row0, __m256i vidx, int64_t kn, ktiles8 *kb) {
    for (int64_t i = 0; i < kn; i++) {
        if (kind == AOTX_TK_Q6_K) {
            const uint8_t *p = row0 + (size_t)i * sizeof(aotx_block_q6_k);
            /* bytes 206..209: d is the high half (a dword at 208 would pass the block) */
            const __m256 d = half_to_ps(gather4(p + 206, vidx), 1);
            __m256i S[4];
            for (int a = 0; a < 4; a++) S[a] = gather4(p + 192 + 4 * a, vidx);
            k6_scales_set(kb, i, S, d);
            continue;
        }
        const uint8_t *p = row0 + (size_t)i * sizeof(aotx_block_q4_k);
        k4_scales_set(kb, i, gather4(p, vidx), gather4(p + 4, vidx), gather4(p + 8, vidx),
                      gather4(p + 12, vidx));
    }
}

/* 32 bytes at rows[r] + off: out[g] lane r = dword g (g < 8). */
AI void tr8x8(const uint8_t *const *rows, size_t off, __m256i *out) {
    tr8x4(rows, off, out);
    tr8x4(rows, off + 16, out + 4);
}

/* Q6_K quants of half h (elements 128h ..) into q: A[g] / B[g] / H[g] lane r = row r's
 * dword g of ql[64h ..] / ql[64h + 32 ..] / qh[32h ..] (element e = 128h + 32k + 4g + byte). */
AI void k6_quants_set(__m256i *q, int h, const __m256i *A, const __m256i *B, const __m256i *H) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    for (int g = 0; g < 8; g++) {
        __m256i *o = q + 32 * h + g;
        o[0] = _mm256_or_si256(_mm256_and_si256(A[g], m4),
                               _mm256_and_si256(_mm256_slli_epi16(H[g], 4), m30));
        o[8] = _mm256_or_si256(_mm256_and_si256(B[g], m4),
                               _mm256_and_si256(_mm256_slli_epi16(H[g], 2), m30));
        o[16] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A[g], 4), m4),
                                _mm256_and_si256(H[g], m30));
        o[24] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B[g], 4), m4),
                                _mm256_and_si256(_mm256_srli_epi16(H[g], 2), m30));
    }
}

/* Q4_K quants of qs bytes 32p .. 32p + 31 into q: T[g] lane r = row r's dword g there
 * (low nibbles sub-block 2p, high 2p + 1). */
AI void k4_quants_set(__m256i *q, int p, const __m256i *T) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int g = 0; g < 8; g++) {
        q[16 * p + g] = _mm256_and_si256(T[g], m4);
        q[16 * p + 8 + g] = _mm256_and_si256(_mm256_srli_epi16(T[g], 4), m4);
    }
}

/* Quants of super-block i of rows[0..7] into kb->q. */
static void ktile_quants(int kind, const uint8_t *const *rows, int64_t i, ktiles8 *kb) {
    if (kind == AOTX_TK_Q6_K) {
        const size_t base = (size_t)i * sizeof(aotx_block_q6_k);
        for (int h = 0; h < 2; h++) {
            __m256i A[8], B[8], H[8];
            tr8x8(rows, base + 64 * h, A);
            tr8x8(rows, base + 64 * h + 32, B);
            tr8x8(rows, base + 128 + 32 * h, H);
            k6_quants_set(kb->q, h, A, B, H);
        }
        return;
    }
    const size_t base = (size_t)i * sizeof(aotx_block_q4_k) + 16;
    for (int p = 0; p < 4; p++) {
        __m256i T[8];
        tr8x8(rows, base + 32 * p, T);
        k4_quants_set(kb->q, p, T);
    }
}

/* Super-block i (slab entry si) x tokens [t0, t0 + nt): y rows [0, nr).  Per 32-value
 * sub-block j the exact int32 sum with the weight scales applied by madd (Q4_K: sc_j * S_j;
 * Q6_K: T_j = sum sc_g * (q - 32) * x_q, the offset from the 16-sums), then the
 * reference's float steps (aotx_block_q8_k32; q6_k_row1 repeats them):
 *   Q4_K: F = fma(float(sc_j S_j), d[j], F), G = fma(m_j, dm[j], G),
 *         r = fma(F, d_w, -(G * dmin)), y = r or y + r;
 *   Q6_K: F = fma(float(T_j), d[j], F), y = F * d_w or fma(F, d_w, y). */
AI void ktile_dot(int kind, const ktiles8 *kb, int64_t si, int64_t i, const uint8_t *act, size_t as,
                  int64_t t0, int nt, float *y, int64_t ldy, int nr, int accum) {
    const aotx_block_q8_k32 *xb[TT];
    __m256 F[TT];
    for (int t = 0; t < nt; t++) {
        xb[t] = (const aotx_block_q8_k32 *)(act + (size_t)(t0 + t) * as) + i;
        F[t] = _mm256_setzero_ps();
    }
    if (kind == AOTX_TK_Q6_K) {
        int32_t b16[TT][8];  /* (16 bsum_2j, 16 bsum_2j+1) pairs (|16 bsum| <= 32512) */
        for (int t = 0; t < nt; t++)
            _mm256_storeu_si256((__m256i *)b16[t],
                                _mm256_slli_epi16(_mm256_loadu_si256((const __m256i *)xb[t]->bsums), 4));
        for (int j = 0; j < 8; j++) {  /* 32 values: groups 2j, 2j + 1 = dwords 8j .. 8j + 7 */
            __m256i A[TT];  /* seeded with the -32 offset: madd((-2 sc), (16 bsum)) */
            for (int t = 0; t < nt; t++)
                A[t] = _mm256_madd_epi16(kb->mm[si][j], _mm256_set1_epi32(b16[t][j]));
            for (int gg = 0; gg < 2; gg++) {
                const int g16 = 2 * j + gg;
                const __m256i sc = kb->sc[si][g16];
                for (int h = 0; h < 2; h++) {
                    __m256i s16[TT];
                    for (int t = 0; t < nt; t++) s16[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
                    for (int g = 4 * g16 + 2 * h; g < 4 * g16 + 2 * h + 2; g++) {
                        const __m256i wv = _mm256_load_si256(&kb->q[g]);
                        for (int t = 0; t < nt; t++)
                            s16[t] = _mm256_add_epi16(
                                s16[t], _mm256_maddubs_epi16(wv, bcast4(xb[t]->qs + 4 * g)));
                    }
                    for (int t = 0; t < nt; t++) A[t] = _mm256_add_epi32(A[t], _mm256_madd_epi16(s16[t], sc));
                }
            }
            for (int t = 0; t < nt; t++)
                F[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A[t]), _mm256_set1_ps(xb[t]->d[j]), F[t]);
        }
    } else {
        for (int j = 0; j < 8; j++) {  /* 32 elements: dwords 8j .. 8j + 7 */
            __m256i s16[TT];
            for (int t = 0; t < nt; t++) s16[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int g = 8 * j; g < 8 * j + 8; g++) {
                const __m256i wv = _mm256_load_si256(&kb->q[g]);
                for (int t = 0; t < nt; t++)
                    s16[t] = _mm256_add_epi16(s16[t],
                                              _mm256_maddubs_epi16(wv, bcast4(xb[t]->qs + 4 * g)));
            }
            const __m256i sc = kb->sc[si][j];
            for (int t = 0; t < nt; t++)
                F[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s16[t], sc)),
                                       _mm256_set1_ps(xb[t]->d[j]), F[t]);
        }
    }
    const __m256i m = row_mask(nr);
    for (int t = 0; t < nt; t++) {
        float *yt = y + (t0 + t) * ldy;
        const __m256 yv = !accum ? _mm256_setzero_ps()
                          : nr == TR ? _mm256_loadu_ps(yt) : _mm256_maskload_ps(yt, m);
        __m256 r;
        if (kind == AOTX_TK_Q6_K) {
            r = accum ? _mm256_fmadd_ps(F[t], kb->d[si], yv) : _mm256_mul_ps(F[t], kb->d[si]);
        } else {
            __m256 G = _mm256_setzero_ps();
            for (int j = 0; j < 8; j++) G = _mm256_fmadd_ps(kb->mf[si][j], _mm256_set1_ps(xb[t]->dm[j]), G);
            r = _mm256_fmsub_ps(F[t], kb->d[si], _mm256_mul_ps(G, kb->dmin[si]));
            if (accum) r = _mm256_add_ps(yv, r);
        }
        if (nr == TR) _mm256_storeu_ps(yt, r);
        else _mm256_maskstore_ps(yt, m, r);
    }
}

/* Tokens [0, n_tok) of super-block i (slab entry si) in groups of TT. */
AI void ktile_tokens(int kind, const ktiles8 *kb, int64_t si, int64_t i, const uint8_t *act,
                     size_t as, int64_t n_tok, float *yc, int64_t ldy, int nr, int accum) {
    for (int64_t tg = 0; tg < n_tok; tg += TT) {
        switch (n_tok - tg < TT ? n_tok - tg : TT) {
        case 4: ktile_dot(kind, kb, si, i, act, as, tg, 4, yc, ldy, nr, accum); break;
        case 3: ktile_dot(kind, kb, si, i, act, as, tg, 3, yc, ldy, nr, accum); break;
        case 2: ktile_dot(kind, kb, si, i, act, as, tg, 2, yc, ldy, nr, accum); break;
        default: ktile_dot(kind, kb, si, i, act, as, tg, 1, yc, ldy, nr, accum); break;
        }
    }
}


AI void k_tiles(int kind, const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act, size_t as,
                int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    ktiles8 ktiles, *kb = &ktiles;
    for (int64_t rc = r0; rc < r1; rc += TR) {
        const int64_t nr = r1 - rc < TR ? r1 - rc : TR;
        const uint8_t *rows[TR];
        for (int r = 0; r < TR; r++)  /* missing rows repeat the first */
            rows[r] = w + (size_t)(rc + (r < nr ? r : 0)) * rb;
        const __m256i vidx = row_index(rb, nr);
        float *yc = y + rc;
        /* the chunk PFC chunks ahead, prefetched over this chunk's super-blocks */
        const aotx_pf_plan pl = aotx_pf_rows(w, rb, rc + PFC * TR, r1, TR, nb);
        for (int64_t k0 = 0; k0 < nb; k0 += KSL) {
            const int64_t kn = nb - k0 < KSL ? nb - k0 : KSL;
            ktile_scales(kind, rows[0] + (size_t)k0 * (rb / (size_t)nb), vidx, kn, kb);
            for (int64_t i = k0; i < k0 + kn; i++) {
                AOTX_PF_SLICE(pl, i, _MM_HINT_T0);
                ktile_quants(kind, rows, i, kb);
                const int accum = i > 0;
                ktile_tokens(kind, kb, i - k0, i, act, as, n_tok, yc, ldy, (int)nr, accum);
            }
        }
    }
}

AI int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* lane j = the sum of the 8 lanes of v[j] (exact int32) */
AI __m256i tree8(const __m256i *v) {
    const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                            _mm256_permute2x128_si256(a, b, 0x31));
}

/* n_tok == 1 for Q6_K (decode): one row at a time, as stored (no transpose).  Each
 * 32-value sub-block's exact integer sum T_j (madd with the scales; the 8 partial lanes
 * of the 8 sub-blocks reduced by a hadd tree, minus 32 sum sc * bsum) and then ktile_dot's
 * float steps, scalar, in its order: bit for bit the tiles' results at any n_tok. */
static void q6_k_row1(const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act, float *y,
                      int64_t r0, int64_t r1) {
    const aotx_block_q8_k32 *xa = (const aotx_block_q8_k32 *)act;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + (size_t)r * rb;
        float yr = 0.0f;
        for (int64_t i = 0; i < nb; i++) {
            const aotx_block_q8_k32 *xb = xa + i;
            const aotx_block_q6_k *b = (const aotx_block_q6_k *)wr + i;
            for (size_t off = 0; off < sizeof(*b); off += 64)
                _mm_prefetch((const char *)b + 3072 + off, _MM_HINT_T0);
            __m256i v[8];
            for (int h = 0; h < 2; h++) {
                const __m256i A = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
                const __m256i B = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
                const __m256i H = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
                __m256i q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(A, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
                q[1] = _mm256_or_si256(_mm256_and_si256(B, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4), _mm256_and_si256(H, m30));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
                for (int k = 0; k < 4; k++) {  /* elements 128h + 32k .. : sub-block 4h + k */
                    const int g = 8 * h + 2 * k;
                    const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(b->scales[g + 1]),
                                                        _mm_set1_epi16(b->scales[g]));
                    const __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 128 * h + 32 * k));
                    v[4 * h + k] = _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], xv), sc);
                }
            }
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
            const __m256i cr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), sc16);
            float tf[8];
            _mm256_storeu_ps(tf, _mm256_cvtepi32_ps(_mm256_sub_epi32(tree8(v), _mm256_slli_epi32(cr, 5))));
            float f = 0.0f;
            for (int j = 0; j < 8; j++) f = __builtin_fmaf(tf[j], xb->d[j], f);
            const float d = _cvtsh_ss(b->d);
            yr = i > 0 ? __builtin_fmaf(f, d, yr) : f * d;
        }
        y[r] = yr;
    }
}

void aotx_avx2_k_tiles(int kind, const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act,
                       size_t as, int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    /* n_tok == 1: Q6_K's transpose costs more than its dot, so rows as stored; Q4_K's
     * tile is the faster (measured), and both give the same bits */
    if (n_tok == 1 && kind == AOTX_TK_Q6_K) q6_k_row1(w, rb, nb, act, y, r0, r1);
    else if (kind == AOTX_TK_Q6_K) k_tiles(AOTX_TK_Q6_K, w, rb, nb, act, as, n_tok, y, ldy, r0, r1);
    else k_tiles(AOTX_TK_Q4_K, w, rb, nb, act, as, n_tok, y, ldy, r0, r1);
}

/* ------------------------------------------ Q4_K / Q6_K re-blocked (packed) copy */

/* Layout (aotx_avx2_k_pack): groups of 8 rows (lanes), per group nb super-blocks of
 * AOTX_Q4KP_BLOCK (Q4_K, 8 x 144) / AOTX_Q6KP_BLOCK (Q6_K, 8 x 210) bytes, the 8 rows'
 * original bytes rearranged into 32-byte lane vectors (byte 4r + i = byte i of a dword of
 * row r): what ktile_scales gathers and ktile_quants' tr8x8 makes, stored once, so the
 * kernel reads one sequential stream by plain loads (no gather, no transpose).
 *   Q4_K, per super-block:
 *     [0, 128)     4 x 32 bytes: vector a, lane r = row r's dword at byte 4a (a = 0:
 *                  d, dmin; 1..3: the 6-bit scales and mins), ktile_scales' G, Q0..Q2;
 *     [128, 1152)  32 x 32 bytes: vector v = 8p + g, lane r = row r's qs dword at byte
 *                  16 + 4v (qs bytes 32p + 4g: low nibbles sub-block 2p, high 2p + 1).
 *   Q6_K, per super-block:
 *     [0, 16)      the 8 rows' fp16 d (byte 208);
 *     [16, 144)    4 x 32 bytes: vector a, lane r = row r's dword at byte 192 + 4a (its
 *                  int8 scales 4a .. 4a + 3);
 *     [144, 1680)  48 x 32 bytes: vector v = 24h + 8c + g, lane r = row r's dword g of
 *                  c = 0: ql[64h ..], c = 1: ql[64h + 32 ..], c = 2: qh[32h ..] (byte 128
 *                  + 32h ..), ktile_quants' A / B / H of half h.
 * Missing rows of the last group are zeros.  The kernel (aotx_avx2_k_packed) unpacks them
 * with the same integer steps and runs the same ktile_dot at every n_tok (Q6_K's n_tok == 1
 * too, whose q6_k_row1 has ktile_dot's bits; at one token kp4_dot1 / kp6_dot1, ktile_dot's
 * steps with the quants kept in registers), so the same bits as aotx_avx2_k_tiles. */
#define KP4_Q 128
#define KP6_S 16
#define KP6_Q 144

AI size_t kp_block(int kind) {
    return kind == AOTX_TK_Q6_K ? AOTX_Q6KP_BLOCK : AOTX_Q4KP_BLOCK;
}

/* Row r of a group of gr rows (8: this file's copy; 16: quant_x86.c's VNNI copy); vectors
 * of vs = 4 gr bytes, lane r at 4r (the offsets above for gr = 8). */
void aotx_k_pack_row(int kind, int gr, uint8_t *o, const uint8_t *p, int r) {
    const size_t vs = 4 * (size_t)gr, lane = 4 * (size_t)r;
    if (kind != AOTX_TK_Q6_K) {
        for (size_t a = 0; a < 4; a++) memcpy(o + vs * a + lane, p + 4 * a, 4);
        for (size_t v = 0; v < 32; v++) memcpy(o + 4 * vs + vs * v + lane, p + 16 + 4 * v, 4);
        return;
    }
    const size_t s0 = 2 * (size_t)gr, q0 = s0 + 4 * vs;
    memcpy(o + 2 * r, p + 208, 2);
    for (size_t a = 0; a < 4; a++) memcpy(o + s0 + vs * a + lane, p + 192 + 4 * a, 4);
    for (size_t h = 0; h < 2; h++)
        for (size_t c = 0; c < 3; c++) {
            const size_t src = c == 2 ? 128 + 32 * h : 64 * h + 32 * c;
            for (size_t gg = 0; gg < 8; gg++)
                memcpy(o + q0 + vs * (24 * h + 8 * c + gg) + lane, p + src + 4 * gg, 4);
        }
}

void aotx_avx2_k_pack(int kind, const uint8_t *w, size_t rb, int64_t nb, int64_t rows, int64_t g0,
                      int64_t g1, uint8_t *dst) {
    const size_t bb = kind == AOTX_TK_Q6_K ? sizeof(aotx_block_q6_k) : sizeof(aotx_block_q4_k);
    aotx_pack_groups(kind, TR, aotx_k_pack_row, w, rb, bb, kp_block(kind), nb, rows, g0, g1, dst);
}

AI __m256i kp_ld(const uint8_t *p) {
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

/* Packed super-block pb into kb (slab entry 0): ktile_scales' and ktile_quants' values,
 * from plain loads. */
AI void kp_unpack(int kind, const uint8_t *pb, ktiles8 *kb) {
    if (kind == AOTX_TK_Q6_K) {
        __m256i S[4];
        for (int a = 0; a < 4; a++) S[a] = kp_ld(pb + KP6_S + 32 * a);
        k6_scales_set(kb, 0, S, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)pb)));
        for (int h = 0; h < 2; h++) {
            __m256i A[8], B[8], H[8];
            for (int g = 0; g < 8; g++) {
                A[g] = kp_ld(pb + KP6_Q + 32 * (24 * h + g));
                B[g] = kp_ld(pb + KP6_Q + 32 * (24 * h + 8 + g));
                H[g] = kp_ld(pb + KP6_Q + 32 * (24 * h + 16 + g));
            }
            k6_quants_set(kb->q, h, A, B, H);
        }
        return;
    }
    k4_scales_set(kb, 0, kp_ld(pb), kp_ld(pb + 32), kp_ld(pb + 64), kp_ld(pb + 96));
    for (int p = 0; p < 4; p++) {
        __m256i T[8];
        for (int g = 0; g < 8; g++) T[g] = kp_ld(pb + KP4_Q + 32 * (8 * p + g));
        k4_quants_set(kb->q, p, T);
    }
}

/* Q6_K, n_tok == 1 on a packed group: ktile_dot (Q6_K, one token) with the quant vectors
 * made in registers from the stream (ktile_dot on kb->q costs 64 stores and loads per
 * super-block: measured slower than q6_k_row1), the scales staged by k6_scales_set.  Per
 * 32-value sub-block j the same int16 pair sums (2 maddubs each), the same madds into the
 * same exact int32 T_j, and the same float steps in the same order: the same bits. */
AI void kp6_dot1(const uint8_t *pb, const uint8_t *pf, int64_t nb, const uint8_t *act, ktiles8 *kb,
                 float *y, int nr) {
    const size_t bb = AOTX_Q6KP_BLOCK;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const aotx_block_q8_k32 *xa = (const aotx_block_q8_k32 *)act;
    __m256 yv = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, pb += bb) {
        if (pf) {
            q45p_prefetch(pf, bb);
            pf += bb;
        }
        const aotx_block_q8_k32 *xb = xa + i;
        __m256i S[4];
        for (int a = 0; a < 4; a++) S[a] = kp_ld(pb + KP6_S + 32 * a);
        k6_scales_set(kb, 0, S, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)pb)));
        int32_t b16[8];  /* (16 bsum_2j, 16 bsum_2j+1) pairs, as ktile_dot */
        _mm256_storeu_si256((__m256i *)b16,
                            _mm256_slli_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), 4));
        __m256 F = _mm256_setzero_ps();
        for (int j = 0; j < 8; j++) {  /* j = 4h + k: ql half h, nibble / bit plane k */
            const int h = j >> 2, k = j & 3;
            const uint8_t *qa = pb + KP6_Q + 32 * (24 * h + 8 * (k & 1));  /* A (k even) or B */
            const uint8_t *qh = pb + KP6_Q + 32 * (24 * h + 16);
            __m256i A = _mm256_madd_epi16(kb->mm[0][j], _mm256_set1_epi32(b16[j]));
            for (int p = 0; p < 4; p++) {  /* dwords 8j + 2p, 8j + 2p + 1: group 2j + p / 2 */
                __m256i s16 = _mm256_setzero_si256();
                for (int e = 0; e < 2; e++) {
                    const int g = 2 * p + e;
                    const __m256i L = kp_ld(qa + 32 * g), H = kp_ld(qh + 32 * g);
                    __m256i q;
                    switch (k) {  /* k6_quants_set's o[8k] */
                    case 0: q = _mm256_or_si256(_mm256_and_si256(L, m4),
                                                _mm256_and_si256(_mm256_slli_epi16(H, 4), m30)); break;
                    case 1: q = _mm256_or_si256(_mm256_and_si256(L, m4),
                                                _mm256_and_si256(_mm256_slli_epi16(H, 2), m30)); break;
                    case 2: q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L, 4), m4),
                                                _mm256_and_si256(H, m30)); break;
                    default: q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L, 4), m4),
                                                 _mm256_and_si256(_mm256_srli_epi16(H, 2), m30)); break;
                    }
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(q, bcast4(xb->qs + 4 * (8 * j + g))));
                }
                A = _mm256_add_epi32(A, _mm256_madd_epi16(s16, kb->sc[0][2 * j + (p >> 1)]));
            }
            F = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A), _mm256_set1_ps(xb->d[j]), F);
        }
        yv = i > 0 ? _mm256_fmadd_ps(F, kb->d[0], yv) : _mm256_mul_ps(F, kb->d[0]);
    }
    if (nr == TR) _mm256_storeu_ps(y, yv);
    else _mm256_maskstore_ps(y, row_mask(nr), yv);
}


/* Q4_K, n_tok == 1 on a packed group: ktile_dot (Q4_K, one token) with the quant vectors
 * made in registers from the stream (one and / shift + and per vector instead of 64
 * stores and loads through kb->q), the scales staged by k4_scales_set.  Per 32-value
 * sub-block the same int16 sums of 8 maddubs, the same madd by (sc, sc), the same float
 * steps in the same order (F chain, then the mins' G chain, fmsub, + y): the same bits. */
AI void kp4_dot1(const uint8_t *pb, const uint8_t *pf, int64_t nb, const uint8_t *act, ktiles8 *kb,
                 float *y, int nr) {
    const size_t bb = AOTX_Q4KP_BLOCK;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const aotx_block_q8_k32 *xa = (const aotx_block_q8_k32 *)act;
    __m256 yv = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, pb += bb) {
        if (pf) {
            q45p_prefetch(pf, bb);
            pf += bb;
        }
        const aotx_block_q8_k32 *xb = xa + i;
        k4_scales_set(kb, 0, kp_ld(pb), kp_ld(pb + 32), kp_ld(pb + 64), kp_ld(pb + 96));
        __m256 F = _mm256_setzero_ps();
        for (int j = 0; j < 8; j++) {  /* sub-block j: qs bytes 32 (j / 2) .., nibble j % 2 */
            const uint8_t *qv = pb + KP4_Q + 32 * 8 * (j >> 1);
            __m256i s16 = _mm256_setzero_si256();
            for (int g = 0; g < 8; g++) {
                const __m256i T = kp_ld(qv + 32 * g);
                const __m256i q = _mm256_and_si256((j & 1) ? _mm256_srli_epi16(T, 4) : T, m4);
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(q, bcast4(xb->qs + 4 * (8 * j + g))));
            }
            F = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s16, kb->sc[0][j])),
                                _mm256_set1_ps(xb->d[j]), F);
        }
        __m256 G = _mm256_setzero_ps();
        for (int j = 0; j < 8; j++) G = _mm256_fmadd_ps(kb->mf[0][j], _mm256_set1_ps(xb->dm[j]), G);
        const __m256 r = _mm256_fmsub_ps(F, kb->d[0], _mm256_mul_ps(G, kb->dmin[0]));
        yv = i > 0 ? _mm256_add_ps(yv, r) : r;
    }
    if (nr == TR) _mm256_storeu_ps(y, yv);
    else _mm256_maskstore_ps(y, row_mask(nr), yv);
}

AI void k_packed(int kind, const uint8_t *pk, int64_t nb, const uint8_t *act, size_t as,
                 int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    ktiles8 ktiles, *kb = &ktiles;
    const size_t bb = kp_block(kind), gbytes = (size_t)nb * bb;
    const uint8_t *end = pk + (size_t)((r1 + TR - 1) / TR) * gbytes;
    for (int64_t rc = r0; rc < r1; rc += TR) {
        const int64_t nr = r1 - rc < TR ? r1 - rc : TR;
        const uint8_t *pb = pk + (size_t)(rc / TR) * gbytes;
        /* the group PKG groups ahead, into L2, one super-block's worth per super-block */
        const uint8_t *pf = pb + PKG * gbytes;
        if (pf + gbytes > end) pf = NULL;
        float *yc = y + rc;
        if (n_tok == 1) {
            if (kind == AOTX_TK_Q6_K) kp6_dot1(pb, pf, nb, act, kb, yc, (int)nr);
            else kp4_dot1(pb, pf, nb, act, kb, yc, (int)nr);
            continue;
        }
        for (int64_t i = 0; i < nb; i++, pb += bb) {
            if (pf) {
                q45p_prefetch(pf, bb);
                pf += bb;
            }
            kp_unpack(kind, pb, kb);
            const int accum = i > 0;
            ktile_tokens(kind, kb, 0, i, act, as, n_tok, yc, ldy, (int)nr, accum);
        }
    }
}

void aotx_avx2_k_packed(int kind, const uint8_t *pk, int64_t nb, const uint8_t *act, size_t as,
                        int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    if (kind == AOTX_TK_Q6_K) k_packed(AOTX_TK_Q6_K, pk, nb, act, as, n_tok, y, ldy, r0, r1);
    else k_packed(AOTX_TK_Q4_K, pk, nb, act, as, n_tok, y, ldy, r0, r1);
}

#pragma GCC pop_options
#endif /* __x86_64__ */
