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
 * the reference in quant.c, then scales it by the same float (d_w * d_x); only
 * the order of the float additions differs:
 *   Q4_0/Q5_0/Q8_0: weights as signed bytes w_s (q - 8, q - 16, or int8), the
 *     activation stored as x_q + 128 (unsigned):  sum (x_q+128)*w_s - 128*sum w_s;
 *     the correction depends on the weights only and seeds each token's sum.
 *   Q4_K/Q5_K: maddubs(q, x_q) * sc (vpdpwssd), minus m * (Q8_K block sums).
 *   Q6_K: maddubs(q, x_q) * sc, minus 32 * sum sc * (Q8_K block sums).
 *
 * Loop structure: n_tok == 1 streams each weight row once (software prefetch
 * QX86_PF bytes ahead: it doubles the DRAM rate on this machine); n_tok > 1
 * walks chunks of QX86_ROWS rows x groups of QX86_NT tokens (8 with AVX-512, 4
 * with AVX2) so that each unpacked weight block serves QX86_NT tokens and the
 * chunk stays in L1.  Activation quantization (Q8_0 pairs, Q8_K) also has an
 * AVX-512 version here producing the same bytes as quant.c's.
 */
#ifndef QX86_BODY

#include "aotx_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#define QX86_ROWS 16
#define QX86_PF 3072  /* software prefetch distance (bytes) in the weight stream */

enum { K_Q4_0, K_Q5_0, K_Q8_0 };  /* weight kinds of the Q8_0-activation family */
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

int aotx_x86_level(void) {
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    int vnni = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    return vnni ? AOTX_LEVEL_AVX512VNNI : avx2 ? AOTX_LEVEL_AVX2 : AOTX_LEVEL_REF;
}

void aotx_x86_pick_act(int max_level, aotx_act8_fn *q8_0, aotx_act8k_fn *q8_k) {
    int vnni = max_level >= AOTX_LEVEL_AVX512VNNI && aotx_x86_level() >= AOTX_LEVEL_AVX512VNNI;
    *q8_0 = vnni ? act8_row_vnni : NULL;
    *q8_k = vnni ? act8k_row_vnni : NULL;
}

void aotx_x86_pick(int type, int max_level, aotx_mm_fn *mm, const char **mm_name,
                   aotx_dq_fn *dq, const char **dq_name) {
    *mm = NULL;
    *dq = NULL;
    *mm_name = NULL;
    *dq_name = NULL;
    int level = aotx_x86_level();
    if (level > max_level) level = max_level;
    if (level >= AOTX_LEVEL_AVX512VNNI) {
        *mm = qx86_pick_vnni(type);
        *mm_name = "avx512vnni";
        *dq = qx86_pick_dq_vnni(type);
        *dq_name = *dq ? "avx512vnni" : NULL;
    } else if (level >= AOTX_LEVEL_AVX2) {
        *mm = qx86_pick_avx2(type);
        *mm_name = "avx2";
    }
    if (!*mm) *mm_name = NULL;
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

/* ---------------------------------------------- Q4_0 / Q5_0 / Q8_0 x Q8_0 */

/* Weights of one block as signed bytes (q - offset, or Q8_0's own int8), 256-bit. */
AI __m256i SFX(unpack_q8fam)(int kind, const uint8_t *wb, uint16_t *d) {
    memcpy(d, wb, 2);
    if (kind == K_Q8_0) return _mm256_loadu_si256((const __m256i *)(wb + 2));
    const uint8_t *qs = wb + (kind == K_Q5_0 ? 6 : 2);
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
    if (kind == K_Q4_0) return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
    uint32_t qh;
    memcpy(&qh, wb + 2, 4);
    v = _mm256_or_si256(v, _mm256_and_si256(SFX(bits_to_bytes)(qh), _mm256_set1_epi8(0x10)));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(16));
}

#if QX86_VNNI
/* Two blocks at once: [block 2p | block 2p+1] signed bytes in one zmm. */
AI __m512i SFX(unpack2_q8fam)(int kind, const uint8_t *b0, const uint8_t *b1, uint16_t *d0,
                              uint16_t *d1) {
    memcpy(d0, b0, 2);
    memcpy(d1, b1, 2);
    if (kind == K_Q8_0)
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                                  _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1);
    size_t off = kind == K_Q5_0 ? 6 : 2;
    __m128i q0 = _mm_loadu_si128((const __m128i *)(b0 + off));
    __m128i q1 = _mm_loadu_si128((const __m128i *)(b1 + off));
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(_mm_srli_epi16(q0, 4), q0)),
                                   _mm256_set_m128i(_mm_srli_epi16(q1, 4), q1), 1);
    v = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
    if (kind == K_Q4_0) return _mm512_sub_epi8(v, _mm512_set1_epi8(8));
    /* the two blocks' 32 high bits straight into a mask register (kmovd, kunpckdq) */
    uint32_t h0, h1;  /* memcpy: the fields are only 2-byte aligned */
    memcpy(&h0, b0 + 2, 4);
    memcpy(&h1, b1 + 2, 4);
    __mmask64 hm = _mm512_kunpackd((__mmask64)_cvtu32_mask32(h1), (__mmask64)_cvtu32_mask32(h0));
    v = _mm512_mask_add_epi8(v, hm, v, _mm512_set1_epi8(0x10));
    return _mm512_sub_epi8(v, _mm512_set1_epi8(16));
}

/* VNNI: sum (x_q + 128) * w_s - 128 * sum w_s = sum x_q * w_s, exact in int32.  The
 * correction depends on the weights only, so it seeds every token's accumulator. */
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
        __m512i neg = _mm512_sub_epi32(_mm512_setzero_si512(),
                                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), c80, ws));
        for (int t = 0; t < nt; t++) {
            const uint8_t *xp = xa[t] + (size_t)p * AOTX_ACT8_PAIR_BYTES;
            __m512i acc = _mm512_dpbusd_epi32(neg, _mm512_loadu_si512((const void *)xp), ws);
            __m512 sc = _mm512_mul_ps(dw, _mm512_loadu_ps((const float *)(xp + 64)));
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), sc, facc[t]);
        }
    }
    if (nb & 1) {
        uint16_t d;
        __m256i ws = SFX(unpack_q8fam)(kind, w + (size_t)(nb - 1) * bbytes, &d);
        __m256 dw = _mm256_set1_ps(SFX(h16)(d));
        __m256i neg = _mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_dpbusd_epi32(_mm256_setzero_si256(),
                                                           _mm256_set1_epi8((char)0x80), ws));
        for (int t = 0; t < nt; t++) {
            __m256i acc = _mm256_dpbusd_epi32(
                neg, _mm256_loadu_si256((const __m256i *)aotx_act8_xu(xa[t], nb - 1)), ws);
            __m256 sc = _mm256_mul_ps(dw, _mm256_loadu_ps(aotx_act8_dx(xa[t], nb - 1)));
            tail[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), sc, tail[t]);
        }
    }
    for (int t = 0; t < nt; t++)
        out[t] = _mm512_reduce_add_ps(facc[t]) + SFX(hsum)(tail[t]);
}
/* n_tok > 1: a weight row unpacked once into L1 (signed quants, seed, scales per
 * block pair), then streamed against QX86_NT tokens at a time: the per-token
 * work is one vpdpbusd, one scale multiply, one conversion and one FMA. */
typedef struct {
    __m512i ws;   /* [block 2p | block 2p+1] signed quants */
    __m512i neg;  /* -128 * sum w_s per int32 lane */
    __m512 dw;    /* per-lane weight scales */
} qx_pair;
#define QX86_MAXP 64  /* pairs a row may have for the buffered path (cols <= 4096) */

AI void SFX(rowbuf_q8fam)(int kind, size_t bbytes, const uint8_t *w, int64_t nb, qx_pair *buf) {
    const __m512i c80 = _mm512_set1_epi8((char)0x80);
    for (int64_t p = 0; p < (nb + 1) / 2; p++) {
        const uint8_t *b0 = w + (size_t)(2 * p) * bbytes;
        __m512i ws;
        __m512 dw;
        if (2 * p + 1 < nb) {
            uint16_t d0, d1;
            ws = SFX(unpack2_q8fam)(kind, b0, b0 + bbytes, &d0, &d1);
            dw = _mm512_cvtph_ps(_mm256_set_m128i(_mm_set1_epi16((short)d1),
                                                  _mm_set1_epi16((short)d0)));
        } else {  /* odd last block: the act pads its pair with x_q = 0, dx = 0 */
            uint16_t d0;
            ws = _mm512_zextsi256_si512(SFX(unpack_q8fam)(kind, b0, &d0));
            dw = _mm512_zextps256_ps512(_mm256_set1_ps(SFX(h16)(d0)));
        }
        buf[p].ws = ws;
        buf[p].neg = _mm512_sub_epi32(_mm512_setzero_si512(),
                                      _mm512_dpbusd_epi32(_mm512_setzero_si512(), c80, ws));
        buf[p].dw = dw;
    }
}

AI void SFX(rowdot_q8fam)(const qx_pair *buf, int64_t np, const uint8_t *act, size_t astride,
                          int nt, float *out) {
    __m512 facc[QX86_NT];
    for (int t = 0; t < nt; t++) facc[t] = _mm512_setzero_ps();
    for (int64_t p = 0; p < np; p++) {
        const uint8_t *xp = act + (size_t)p * AOTX_ACT8_PAIR_BYTES;
        for (int t = 0; t < nt; t++, xp += astride) {
            __m512i acc = _mm512_dpbusd_epi32(buf[p].neg, _mm512_loadu_si512((const void *)xp),
                                              buf[p].ws);
            __m512 sc = _mm512_mul_ps(buf[p].dw, _mm512_loadu_ps((const float *)(xp + 64)));
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), sc, facc[t]);
        }
    }
    for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(facc[t]);
}

#define ROWDOT_Q8FAM(buf, np, a, as, nt, o) SFX(rowdot_q8fam)(buf, np, a, as, nt, o)

AI void SFX(mm_q8fam_multi)(int kind, const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act,
                            size_t as, int64_t n_tok, float *y, int64_t ldy, int64_t r0,
                            int64_t r1) {
    /* chunks of up to 16 rows (<= QX86_MAXP pairs buffered: 48 KiB) x groups of
     * QX86_NT tokens, so the group's activations stay in L1 across the chunk */
    qx_pair buf[QX86_MAXP * 4];
    const int64_t np = (nb + 1) / 2;
    const size_t bbytes = rb / (size_t)nb;
    int64_t chunk = QX86_MAXP * 4 / np;
    if (chunk > 16) chunk = 16;
    float o[QX86_NT];
    for (int64_t rc = r0; rc < r1; rc += chunk) {
        int64_t re = rc + chunk < r1 ? rc + chunk : r1;
        for (int64_t r = rc; r < re; r++)
            SFX(rowbuf_q8fam)(kind, bbytes, w + (size_t)r * rb, nb, buf + (r - rc) * np);
        for (int64_t t0 = 0; t0 < n_tok; t0 += QX86_NT) {
            int64_t nt = n_tok - t0 < QX86_NT ? n_tok - t0 : QX86_NT;
            const uint8_t *a = act + (size_t)t0 * as;
            for (int64_t r = rc; r < re; r++) {
                const qx_pair *rowbuf = buf + (r - rc) * np;
                QX86_SWITCH_NT(nt, ROWDOT_Q8FAM, rowbuf, np, a, as)
                for (int64_t t = 0; t < nt; t++) y[(t0 + t) * ldy + r] = o[t];
            }
        }
    }
}
#else
/* AVX2: maddubs(x_q + 128, w_s) - maddubs(128, w_s) per int16 pair (no saturation for
 * |w_s| <= 16); Q8_0 uses the sign trick maddubs(|w|, sign(x_q, w)) instead. */
AI void SFX(step_q8fam)(int kind, const uint8_t *wb, const uint8_t *const *xa, int64_t i, int nt,
                        __m256 *facc) {
    uint16_t d;
    __m256i ws = SFX(unpack_q8fam)(kind, wb, &d);
    __m256 dw = _mm256_set1_ps(SFX(h16)(d));
    const __m256i c80 = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256i aux = kind == K_Q8_0 ? _mm256_sign_epi8(ws, ws) : _mm256_maddubs_epi16(c80, ws);
    for (int t = 0; t < nt; t++) {
        __m256i xu = _mm256_loadu_si256((const __m256i *)aotx_act8_xu(xa[t], i));
        __m256i p16;
        if (kind == K_Q8_0)
            p16 = _mm256_maddubs_epi16(aux, _mm256_sign_epi8(_mm256_xor_si256(xu, c80), ws));
        else
            p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(xu, ws), aux);
        __m256i acc = _mm256_madd_epi16(p16, ones);
        __m256 sc = _mm256_mul_ps(dw, _mm256_loadu_ps(aotx_act8_dx(xa[t], i)));
        facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), sc, facc[t]);
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

static void SFX(act8_row)(const float *x, int64_t cols, uint8_t *out) {
    const int64_t nb = cols / 32;
    for (int64_t b = 0; b < (nb + 1) / 2 * 2; b++) {
        uint8_t *xu = out + (b >> 1) * AOTX_ACT8_PAIR_BYTES + (b & 1) * 32;
        float *dx = (float *)(out + (b >> 1) * AOTX_ACT8_PAIR_BYTES + 64 + (b & 1) * 32);
        float d = 0.0f;
        __m256i q = _mm256_set1_epi8((char)0x80);
        if (b < nb) {
            __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            d = amax / 127.0f;
            __m512 id = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
            q = _mm256_set_m128i(_mm512_cvtepi32_epi8(SFX(quant16)(v1, id)),
                                 _mm512_cvtepi32_epi8(SFX(quant16)(v0, id)));
            q = _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80));  /* + 128 */
        }
        _mm256_storeu_si256((__m256i *)xu, q);
        _mm256_storeu_ps(dx, _mm256_set1_ps(d));
    }
}

static void SFX(act8k_row)(const float *x, int64_t cols, aotx_block_q8_k *out) {
    for (int64_t b = 0; b < cols / 256; b++, out++, x += 256) {
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < 16; j++) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + 16 * j)));
        float d = _mm512_reduce_max_ps(m) / 127.0f;
        __m512 id = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
        out->d = d;
        for (int j = 0; j < 16; j++) {
            __m512i q = SFX(quant16)(_mm512_loadu_ps(x + 16 * j), id);
            _mm_storeu_si128((__m128i *)(out->qs + 16 * j), _mm512_cvtepi32_epi8(q));
            out->bsums[j] = (int16_t)_mm512_reduce_add_epi32(q);
        }
    }
}
#endif

AI void SFX(k4_scales)(const uint8_t *q, uint8_t *sc, uint8_t *m) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
        sc[j + 4] = (uint8_t)((q[j + 8] & 0x0f) | ((q[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
    }
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

static aotx_dq_fn SFX(qx86_pick_dq)(int type) {
    switch (type) {
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

/* ------------------------------------------------------- k-quants x Q8_K */


/* Q4_K (has_qh = 0) and Q5_K (has_qh = 1) */
AI void SFX(row_k45)(int has_qh, const uint8_t *w, int64_t nb, const uint8_t *act, size_t astride,
                     int nt, float *out) {
    const size_t bbytes = has_qh ? sizeof(aotx_block_q5_k) : sizeof(aotx_block_q4_k);
    const aotx_block_q8_k *xa[QX86_NT];
    __m256 facc[QX86_NT];
    for (int t = 0; t < nt; t++) {
        xa[t] = (const aotx_block_q8_k *)(act + (size_t)t * astride);
        facc[t] = _mm256_setzero_ps();
    }
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *wb = w + (size_t)i * bbytes;
        for (size_t off = 0; off < bbytes; off += 64)
            _mm_prefetch((const char *)wb + QX86_PF + off, _MM_HINT_T0);
        uint16_t d16, dm16;
        memcpy(&d16, wb, 2);
        memcpy(&dm16, wb + 2, 2);
        const uint8_t *scales = wb + 4;
        const uint8_t *qh = wb + 16;
        const uint8_t *qs = wb + (has_qh ? 48 : 16);
        uint8_t sc[8], m[8];
        SFX(k4_scales)(scales, sc, m);
        float dw = SFX(h16)(d16), dmw = SFX(h16)(dm16);
        __m256i mins = _mm256_cvtepu8_epi16(_mm_set_epi8(
            (char)m[7], (char)m[7], (char)m[6], (char)m[6], (char)m[5], (char)m[5], (char)m[4],
            (char)m[4], (char)m[3], (char)m[3], (char)m[2], (char)m[2], (char)m[1], (char)m[1],
            (char)m[0], (char)m[0]));
        __m256i q[8];
        __m256i hv = has_qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
            q[2 * p] = _mm256_and_si256(v, m4);
            q[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (has_qh) {
                const __m256i one = _mm256_set1_epi8(1);
                __m256i b0 = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * p), one);
                __m256i b1 = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * p + 1), one);
                q[2 * p] = _mm256_or_si256(q[2 * p], _mm256_slli_epi16(b0, 4));
                q[2 * p + 1] = _mm256_or_si256(q[2 * p + 1], _mm256_slli_epi16(b1, 4));
            }
        }
        for (int t = 0; t < nt; t++) {
            const aotx_block_q8_k *xb = xa[t] + i;
            __m256i acc = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * j));
                acc = DP_S16(acc, _mm256_maddubs_epi16(q[j], xv), _mm256_set1_epi16(sc[j]));
            }
            __m256i mn = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), mins);
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(dw * xb->d), facc[t]);
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mn), _mm256_set1_ps(-(dmw * xb->d)),
                                      facc[t]);
        }
    }
    for (int t = 0; t < nt; t++) out[t] = SFX(hsum)(facc[t]);
}

AI void SFX(row_q6_k)(const uint8_t *w, int64_t nb, const uint8_t *act, size_t astride, int nt,
                      float *out) {
    const aotx_block_q8_k *xa[QX86_NT];
    __m256 facc[QX86_NT];
    for (int t = 0; t < nt; t++) {
        xa[t] = (const aotx_block_q8_k *)(act + (size_t)t * astride);
        facc[t] = _mm256_setzero_ps();
    }
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    for (int64_t i = 0; i < nb; i++) {
        const aotx_block_q6_k *b = (const aotx_block_q6_k *)w + i;
        for (size_t off = 0; off < sizeof(*b); off += 64)
            _mm_prefetch((const char *)b + QX86_PF + off, _MM_HINT_T0);
        float dw = SFX(h16)(b->d);
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        __m256i q[8], scq[8];
        for (int h = 0; h < 2; h++) {
            __m256i A = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
            __m256i B = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
            __m256i H = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
            q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(A, m4),
                                           _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
            q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(B, m4),
                                           _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
            q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4),
                                           _mm256_and_si256(H, m30));
            q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), m4),
                                           _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
        }
        for (int k = 0; k < 8; k++)
            scq[k] = _mm256_set_m128i(_mm_set1_epi16(b->scales[2 * k + 1]),
                                      _mm_set1_epi16(b->scales[2 * k]));
        for (int t = 0; t < nt; t++) {
            const aotx_block_q8_k *xb = xa[t] + i;
            __m256i acc = _mm256_setzero_si256();
            for (int k = 0; k < 8; k++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * k));
                acc = DP_S16(acc, _mm256_maddubs_epi16(q[k], xv), scq[k]);
            }
            __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), sc16);
            acc = _mm256_sub_epi32(acc, _mm256_slli_epi32(corr, 5));  /* the -32 offset */
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(dw * xb->d), facc[t]);
        }
    }
    for (int t = 0; t < nt; t++) out[t] = SFX(hsum)(facc[t]);
}

/* n_tok > 1 for the k-quants: chunks of rows unpacked once (quants, int16 scale
 * vectors, the min / offset correction vector, the two float scales), then
 * each group of QX86_NT tokens runs over the chunk from L1.  The same integer
 * arithmetic as row_k45 / row_q6_k. */
typedef struct {
    __m256i q[8];   /* unsigned quants per 32 elements */
    __m256i sc[8];  /* int16 scale vector per 32 elements */
    __m256i corr;   /* Q4_K/Q5_K: m_j per Q8_K bsum pair; Q6_K: the 16 scales (int16) */
    float d, dmin;
} SFX(qx_ksb);
#define QX86_KSB 64  /* super-blocks buffered per chunk (36 KiB) */

AI void SFX(kbuf_fill)(int kind, const uint8_t *w, int64_t nb, SFX(qx_ksb) *buf) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    for (int64_t i = 0; i < nb; i++) {
        SFX(qx_ksb) *k = buf + i;
        if (kind == KQ_Q6_K) {
            const aotx_block_q6_k *b = (const aotx_block_q6_k *)w + i;
            k->d = SFX(h16)(b->d);
            k->dmin = 0.0f;
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
            continue;
        }
        const int has_qh = kind == KQ_Q5_K;
        const size_t bbytes = has_qh ? sizeof(aotx_block_q5_k) : sizeof(aotx_block_q4_k);
        const uint8_t *wb = w + (size_t)i * bbytes;
        uint16_t d16, dm16;
        memcpy(&d16, wb, 2);
        memcpy(&dm16, wb + 2, 2);
        const uint8_t *qh = wb + 16, *qs = wb + (has_qh ? 48 : 16);
        uint8_t sc[8], m[8];
        SFX(k4_scales)(wb + 4, sc, m);
        k->d = SFX(h16)(d16);
        k->dmin = SFX(h16)(dm16);
        k->corr = _mm256_cvtepu8_epi16(_mm_set_epi8(
            (char)m[7], (char)m[7], (char)m[6], (char)m[6], (char)m[5], (char)m[5], (char)m[4],
            (char)m[4], (char)m[3], (char)m[3], (char)m[2], (char)m[2], (char)m[1], (char)m[1],
            (char)m[0], (char)m[0]));
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
        for (int j = 0; j < 8; j++) k->sc[j] = _mm256_set1_epi16(sc[j]);
    }
}

AI void SFX(kbuf_dot)(int kind, const SFX(qx_ksb) *buf, int64_t nb, const uint8_t *act,
                      size_t astride, int nt, float *out) {
    __m256 facc[QX86_NT];
    for (int t = 0; t < nt; t++) facc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const SFX(qx_ksb) *k = buf + i;
        for (int t = 0; t < nt; t++) {
            const aotx_block_q8_k *xb = (const aotx_block_q8_k *)(act + (size_t)t * astride) + i;
            __m256i acc = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * j));
                acc = DP_S16(acc, _mm256_maddubs_epi16(k->q[j], xv), k->sc[j]);
            }
            __m256i cr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), k->corr);
            if (kind == KQ_Q6_K) {
                acc = _mm256_sub_epi32(acc, _mm256_slli_epi32(cr, 5));  /* the -32 offset */
                facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(k->d * xb->d),
                                          facc[t]);
            } else {
                facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(k->d * xb->d),
                                          facc[t]);
                facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(cr),
                                          _mm256_set1_ps(-(k->dmin * xb->d)), facc[t]);
            }
        }
    }
    for (int t = 0; t < nt; t++) out[t] = SFX(hsum)(facc[t]);
}

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
#define ROW_Q4_K(w, nb, a, as, nt, o) SFX(row_k45)(0, w, nb, a, as, nt, o)
#define ROW_Q5_K(w, nb, a, as, nt, o) SFX(row_k45)(1, w, nb, a, as, nt, o)
#define ROW_Q6_K(w, nb, a, as, nt, o) SFX(row_q6_k)(w, nb, a, as, nt, o)
#define ROW_F16(w, nb, a, as, nt, o) SFX(row_half)(0, w, nb, a, as, nt, o)
#define ROW_BF16(w, nb, a, as, nt, o) SFX(row_half)(1, w, nb, a, as, nt, o)

QX86_DEFINE_MM(mm_q4_0, ROW_Q4_0)
QX86_DEFINE_MM(mm_q5_0, ROW_Q5_0)
QX86_DEFINE_MM(mm_q8_0, ROW_Q8_0)
#if QX86_VNNI
/* the Q8_0 family: the buffered row path for n_tok > 1 */
#define QX86_DEFINE_MM_BUF(NAME, KIND, BASE)                                                    \
    static void SFX(NAME)(const uint8_t *w, size_t rb, int64_t nb, const uint8_t *act,          \
                          size_t as, int64_t n_tok, float *y, int64_t ldy, int64_t r0,           \
                          int64_t r1) {                                                          \
        if (n_tok == 1 || (nb + 1) / 2 > QX86_MAXP)                                              \
            SFX(BASE)(w, rb, nb, act, as, n_tok, y, ldy, r0, r1);                                \
        else                                                                                     \
            SFX(mm_q8fam_multi)(KIND, w, rb, nb, act, as, n_tok, y, ldy, r0, r1);                \
    }
QX86_DEFINE_MM_BUF(mmb_q4_0, K_Q4_0, mm_q4_0)
QX86_DEFINE_MM_BUF(mmb_q5_0, K_Q5_0, mm_q5_0)
QX86_DEFINE_MM_BUF(mmb_q8_0, K_Q8_0, mm_q8_0)
#undef QX86_DEFINE_MM_BUF
#define QX86_MM_Q8FAM(x) SFX(mmb_##x)
#else
#define QX86_MM_Q8FAM(x) SFX(mm_##x)
#endif
QX86_DEFINE_MM(mm_q4_k, ROW_Q4_K)
QX86_DEFINE_MM(mm_q5_k, ROW_Q5_K)
QX86_DEFINE_MM(mm_q6_k, ROW_Q6_K)
QX86_DEFINE_KMULTI(mmb_q4_k, KQ_Q4_K, KDOT_Q4_K, mm_q4_k)
QX86_DEFINE_KMULTI(mmb_q5_k, KQ_Q5_K, KDOT_Q5_K, mm_q5_k)
QX86_DEFINE_KMULTI(mmb_q6_k, KQ_Q6_K, KDOT_Q6_K, mm_q6_k)
QX86_DEFINE_MM(mm_f16, ROW_F16)
QX86_DEFINE_MM(mm_bf16, ROW_BF16)

static aotx_mm_fn SFX(qx86_pick)(int type) {
    switch (type) {
    case AOTX_T_Q4_0: return QX86_MM_Q8FAM(q4_0);
    case AOTX_T_Q5_0: return QX86_MM_Q8FAM(q5_0);
    case AOTX_T_Q8_0: return QX86_MM_Q8FAM(q8_0);
    case AOTX_T_Q4_K: return SFX(mmb_q4_k);
    case AOTX_T_Q5_K: return SFX(mmb_q5_k);
    case AOTX_T_Q6_K: return SFX(mmb_q6_k);
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
#undef ROWDOT_Q8FAM
#undef QX86_MAXP
#undef QX86_SWITCH_NT
#undef QX86_NT
#undef ROW_Q4_0
#undef ROW_Q5_0
#undef ROW_Q8_0
#undef ROW_Q4_K
#undef ROW_Q5_K
#undef ROW_Q6_K
#undef ROW_F16
#undef ROW_BF16

#endif /* QX86_BODY */
