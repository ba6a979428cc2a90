/* kv_f16.c -- K/V rows stored as IEEE binary16 (aotx_kv_params.kv_f16): the
 * conversions and the attention helpers that read half rows and accumulate in float.
 *
 * Two paths, picked once (AOTX_KERNELS=ref or aotx_kernel_force("ref") forces the
 * reference): "f16c" (AVX2 + FMA + F16C: vcvtph2ps / vcvtps2ph, 8 lanes) and "ref"
 * (portable C, the conversions done on the bits).  Both round float -> half to
 * nearest even and widen half -> float exactly, so the stored bits are the same on
 * either path; the float sums differ only in rounding order (FMA on f16c).  Each
 * helper's reduction order is fixed by n alone (16 lanes, then a pairwise tree),
 * as the float32 helpers in backend_cpu.c: batch invariance holds per path.
 */
#include "aotx_kv.h"
#include "cpu_internal.h"
#include "kv_f16_internal.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define LANES 16

/* ---------- the portable reference ---------- */

static inline float h2f(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    if (e == 0x1f) {
        bits = s | 0x7f800000u | (m << 13);                 /* inf / NaN (payload kept) */
    } else if (e != 0) {
        bits = s | ((e + 112u) << 23) | (m << 13);          /* normal: rebias 15 -> 127 */
    } else if (m == 0) {
        bits = s;                                           /* +-0 */
    } else {                                                /* subnormal: normalise */
        int sh = __builtin_clz(m) - 21;                     /* leading zeros within 10 bits */
        m = (m << sh) & 0x3ffu;
        bits = s | ((uint32_t)(113 - sh) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t s = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u)                                   /* inf; NaN stays quiet NaN */
        return (uint16_t)(s | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0));
    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u);   /* rounds past 65504: inf */
    if (a < 0x38800000u) {                                  /* below 2^-14: subnormal or 0 */
        if (a < 0x33000000u) return s;                      /* <= 2^-25: rounds to 0 */
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t sh = 126u - e;                             /* 14..24 */
        uint32_t q = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(s | q);
    }
    uint32_t q = (a >> 13) - (112u << 10), rem = a & 0x1fffu;   /* normal */
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++;   /* carry may reach inf: right */
    return (uint16_t)(s | q);
}

static void store_ref(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = f2h(src[i]);
}

static void load_ref(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = h2f(src[i]);
}

#define TREE_SUM(acc)                                                     \
    for (int w_ = LANES / 2; w_ > 0; w_ >>= 1)                            \
        for (int j_ = 0; j_ < w_; j_++) (acc)[j_] += (acc)[j_ + w_];

static float dot_ref(const float *q, const uint16_t *k, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += q[i + j] * h2f(k[i + j]);
    float s = 0;
    for (; i < n; i++) s += q[i] * h2f(k[i]);
    TREE_SUM(acc);
    return s + acc[0];
}

static void axpy_ref(float *y, float c, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += c * h2f(x[i]);
}

static void dot4_ref(const float *const *q, const uint16_t *k, int64_t n, float *out) {
    for (int j = 0; j < 4; j++) out[j] = dot_ref(q[j], k, n);
}

static void acc4_ref(float *const *out, const float *w, int64_t stride,
                     const uint16_t *const *rows, int32_t n_rows, int64_t vd) {
    for (int i = 0; i < 4; i++) {
        memset(out[i], 0, sizeof(float) * (size_t)vd);
        for (int32_t s = 0; s < n_rows; s++) axpy_ref(out[i], w[i * stride + s], rows[s], vd);
    }
}

/* ---------- AVX2 + FMA + F16C ---------- */

#if defined(__x86_64__) && defined(__GNUC__)
#define F16C_FN __attribute__((target("avx2,fma,f16c")))

F16C_FN static inline __m256 ld8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

F16C_FN static inline float hsum8(__m256 v) {
    /* the tree of TREE_SUM on 8 lanes: (0+4, 1+5, 2+6, 3+7), then (0+2, 1+3), then 0+1 */
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

F16C_FN static void store_f16c(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = f2h(src[i]);
}

F16C_FN static void load_f16c(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld8(src + i));
    for (; i < n; i++) dst[i] = h2f(src[i]);
}

F16C_FN static float dot_f16c(const float *q, const uint16_t *k, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), ld8(k + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), ld8(k + i + 8), a1);
    }
    float s = 0;
    for (; i < n; i++) s += q[i] * h2f(k[i]);
    return s + hsum8(_mm256_add_ps(a0, a1));
}

F16C_FN static void axpy_f16c(float *y, float c, const uint16_t *x, int64_t n) {
    __m256 cc = _mm256_set1_ps(c);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(cc, ld8(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += c * h2f(x[i]);
}

F16C_FN static void dot4_f16c(const float *const *q, const uint16_t *k, int64_t n, float *out) {
    if (n % LANES) {
        for (int j = 0; j < 4; j++) out[j] = dot_f16c(q[j], k, n);
        return;
    }
    __m256 a[4][2];
    for (int j = 0; j < 4; j++) a[j][0] = a[j][1] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += LANES) {
        __m256 k0 = ld8(k + i), k1 = ld8(k + i + 8);
        for (int j = 0; j < 4; j++) {
            a[j][0] = _mm256_fmadd_ps(_mm256_loadu_ps(q[j] + i), k0, a[j][0]);
            a[j][1] = _mm256_fmadd_ps(_mm256_loadu_ps(q[j] + i + 8), k1, a[j][1]);
        }
    }
    /* the same bits as dot_f16c(q[j], k, n) */
    for (int j = 0; j < 4; j++) out[j] = 0.0f + hsum8(_mm256_add_ps(a[j][0], a[j][1]));
}

/* Rows four at a time, each read whole while in cache, accumulated into the outputs (in
 * L1); per element axpy_f16c's fma(c, v, y) in the order of s: the same bits (passes of 16
 * columns over all rows took one line of each row per pass, a miss each time). */
F16C_FN static void acc4_f16c(float *const *out, const float *w, int64_t stride,
                              const uint16_t *const *rows, int32_t n_rows, int64_t vd) {
    for (int i = 0; i < 4; i++) memset(out[i], 0, sizeof(float) * (size_t)vd);
    int32_t s = 0;
    for (; s + 4 <= n_rows; s += 4) {
        const uint16_t *v0 = rows[s], *v1 = rows[s + 1], *v2 = rows[s + 2], *v3 = rows[s + 3];
        for (int32_t r = s + 8; r < s + 12 && r < n_rows; r++)
            for (int64_t o = 0; o < vd; o += 32) _mm_prefetch((const char *)(rows[r] + o), _MM_HINT_T0);
        __m256 c[4][4];
        for (int i = 0; i < 4; i++)
            for (int k = 0; k < 4; k++) c[i][k] = _mm256_broadcast_ss(w + i * stride + s + k);
        int64_t d = 0;
        for (; d + 8 <= vd; d += 8) {
            const __m256 x0 = ld8(v0 + d), x1 = ld8(v1 + d), x2 = ld8(v2 + d), x3 = ld8(v3 + d);
            for (int i = 0; i < 4; i++) {
                __m256 t = _mm256_loadu_ps(out[i] + d);
                t = _mm256_fmadd_ps(c[i][0], x0, t);
                t = _mm256_fmadd_ps(c[i][1], x1, t);
                t = _mm256_fmadd_ps(c[i][2], x2, t);
                t = _mm256_fmadd_ps(c[i][3], x3, t);
                _mm256_storeu_ps(out[i] + d, t);
            }
        }
        for (; d < vd; d++)
            for (int i = 0; i < 4; i++)
                for (int k = 0; k < 4; k++) out[i][d] += w[i * stride + s + k] * h2f(rows[s + k][d]);
    }
    for (; s < n_rows; s++)
        for (int i = 0; i < 4; i++) axpy_f16c(out[i], w[i * stride + s], rows[s], vd);
}
#endif

/* ---------- dispatch ---------- */

static const aotx_kvh_ops ops_ref = {"ref", store_ref, load_ref, dot_ref, axpy_ref, dot4_ref,
                                     acc4_ref};
#if defined(__x86_64__) && defined(__GNUC__)
static const aotx_kvh_ops ops_f16c = {"f16c", store_f16c, load_f16c, dot_f16c, axpy_f16c,
                                      dot4_f16c, acc4_f16c};
#endif

static const aotx_kvh_ops *cur = &ops_ref;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int have_f16c(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    return aotx_cpu_has(AOTX_CPU_AVX2_FMA | AOTX_CPU_F16C);
#else
    return 0;
#endif
}

static void pick(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_f16c() && aotx_cpu_kernel_cap() != AOTX_KERNELS_REF) cur = &ops_f16c;
#endif
}

const aotx_kvh_ops *aotx_kvh(void) {
    pthread_once(&once, pick);
    return cur;
}

const char *aotx_kv_f16_impl(void) { return aotx_kvh()->name; }

int aotx_kv_f16_force(const char *impl) {
    pthread_once(&once, pick);
    if (!impl) return AOTX_E_INVALID_ARGUMENT;
    if (strcmp(impl, "ref") == 0) {
        cur = &ops_ref;
        return AOTX_OK;
    }
    if (strcmp(impl, "f16c") != 0 && strcmp(impl, "auto") != 0) return AOTX_E_INVALID_ARGUMENT;
    if (!have_f16c()) return strcmp(impl, "auto") == 0 ? (cur = &ops_ref, AOTX_OK)
                                                       : AOTX_E_UNSUPPORTED;
#if defined(__x86_64__) && defined(__GNUC__)
    cur = &ops_f16c;
#endif
    return AOTX_OK;
}

void aotx_kv_f16_store(uint16_t *dst, const float *src, int64_t n) { aotx_kvh()->store(dst, src, n); }
void aotx_kv_f16_load(float *dst, const uint16_t *src, int64_t n) { aotx_kvh()->load(dst, src, n); }
