/* quant_x86.c -- AVX2/FMA/F16C and AVX-512 (BW/VL/VNNI) quantized matmul
 * kernels, chosen at run time by aotx_x86_pick() (the build passes no -march
 * flag; each instantiation is compiled under its own `#pragma GCC target`).
 *
 * The kernel bodies below the #else are written once and compiled twice: this
 * file includes itself with QX86_VNNI = 0 (AVX2: maddubs + madd) and
 * QX86_VNNI = 1 (AVX-512 BW/VL/VNNI: vpdpbusd / vpdpwssd; the Q4_0/Q5_0/Q8_0
 * family runs two blocks per 512-bit vector, the k-quants 256-bit vectors).
 *
 * Every kernel computes, per weight block and token, the same integer sum as
 * the reference in quant.c, then scales it by the same floats; only the order of
 * the float additions differs (the AVX-512 k-quant tiles repeat the reference's):
 *   Q4_0/Q5_0/Q8_0/IQ4_NL: weights as signed bytes w_s (q - 8, q - 16, int8, or the
 *     IQ4 codebook's level by pshufb), the activation stored as x_q + 128 (unsigned):
 *     sum (x_q+128)*w_s - 128*sum w_s; the correction depends on the weights only and
 *     seeds each token's sum.  Q4_1/Q5_1 likewise with w_s = q, plus m_w * dx * sum x_q.
 *   Q2_K/Q3_K/IQ4_XS x Q8_K32: a super-block unpacked to signed quants and 16 group
 *     scales; maddubs(|w|, sign(x_q, w)) * scale (madd) per 32 values, by its d[j].
 *   Q4_K/Q5_K x Q8_K32 (one activation scale per 32 values): per 32-value sub-block
 *     maddubs(q, x_q) * sc (vpdpwssd) scaled by its own d[j]; the mins m_j * dm[j].
 *   Q6_K: per 32 values maddubs(q, x_q) * sc minus 32 * sum sc * (16-sums), by d[j].
 *
 * Loop structure: n_tok == 1 streams each weight row once (software prefetch
 * QX86_PF bytes ahead: it doubles the DRAM rate on this machine).  n_tok > 1
 * with AVX-512 VNNI for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL/Q4_K/Q6_K: register tiles of 16 rows (the
 * int32 lanes) x up to 8 tokens: a 16-row chunk is transposed once per step into
 * unsigned quant dwords per row lane, the activation quants are broadcast 4 at a
 * time, so each block costs 8 vpdpbusd (512 multiply-adds) plus 3 float ops per
 * token (see mm_q8fam_tiles / mm_k_tiles); with aotx_kernel_invariant(1) n_tok == 1
 * runs them too (Q8_0: q8_0_rows1), so that results do not depend on the batch.
 * AVX2 runs Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q6_K as the register tiles of
 * quant_avx2_tiles.c at every n_tok.  Otherwise (Q5_K, F16/BF16, IQ4_NL, Q2_K/Q3_K/IQ4_XS,
 * and the unused AVX2 row kernels below)
 * n_tok > 1 walks chunks of QX86_ROWS rows x groups of QX86_NT tokens (8 with
 * AVX-512, 4 with AVX2) so that each unpacked weight block serves QX86_NT tokens.
 * Activation quantization (Q8_0 pairs, Q8_K32) also has AVX2 and AVX-512 versions here
 * producing the same bytes as quant.c's.
 */
#ifndef QX86_BODY

#include "aotx_kernels.h"
#include "cpu_internal.h"
#include "quant_tiles_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#define QX86_ROWS 16
#define QX86_PF 3072  /* software prefetch distance (bytes) in the weight stream */

enum { K_Q4_0, K_Q5_0, K_Q8_0, K_IQ4_NL, K_Q4_1, K_Q5_1 };  /* weight kinds of the Q8_0-activation family */
/* the VNNI copies' bytes per group of 16 rows and block (see mm_q8fam_packed below) */
#define QX86_VQ8_BLOCK 544
#define QX86_VQ5_BLOCK 352
#define QX86_VQ4_BLOCK 288
#define QX86_VQ4K_BLOCK 2304
#define QX86_VQ6K_BLOCK 3360
enum { KQ_Q4_K, KQ_Q5_K, KQ_Q6_K };  /* and of the Q8_K family */

#define QX86_BODY 1

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define QX86_VNNI 0
#include "quant_x86.c"
#undef QX86_VNNI
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define QX86_VNNI 1
#include "quant_x86.c"
#undef QX86_VNNI
#pragma GCC pop_options

/* AVX2: every n_tok runs the register tiles of quant_avx2_tiles.c (batch invariant). */
#define QX86_TILE2(NAME, FN, KIND)                                                             \
    static void NAME(const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act, size_t as,    \
                     int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {             \
        FN(KIND, w, rb, nb, act, as, n_tok, y, ldy, r0, r1);                                     \
    }
QX86_TILE2(t2_q4_0, aotx_avx2_q8fam_tiles, AOTX_TK_Q4_0)
QX86_TILE2(t2_q5_0, aotx_avx2_q8fam_tiles, AOTX_TK_Q5_0)
QX86_TILE2(t2_q8_0, aotx_avx2_q8fam_tiles, AOTX_TK_Q8_0)
QX86_TILE2(t2_q4_1, aotx_avx2_q8fam_tiles, AOTX_TK_Q4_1)
QX86_TILE2(t2_q5_1, aotx_avx2_q8fam_tiles, AOTX_TK_Q5_1)
QX86_TILE2(t2_q4_k, aotx_avx2_k_tiles, AOTX_TK_Q4_K)
QX86_TILE2(t2_q6_k, aotx_avx2_k_tiles, AOTX_TK_Q6_K)
#undef QX86_TILE2

static aotx_mm_fn qx86_pick_tiles2(int type) {
    switch (type) {
    case AOTX_T_Q4_0: return t2_q4_0;
    case AOTX_T_Q5_0: return t2_q5_0;
    case AOTX_T_Q8_0: return t2_q8_0;
    case AOTX_T_Q4_1: return t2_q4_1;
    case AOTX_T_Q5_1: return t2_q5_1;
    case AOTX_T_Q4_K: return t2_q4_k;
    case AOTX_T_Q6_K: return t2_q6_k;
    default: return NULL;
    }
}

int aotx_x86_level(void) {
    int avx2 = aotx_cpu_has(AOTX_CPU_AVX2_FMA | AOTX_CPU_F16C);
    int vnni = avx2 && aotx_cpu_has(AOTX_CPU_AVX512 | AOTX_CPU_AVX512VNNI);
    return vnni ? AOTX_LEVEL_AVX512VNNI : avx2 ? AOTX_LEVEL_AVX2 : AOTX_LEVEL_REF;
}

void aotx_x86_pick_act(int max_level, aotx_act8_fn *q8_0, aotx_act8k_fn *q8_k) {
    int level = aotx_x86_level();
    if (level > max_level) level = max_level;
    *q8_0 = level >= AOTX_LEVEL_AVX512VNNI ? act8_row_vnni : level >= AOTX_LEVEL_AVX2 ? act8_row_avx2 : NULL;
    *q8_k = level >= AOTX_LEVEL_AVX512VNNI ? act8k_row_vnni : level >= AOTX_LEVEL_AVX2 ? act8k_row_avx2 : NULL;
}

void aotx_x86_pick(int type, int max_level, int invariant, aotx_mm_fn *mm, const char **mm_name,
                   aotx_dq_fn *dq, const char **dq_name) {
    *mm = NULL;
    *dq = NULL;
    *mm_name = NULL;
    *dq_name = NULL;
    int level = aotx_x86_level();
    if (level > max_level) level = max_level;
    if (level >= AOTX_LEVEL_AVX512VNNI) {
        *mm = invariant ? qx86_pick_inv_vnni(type) : NULL;
        if (!*mm) *mm = qx86_pick_vnni(type);
        *mm_name = "avx512vnni";
        *dq = qx86_pick_dq_vnni(type);
        *dq_name = *dq ? "avx512vnni" : NULL;
    } else if (level >= AOTX_LEVEL_AVX2) {
        *mm = qx86_pick_tiles2(type);
        if (!*mm) *mm = qx86_pick_avx2(type);
        *mm_name = "avx2";
    }
    if (!*mm) *mm_name = NULL;
}

/* The re-blocked copies of weight matrices, one layout per kernel family that runs them:
 *   PK_AVX2: quant_avx2_tiles.c's (Q8_0 / Q5_0 / Q4_0 / Q4_K / Q6_K, groups of 8 rows);
 *   PK_VNNI: this file's AVX-512 VNNI tiles' (the same types, groups of 16 rows, below).
 * Each reproduces its tiles' bits (the same integer sums and float steps) and is served
 * while the type's pick is that family.  A copy starts with a header naming its layout, so
 * a copy made under one pick is refused (AOTX_E_UNSUPPORTED: run the original) under
 * another. */
enum { PK_NONE, PK_AVX2, PK_VNNI };
#define PK_MAGIC "AOTXPK1"

typedef struct {
    char magic[8];          /* PK_MAGIC */
    int32_t layout, type;   /* PK_*, AOTX_T_* */
    int64_t cols;
    uint8_t pad[AOTX_PK_HEAD - 24];
} pk_head;
_Static_assert(sizeof(pk_head) == AOTX_PK_HEAD, "the copy's header is AOTX_PK_HEAD bytes");

/* the layout the kernels picked now for the type run, PK_NONE if they use no copy */
static int pk_layout(int32_t type) {
    const char *impl = aotx_kernel_impl(type);
    if (!impl) return PK_NONE;
    switch (type) {
    case AOTX_T_Q8_0: case AOTX_T_Q5_0: case AOTX_T_Q4_0:
        return strcmp(impl, "avx2") == 0 ? PK_AVX2 : strcmp(impl, "avx512vnni") == 0 ? PK_VNNI : PK_NONE;
    case AOTX_T_Q4_K: case AOTX_T_Q6_K:
        return strcmp(impl, "avx2") == 0 ? PK_AVX2 : strcmp(impl, "avx512vnni") == 0 ? PK_VNNI : PK_NONE;
    default:
        return PK_NONE;
    }
}

static int pk_group(int layout) { return layout == PK_VNNI ? 16 : 8; }

/* bytes per group and block (k-quants: 256-column super-block); 0: no such copy */
static size_t pk_block(int layout, int32_t type) {
    if (layout == PK_VNNI) {
        switch (type) {
        case AOTX_T_Q8_0: return QX86_VQ8_BLOCK;
        case AOTX_T_Q5_0: return QX86_VQ5_BLOCK;
        case AOTX_T_Q4_0: return QX86_VQ4_BLOCK;
        case AOTX_T_Q4_K: return QX86_VQ4K_BLOCK;
        case AOTX_T_Q6_K: return QX86_VQ6K_BLOCK;
        default: return 0;
        }
    }
    if (layout != PK_AVX2) return 0;
    switch (type) {
    case AOTX_T_Q8_0: return AOTX_Q8P_BLOCK;
    case AOTX_T_Q5_0: return AOTX_Q5P_BLOCK;
    case AOTX_T_Q4_0: return AOTX_Q4P_BLOCK;
    case AOTX_T_Q4_K: return AOTX_Q4KP_BLOCK;
    case AOTX_T_Q6_K: return AOTX_Q6KP_BLOCK;
    default: return 0;
    }
}

/* VNNI row filler, Q8_0: scales at 2r, vector g (64 bytes at 32 + 64 g) lane r = the
 * row's quants 4g .. 4g + 3 as unsigned bytes w + 128 (the tiles' u) */
static void vq8_row(int kind, int gr, uint8_t *o, const uint8_t *p, int r) {
    (void)kind;
    memcpy(o + 2 * r, p, 2);
    for (int g = 0; g < 8; g++)
        for (int i = 0; i < 4; i++)
            o[2 * gr + 4 * gr * g + 4 * r + i] = (uint8_t)(p[2 + 4 * g + i] ^ 0x80);
}

int64_t aotx_packed_bytes(int32_t type, int64_t rows, int64_t cols) {
    const int layout = pk_layout(type);
    const size_t pb = pk_block(layout, type);
    const int64_t be = aotx_type_block_elems(type), gr = pk_group(layout);
    if (rows <= 0 || cols <= 0 || !pb || be <= 0 || cols % be) return 0;
    return AOTX_PK_HEAD + (rows + gr - 1) / gr * (cols / be) * (int64_t)pb;
}

int aotx_pack(int32_t type, const void *w, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
              void *dst) {
    const int layout = pk_layout(type);
    const int64_t be = aotx_type_block_elems(type), gr = pk_group(layout);
    if (!w || !dst || be <= 0 || rows <= 0 || cols <= 0 || cols % be || r0 < 0 || r0 % gr ||
        r1 > rows || r0 > r1)
        return AOTX_E_INVALID_ARGUMENT;
    const size_t pb = pk_block(layout, type);
    if (!pb) return AOTX_E_UNSUPPORTED;
    pk_head h = {.magic = PK_MAGIC, .layout = layout, .type = type, .cols = cols};
    memcpy(dst, &h, sizeof h);
    uint8_t *body = (uint8_t *)dst + AOTX_PK_HEAD;
    const int64_t nb = cols / be, g0 = r0 / gr, g1 = (r1 + gr - 1) / gr;
    const size_t rb = (size_t)aotx_type_row_bytes(type, cols), bb = rb / (size_t)nb;
    if (layout == PK_VNNI && (type == AOTX_T_Q4_K || type == AOTX_T_Q6_K)) {
        aotx_pack_groups(type == AOTX_T_Q6_K ? AOTX_TK_Q6_K : AOTX_TK_Q4_K, 16, aotx_k_pack_row, w, rb,
                         bb, pb, nb, rows, g0, g1, body);
        return 0;
    }
    if (layout == PK_VNNI) {
        const int kind = type == AOTX_T_Q8_0 ? K_Q8_0 : type == AOTX_T_Q5_0 ? K_Q5_0 : K_Q4_0;
        aotx_pack_groups(kind, 16, kind == K_Q8_0 ? vq8_row : aotx_q45_pack_row, w, rb, bb, pb, nb,
                         rows, g0, g1, body);
        return 0;
    }
    switch (type) {
    case AOTX_T_Q8_0: aotx_avx2_q8_0_pack(w, rb, nb, rows, g0, g1, body); break;
    case AOTX_T_Q5_0: aotx_avx2_q45_pack(AOTX_TK_Q5_0, w, rb, nb, rows, g0, g1, body); break;
    case AOTX_T_Q4_0: aotx_avx2_q45_pack(AOTX_TK_Q4_0, w, rb, nb, rows, g0, g1, body); break;
    case AOTX_T_Q6_K: aotx_avx2_k_pack(AOTX_TK_Q6_K, w, rb, nb, rows, g0, g1, body); break;
    default: aotx_avx2_k_pack(AOTX_TK_Q4_K, w, rb, nb, rows, g0, g1, body); break;
    }
    return 0;
}

int aotx_matmul_packed(int32_t type, const void *pk, int64_t cols, const void *act, int64_t n_tok,
                       float *y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t be = aotx_type_block_elems(type);
    if (!pk || !act || !y || be <= 0 || cols <= 0 || cols % be || n_tok <= 0 || r0 < 0 || r1 < r0 ||
        (n_tok > 1 && ldy < r1))
        return AOTX_E_INVALID_ARGUMENT;
    pk_head h;
    memcpy(&h, pk, sizeof h);
    if (memcmp(h.magic, PK_MAGIC, sizeof h.magic) != 0 || h.type != type || h.cols != cols ||
        !pk_block(h.layout, type) || r0 % pk_group(h.layout))
        return AOTX_E_INVALID_ARGUMENT;
    if (h.layout != pk_layout(type)) return AOTX_E_UNSUPPORTED;
    if (r0 == r1) return 0;
    const uint8_t *body = (const uint8_t *)pk + AOTX_PK_HEAD;
    const size_t as = (size_t)aotx_act_bytes(type, cols, 1);
    const int64_t nb = cols / be;
    if (h.layout == PK_VNNI && (type == AOTX_T_Q4_K || type == AOTX_T_Q6_K)) {
        mm_k_packed_vnni(type == AOTX_T_Q6_K ? KQ_Q6_K : KQ_Q4_K, body, nb, act, as, n_tok, y, ldy, r0, r1);
        return 0;
    }
    if (h.layout == PK_VNNI) {
        const int kind = type == AOTX_T_Q8_0 ? K_Q8_0 : type == AOTX_T_Q5_0 ? K_Q5_0 : K_Q4_0;
        mm_q8fam_packed_vnni(kind, body, nb, act, as, n_tok, y, ldy, r0, r1);
        return 0;
    }
    switch (type) {
    case AOTX_T_Q8_0: aotx_avx2_q8_0_packed(body, nb, act, as, n_tok, y, ldy, r0, r1); break;
    case AOTX_T_Q5_0: aotx_avx2_q45_packed(AOTX_TK_Q5_0, body, nb, act, as, n_tok, y, ldy, r0, r1); break;
    case AOTX_T_Q4_0: aotx_avx2_q45_packed(AOTX_TK_Q4_0, body, nb, act, as, n_tok, y, ldy, r0, r1); break;
    case AOTX_T_Q6_K: aotx_avx2_k_packed(AOTX_TK_Q6_K, body, nb, act, as, n_tok, y, ldy, r0, r1); break;
    default: aotx_avx2_k_packed(AOTX_TK_Q4_K, body, nb, act, as, n_tok, y, ldy, r0, r1); break;
    }
    return 0;
}
#else /* !__x86_64__: no copy */
int64_t aotx_packed_bytes(int32_t type, int64_t rows, int64_t cols) {
    (void)type; (void)rows; (void)cols;
    return 0;
}
int aotx_pack(int32_t type, const void *w, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
              void *dst) {
    (void)type; (void)w; (void)rows; (void)cols; (void)r0; (void)r1; (void)dst;
    return AOTX_E_UNSUPPORTED;
}
int aotx_matmul_packed(int32_t type, const void *pk, int64_t cols, const void *act, int64_t n_tok,
                       float *y, int64_t ldy, int64_t r0, int64_t r1) {
    (void)type; (void)pk; (void)cols; (void)act; (void)n_tok; (void)y; (void)ldy; (void)r0; (void)r1;
    return AOTX_E_UNSUPPORTED;
}
#endif /* __x86_64__ */

#else /* ------------------------------------------------ QX86_BODY: kernels */

#if QX86_VNNI
#define QX86_NT 8   /* tokens per pass over a weight row: 32 vector registers */
#define SFX(name) name##_vnni
/* acc + sum of 4 (u8 * s8) products per int32 lane; u up to 255 */
#define DP_U8S8(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
/* acc + sum of 2 (s16 * s16) products per int32 lane */
#define DP_S16(acc, a, b) _mm256_dpwssd_epi32((acc), (a), (b))
#else
#define QX86_NT 4   /* tokens per pass over a weight row: 16 vector registers */
#define SFX(name) name##_avx2
/* maddubs saturates above 32767 per pair: callers keep u * |s| * 2 below it */
#define DP_U8S8(acc, u, s) \
    _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1)))
#define DP_S16(acc, a, b) _mm256_add_epi32((acc), _mm256_madd_epi16((a), (b)))
#endif

#define AI static inline __attribute__((always_inline))

#define QX86_CASE(n, ROW, ...) case n: ROW(__VA_ARGS__, n, o); break;
#if QX86_NT == 8
#define QX86_SWITCH_NT(nt, ROW, ...)                                                        \
    switch (nt) {                                                                         \
    QX86_CASE(8, ROW, __VA_ARGS__) QX86_CASE(7, ROW, __VA_ARGS__)                          \
    QX86_CASE(6, ROW, __VA_ARGS__) QX86_CASE(5, ROW, __VA_ARGS__)                          \
    QX86_CASE(4, ROW, __VA_ARGS__) QX86_CASE(3, ROW, __VA_ARGS__)                          \
    QX86_CASE(2, ROW, __VA_ARGS__) default: ROW(__VA_ARGS__, 1, o); break;                 \
    }
#else
#define QX86_SWITCH_NT(nt, ROW, ...)                                                        \
    switch (nt) {                                                                         \
    QX86_CASE(4, ROW, __VA_ARGS__) QX86_CASE(3, ROW, __VA_ARGS__)                          \
    QX86_CASE(2, ROW, __VA_ARGS__) default: ROW(__VA_ARGS__, 1, o); break;                 \
    }
#endif


AI float SFX(hsum)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AI float SFX(h16)(uint16_t h) { return _cvtsh_ss(h); }

/* byte j of the result = 0xFF where bit j of x is set */
AI __m256i SFX(bits_to_bytes)(uint32_t x) {
#if QX86_VNNI
    return _mm256_movm_epi8((__mmask32)x);
#else
    __m256i v = _mm256_set1_epi32((int)x);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0);
    v = _mm256_shuffle_epi8(v, shuf);
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL));
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
#endif
}

/* --------------------- Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL x Q8_0 */

/* Q4_1 / Q5_1: w = d q + m, q unsigned; the kernels add m dx X per block (X = sum x_q) */
#define QX86_HAS_MIN(kind) ((kind) == K_Q4_1 || (kind) == K_Q5_1)
/* byte offsets in a block of the nibbles and of the fifth bits */
#define QX86_QS_OFF(kind) \
    ((kind) == K_Q5_0 ? 6 : (kind) == K_Q4_1 ? 4 : (kind) == K_Q5_1 ? 8 : 2)
#define QX86_QH_OFF(kind) ((kind) == K_Q5_1 ? 4 : 2)

/* The IQ4_NL codebook in both 128-bit lanes (a pshufb table) */
AI __m256i SFX(iq4_table)(void) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)aotx_iq4nl_values));
}

/* Weights of one block as signed bytes (q - offset, IQ4_NL's level, Q8_0's own int8, or
 * Q4_1 / Q5_1's unsigned q), 256-bit. */
AI __m256i SFX(unpack_q8fam)(int kind, const uint8_t *wb, uint16_t *d) {
    memcpy(d, wb, 2);
    if (kind == K_Q8_0) return _mm256_loadu_si256((const __m256i *)(wb + 2));
    const uint8_t *qs = wb + QX86_QS_OFF(kind);
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
    if (kind == K_IQ4_NL) return _mm256_shuffle_epi8(SFX(iq4_table)(), v);
    if (kind == K_Q4_0) return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
    if (kind == K_Q4_1) return v;
    uint32_t qh;
    memcpy(&qh, wb + QX86_QH_OFF(kind), 4);
    v = _mm256_or_si256(v, _mm256_and_si256(SFX(bits_to_bytes)(qh), _mm256_set1_epi8(0x10)));
    return kind == K_Q5_1 ? v : _mm256_sub_epi8(v, _mm256_set1_epi8(16));
}

AI uint16_t SFX(rd16)(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Q4_1 / Q5_1: the block's m as float */
AI float SFX(q8fam_min)(const uint8_t *wb) { return SFX(h16)(SFX(rd16)(wb + 2)); }

#if QX86_VNNI
/* Two blocks at once: [block 2p | block 2p+1] signed bytes in one zmm. */
AI __m512i SFX(unpack2_q8fam)(int kind, const uint8_t *b0, const uint8_t *b1, uint16_t *d0,
                              uint16_t *d1) {
    memcpy(d0, b0, 2);
    memcpy(d1, b1, 2);
    if (kind == K_Q8_0)
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                                  _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1);
    size_t off = QX86_QS_OFF(kind);
    __m128i q0 = _mm_loadu_si128((const __m128i *)(b0 + off));
    __m128i q1 = _mm_loadu_si128((const __m128i *)(b1 + off));
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(_mm_srli_epi16(q0, 4), q0)),
                                   _mm256_set_m128i(_mm_srli_epi16(q1, 4), q1), 1);
    v = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
    if (kind == K_IQ4_NL)
        return _mm512_shuffle_epi8(
            _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)aotx_iq4nl_values)), v);
    if (kind == K_Q4_0) return _mm512_sub_epi8(v, _mm512_set1_epi8(8));
    if (kind == K_Q4_1) return v;
    /* the two blocks' 32 high bits straight into a mask register (kmovd, kunpckdq) */
    uint32_t h0, h1;  /* memcpy: the fields are only 2-byte aligned */
    memcpy(&h0, b0 + QX86_QH_OFF(kind), 4);
    memcpy(&h1, b1 + QX86_QH_OFF(kind), 4);
    __mmask64 hm = _mm512_kunpackd((__mmask64)_cvtu32_mask32(h1), (__mmask64)_cvtu32_mask32(h0));
    v = _mm512_mask_add_epi8(v, hm, v, _mm512_set1_epi8(0x10));
    if (kind == K_Q5_1) return v;
    return _mm512_sub_epi8(v, _mm512_set1_epi8(16));
}

/* VNNI: sum (x_q + 128) * w_s - 128 * sum w_s = sum x_q * w_s, exact in int32.  The
 * correction depends on the weights only, so it seeds every token's accumulator.  Q4_1 /
 * Q5_1 (w_s = q) add X = sum (x_q + 128) - 128 * 32 (vpdpbusd with ones seeded by -512 per
 * 4-lane) times m_w dx. */
AI void SFX(row_q8fam)(int kind, size_t bbytes, const uint8_t *w, int64_t nb, const uint8_t *act,
                       size_t astride, int nt, float *out) {
    const uint8_t *xa[QX86_NT];
    __m512 facc[QX86_NT];
    __m256 tail[QX86_NT];
    for (int t = 0; t < nt; t++) {
        xa[t] = act + (size_t)t * astride;
        facc[t] = _mm512_setzero_ps();
        tail[t] = _mm256_setzero_ps();
    }
    const __m512i c80 = _mm512_set1_epi8((char)0x80);
    const int64_t np = nb / 2;
    for (int64_t p = 0; p < np; p++) {
        const uint8_t *b0 = w + (size_t)(2 * p) * bbytes;
        _mm_prefetch((const char *)b0 + QX86_PF, _MM_HINT_T0);
        if (2 * bbytes > 64) _mm_prefetch((const char *)b0 + QX86_PF + 64, _MM_HINT_T0);
        uint16_t d0, d1;
        __m512i ws = SFX(unpack2_q8fam)(kind, b0, b0 + bbytes, &d0, &d1);
        __m512 dw = _mm512_cvtph_ps(_mm256_set_m128i(_mm_set1_epi16((short)d1),
                                                     _mm_set1_epi16((short)d0)));
        __m512 mw = _mm512_setzero_ps();
        if (QX86_HAS_MIN(kind))
            mw = _mm512_cvtph_ps(_mm256_set_m128i(_mm_set1_epi16((short)SFX(rd16)(b0 + bbytes + 2)),
                                                  _mm_set1_epi16((short)SFX(rd16)(b0 + 2))));
        __m512i neg = _mm512_sub_epi32(_mm512_setzero_si512(),
                                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), c80, ws));
        for (int t = 0; t < nt; t++) {
            const uint8_t *xp = xa[t] + (size_t)p * AOTX_ACT8_PAIR_BYTES;
            const __m512i xu = _mm512_loadu_si512((const void *)xp);
            __m512i acc = _mm512_dpbusd_epi32(neg, xu, ws);
            const __m512 dx = _mm512_loadu_ps((const float *)(xp + 64));
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(dw, dx), facc[t]);
            if (QX86_HAS_MIN(kind)) {
                const __m512i sx = _mm512_dpbusd_epi32(_mm512_set1_epi32(-512), xu,
                                                       _mm512_set1_epi8(1));
                facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sx), _mm512_mul_ps(mw, dx), facc[t]);
            }
        }
    }
    if (nb & 1) {
        uint16_t d;
        const uint8_t *wb = w + (size_t)(nb - 1) * bbytes;
        __m256i ws = SFX(unpack_q8fam)(kind, wb, &d);
        __m256 dw = _mm256_set1_ps(SFX(h16)(d));
        const __m256 mw = _mm256_set1_ps(QX86_HAS_MIN(kind) ? SFX(q8fam_min)(wb) : 0.0f);
        __m256i neg = _mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_dpbusd_epi32(_mm256_setzero_si256(),
                                                           _mm256_set1_epi8((char)0x80), ws));
        for (int t = 0; t < nt; t++) {
            const __m256i xu = _mm256_loadu_si256((const __m256i *)aotx_act8_xu(xa[t], nb - 1));
            __m256i acc = _mm256_dpbusd_epi32(neg, xu, ws);
            const __m256 dx = _mm256_loadu_ps(aotx_act8_dx(xa[t], nb - 1));
            tail[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(dw, dx), tail[t]);
            if (QX86_HAS_MIN(kind)) {
                const __m256i sx = _mm256_dpbusd_epi32(_mm256_set1_epi32(-512), xu,
                                                       _mm256_set1_epi8(1));
                tail[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sx), _mm256_mul_ps(mw, dx), tail[t]);
            }
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = _mm512_reduce_add_ps(facc[t]) + SFX(hsum)(tail[t]);
}
/* ---- n_tok > 1: register tiles of 16 rows x up to 8 tokens (lanes = rows) ----
 * A chunk of 16 weight rows is transposed once per K slab (QX86_KB blocks) into
 * wt[b].q[g] = quants 4g..4g+3 of block b of rows 0..15 (one dword per lane), as
 * unsigned bytes u = w + c: c = 128 for Q8_0 (w xor 0x80), c = 8 / 16 for Q4_0 / Q5_0
 * (the raw q), c = 128 for IQ4_NL (u = its codebook level + 128), c = 0 for Q4_1 / Q5_1 (u = q; their mins' term m_w * (d_x * sum x_q) is one
 * more FMA per block and token).  The activations of the K slab are copied once per call as signed
 * x_q with a seed -c * sum(x_q) per token and block, so that
 *   vpdpbusd(seed, u, broadcast 4 x_q) over the 8 dwords of a block = sum w * x_q,
 * the reference's block sum exactly.  Per block and token the float work is one
 * conversion, one scale product (d_w lanes * d_x) and one FMA for 16 rows, against
 * 8 vpdpbusd (512 multiply-adds).  Slabs past the first add into y. */
#define QX86_TR 16                 /* rows per tile: the 16 int32 lanes */
#define QX86_TT 8                  /* tokens per tile */
/* Tokens [0, total) in groups of QX86_TT, each group's size a constant: CASE(n) runs the
 * group at tg of n tokens (a statement ending in break). */
#define QX86_TOKENS(total, CASE)                                                              \
    for (int64_t tg = 0; tg < (total); tg += QX86_TT) {                                        \
        switch ((total) - tg < QX86_TT ? (total) - tg : QX86_TT) {                             \
        CASE(8) CASE(7) CASE(6) CASE(5) CASE(4) CASE(3) CASE(2) default: CASE(1)               \
        }                                                                                      \
    }
#define QX86_KB 32                 /* blocks per K slab (1024 columns) */
#define QX86_ACTB (20 * 1024)      /* bytes of signed activation quants per slab */
#ifndef QX86_PFC
#define QX86_PFC 2                 /* weight prefetch distance in 16-row chunks */
#endif

typedef struct {
    __m512i q[8];  /* [dword g][row lane]: 4 unsigned quants of each of 16 rows */
} qx_wt;

typedef struct {
    qx_wt wt[QX86_KB];                      /* [block][8 dwords][16 rows] */
    __m512 dw[QX86_KB];                     /* [block][16 rows] weight scales */
    __m512 mw[QX86_KB];                     /* [block][16 rows] Q4_1 / Q5_1 mins */
    uint16_t d16[QX86_KB][QX86_TR];         /* [block][row] fp16 scales (staging) */
    uint16_t m16[QX86_KB][QX86_TR];         /* [block][row] fp16 mins (staging) */
    uint32_t qh[QX86_KB][QX86_TR];          /* [block][row] Q5_0 / Q5_1 high bits (staging) */
    int8_t xq[QX86_ACTB];                   /* [token][block][32] signed x_q */
    int32_t sd[QX86_ACTB / 32];             /* [token][block] seed -c * sum x_q */
    float dx[QX86_ACTB / 32];               /* [token][block] activation scale */
    float dxs[QX86_ACTB / 32];              /* [token][block] dx * sum x_q (the mins' term) */
} qx_tiles;                                 /* ~53 KiB, on the caller's stack */

/* The slab's activations: tokens [0, ts) x blocks [k0, k0 + kn). */
AI void SFX(tile_act)(const uint8_t *act, size_t as, int64_t ts, int64_t k0, int64_t kn,
                      int32_t c, qx_tiles *tb) {
    const __m256i c80 = _mm256_set1_epi8((char)0x80);
    for (int64_t t = 0; t < ts; t++) {
        const uint8_t *row = act + (size_t)t * as;
        for (int64_t b = 0; b < kn; b++) {
            __m256i xu = _mm256_loadu_si256((const __m256i *)aotx_act8_xu(row, k0 + b));
            __m256i s4 = _mm256_sad_epu8(xu, _mm256_setzero_si256());  /* sum (x_q + 128) */
            __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
            int32_t sum = (int32_t)(_mm_cvtsi128_si32(s2) + _mm_extract_epi32(s2, 2)) - 32 * 128;
            _mm256_storeu_si256((__m256i *)(tb->xq + (t * kn + b) * 32), _mm256_xor_si256(xu, c80));
            tb->sd[t * kn + b] = -c * sum;
            tb->dx[t * kn + b] = *aotx_act8_dx(row, k0 + b);
            tb->dxs[t * kn + b] = tb->dx[t * kn + b] * (float)sum;
        }
    }
}

/* out[g] lane r = dword g of the 32 bytes at rows[r] + off (r < 16, g < 8). */
AI void SFX(tr16x8)(const uint8_t *const *rows, size_t off, __m512i *out) {
    const __m512i lo_idx = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
    const __m512i hi_idx = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    /* z_i = [row i | row i+8]: an 8x8 dword transpose in each 256-bit half */
    __m512i z[8], t[8], u[8];
    for (int i = 0; i < 8; i++)
        z[i] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(rows[i] + off))),
            _mm256_loadu_si256((const __m256i *)(rows[i + 8] + off)), 1);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_unpacklo_epi32(z[i], z[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(z[i], z[i + 1]);
    }
    for (int h = 0; h < 8; h += 4) {  /* rows h..h+3 (and h+8..h+11) */
        u[h + 0] = _mm512_unpacklo_epi64(t[h], t[h + 2]);      /* dwords 0, 4 */
        u[h + 1] = _mm512_unpackhi_epi64(t[h], t[h + 2]);      /* dwords 1, 5 */
        u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);  /* dwords 2, 6 */
        u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);  /* dwords 3, 7 */
    }
    for (int g = 0; g < 4; g++) {
        out[g] = _mm512_permutex2var_epi64(u[g], lo_idx, u[g + 4]);
        out[g + 4] = _mm512_permutex2var_epi64(u[g], hi_idx, u[g + 4]);
    }
}

/* Rows rows[0..15] (pointers to each row's block k0), kn blocks: transpose into tb->wt. */
AI void SFX(tile_weights)(int kind, size_t bbytes, const uint8_t *const *rows, int64_t kn,
                          const uint8_t *next, size_t next_bytes, qx_tiles *tb) {
    /* staging pass: scales (and Q5_0 high bits) row by row */
    for (int r = 0; r < QX86_TR; r++) {
        const uint8_t *p = rows[r];
        for (int64_t b = 0; b < kn; b++, p += bbytes) {
            memcpy(&tb->d16[b][r], p, 2);
            if (QX86_HAS_MIN(kind)) memcpy(&tb->m16[b][r], p + 2, 2);
            if (kind == K_Q5_0 || kind == K_Q5_1) memcpy(&tb->qh[b][r], p + QX86_QH_OFF(kind), 4);
        }
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f), c80 = _mm512_set1_epi8((char)0x80);
    /* prefetch a later chunk, spread over the blocks */
    const aotx_pf_plan pl = aotx_pf_span(next, next_bytes, kn);
    for (int64_t b = 0; b < kn; b++) {
        const size_t off = (size_t)b * bbytes;
        __m512i *out = tb->wt[b].q;
        AOTX_PF_SLICE(pl, b, _MM_HINT_T0);
        tb->dw[b] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tb->d16[b]));
        if (QX86_HAS_MIN(kind))
            tb->mw[b] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tb->m16[b]));
        if (kind == K_Q8_0) {
            SFX(tr16x8)(rows, off + 2, out);
            for (int g = 0; g < 8; g++) out[g] = _mm512_xor_si512(out[g], c80);
            continue;
        }
        /* Q4_0 / Q5_0: transpose the 16 packed bytes (4 dwords) of each row, then split
         * nibbles: dword g < 4 holds elements 4g.. (low nibbles), g + 4 the high ones */
        const size_t qo = off + QX86_QS_OFF(kind);
        __m512i z[4], t[4], p[4];
        for (int i = 0; i < 4; i++) {
            __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(rows[i] + qo)));
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rows[i + 4] + qo)), 1);
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rows[i + 8] + qo)), 2);
            z[i] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rows[i + 12] + qo)), 3);
        }
        t[0] = _mm512_unpacklo_epi32(z[0], z[1]);
        t[1] = _mm512_unpackhi_epi32(z[0], z[1]);
        t[2] = _mm512_unpacklo_epi32(z[2], z[3]);
        t[3] = _mm512_unpackhi_epi32(z[2], z[3]);
        p[0] = _mm512_unpacklo_epi64(t[0], t[2]);
        p[1] = _mm512_unpackhi_epi64(t[0], t[2]);
        p[2] = _mm512_unpacklo_epi64(t[1], t[3]);
        p[3] = _mm512_unpackhi_epi64(t[1], t[3]);
        /* lanes of p[h]: lane 4L + e = row (z index e) + 4L = row 4L + e: rows in order,
         * but z[i] holds rows i, i+4, i+8, i+12 in its 128-bit lanes L: row i + 4L */
        for (int g = 0; g < 4; g++) {
            out[g] = _mm512_and_si512(p[g], m4);
            out[g + 4] = _mm512_and_si512(_mm512_srli_epi16(p[g], 4), m4);
        }
        if (kind == K_IQ4_NL) {  /* u = the codebook level + 128 */
            const __m512i tab = _mm512_xor_si512(
                _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)aotx_iq4nl_values)), c80);
            for (int g = 0; g < 8; g++) out[g] = _mm512_shuffle_epi8(tab, out[g]);
        }
        if (kind == K_Q5_0 || kind == K_Q5_1) {
            /* byte i of dword g gets bit 4g + i of the row's qh: byte g/2, bit 4(g&1) + i */
            __m512i h = _mm512_loadu_si512((const void *)tb->qh[b]);
            const __m512i b0 = _mm512_set1_epi32(0x08040201), b1 = _mm512_set1_epi32((int)0x80402010u);
            const __m512i c10 = _mm512_set1_epi8(0x10);
            const __m512i rep0 = _mm512_set4_epi32(12 * 0x01010101, 8 * 0x01010101,
                                                   4 * 0x01010101, 0);
            for (int k = 0; k < 4; k++) {  /* dwords 2k, 2k+1 take byte k of qh */
                __m512i rep = _mm512_shuffle_epi8(
                    h, _mm512_add_epi8(rep0, _mm512_set1_epi32(0x01010101 * k)));
                __mmask64 m0 = _mm512_test_epi8_mask(rep, b0), m1 = _mm512_test_epi8_mask(rep, b1);
                out[2 * k] = _mm512_mask_add_epi8(out[2 * k], m0, out[2 * k], c10);
                out[2 * k + 1] = _mm512_mask_add_epi8(out[2 * k + 1], m1, out[2 * k + 1], c10);
            }
        }
    }
}

/* y[(t0 + t) * ldy + r] = f[t] lane r (+= with accum) for t < nt, rows masked by m. */
AI void SFX(tile_store)(__m512 *f, int nt, int64_t t0, float *y, int64_t ldy, __mmask16 m,
                        int accum) {
    for (int t = 0; t < nt; t++) {
        float *yt = y + (t0 + t) * ldy;
        if (accum) f[t] = _mm512_add_ps(f[t], _mm512_maskz_loadu_ps(m, yt));
        _mm512_mask_storeu_ps(yt, m, f[t]);
    }
}

/* One tile: 16 rows (lanes) x NT tokens over the slab's kn blocks; y rows masked by m. */
AI void SFX(tile_dot)(const qx_tiles *tb, int has_min, int64_t kn, int64_t t0, int nt, float *y,
                      int64_t ldy, __mmask16 m, int accum) {
    __m512 f[QX86_TT];
    for (int t = 0; t < nt; t++) f[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < kn; b++) {
        __m512i a[QX86_TT];
        const int8_t *xq = tb->xq + (t0 * kn + b) * 32;
        for (int t = 0; t < nt; t++) a[t] = _mm512_set1_epi32(tb->sd[(t0 + t) * kn + b]);
        for (int g = 0; g < 8; g++) {
            const __m512i wv = _mm512_load_si512((const void *)&tb->wt[b].q[g]);
            for (int t = 0; t < nt; t++) {
                int32_t x4;
                memcpy(&x4, xq + (size_t)t * (size_t)kn * 32 + 4 * g, 4);
                a[t] = _mm512_dpbusd_epi32(a[t], wv, _mm512_set1_epi32(x4));
            }
        }
        const __m512 dw = tb->dw[b];
        for (int t = 0; t < nt; t++)
            f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[t]),
                                   _mm512_mul_ps(dw, _mm512_set1_ps(tb->dx[(t0 + t) * kn + b])), f[t]);
        if (has_min)  /* Q4_1 / Q5_1: + m_w * (dx * sum x_q) */
            for (int t = 0; t < nt; t++)
                f[t] = _mm512_fmadd_ps(tb->mw[b], _mm512_set1_ps(tb->dxs[(t0 + t) * kn + b]), f[t]);
    }
    SFX(tile_store)(f, nt, t0, y, ldy, m, accum);
}

#define QX86_TCASE(n) \
    case n: SFX(tile_dot)(tb, QX86_HAS_MIN(kind), kn, tg, n, yc, ldy, m, accum); break;

static void SFX(mm_q8fam_tiles)(int kind, const uint8_t *w, size_t rb, int64_t nb,
                                const uint8_t *act, size_t as, int64_t n_tok, float *y,
                                int64_t ldy, int64_t r0, int64_t r1) {
    qx_tiles tiles, *tb = &tiles;
    const size_t bbytes = rb / (size_t)nb;
    /* Q4_1 / Q5_1: u = q, no offset (their mins' term is added per block) */
    const int32_t c = kind == K_Q8_0 || kind == K_IQ4_NL ? 128 : kind == K_Q5_0 ? 16
                      : QX86_HAS_MIN(kind)                  ? 0
                                                            : 8;
    for (int64_t k0 = 0; k0 < nb; k0 += QX86_KB) {
        const int64_t kn = nb - k0 < QX86_KB ? nb - k0 : QX86_KB;
        int64_t ts_max = QX86_ACTB / (kn * 32);
        for (int64_t s0 = 0; s0 < n_tok; s0 += ts_max) {
            const int64_t ts = n_tok - s0 < ts_max ? n_tok - s0 : ts_max;
            SFX(tile_act)(act + (size_t)s0 * as, as, ts, k0, kn, c, tb);
            for (int64_t rc = r0; rc < r1; rc += QX86_TR) {
                const int64_t nr = r1 - rc < QX86_TR ? r1 - rc : QX86_TR;
                const uint8_t *rows[QX86_TR];
                for (int r = 0; r < QX86_TR; r++)  /* missing rows repeat the first */
                    rows[r] = w + (size_t)(rc + (r < nr ? r : 0)) * rb + (size_t)k0 * bbytes;
                /* the chunk QX86_PFC chunks ahead: prefetched while this one is unpacked */
                const int64_t pa = rc + QX86_PFC * QX86_TR;
                const int64_t nn = r1 - pa < QX86_TR ? r1 - pa : QX86_TR;
                SFX(tile_weights)(kind, bbytes, rows, kn, w + (size_t)pa * rb + (size_t)k0 * bbytes,
                                  nn > 0 ? (size_t)nn * rb : 0, tb);
                const __mmask16 m = (__mmask16)((1u << nr) - 1u);
                const int accum = k0 > 0;
                float *yc = y + s0 * ldy + rc;
                QX86_TOKENS(ts, QX86_TCASE)
            }
        }
    }
}
#undef QX86_TCASE

/* ---- the VNNI copies of Q8_0 / Q5_0 / Q4_0 (aotx_pack with this path picked) ----
 * Groups of 16 rows (lanes), per group nb blocks as one sequential stream:
 *   [0, 32)   the 16 rows' fp16 scales;
 *   Q8_0 [32, 544): 8 x 64 bytes, vector g lane r = row r's quants 4g .. 4g + 3 as
 *             unsigned bytes w + 128: tile_weights' wt[b].q[g] as it leaves it;
 *   Q4_0 / Q5_0 [32, 288): 4 x 64 bytes, vector n byte 4r + i = quant 4n + i of row r in
 *             the low nibble, 4(n + 4) + i in the high one; Q5_0 [288, 352): the fifth
 *             bits, byte 4r + i bit g = quant 4g + i's (aotx_q45_pack_row with 16 rows).
 * The same bytes as the original rows, rearranged.  The kernel is mm_q8fam_tiles with the
 * weight vectors read (Q8_0) or made in registers (Q4_0 / Q5_0: and / shift, the fifth
 * bit by a test mask and a masked add) from the stream instead of transposed per call:
 * the same integer sums and float steps, so its bits at every n_tok, n_tok == 1
 * included (the tiles' bits: AOTX_INVARIANT's, not the one-row kernels'). */
AI size_t SFX(vpk_block)(int kind) {
    return kind == K_Q8_0 ? QX86_VQ8_BLOCK : kind == K_Q5_0 ? QX86_VQ5_BLOCK : QX86_VQ4_BLOCK;
}

AI void SFX(vpk_weights)(int kind, const uint8_t *pb, __m512i *wv) {
    if (kind == K_Q8_0) {
        for (int g = 0; g < 8; g++) wv[g] = _mm512_loadu_si512((const void *)(pb + 32 + 64 * g));
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int n = 0; n < 4; n++) {
        const __m512i p = _mm512_loadu_si512((const void *)(pb + 32 + 64 * n));
        wv[n] = _mm512_and_si512(p, m4);
        wv[n + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), m4);
    }
    if (kind == K_Q5_0) {
        const __m512i h = _mm512_loadu_si512((const void *)(pb + 288)), c10 = _mm512_set1_epi8(0x10);
        for (int g = 0; g < 8; g++)
            wv[g] = _mm512_mask_add_epi8(wv[g], _mm512_test_epi8_mask(h, _mm512_set1_epi8((char)(1 << g))),
                                         wv[g], c10);
    }
}

/* tile_dot on packed blocks pb (the group's block k0 first); pf: a later group's bytes to
 * prefetch into L2, one block's worth per block (NULL: none). */
AI void SFX(vpk_dot)(int kind, const uint8_t *pb, const uint8_t *pf, const qx_tiles *tb, int64_t kn,
                     int64_t t0, int nt, float *y, int64_t ldy, __mmask16 m, int accum) {
    const size_t bb = SFX(vpk_block)(kind);
    __m512 f[QX86_TT];
    for (int t = 0; t < nt; t++) f[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < kn; b++, pb += bb) {
        if (pf) {
            for (size_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)pf + o, _MM_HINT_T1);
            pf += bb;
        }
        __m512i a[QX86_TT], wv[8];
        const int8_t *xq = tb->xq + (t0 * kn + b) * 32;
        for (int t = 0; t < nt; t++) a[t] = _mm512_set1_epi32(tb->sd[(t0 + t) * kn + b]);
        SFX(vpk_weights)(kind, pb, wv);
        for (int g = 0; g < 8; g++)
            for (int t = 0; t < nt; t++) {
                int32_t x4;
                memcpy(&x4, xq + (size_t)t * (size_t)kn * 32 + 4 * g, 4);
                a[t] = _mm512_dpbusd_epi32(a[t], wv[g], _mm512_set1_epi32(x4));
            }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)pb));
        for (int t = 0; t < nt; t++)
            f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[t]),
                                   _mm512_mul_ps(dw, _mm512_set1_ps(tb->dx[(t0 + t) * kn + b])), f[t]);
    }
    SFX(tile_store)(f, nt, t0, y, ldy, m, accum);
}

#define QX86_PCASE(n) \
    case n: SFX(vpk_dot)(kind, pb, tg == 0 ? pf : NULL, tb, kn, tg, n, yc, ldy, m, accum); break;

AI void SFX(q8fam_packed)(int kind, const uint8_t *pk, int64_t nb, const uint8_t *act, size_t as,
                          int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    qx_tiles tiles, *tb = &tiles;
    const size_t bb = SFX(vpk_block)(kind), gbytes = (size_t)nb * bb;
    const int32_t c = kind == K_Q8_0 ? 128 : kind == K_Q5_0 ? 16 : 8;
    const uint8_t *end = pk + (size_t)((r1 + QX86_TR - 1) / QX86_TR) * gbytes;
    for (int64_t k0 = 0; k0 < nb; k0 += QX86_KB) {
        const int64_t kn = nb - k0 < QX86_KB ? nb - k0 : QX86_KB;
        const int64_t ts_max = QX86_ACTB / (kn * 32);
        for (int64_t s0 = 0; s0 < n_tok; s0 += ts_max) {
            const int64_t ts = n_tok - s0 < ts_max ? n_tok - s0 : ts_max;
            SFX(tile_act)(act + (size_t)s0 * as, as, ts, k0, kn, c, tb);
            for (int64_t rc = r0; rc < r1; rc += QX86_TR) {
                const int64_t nr = r1 - rc < QX86_TR ? r1 - rc : QX86_TR;
                const uint8_t *pb = pk + (size_t)(rc / QX86_TR) * gbytes + (size_t)k0 * bb;
                const uint8_t *pf = pb + 4 * gbytes;  /* 4 groups (64 rows) ahead */
                if (pf + (size_t)kn * bb > end) pf = NULL;
                const __mmask16 m = (__mmask16)((1u << nr) - 1u);
                const int accum = k0 > 0;
                float *yc = y + s0 * ldy + rc;
                QX86_TOKENS(ts, QX86_PCASE)
            }
        }
    }
}
#undef QX86_PCASE

static void SFX(mm_q8fam_packed)(int kind, const uint8_t *pk, int64_t nb, const uint8_t *act,
                                 size_t as, int64_t n_tok, float *y, int64_t ldy, int64_t r0,
                                 int64_t r1) {
    if (kind == K_Q8_0) SFX(q8fam_packed)(K_Q8_0, pk, nb, act, as, n_tok, y, ldy, r0, r1);
    else if (kind == K_Q5_0) SFX(q8fam_packed)(K_Q5_0, pk, nb, act, as, n_tok, y, ldy, r0, r1);
    else SFX(q8fam_packed)(K_Q4_0, pk, nb, act, as, n_tok, y, ldy, r0, r1);
}

/* lane r = the sum of v[r]'s 8 lanes (integer: exact in any order) */
AI __m256i SFX(reduce8)(const __m256i *v) {
    __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
    __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* n_tok == 1 for Q8_0 (the output head of a decode step): 16 rows straight from memory,
 * no transpose.  Per row and block vpdpbusd(w xor 0x80, x_q) leaves 8 partial sums of
 * (w + 128) x_q; hadd trees reduce them into lanes = rows, and -128 sum x_q makes them
 * the tile's exact block sums.  The float steps are mm_q8fam_tiles' in its order (K
 * slabs of QX86_KB blocks), so the results are bit for bit the tiles' at any n_tok. */
static void SFX(q8_0_rows1)(const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act, float *y,
                            int64_t r0, int64_t r1) {
    const __m256i c80 = _mm256_set1_epi8((char)0x80);
    const size_t bb = sizeof(aotx_block_q8_0);
    for (int64_t rc = r0; rc < r1; rc += QX86_TR) {
        const int64_t nr = r1 - rc < QX86_TR ? r1 - rc : QX86_TR;
        const uint8_t *rows[QX86_TR];
        for (int r = 0; r < QX86_TR; r++) rows[r] = w + (size_t)(rc + (r < nr ? r : 0)) * rb;
        const aotx_pf_plan pl = aotx_pf_rows(w, rb, rc + QX86_PFC * QX86_TR, r1, QX86_TR, nb);
        const __mmask16 m = (__mmask16)((1u << nr) - 1u);
        float *yc = y + rc;
        for (int64_t k0 = 0; k0 < nb; k0 += QX86_KB) {
            const int64_t ke = nb - k0 < QX86_KB ? nb : k0 + QX86_KB;
            __m512 f = _mm512_setzero_ps();
            for (int64_t b = k0; b < ke; b++) {
                AOTX_PF_SLICE(pl, b, _MM_HINT_T0);
                const __m256i xu = _mm256_loadu_si256((const __m256i *)aotx_act8_xu(act, b));
                const __m256i xs = _mm256_xor_si256(xu, c80);
                __m256i s4 = _mm256_sad_epu8(xu, _mm256_setzero_si256());  /* sum (x_q + 128) */
                __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
                const int32_t sx = (int32_t)(_mm_cvtsi128_si32(s2) + _mm_extract_epi32(s2, 2)) - 32 * 128;
                const size_t off = (size_t)b * bb;
                __m256i v[QX86_TR];
                uint16_t d16[QX86_TR];
                for (int r = 0; r < QX86_TR; r++) {
                    const __m256i wu = _mm256_xor_si256(
                        _mm256_loadu_si256((const __m256i *)(rows[r] + off + 2)), c80);
                    v[r] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wu, xs);
                    memcpy(&d16[r], rows[r] + off, 2);
                }
                __m512i S = _mm512_inserti64x4(_mm512_castsi256_si512(SFX(reduce8)(v)),
                                               SFX(reduce8)(v + 8), 1);
                S = _mm512_add_epi32(S, _mm512_set1_epi32(-128 * sx));
                const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d16));
                f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S),
                                    _mm512_mul_ps(dw, _mm512_set1_ps(*aotx_act8_dx(act, b))), f);
            }
            if (k0 > 0) f = _mm512_add_ps(f, _mm512_maskz_loadu_ps(m, yc));
            _mm512_mask_storeu_ps(yc, m, f);
        }
    }
}
#else
/* AVX2: maddubs(x_q + 128, w_s) - maddubs(128, w_s) per int16 pair (no saturation for
 * |w_s| <= 31); Q8_0 and IQ4_NL use the sign trick maddubs(|w|, sign(x_q, w)) instead.
 * Q4_1 / Q5_1 add X = madd(maddubs(x_q + 128, 1), 1) - 512 per 4-lane times m_w dx. */
AI void SFX(step_q8fam)(int kind, const uint8_t *wb, const uint8_t *const *xa, int64_t i, int nt,
                        __m256 *facc) {
    uint16_t d;
    __m256i ws = SFX(unpack_q8fam)(kind, wb, &d);
    __m256 dw = _mm256_set1_ps(SFX(h16)(d));
    const __m256 mw = _mm256_set1_ps(QX86_HAS_MIN(kind) ? SFX(q8fam_min)(wb) : 0.0f);
    const __m256i c80 = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    const int wide = kind == K_Q8_0 || kind == K_IQ4_NL;  /* |w| up to 127 */
    __m256i aux = wide ? _mm256_sign_epi8(ws, ws) : _mm256_maddubs_epi16(c80, ws);
    for (int t = 0; t < nt; t++) {
        __m256i xu = _mm256_loadu_si256((const __m256i *)aotx_act8_xu(xa[t], i));
        __m256i p16;
        if (wide)
            p16 = _mm256_maddubs_epi16(aux, _mm256_sign_epi8(_mm256_xor_si256(xu, c80), ws));
        else
            p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(xu, ws), aux);
        __m256i acc = _mm256_madd_epi16(p16, ones);
        const __m256 dx = _mm256_loadu_ps(aotx_act8_dx(xa[t], i));
        facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(dw, dx), facc[t]);
        if (QX86_HAS_MIN(kind)) {
            const __m256i sx = _mm256_sub_epi32(
                _mm256_madd_epi16(_mm256_maddubs_epi16(xu, _mm256_set1_epi8(1)), ones),
                _mm256_set1_epi32(512));
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sx), _mm256_mul_ps(mw, dx), facc[t]);
        }
    }
}

AI void SFX(row_q8fam)(int kind, size_t bbytes, const uint8_t *w, int64_t nb, const uint8_t *act,
                       size_t astride, int nt, float *out) {
    const uint8_t *xa[QX86_NT];
    __m256 f0[QX86_NT], f1[QX86_NT];
    for (int t = 0; t < nt; t++) {
        xa[t] = act + (size_t)t * astride;
        f0[t] = _mm256_setzero_ps();
        f1[t] = _mm256_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {  /* two chains: hides the FMA latency at nt == 1 */
        _mm_prefetch((const char *)(w + (size_t)i * bbytes) + QX86_PF, _MM_HINT_T0);
        SFX(step_q8fam)(kind, w + (size_t)i * bbytes, xa, i, nt, f0);
        SFX(step_q8fam)(kind, w + (size_t)(i + 1) * bbytes, xa, i + 1, nt, f1);
    }
    if (i < nb) SFX(step_q8fam)(kind, w + (size_t)i * bbytes, xa, i, nt, f0);
    for (int t = 0; t < nt; t++) out[t] = SFX(hsum)(_mm256_add_ps(f0[t], f1[t]));
}
#endif

#if QX86_VNNI
/* ------------------------------------------------- activation quantization
 * The arithmetic of quant.c's quant_group: d = max|x| / 127, id = 1/d (0 if d == 0),
 * q = round-half-even(clamp(x * id, -127, 127)); the same bytes for finite x. */
AI __m512i SFX(quant16)(__m512 v, __m512 id) {
    v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v, id), _mm512_set1_ps(-127.0f)),
                      _mm512_set1_ps(127.0f));
    return _mm512_cvtps_epi32(v);  /* MXCSR default: round to nearest even */
}

/* 32 values -> 32 int8 in order, d returned; s16[2] (if not NULL) the two 16-sums. */
AI float SFX(quant32)(const float *x, __m256i *q8, int32_t *s16) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
    const __m512i q0 = SFX(quant16)(v0, id), q1 = SFX(quant16)(v1, id);
    *q8 = _mm256_set_m128i(_mm512_cvtepi32_epi8(q1), _mm512_cvtepi32_epi8(q0));
    if (s16) {
        s16[0] = _mm512_reduce_add_epi32(q0);
        s16[1] = _mm512_reduce_add_epi32(q1);
    }
    return d;
}
#else
/* ------------------------------------------------- activation quantization, AVX2
 * quant.c's quant_group again (the AVX-512 version's steps on 8-float vectors): the same
 * bytes for finite x.  32 values -> 32 int8 in order, d returned; s16[2] the two 16-sums. */
AI __m256i SFX(quant8)(__m256 v, __m256 id) {
    v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v, id), _mm256_set1_ps(-127.0f)),
                      _mm256_set1_ps(127.0f));
    return _mm256_cvtps_epi32(v);  /* MXCSR default: round to nearest even */
}

AI int32_t SFX(hsum_i32)(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

AI float SFX(quant32)(const float *x, __m256i *q8, int32_t *s16) {
    const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    const __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    const __m256 sgn = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sgn, v0), _mm256_andnot_ps(sgn, v1)),
                             _mm256_max_ps(_mm256_andnot_ps(sgn, v2), _mm256_andnot_ps(sgn, v3)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float d = _mm_cvtss_f32(h) / 127.0f;
    const __m256 id = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
    const __m256i q0 = SFX(quant8)(v0, id), q1 = SFX(quant8)(v1, id);
    const __m256i q2 = SFX(quant8)(v2, id), q3 = SFX(quant8)(v3, id);
    /* |q| <= 127: the packs do not saturate; they interleave 128-bit lanes, undone below */
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    *q8 = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    if (s16) {
        s16[0] = SFX(hsum_i32)(_mm256_add_epi32(q0, q1));
        s16[1] = SFX(hsum_i32)(_mm256_add_epi32(q2, q3));
    }
    return d;
}
#endif

/* Q8_0-family pairs and Q8_K32 blocks from SFX(quant32): quant.c's bytes. */
static void SFX(act8_row)(const float *x, int64_t cols, uint8_t *out) {
    const int64_t nb = cols / 32;
    for (int64_t b = 0; b < (nb + 1) / 2 * 2; b++) {
        uint8_t *xu = out + (b >> 1) * AOTX_ACT8_PAIR_BYTES + (b & 1) * 32;
        float *dx = (float *)(out + (b >> 1) * AOTX_ACT8_PAIR_BYTES + 64 + (b & 1) * 32);
        float d = 0.0f;
        __m256i q = _mm256_setzero_si256();
        if (b < nb) d = SFX(quant32)(x + 32 * b, &q, NULL);
        _mm256_storeu_si256((__m256i *)xu, _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)));
        _mm256_storeu_ps(dx, _mm256_set1_ps(d));
    }
}

static void SFX(act8k_row)(const float *x, int64_t cols, aotx_block_q8_k32 *out) {
    for (int64_t b = 0; b < cols / 256; b++, out++, x += 256) {
        for (int j = 0; j < 8; j++) {  /* each 32 values as one Q8_0-family block */
            __m256i q;
            int32_t s[2];
            const float d = SFX(quant32)(x + 32 * j, &q, s);
            _mm256_storeu_si256((__m256i *)(out->qs + 32 * j), q);
            out->bsums[2 * j] = (int16_t)s[0];
            out->bsums[2 * j + 1] = (int16_t)s[1];
            out->d[j] = d;
            out->dm[j] = d * (float)(s[0] + s[1]);
        }
    }
}

AI void SFX(k4_scales)(const uint8_t *q, uint8_t *sc, uint8_t *m) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
        sc[j + 4] = (uint8_t)((q[j + 8] & 0x0f) | ((q[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
    }
}

/* ---------------------------------------- Q2_K / Q3_K / IQ4_XS unpacking
 * A super-block as 8 vectors of 32 signed quants (Q2_K 0..3, Q3_K -4..3, IQ4_XS its
 * codebook levels), the 16 group scales and (Q2_K) mins as int8, d and dmin. */
typedef struct {
    __m256i w[8];
    int8_t sc[16], m[16];
    float d, dmin;
} SFX(qx_kx);

AI void SFX(kx_unpack)(int type, const uint8_t *wb, SFX(qx_kx) *k) {
    const __m256i c3 = _mm256_set1_epi8(3);
    k->dmin = 0.0f;
    memset(k->m, 0, sizeof k->m);
    if (type == AOTX_T_IQ4_XS) {
        const aotx_block_iq4_xs *b = (const aotx_block_iq4_xs *)wb;
        const __m256i tab = SFX(iq4_table)(), m4 = _mm256_set1_epi8(0x0f);
        k->d = SFX(h16)(b->d);
        for (int j = 0; j < 8; j++) {
            __m128i q = _mm_loadu_si128((const __m128i *)(b->qs + 16 * j));
            k->w[j] = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4));
            k->sc[2 * j] = k->sc[2 * j + 1] = (int8_t)aotx_iq4xs_scale(b, j);
        }
        return;
    }
    const uint8_t *qs = wb + (type == AOTX_T_Q2_K ? 16 : 32);
    const __m256i hm = _mm256_loadu_si256((const __m256i *)wb);  /* Q3_K's hmask */
    for (int h = 0; h < 2; h++) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
        for (int kk = 0; kk < 4; kk++) {
            const int j = 4 * h + kk;
            __m256i v = _mm256_and_si256(_mm256_srli_epi16(a, 2 * kk), c3);
            if (type == AOTX_T_Q3_K) {  /* -4 where bit j of hmask is clear */
                const __m256i clear = _mm256_cmpeq_epi8(
                    _mm256_and_si256(hm, _mm256_set1_epi8((char)(1 << j))), _mm256_setzero_si256());
                v = _mm256_sub_epi8(v, _mm256_and_si256(clear, _mm256_set1_epi8(4)));
            }
            k->w[j] = v;
        }
    }
    if (type == AOTX_T_Q2_K) {
        const aotx_block_q2_k *b = (const aotx_block_q2_k *)wb;
        k->d = SFX(h16)(b->d);
        k->dmin = SFX(h16)(b->dmin);
        for (int g = 0; g < 16; g++) {
            k->sc[g] = (int8_t)(b->scales[g] & 0x0f);
            k->m[g] = (int8_t)(b->scales[g] >> 4);
        }
        return;
    }
    const aotx_block_q3_k *b = (const aotx_block_q3_k *)wb;
    k->d = SFX(h16)(b->d);
    for (int g = 0; g < 16; g++) k->sc[g] = (int8_t)aotx_q3k_scale(b->scales, g);
}

#if QX86_VNNI
/* ------------------------------------------------------------ dequantization
 * The arithmetic of quant.c's dq_* (and gguf-py's): one float multiply per
 * element (two for the k-quants' d*sc), then for Q4_K/Q5_K a subtraction, with
 * explicitly rounded intrinsics so the compiler cannot fuse them into an FMA. */
#define QX86_RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

AI void SFX(store_scaled)(float *dst, __m512i q, float d) {
    _mm512_storeu_ps(dst, _mm512_mul_round_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(q), QX86_RN));
}

static void SFX(dq_q8_0)(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += 32) {
        const aotx_block_q8_0 *b = (const aotx_block_q8_0 *)(src + (size_t)i * 34);
        float d = SFX(h16)(b->d);
        SFX(store_scaled)(dst, _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b->qs)), d);
        SFX(store_scaled)(dst + 16,
                          _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16))), d);
    }
}

static void SFX(dq_q4_0)(const uint8_t *src, float *dst, int64_t nb) {
    const __m512i m4 = _mm512_set1_epi32(0x0f), eight = _mm512_set1_epi32(8);
    for (int64_t i = 0; i < nb; i++, dst += 32) {
        const aotx_block_q4_0 *b = (const aotx_block_q4_0 *)(src + (size_t)i * 18);
        float d = SFX(h16)(b->d);
        __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b->qs));
        SFX(store_scaled)(dst, _mm512_sub_epi32(_mm512_and_si512(q, m4), eight), d);
        SFX(store_scaled)(dst + 16, _mm512_sub_epi32(_mm512_srli_epi32(q, 4), eight), d);
    }
}

static void SFX(dq_q5_0)(const uint8_t *src, float *dst, int64_t nb) {
    const __m512i m4 = _mm512_set1_epi32(0x0f), c16 = _mm512_set1_epi32(16);
    for (int64_t i = 0; i < nb; i++, dst += 32) {
        const aotx_block_q5_0 *b = (const aotx_block_q5_0 *)(src + (size_t)i * 22);
        float d = SFX(h16)(b->d);
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b->qs));
        __m512i lo = _mm512_mask_add_epi32(_mm512_and_si512(q, m4), (__mmask16)qh,
                                           _mm512_and_si512(q, m4), c16);
        __m512i hi = _mm512_mask_add_epi32(_mm512_srli_epi32(q, 4), (__mmask16)(qh >> 16),
                                           _mm512_srli_epi32(q, 4), c16);
        SFX(store_scaled)(dst, _mm512_sub_epi32(lo, c16), d);
        SFX(store_scaled)(dst + 16, _mm512_sub_epi32(hi, c16), d);
    }
}

/* Q4_K (has_qh = 0) / Q5_K (has_qh = 1): (d*sc) * q - (dmin*m) */
AI void SFX(dq_k45)(int has_qh, const uint8_t *src, float *dst, int64_t nb) {
    const size_t bbytes = has_qh ? sizeof(aotx_block_q5_k) : sizeof(aotx_block_q4_k);
    for (int64_t i = 0; i < nb; i++, dst += 256) {
        const uint8_t *wb = src + (size_t)i * bbytes;
        uint16_t d16, dm16;
        memcpy(&d16, wb, 2);
        memcpy(&dm16, wb + 2, 2);
        const uint8_t *qh = wb + 16, *qs = wb + (has_qh ? 48 : 16);
        uint8_t sc[8], m[8];
        SFX(k4_scales)(wb + 4, sc, m);
        float d = SFX(h16)(d16), dmin = SFX(h16)(dm16);
        for (int j = 0; j < 8; j++) {
            __m512 dl = _mm512_set1_ps(d * (float)sc[j]), ml = _mm512_set1_ps(dmin * (float)m[j]);
            for (int h = 0; h < 2; h++) {
                __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + 32 * (j / 2) + 16 * h)));
                q = _mm512_and_si512(_mm512_srli_epi32(q, 4 * (j & 1)), _mm512_set1_epi32(0x0f));
                if (has_qh) {
                    __m512i hb = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qh + 16 * h)));
                    hb = _mm512_and_si512(_mm512_srli_epi32(hb, j), _mm512_set1_epi32(1));
                    q = _mm512_or_si512(q, _mm512_slli_epi32(hb, 4));
                }
                __m512 p = _mm512_mul_round_ps(dl, _mm512_cvtepi32_ps(q), QX86_RN);
                _mm512_storeu_ps(dst + 32 * j + 16 * h, _mm512_sub_round_ps(p, ml, QX86_RN));
            }
        }
    }
}

static void SFX(dq_q4_k)(const uint8_t *src, float *dst, int64_t nb) { SFX(dq_k45)(0, src, dst, nb); }
static void SFX(dq_q5_k)(const uint8_t *src, float *dst, int64_t nb) { SFX(dq_k45)(1, src, dst, nb); }

static void SFX(dq_q6_k)(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += 256) {
        const aotx_block_q6_k *b = (const aotx_block_q6_k *)(src + (size_t)i * sizeof(aotx_block_q6_k));
        float d = SFX(h16)(b->d);
        for (int g = 0; g < 16; g++) {  /* element e = 128h + 32k + l, g = e / 16 */
            int h = g / 8, k = (g % 8) / 2, l0 = (g % 2) * 16;
            const uint8_t *ql = b->ql + 64 * h + 32 * (k & 1) + l0;
            __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)ql));
            lo = _mm512_and_si512(_mm512_srli_epi32(lo, k < 2 ? 0 : 4), _mm512_set1_epi32(0x0f));
            __m512i hi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->qh + 32 * h + l0)));
            hi = _mm512_and_si512(_mm512_srli_epi32(hi, 2 * k), _mm512_set1_epi32(3));
            __m512i q = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)),
                                         _mm512_set1_epi32(32));
            SFX(store_scaled)(dst + 16 * g, q, d * (float)b->scales[g]);
        }
    }
}

static void SFX(dq_f16)(const uint8_t *src, float *dst, int64_t n) {
    int64_t k = 0;
    for (; k + 16 <= n; k += 16)
        _mm512_storeu_ps(dst + k, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + 2 * k))));
    for (; k < n; k++) {
        uint16_t h;
        memcpy(&h, src + 2 * k, 2);
        dst[k] = aotx_fp16_to_f32(h);
    }
}

static void SFX(dq_bf16)(const uint8_t *src, float *dst, int64_t n) {
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + 2 * k)));
        _mm512_storeu_si512((void *)(dst + k), _mm512_slli_epi32(v, 16));
    }
    for (; k < n; k++) {
        uint16_t h;
        memcpy(&h, src + 2 * k, 2);
        dst[k] = aotx_bf16_to_f32(h);
    }
}

/* Q4_1 / Q5_1: d * q, then + m (each rounded, as gguf-py) */
AI void SFX(dq_q8min)(int kind, const uint8_t *src, float *dst, int64_t nb) {
    const size_t bb = kind == K_Q5_1 ? sizeof(aotx_block_q5_1) : sizeof(aotx_block_q4_1);
    for (int64_t i = 0; i < nb; i++, dst += 32) {
        const uint8_t *wb = src + (size_t)i * bb;
        uint16_t d16;
        const __m256i q = SFX(unpack_q8fam)(kind, wb, &d16);
        const __m512 d = _mm512_set1_ps(SFX(h16)(d16)), m = _mm512_set1_ps(SFX(q8fam_min)(wb));
        for (int h = 0; h < 2; h++) {
            __m512i qi = _mm512_cvtepu8_epi32(h ? _mm256_extracti128_si256(q, 1) : _mm256_castsi256_si128(q));
            __m512 p = _mm512_mul_round_ps(d, _mm512_cvtepi32_ps(qi), QX86_RN);
            _mm512_storeu_ps(dst + 16 * h, _mm512_add_round_ps(p, m, QX86_RN));
        }
    }
}

static void SFX(dq_q4_1)(const uint8_t *src, float *dst, int64_t nb) { SFX(dq_q8min)(K_Q4_1, src, dst, nb); }
static void SFX(dq_q5_1)(const uint8_t *src, float *dst, int64_t nb) { SFX(dq_q8min)(K_Q5_1, src, dst, nb); }

static void SFX(dq_iq4_nl)(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += 32) {
        uint16_t d;
        const __m256i q = SFX(unpack_q8fam)(K_IQ4_NL, src + (size_t)i * sizeof(aotx_block_iq4_nl), &d);
        SFX(store_scaled)(dst, _mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)), SFX(h16)(d));
        SFX(store_scaled)(dst + 16, _mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)), SFX(h16)(d));
    }
}

/* Q2_K / Q3_K / IQ4_XS: (d * sc) * q, Q2_K minus dmin * m (each rounded, as gguf-py) */
AI void SFX(dq_kx)(int type, const uint8_t *src, float *dst, int64_t nb) {
    const size_t bb = (size_t)aotx_type_block_bytes(type);
    for (int64_t i = 0; i < nb; i++, dst += 256) {
        SFX(qx_kx) k;
        SFX(kx_unpack)(type, src + (size_t)i * bb, &k);
        for (int g = 0; g < 16; g++) {
            const __m256i w = k.w[g / 2];
            const __m512i q = _mm512_cvtepi8_epi32(g & 1 ? _mm256_extracti128_si256(w, 1) : _mm256_castsi256_si128(w));
            const __m512 p = _mm512_mul_round_ps(_mm512_set1_ps(k.d * (float)k.sc[g]), _mm512_cvtepi32_ps(q), QX86_RN);
            _mm512_storeu_ps(dst + 16 * g, type == AOTX_T_Q2_K
                                               ? _mm512_sub_round_ps(p, _mm512_set1_ps(k.dmin * (float)k.m[g]), QX86_RN)
                                               : p);
        }
    }
}

static void SFX(dq_q2_k)(const uint8_t *src, float *dst, int64_t nb) { SFX(dq_kx)(AOTX_T_Q2_K, src, dst, nb); }
static void SFX(dq_q3_k)(const uint8_t *src, float *dst, int64_t nb) { SFX(dq_kx)(AOTX_T_Q3_K, src, dst, nb); }
static void SFX(dq_iq4_xs)(const uint8_t *src, float *dst, int64_t nb) { SFX(dq_kx)(AOTX_T_IQ4_XS, src, dst, nb); }

static aotx_dq_fn SFX(qx86_pick_dq)(int type) {
    switch (type) {
    case AOTX_T_Q4_1: return SFX(dq_q4_1);
    case AOTX_T_Q5_1: return SFX(dq_q5_1);
    case AOTX_T_IQ4_NL: return SFX(dq_iq4_nl);
    case AOTX_T_Q2_K: return SFX(dq_q2_k);
    case AOTX_T_Q3_K: return SFX(dq_q3_k);
    case AOTX_T_IQ4_XS: return SFX(dq_iq4_xs);
    case AOTX_T_Q8_0: return SFX(dq_q8_0);
    case AOTX_T_Q4_0: return SFX(dq_q4_0);
    case AOTX_T_Q5_0: return SFX(dq_q5_0);
    case AOTX_T_Q4_K: return SFX(dq_q4_k);
    case AOTX_T_Q5_K: return SFX(dq_q5_k);
    case AOTX_T_Q6_K: return SFX(dq_q6_k);
    case AOTX_T_F16: return SFX(dq_f16);
    case AOTX_T_BF16: return SFX(dq_bf16);
    default: return NULL;
    }
}
#undef QX86_RN
#endif

/* ------------------------------------------------------- k-quants x Q8_K32
 * One super-block of one row, unpacked (qx_ksb), against one token (k_tok): per 32-value
 * sub-block j the exact integer sum (Q4_K/Q5_K: sc_j * S_j; Q6_K: T_j, the -32 offset
 * from the 16-sums) as 8 int32 partial lanes, reduced by a hadd tree into one vector
 * whose lane j is that sum, then scaled by the activation's d[j] in float.  Row kernels
 * (n_tok == 1) and the chunked n_tok > 1 driver share k_tok, so a token's float steps do
 * not depend on n_tok (AVX2 Q5_K; the AVX-512 and AVX2 Q4_K / Q6_K tiles below and in
 * quant_avx2_tiles.c follow the reference's order instead). */
typedef struct {
    __m256i q[8];   /* unsigned quants per 32 elements */
    __m256i sc[8];  /* int16 scale vector per 32 elements */
    __m256i corr;   /* Q6_K: the 16 scales (int16), for sum sc_g * bsum_g */
    __m256 mf;      /* Q4_K/Q5_K: m_j as float */
#if QX86_VNNI
    __m256 dsc;     /* Q4_K/Q5_K: d * sc_j (exact); Q6_K: unused */
    __m512 dsc16;   /* Q6_K: d * sc_g (exact) */
#endif
    float d, dmin;
} SFX(qx_ksb);
#define QX86_KSB 64  /* super-blocks buffered per chunk (38 KiB) */

AI void SFX(kq_unpack)(int kind, const uint8_t *wb, SFX(qx_ksb) *k) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    if (kind == KQ_Q6_K) {
        const aotx_block_q6_k *b = (const aotx_block_q6_k *)wb;
        k->d = SFX(h16)(b->d);
        k->dmin = 0.0f;
        k->mf = _mm256_setzero_ps();
        k->corr = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        for (int h = 0; h < 2; h++) {
            __m256i A = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
            __m256i B = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
            __m256i H = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
            k->q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(A, m4),
                                              _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
            k->q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(B, m4),
                                              _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
            k->q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4),
                                              _mm256_and_si256(H, m30));
            k->q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), m4),
                                              _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
        }
        for (int j = 0; j < 8; j++)
            k->sc[j] = _mm256_set_m128i(_mm_set1_epi16(b->scales[2 * j + 1]),
                                        _mm_set1_epi16(b->scales[2 * j]));
#if QX86_VNNI
        k->dsc16 = _mm512_mul_ps(_mm512_set1_ps(k->d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                           _mm_loadu_si128((const __m128i *)b->scales))));
#endif
        return;
    }
    const int has_qh = kind == KQ_Q5_K;
    uint16_t d16, dm16;
    memcpy(&d16, wb, 2);
    memcpy(&dm16, wb + 2, 2);
    const uint8_t *qh = wb + 16, *qs = wb + (has_qh ? 48 : 16);
    /* the 6-bit scales and mins as 8 bytes each, in registers (k4_scales' bytes written to
     * memory and read back as one 8-byte vector stall store forwarding) */
    uint32_t a, b, c;
    memcpy(&a, wb + 4, 4);
    memcpy(&b, wb + 8, 4);
    memcpy(&c, wb + 12, 4);
    const uint64_t sc8 = (uint64_t)(a & 0x3f3f3f3fu) |
                         (uint64_t)((c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u)) << 32;
    const uint64_t m8 = (uint64_t)(b & 0x3f3f3f3fu) |
                        (uint64_t)(((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u)) << 32;
    k->d = SFX(h16)(d16);
    k->dmin = SFX(h16)(dm16);
    k->corr = _mm256_setzero_si256();
    k->mf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m8)));
    __m256i hv = has_qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    for (int p = 0; p < 4; p++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (has_qh) {
            const __m256i one = _mm256_set1_epi8(1);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(
                                         _mm256_and_si256(_mm256_srli_epi16(hv, 2 * p), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(
                                         _mm256_and_si256(_mm256_srli_epi16(hv, 2 * p + 1), one), 4));
        }
        k->q[2 * p] = lo;
        k->q[2 * p + 1] = hi;
    }
    for (int j = 0; j < 8; j++) k->sc[j] = _mm256_set1_epi16((short)((sc8 >> (8 * j)) & 0xff));
#if QX86_VNNI
    k->dsc = _mm256_mul_ps(_mm256_set1_ps(k->d),
                           _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc8))));
    k->mf = _mm256_mul_ps(_mm256_set1_ps(k->dmin), k->mf);  /* dmin * m_j (exact) */
#endif
}

/* lane j = the sum of the 8 lanes of v[j] (exact int32) */
AI __m256i SFX(tree8)(const __m256i *v) {
    const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                            _mm256_permute2x128_si256(a, b, 0x31));
}

#if QX86_VNNI
/* AVX-512: 64 values per vpdpbusd (two 32-blocks; lanes = sums of 4), each lane scaled
 * by its d_w * sc * d[j] (a permute of 8 or 16 products per token), the mins / the -32
 * offset from the 8 sub-block terms; facc is one 16-lane accumulator per token. */
typedef __m512 SFX(kacc);
#define KACC_ZERO() _mm512_setzero_ps()
#define KACC_SUM(v) _mm512_reduce_add_ps(v)
AI __m512 SFX(k_tok)(int kind, const SFX(qx_ksb) *k, const aotx_block_q8_k32 *xb, __m512 facc) {
    const __m256 d8 = _mm256_loadu_ps(xb->d);
    const __m512i zero = _mm512_setzero_si512();
    if (kind == KQ_Q6_K) {
        /* lane l of pair p: group 4p + l / 4 */
        const __m512i ig = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
        const __m512 w16 = _mm512_mul_ps(k->dsc16, _mm512_permutexvar_ps(ig, _mm512_zextps256_ps512(d8)));
        for (int p = 0; p < 4; p++) {
            const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(k->q[2 * p]), k->q[2 * p + 1], 1);
            const __m512i s = _mm512_dpbusd_epi32(zero, z, _mm512_loadu_si512((const void *)(xb->qs + 64 * p)));
            const __m512i il = _mm512_set_epi32(4 * p + 3, 4 * p + 3, 4 * p + 3, 4 * p + 3, 4 * p + 2,
                                                4 * p + 2, 4 * p + 2, 4 * p + 2, 4 * p + 1, 4 * p + 1,
                                                4 * p + 1, 4 * p + 1, 4 * p, 4 * p, 4 * p, 4 * p);
            facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(il, w16), facc);
        }
        const __m256i cr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), k->corr);
        const __m256 off = _mm256_mul_ps(_mm256_cvtepi32_ps(cr), d8);
        return _mm512_fnmadd_ps(_mm512_zextps256_ps512(off), _mm512_set1_ps(32.0f * k->d), facc);
    }
    const __m512 w8 = _mm512_zextps256_ps512(_mm256_mul_ps(k->dsc, d8));
    for (int p = 0; p < 4; p++) {
        const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(k->q[2 * p]), k->q[2 * p + 1], 1);
        const __m512i s = _mm512_dpbusd_epi32(zero, z, _mm512_loadu_si512((const void *)(xb->qs + 64 * p)));
        const __m512i il = _mm512_set_epi32(2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1,
                                            2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p, 2 * p, 2 * p, 2 * p,
                                            2 * p, 2 * p, 2 * p, 2 * p);
        facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(il, w8), facc);
    }
    return _mm512_fnmadd_ps(_mm512_zextps256_ps512(k->mf), _mm512_zextps256_ps512(_mm256_loadu_ps(xb->dm)),
                            facc);
}
#else
typedef __m256 SFX(kacc);
#define KACC_ZERO() _mm256_setzero_ps()
#define KACC_SUM(v) SFX(hsum)(v)
/* facc (lane j) += this super-block's sub-block j term for one token */
AI __m256 SFX(k_tok)(int kind, const SFX(qx_ksb) *k, const aotx_block_q8_k32 *xb, __m256 facc) {
    __m256i v[8];
    for (int j = 0; j < 8; j++) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * j));
        v[j] = DP_S16(_mm256_setzero_si256(), _mm256_maddubs_epi16(k->q[j], xv), k->sc[j]);
    }
    __m256i T = SFX(tree8)(v);
    const __m256 d8 = _mm256_loadu_ps(xb->d);
    if (kind == KQ_Q6_K) {
        const __m256i cr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), k->corr);
        T = _mm256_sub_epi32(T, _mm256_slli_epi32(cr, 5));  /* the -32 offset */
        return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(T), d8), _mm256_set1_ps(k->d), facc);
    }
    facc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(T), d8), _mm256_set1_ps(k->d), facc);
    return _mm256_fnmadd_ps(_mm256_mul_ps(k->mf, _mm256_loadu_ps(xb->dm)), _mm256_set1_ps(k->dmin),
                            facc);
}
#endif

AI void SFX(row_kq)(int kind, const uint8_t *w, int64_t nb, const uint8_t *act, size_t astride,
                    int nt, float *out) {
    const size_t bbytes = kind == KQ_Q6_K   ? sizeof(aotx_block_q6_k)
                          : kind == KQ_Q5_K ? sizeof(aotx_block_q5_k)
                                            : sizeof(aotx_block_q4_k);
    SFX(kacc) facc[QX86_NT];
    for (int t = 0; t < nt; t++) facc[t] = KACC_ZERO();
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *wb = w + (size_t)i * bbytes;
        for (size_t off = 0; off < bbytes; off += 64)
            _mm_prefetch((const char *)wb + QX86_PF + off, _MM_HINT_T0);
        SFX(qx_ksb) k;
        SFX(kq_unpack)(kind, wb, &k);
        for (int t = 0; t < nt; t++)
            facc[t] = SFX(k_tok)(kind, &k, (const aotx_block_q8_k32 *)(act + (size_t)t * astride) + i,
                                 facc[t]);
    }
    for (int t = 0; t < nt; t++) out[t] = KACC_SUM(facc[t]);
}

/* n_tok > 1: chunks of rows unpacked once, then each group of QX86_NT tokens runs over
 * the chunk from L1 (k_tok: the row kernel's float steps). */
AI void SFX(kbuf_fill)(int kind, const uint8_t *w, int64_t nb, SFX(qx_ksb) *buf) {
    const size_t bbytes = kind == KQ_Q6_K   ? sizeof(aotx_block_q6_k)
                          : kind == KQ_Q5_K ? sizeof(aotx_block_q5_k)
                                            : sizeof(aotx_block_q4_k);
    for (int64_t i = 0; i < nb; i++) SFX(kq_unpack)(kind, w + (size_t)i * bbytes, buf + i);
}

AI void SFX(kbuf_dot)(int kind, const SFX(qx_ksb) *buf, int64_t nb, const uint8_t *act,
                      size_t astride, int nt, float *out) {
    SFX(kacc) facc[QX86_NT];
    for (int t = 0; t < nt; t++) facc[t] = KACC_ZERO();
    for (int64_t i = 0; i < nb; i++)
        for (int t = 0; t < nt; t++)
            facc[t] = SFX(k_tok)(kind, buf + i,
                                 (const aotx_block_q8_k32 *)(act + (size_t)t * astride) + i, facc[t]);
    for (int t = 0; t < nt; t++) out[t] = KACC_SUM(facc[t]);
}
#undef KACC_ZERO
#undef KACC_SUM

#define KDOT_Q4_K(buf, nb, a, as, nt, o) SFX(kbuf_dot)(KQ_Q4_K, buf, nb, a, as, nt, o)
#define KDOT_Q5_K(buf, nb, a, as, nt, o) SFX(kbuf_dot)(KQ_Q5_K, buf, nb, a, as, nt, o)
#define KDOT_Q6_K(buf, nb, a, as, nt, o) SFX(kbuf_dot)(KQ_Q6_K, buf, nb, a, as, nt, o)

/* The chunked driver for one k-quant kind (KDOT: its kbuf_dot macro). */
#define QX86_DEFINE_KMULTI(NAME, KIND, KDOT, BASE)                                              \
    static void SFX(NAME)(const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act,          \
                          size_t as, int64_t n_tok, float *y, int64_t ldy, int64_t r0,           \
                          int64_t r1) {                                                          \
        if (n_tok == 1 || nb > QX86_KSB) {                                                       \
            SFX(BASE)(w, rb, nb, act, as, n_tok, y, ldy, r0, r1);                                \
            return;                                                                              \
        }                                                                                        \
        SFX(qx_ksb) buf[QX86_KSB];                                                               \
        int64_t chunk = QX86_KSB / nb;                                                           \
        if (chunk > 16) chunk = 16;                                                              \
        float o[QX86_NT];                                                                        \
        for (int64_t rc = r0; rc < r1; rc += chunk) {                                            \
            int64_t re = rc + chunk < r1 ? rc + chunk : r1;                                      \
            for (int64_t r = rc; r < re; r++)                                                    \
                SFX(kbuf_fill)(KIND, w + (size_t)r * rb, nb, buf + (r - rc) * nb);               \
            for (int64_t t0 = 0; t0 < n_tok; t0 += QX86_NT) {                                    \
                int64_t nt = n_tok - t0 < QX86_NT ? n_tok - t0 : QX86_NT;                        \
                const uint8_t *a = act + (size_t)t0 * as;                                        \
                for (int64_t r = rc; r < re; r++) {                                              \
                    const SFX(qx_ksb) *kb = buf + (r - rc) * nb;                                 \
                    QX86_SWITCH_NT(nt, KDOT, kb, nb, a, as)                                      \
                    for (int64_t t = 0; t < nt; t++) y[(t0 + t) * ldy + r] = o[t];               \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }

/* ----------------------------------------------------------- F16 / BF16 */

AI __m256 SFX(load8_half)(int bf, const uint8_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (bf) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

AI void SFX(row_half)(int bf, const uint8_t *w, int64_t cols, const uint8_t *act, size_t astride,
                      int nt, float *out) {
    const float *xa[QX86_NT];
    __m256 f0[QX86_NT], f1[QX86_NT];
    for (int t = 0; t < nt; t++) {
        xa[t] = (const float *)(act + (size_t)t * astride);
        f0[t] = _mm256_setzero_ps();
        f1[t] = _mm256_setzero_ps();
    }
    int64_t k = 0;
    for (; k + 16 <= cols; k += 16) {
        _mm_prefetch((const char *)(w + 2 * k) + QX86_PF, _MM_HINT_T0);
        __m256 w0 = SFX(load8_half)(bf, w + 2 * k), w1 = SFX(load8_half)(bf, w + 2 * k + 16);
        for (int t = 0; t < nt; t++) {
            f0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xa[t] + k), f0[t]);
            f1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xa[t] + k + 8), f1[t]);
        }
    }
    for (; k + 8 <= cols; k += 8) {
        __m256 w0 = SFX(load8_half)(bf, w + 2 * k);
        for (int t = 0; t < nt; t++) f0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xa[t] + k), f0[t]);
    }
    for (int t = 0; t < nt; t++) {
        float s = SFX(hsum)(_mm256_add_ps(f0[t], f1[t]));
        for (int64_t j = k; j < cols; j++) {
            uint16_t h;
            memcpy(&h, w + 2 * j, 2);
            s += (bf ? aotx_bf16_to_f32(h) : SFX(h16)(h)) * xa[t][j];
        }
        out[t] = s;
    }
}

/* ------------------------------------------- Q2_K / Q3_K / IQ4_XS x Q8_K32 (rows)
 * Per super-block and token: per 32 values j, maddubs(|w|, sign(x_q, w)) (|w| <= 127: no
 * saturation) times the two groups' scales (int16 pairs), a hadd tree into lane j = T_j;
 * Q2_K's mins M_j = madd(bsums, m).  facc lane j += T_j d[j] d_w (- M_j d[j] dmin). */
AI __m256 SFX(kx_tok)(int type, const SFX(qx_kx) *k, const __m256i *sc, __m256i m16,
                      const aotx_block_q8_k32 *xb, __m256 facc) {
    __m256i v[8];
    for (int j = 0; j < 8; j++) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * j));
        const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(k->w[j], k->w[j]),
                                               _mm256_sign_epi8(xv, k->w[j]));
        v[j] = DP_S16(_mm256_setzero_si256(), p, sc[j]);
    }
    const __m256 d8 = _mm256_loadu_ps(xb->d);
    facc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(SFX(tree8)(v)), d8), _mm256_set1_ps(k->d), facc);
    if (type != AOTX_T_Q2_K) return facc;
    const __m256i mj = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), m16);
    return _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(mj), d8), _mm256_set1_ps(k->dmin), facc);
}

AI void SFX(row_kx)(int type, const uint8_t *w, int64_t nb, const uint8_t *act, size_t astride,
                    int nt, float *out) {
    const size_t bb = (size_t)aotx_type_block_bytes(type);
    __m256 facc[QX86_NT];
    for (int t = 0; t < nt; t++) facc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *wb = w + (size_t)i * bb;
        for (size_t off = 0; off < bb; off += 64)
            _mm_prefetch((const char *)wb + QX86_PF + off, _MM_HINT_T0);
        SFX(qx_kx) k;
        SFX(kx_unpack)(type, wb, &k);
        __m256i sc[8];
        for (int j = 0; j < 8; j++)
            sc[j] = _mm256_set_m128i(_mm_set1_epi16(k.sc[2 * j + 1]), _mm_set1_epi16(k.sc[2 * j]));
        const __m256i m16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)k.m));
        for (int t = 0; t < nt; t++)
            facc[t] = SFX(kx_tok)(type, &k, sc, m16,
                                  (const aotx_block_q8_k32 *)(act + (size_t)t * astride) + i, facc[t]);
    }
    for (int t = 0; t < nt; t++) out[t] = SFX(hsum)(facc[t]);
}

/* ------------------------------------------------------------ drivers */

/* Instantiates a matmul kernel from ROW(w_row, nb, act, astride, nt, out). */
#define QX86_DEFINE_MM(NAME, ROW)                                                              \
    static void SFX(NAME)(const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act,          \
                          size_t as, int64_t n_tok, float *y, int64_t ldy, int64_t r0,           \
                          int64_t r1) {                                                          \
        float o[QX86_NT];                                                                        \
        if (n_tok == 1) {                                                                        \
            for (int64_t r = r0; r < r1; r++) {                                                  \
                ROW(w + (size_t)r * rb, nb, act, as, 1, o);                                      \
                y[r] = o[0];                                                                     \
            }                                                                                    \
            return;                                                                              \
        }                                                                                        \
        for (int64_t rc = r0; rc < r1; rc += QX86_ROWS) {                                        \
            int64_t re = rc + QX86_ROWS < r1 ? rc + QX86_ROWS : r1;                              \
            for (int64_t t0 = 0; t0 < n_tok; t0 += QX86_NT) {                                    \
                const uint8_t *a = act + (size_t)t0 * as;                                        \
                int64_t nt = n_tok - t0 < QX86_NT ? n_tok - t0 : QX86_NT;                        \
                for (int64_t r = rc; r < re; r++) {                                              \
                    const uint8_t *wr = w + (size_t)r * rb;                                      \
                    QX86_SWITCH_NT(nt, ROW, wr, nb, a, as)                                       \
                    for (int64_t t = 0; t < nt; t++) y[(t0 + t) * ldy + r] = o[t];               \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }

#define ROW_Q4_0(w, nb, a, as, nt, o) \
    SFX(row_q8fam)(K_Q4_0, sizeof(aotx_block_q4_0), w, nb, a, as, nt, o)
#define ROW_Q5_0(w, nb, a, as, nt, o) \
    SFX(row_q8fam)(K_Q5_0, sizeof(aotx_block_q5_0), w, nb, a, as, nt, o)
#define ROW_Q8_0(w, nb, a, as, nt, o) \
    SFX(row_q8fam)(K_Q8_0, sizeof(aotx_block_q8_0), w, nb, a, as, nt, o)
#define ROW_Q4_K(w, nb, a, as, nt, o) SFX(row_kq)(KQ_Q4_K, w, nb, a, as, nt, o)
#define ROW_Q5_K(w, nb, a, as, nt, o) SFX(row_kq)(KQ_Q5_K, w, nb, a, as, nt, o)
#define ROW_Q6_K(w, nb, a, as, nt, o) SFX(row_kq)(KQ_Q6_K, w, nb, a, as, nt, o)
#define ROW_Q4_1(w, nb, a, as, nt, o) \
    SFX(row_q8fam)(K_Q4_1, sizeof(aotx_block_q4_1), w, nb, a, as, nt, o)
#define ROW_Q5_1(w, nb, a, as, nt, o) \
    SFX(row_q8fam)(K_Q5_1, sizeof(aotx_block_q5_1), w, nb, a, as, nt, o)
#define ROW_IQ4_NL(w, nb, a, as, nt, o) \
    SFX(row_q8fam)(K_IQ4_NL, sizeof(aotx_block_iq4_nl), w, nb, a, as, nt, o)
#define ROW_Q2_K(w, nb, a, as, nt, o) SFX(row_kx)(AOTX_T_Q2_K, w, nb, a, as, nt, o)
#define ROW_Q3_K(w, nb, a, as, nt, o) SFX(row_kx)(AOTX_T_Q3_K, w, nb, a, as, nt, o)
#define ROW_IQ4_XS(w, nb, a, as, nt, o) SFX(row_kx)(AOTX_T_IQ4_XS, w, nb, a, as, nt, o)
#define ROW_F16(w, nb, a, as, nt, o) SFX(row_half)(0, w, nb, a, as, nt, o)
#define ROW_BF16(w, nb, a, as, nt, o) SFX(row_half)(1, w, nb, a, as, nt, o)

QX86_DEFINE_MM(mm_q4_0, ROW_Q4_0)
QX86_DEFINE_MM(mm_q5_0, ROW_Q5_0)
QX86_DEFINE_MM(mm_q8_0, ROW_Q8_0)
/* the new types: row kernels on every path (no register tiles, no re-blocked copies) */
QX86_DEFINE_MM(mm_q4_1, ROW_Q4_1)
QX86_DEFINE_MM(mm_q5_1, ROW_Q5_1)
QX86_DEFINE_MM(mm_iq4_nl, ROW_IQ4_NL)
QX86_DEFINE_MM(mm_q2_k, ROW_Q2_K)
QX86_DEFINE_MM(mm_q3_k, ROW_Q3_K)
QX86_DEFINE_MM(mm_iq4_xs, ROW_IQ4_XS)
#if QX86_VNNI
/* the Q8_0 family: the buffered row path for n_tok > 1 */
#define QX86_DEFINE_MM_BUF(NAME, KIND, BASE)                                                    \
    static void SFX(NAME)(const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act,          \
                          size_t as, int64_t n_tok, float *y, int64_t ldy, int64_t r0,           \
                          int64_t r1) {                                                          \
        if (n_tok == 1)                                                                          \
            SFX(BASE)(w, rb, nb, act, as, n_tok, y, ldy, r0, r1);                                \
        else                                                                                     \
            SFX(mm_q8fam_tiles)(KIND, w, rb, nb, act, as, n_tok, y, ldy, r0, r1);                \
    }                                                                                            \
    /* batch invariant: n_tok == 1 in the tiles' float order too */                             \
    static void SFX(mmi_##NAME)(const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act,    \
                                size_t as, int64_t n_tok, float *y, int64_t ldy, int64_t r0,     \
                                int64_t r1) {                                                    \
        if (KIND == K_Q8_0 && n_tok == 1)                                                        \
            SFX(q8_0_rows1)(w, rb, nb, act, y, r0, r1);                                          \
        else                                                                                     \
            SFX(mm_q8fam_tiles)(KIND, w, rb, nb, act, as, n_tok, y, ldy, r0, r1);                \
    }
QX86_DEFINE_MM_BUF(mmb_q4_0, K_Q4_0, mm_q4_0)
QX86_DEFINE_MM_BUF(mmb_q5_0, K_Q5_0, mm_q5_0)
QX86_DEFINE_MM_BUF(mmb_q8_0, K_Q8_0, mm_q8_0)
QX86_DEFINE_MM_BUF(mmb_q4_1, K_Q4_1, mm_q4_1)
QX86_DEFINE_MM_BUF(mmb_q5_1, K_Q5_1, mm_q5_1)
QX86_DEFINE_MM_BUF(mmb_iq4_nl, K_IQ4_NL, mm_iq4_nl)
#undef QX86_DEFINE_MM_BUF
#define QX86_MM_Q8FAM(x) SFX(mmb_##x)
#else
#define QX86_MM_Q8FAM(x) SFX(mm_##x)
#endif
QX86_DEFINE_MM(mm_q4_k, ROW_Q4_K)
QX86_DEFINE_MM(mm_q5_k, ROW_Q5_K)
QX86_DEFINE_MM(mm_q6_k, ROW_Q6_K)
QX86_DEFINE_KMULTI(mmb_q5_k, KQ_Q5_K, KDOT_Q5_K, mm_q5_k)
#if !QX86_VNNI  /* AVX-512 runs Q4_K / Q6_K with n_tok > 1 as register tiles (below) */
QX86_DEFINE_KMULTI(mmb_q4_k, KQ_Q4_K, KDOT_Q4_K, mm_q4_k)
QX86_DEFINE_KMULTI(mmb_q6_k, KQ_Q6_K, KDOT_Q6_K, mm_q6_k)
#endif
#if QX86_VNNI
/* ---- n_tok > 1 for Q4_K / Q6_K: register tiles of 16 rows x up to 8 tokens ----
 * As for the Q8_0 family, lanes = rows: each super-block of 16 rows is transposed
 * into q[e/4] = quants 4(e/4).. of each row (unsigned: Q4_K's 0..15, Q6_K's 0..63), and
 * the Q8_K32 activations' signed quants are broadcast 4 at a time straight from act:
 * vpdpbusd gives each sub-block's (Q4_K: 32, Q6_K: 16 elements) exact sum q * x_q
 * (Q6_K: seeded with -32 * bsum, so the -32 offset is in it).  The float steps are the
 * reference's (aotx_block_q8_k32), per row lane:
 *   Q4_K: F = fma(S_j * sc_j, d[j], F) (the product of two integers < 2^24: exact),
 *     G = fma(m_j, dm[j], G), r = fma(F, d_w, -(G * dmin)), y = r or y + r;
 *   Q6_K: T_j = S'_2j * sc_2j + S'_2j+1 * sc_2j+1 (a product and an fma, both exact:
 *     |T_j| < 2^24), F = fma(T_j, d[j], F), y = F * d_w or fma(F, d_w, y).
 * Super-blocks after the first add into y. */
#define QX86_KSL 8   /* super-blocks per scale staging slab */

typedef struct {
    __m512i q[64];                       /* [element dword][row lane] unsigned quants */
    __m512 scf[QX86_KSL][16];            /* [sb][sub-block] sc per row, as float */
    __m512 mf[QX86_KSL][8];              /* [sb][sub-block] Q4_K m per row, as float */
    __m512 d[QX86_KSL], dmin[QX86_KSL];  /* [sb] per row */
} qx_ktiles;                             /* ~29 KiB */

/* Q6_K scales of slab entry i from lane vectors: D = the 16 rows' fp16 d, S[a] lane r =
 * row r's dword at byte 192 + 4a. */
AI void SFX(k6v_scales_set)(qx_ktiles *kb, int64_t i, __m256i D, const __m512i *S) {
    kb->d[i] = _mm512_cvtph_ps(D);
    for (int a = 0; a < 4; a++)
        for (int c = 0; c < 4; c++)
            kb->scf[i][4 * a + c] = _mm512_cvtepi32_ps(
                _mm512_srai_epi32(_mm512_sllv_epi32(S[a], _mm512_set1_epi32(24 - 8 * c)), 24));
}

/* Q4_K scales of slab entry i from lane vectors: lane r of G / Q0 / Q1 / Q2 = row r's
 * dword at byte 0 (d, dmin) / 4 / 8 / 12. */
AI void SFX(k4v_scales_set)(qx_ktiles *kb, int64_t i, __m512i G, __m512i Q0, __m512i Q1, __m512i Q2) {
    const __m512i ff = _mm512_set1_epi32(0xff);
    kb->d[i] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(G));
    kb->dmin[i] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(G, 16)));
    const __m512i c3f = _mm512_set1_epi8(0x3f), c0f = _mm512_set1_epi8(0x0f), c30 = _mm512_set1_epi8(0x30);
    /* the 6-bit packing (k4_scales), 4 bytes per vector lane */
    const __m512i sv[2] = {
        _mm512_and_si512(Q0, c3f),
        _mm512_or_si512(_mm512_and_si512(Q2, c0f), _mm512_and_si512(_mm512_srli_epi32(Q0, 2), c30))};
    const __m512i mv[2] = {
        _mm512_and_si512(Q1, c3f),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(Q2, 4), c0f),
                        _mm512_and_si512(_mm512_srli_epi32(Q1, 2), c30))};
    for (int j = 0; j < 8; j++) {
        const __m128i sh = _mm_cvtsi32_si128(8 * (j & 3));
        kb->scf[i][j] = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srl_epi32(sv[j >> 2], sh), ff));
        kb->mf[i][j] = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srl_epi32(mv[j >> 2], sh), ff));
    }
}

/* Scales of rows[0..15], super-blocks [0, kn): gathered per super-block (one dword of
 * each row per gather), unpacked in vectors. */
AI void SFX(ktile_scales)(int kind, const uint8_t *const *rows, int64_t kn, qx_ktiles *kb) {
    int32_t ix[16];
    for (int r = 0; r < 16; r++) ix[r] = (int32_t)(rows[r] - rows[0]);
    const __m512i vidx = _mm512_loadu_si512((const void *)ix);
    for (int64_t i = 0; i < kn; i++) {
        if (kind == KQ_Q6_K) {
            const uint8_t *p = rows[0] + (size_t)i * sizeof(aotx_block_q6_k);
            /* bytes 206..209: d is the high half (a dword at 208 would pass the block) */
            const __m512i D = _mm512_i32gather_epi32(vidx, (const void *)(p + 206), 1);
            __m512i S[4];
            for (int a = 0; a < 4; a++) S[a] = _mm512_i32gather_epi32(vidx, (const void *)(p + 192 + 4 * a), 1);
            SFX(k6v_scales_set)(kb, i, _mm512_cvtepi32_epi16(_mm512_srli_epi32(D, 16)), S);
            continue;
        }
        const uint8_t *p = rows[0] + (size_t)i * sizeof(aotx_block_q4_k);
        SFX(k4v_scales_set)(kb, i, _mm512_i32gather_epi32(vidx, (const void *)p, 1),
                            _mm512_i32gather_epi32(vidx, (const void *)(p + 4), 1),
                            _mm512_i32gather_epi32(vidx, (const void *)(p + 8), 1),
                            _mm512_i32gather_epi32(vidx, (const void *)(p + 12), 1));
    }
}

/* Q6_K quants of half h into q from A / B / H[g] lane r = row r's dword g of ql[64h ..] /
 * ql[64h + 32 ..] / qh[32h ..] (element e = 128h + 32k + 4g + byte). */
AI void SFX(k6v_quants_set)(__m512i *q, int h, const __m512i *A, const __m512i *B, const __m512i *H) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    for (int g = 0; g < 8; g++) {
        __m512i *o = q + 32 * h + g;
        o[0] = _mm512_or_si512(_mm512_and_si512(A[g], m4),
                               _mm512_and_si512(_mm512_slli_epi16(H[g], 4), m30));
        o[8] = _mm512_or_si512(_mm512_and_si512(B[g], m4),
                               _mm512_and_si512(_mm512_slli_epi16(H[g], 2), m30));
        o[16] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(A[g], 4), m4),
                                _mm512_and_si512(H[g], m30));
        o[24] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(B[g], 4), m4),
                                _mm512_and_si512(_mm512_srli_epi16(H[g], 2), m30));
    }
}

/* Q4_K quants of qs bytes 32p .. into q: T[g] lane r = row r's dword g there (low nibbles
 * sub-block 2p, high 2p + 1). */
AI void SFX(k4v_quants_set)(__m512i *q, int p, const __m512i *T) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int g = 0; g < 8; g++) {
        q[16 * p + g] = _mm512_and_si512(T[g], m4);
        q[16 * p + 8 + g] = _mm512_and_si512(_mm512_srli_epi16(T[g], 4), m4);
    }
}

/* Quants of super-block i of rows[0..15] into kb->q. */
AI void SFX(ktile_quants)(int kind, const uint8_t *const *rows, int64_t i, qx_ktiles *kb) {
    if (kind == KQ_Q6_K) {
        const size_t base = (size_t)i * sizeof(aotx_block_q6_k);
        for (int h = 0; h < 2; h++) {
            __m512i A[8], B[8], H[8];
            SFX(tr16x8)(rows, base + 64 * h, A);
            SFX(tr16x8)(rows, base + 64 * h + 32, B);
            SFX(tr16x8)(rows, base + 128 + 32 * h, H);
            SFX(k6v_quants_set)(kb->q, h, A, B, H);
        }
        return;
    }
    const size_t base = (size_t)i * sizeof(aotx_block_q4_k) + 16;
    for (int p = 0; p < 4; p++) {
        __m512i T[8];
        SFX(tr16x8)(rows, base + 32 * p, T);
        SFX(k4v_quants_set)(kb->q, p, T);
    }
}

/* Super-block i (slab entry si) x tokens [t0, t0 + nt): y rows masked by m. */
AI void SFX(ktile_dot)(int kind, const qx_ktiles *kb, int64_t si, int64_t i, const uint8_t *act,
                       size_t as, int64_t t0, int nt, float *y, int64_t ldy, __mmask16 m,
                       int accum) {
    const aotx_block_q8_k32 *xb[QX86_TT];
    __m512 F[QX86_TT];
    for (int t = 0; t < nt; t++) {
        xb[t] = (const aotx_block_q8_k32 *)(act + (size_t)(t0 + t) * as) + i;
        F[t] = _mm512_setzero_ps();
    }
    if (kind == KQ_Q6_K) {
        int32_t sd[QX86_TT][16];  /* the seeds -32 * bsum_g, broadcast from memory below */
        for (int t = 0; t < nt; t++)
            _mm512_storeu_si512((void *)sd[t], _mm512_slli_epi32(_mm512_sub_epi32(
                _mm512_setzero_si512(), _mm512_cvtepi16_epi32(_mm256_loadu_si256(
                                            (const __m256i *)xb[t]->bsums))), 5));
        for (int j = 0; j < 8; j++) {  /* 32 values: groups 2j, 2j + 1 = dwords 8j .. 8j + 7 */
            __m512i a0[QX86_TT], a1[QX86_TT];
            for (int t = 0; t < nt; t++) {
                a0[t] = _mm512_set1_epi32(sd[t][2 * j]);
                a1[t] = _mm512_set1_epi32(sd[t][2 * j + 1]);
            }
            for (int g = 0; g < 4; g++) {
                const __m512i w0 = _mm512_load_si512((const void *)&kb->q[8 * j + g]);
                const __m512i w1 = _mm512_load_si512((const void *)&kb->q[8 * j + 4 + g]);
                for (int t = 0; t < nt; t++) {
                    int32_t x0, x1;
                    memcpy(&x0, xb[t]->qs + 4 * (8 * j + g), 4);
                    memcpy(&x1, xb[t]->qs + 4 * (8 * j + 4 + g), 4);
                    a0[t] = _mm512_dpbusd_epi32(a0[t], w0, _mm512_set1_epi32(x0));
                    a1[t] = _mm512_dpbusd_epi32(a1[t], w1, _mm512_set1_epi32(x1));
                }
            }
            for (int t = 0; t < nt; t++) {
                __m512 tj = _mm512_mul_ps(_mm512_cvtepi32_ps(a0[t]), kb->scf[si][2 * j]);
                tj = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1[t]), kb->scf[si][2 * j + 1], tj);
                F[t] = _mm512_fmadd_ps(tj, _mm512_set1_ps(xb[t]->d[j]), F[t]);
            }
        }
        for (int t = 0; t < nt; t++) {
            float *yt = y + (t0 + t) * ldy;
            __m512 r = accum ? _mm512_fmadd_ps(F[t], kb->d[si], _mm512_maskz_loadu_ps(m, yt))
                             : _mm512_mul_ps(F[t], kb->d[si]);
            _mm512_mask_storeu_ps(yt, m, r);
        }
        return;
    }
    for (int j = 0; j < 8; j++) {  /* 32 values = dwords 8j .. 8j + 7 */
        __m512i a[QX86_TT];
        for (int t = 0; t < nt; t++) a[t] = _mm512_setzero_si512();
        for (int g = 0; g < 8; g++) {
            const __m512i wv = _mm512_load_si512((const void *)&kb->q[8 * j + g]);
            for (int t = 0; t < nt; t++) {
                int32_t x4;
                memcpy(&x4, xb[t]->qs + 4 * (8 * j + g), 4);
                a[t] = _mm512_dpbusd_epi32(a[t], wv, _mm512_set1_epi32(x4));
            }
        }
        for (int t = 0; t < nt; t++)
            F[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a[t]), kb->scf[si][j]),
                                   _mm512_set1_ps(xb[t]->d[j]), F[t]);
    }
    for (int t = 0; t < nt; t++) {
        __m512 G = _mm512_setzero_ps();
        for (int j = 0; j < 8; j++) G = _mm512_fmadd_ps(kb->mf[si][j], _mm512_set1_ps(xb[t]->dm[j]), G);
        __m512 r = _mm512_fmsub_ps(F[t], kb->d[si], _mm512_mul_ps(G, kb->dmin[si]));
        float *yt = y + (t0 + t) * ldy;
        if (accum) r = _mm512_add_ps(_mm512_maskz_loadu_ps(m, yt), r);
        _mm512_mask_storeu_ps(yt, m, r);
    }
}

#define QX86_KCASE(n) \
    case n: SFX(ktile_dot)(kind, kb, i - k0, i, act, as, tg, n, yc, ldy, m, accum); break;

static void SFX(mm_k_tiles)(int kind, const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act,
                            size_t as, int64_t n_tok, float *y, int64_t ldy, int64_t r0,
                            int64_t r1) {
    qx_ktiles ktiles, *kb = &ktiles;
    for (int64_t rc = r0; rc < r1; rc += 16) {
        const int64_t nr = r1 - rc < 16 ? r1 - rc : 16;
        const uint8_t *rows[16];
        for (int r = 0; r < 16; r++)  /* missing rows repeat the first */
            rows[r] = w + (size_t)(rc + (r < nr ? r : 0)) * rb;
        const __mmask16 m = (__mmask16)((1u << nr) - 1u);
        float *yc = y + rc;
        /* the next chunk's bytes, prefetched over this chunk's super-blocks */
        const aotx_pf_plan pl = aotx_pf_rows(w, rb, rc + 16, r1, 16, nb);
        for (int64_t k0 = 0; k0 < nb; k0 += QX86_KSL) {
            const int64_t kn = nb - k0 < QX86_KSL ? nb - k0 : QX86_KSL;
            const uint8_t *srows[16];
            for (int r = 0; r < 16; r++)
                srows[r] = rows[r] + (size_t)k0 * (rb / (size_t)nb);
            SFX(ktile_scales)(kind, srows, kn, kb);
            for (int64_t i = k0; i < k0 + kn; i++) {
                AOTX_PF_SLICE(pl, i, _MM_HINT_T0);
                SFX(ktile_quants)(kind, rows, i, kb);
                const int accum = i > 0;
                QX86_TOKENS(n_tok, QX86_KCASE)
            }
        }
    }
}
#undef QX86_KCASE
#undef QX86_KSL

/* ---- the VNNI copies of Q4_K / Q6_K: groups of 16 rows per super-block, the rows'
 * bytes as 64-byte lane vectors (aotx_k_pack_row with 16 rows): Q4_K [0, 256) the scale
 * dwords ktile_scales gathers (G, Q0, Q1, Q2), [256, 2304) the 32 qs vectors tr16x8 made;
 * Q6_K [0, 32) the 16 fp16 d, [32, 288) the 4 scale vectors, [288, 3360) per half the 8
 * ql, 8 ql + 32 and 8 qh vectors.  Unpacked by the same steps into kb, then the same
 * ktile_dot at every n_tok: mm_k_tiles' bits (AOTX_INVARIANT's at n_tok == 1). */
AI __m512i SFX(kv_ld)(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }

AI void SFX(kv_unpack)(int kind, const uint8_t *pb, qx_ktiles *kb) {
    if (kind == KQ_Q6_K) {
        __m512i S[4];
        for (int a = 0; a < 4; a++) S[a] = SFX(kv_ld)(pb + 32 + 64 * a);
        SFX(k6v_scales_set)(kb, 0, _mm256_loadu_si256((const __m256i *)(const void *)pb), S);
        for (int h = 0; h < 2; h++) {
            __m512i A[8], B[8], H[8];
            for (int g = 0; g < 8; g++) {
                A[g] = SFX(kv_ld)(pb + 288 + 64 * (24 * h + g));
                B[g] = SFX(kv_ld)(pb + 288 + 64 * (24 * h + 8 + g));
                H[g] = SFX(kv_ld)(pb + 288 + 64 * (24 * h + 16 + g));
            }
            SFX(k6v_quants_set)(kb->q, h, A, B, H);
        }
        return;
    }
    SFX(k4v_scales_set)(kb, 0, SFX(kv_ld)(pb), SFX(kv_ld)(pb + 64), SFX(kv_ld)(pb + 128),
                        SFX(kv_ld)(pb + 192));
    for (int p = 0; p < 4; p++) {
        __m512i T[8];
        for (int g = 0; g < 8; g++) T[g] = SFX(kv_ld)(pb + 256 + 64 * (8 * p + g));
        SFX(k4v_quants_set)(kb->q, p, T);
    }
}

#define QX86_KPCASE(n) \
    case n: SFX(ktile_dot)(kind, kb, 0, i, act, as, tg, n, yc, ldy, m, i > 0); break;

AI void SFX(k_packed)(int kind, const uint8_t *pk, int64_t nb, const uint8_t *act, size_t as,
                      int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    qx_ktiles ktiles, *kb = &ktiles;
    const size_t bb = kind == KQ_Q6_K ? QX86_VQ6K_BLOCK : QX86_VQ4K_BLOCK, gbytes = (size_t)nb * bb;
    const uint8_t *end = pk + (size_t)((r1 + 15) / 16) * gbytes;
    for (int64_t rc = r0; rc < r1; rc += 16) {
        const int64_t nr = r1 - rc < 16 ? r1 - rc : 16;
        const __mmask16 m = (__mmask16)((1u << nr) - 1u);
        const uint8_t *pb = pk + (size_t)(rc / 16) * gbytes, *pf = pb + 2 * gbytes;
        if (pf + gbytes > end) pf = NULL;
        float *yc = y + rc;
        for (int64_t i = 0; i < nb; i++, pb += bb) {
            if (pf) {  /* two groups ahead, into L2, one super-block's worth at a time */
                for (size_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)pf + o, _MM_HINT_T1);
                pf += bb;
            }
            SFX(kv_unpack)(kind, pb, kb);
            QX86_TOKENS(n_tok, QX86_KPCASE)
        }
    }
}
#undef QX86_KPCASE

static void SFX(mm_k_packed)(int kind, const uint8_t *pk, int64_t nb, const uint8_t *act, size_t as,
                             int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    if (kind == KQ_Q6_K) SFX(k_packed)(KQ_Q6_K, pk, nb, act, as, n_tok, y, ldy, r0, r1);
    else SFX(k_packed)(KQ_Q4_K, pk, nb, act, as, n_tok, y, ldy, r0, r1);
}

static void SFX(mmt_q4_k)(const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act, size_t as,
                          int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    if (n_tok == 1) SFX(mm_q4_k)(w, rb, nb, act, as, n_tok, y, ldy, r0, r1);
    else SFX(mm_k_tiles)(KQ_Q4_K, w, rb, nb, act, as, n_tok, y, ldy, r0, r1);
}

static void SFX(mmt_q6_k)(const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act, size_t as,
                          int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    if (n_tok == 1) SFX(mm_q6_k)(w, rb, nb, act, as, n_tok, y, ldy, r0, r1);
    else SFX(mm_k_tiles)(KQ_Q6_K, w, rb, nb, act, as, n_tok, y, ldy, r0, r1);
}

/* batch invariant (AOTX_INVARIANT=1): the tiles at every n_tok */
static void SFX(mmi_q4_k)(const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act, size_t as,
                          int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    SFX(mm_k_tiles)(KQ_Q4_K, w, rb, nb, act, as, n_tok, y, ldy, r0, r1);
}

static void SFX(mmi_q6_k)(const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act, size_t as,
                          int64_t n_tok, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    SFX(mm_k_tiles)(KQ_Q6_K, w, rb, nb, act, as, n_tok, y, ldy, r0, r1);
}

static aotx_mm_fn SFX(qx86_pick_inv)(int type) {
    switch (type) {
    case AOTX_T_Q4_0: return SFX(mmi_mmb_q4_0);
    case AOTX_T_Q5_0: return SFX(mmi_mmb_q5_0);
    case AOTX_T_Q8_0: return SFX(mmi_mmb_q8_0);
    case AOTX_T_Q4_1: return SFX(mmi_mmb_q4_1);
    case AOTX_T_Q5_1: return SFX(mmi_mmb_q5_1);
    case AOTX_T_IQ4_NL: return SFX(mmi_mmb_iq4_nl);
    case AOTX_T_Q4_K: return SFX(mmi_q4_k);
    case AOTX_T_Q6_K: return SFX(mmi_q6_k);
    default: return NULL;
    }
}
#define QX86_MM_Q4_K SFX(mmt_q4_k)
#define QX86_MM_Q6_K SFX(mmt_q6_k)
#else
#define QX86_MM_Q4_K SFX(mmb_q4_k)
#define QX86_MM_Q6_K SFX(mmb_q6_k)
#endif
QX86_DEFINE_MM(mm_f16, ROW_F16)
QX86_DEFINE_MM(mm_bf16, ROW_BF16)

static aotx_mm_fn SFX(qx86_pick)(int type) {
    switch (type) {
    case AOTX_T_Q4_0: return QX86_MM_Q8FAM(q4_0);
    case AOTX_T_Q5_0: return QX86_MM_Q8FAM(q5_0);
    case AOTX_T_Q8_0: return QX86_MM_Q8FAM(q8_0);
    case AOTX_T_Q4_1: return QX86_MM_Q8FAM(q4_1);
    case AOTX_T_Q5_1: return QX86_MM_Q8FAM(q5_1);
    case AOTX_T_IQ4_NL: return QX86_MM_Q8FAM(iq4_nl);
    case AOTX_T_Q2_K: return SFX(mm_q2_k);
    case AOTX_T_Q3_K: return SFX(mm_q3_k);
    case AOTX_T_IQ4_XS: return SFX(mm_iq4_xs);
    case AOTX_T_Q4_K: return QX86_MM_Q4_K;
    case AOTX_T_Q5_K: return SFX(mmb_q5_k);
    case AOTX_T_Q6_K: return QX86_MM_Q6_K;
    case AOTX_T_F16: return SFX(mm_f16);
    case AOTX_T_BF16: return SFX(mm_bf16);
    default: return NULL;
    }
}

#undef SFX
#undef DP_U8S8
#undef DP_S16
#undef AI
#undef QX86_DEFINE_MM
#undef QX86_CASE
#undef QX86_DEFINE_KMULTI
#undef KDOT_Q4_K
#undef KDOT_Q5_K
#undef KDOT_Q6_K
#undef QX86_KSB
#undef QX86_MM_Q8FAM
#undef QX86_MM_Q4_K
#undef QX86_MM_Q6_K
#undef QX86_TR
#undef QX86_TT
#undef QX86_KB
#undef QX86_ACTB
#undef QX86_PFC
#undef QX86_SWITCH_NT
#undef QX86_NT
#undef ROW_Q4_0
#undef ROW_Q5_0
#undef ROW_Q8_0
#undef ROW_Q4_K
#undef ROW_Q5_K
#undef ROW_Q6_K
#undef ROW_F16
#undef ROW_Q4_1
#undef QX86_HAS_MIN
#undef QX86_QS_OFF
#undef QX86_QH_OFF
#undef ROW_Q5_1
#undef ROW_IQ4_NL
#undef ROW_Q2_K
#undef ROW_Q3_K
#undef ROW_IQ4_XS
#undef ROW_BF16

#endif /* QX86_BODY */
