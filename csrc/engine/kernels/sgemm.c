/* sgemm.c -- float32 row products Y[t][r] = W[r,:] . X[t,:] (weights row-major,
 * activations row-major: both operands are read along k).
 *
 * A portable reference (double accumulation: the test oracle) and a
 * cache-blocked version compiled twice from the body below the #else (this
 * file includes itself): AVX2/FMA (8 floats a vector) and AVX-512F (16).
 * Blocking: chunks of SG_TCHUNK tokens (their X rows stay in L2), inside them
 * 4-row panels of W (stay in L1) against 4-token groups; the micro-kernel
 * keeps a 4 x 4 tile of vector accumulators over the whole k range, then
 * reduces each to one float.  Tails use masked loads (no scalar loop over k).
 */
#ifndef SG_BODY

#include "aotx_sgemm.h"
#include "cpu_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

void aotx_sgemm_rows_ref(const float *w, int64_t cols, const float *x, int64_t ldx, int64_t n_tok,
                         float *y, int64_t ldy, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const float *wr = w + r * cols;
        for (int64_t t = 0; t < n_tok; t++) {
            const float *xt = x + t * ldx;
            double s = 0.0;
            for (int64_t k = 0; k < cols; k++) s += (double)wr[k] * xt[k];
            y[t * ldy + r] = (float)s;
        }
    }
}

typedef void (*sgemm_fn)(const float *w, int64_t cols, const float *x, int64_t ldx, int64_t n_tok,
                         float *y, int64_t ldy, int64_t r0, int64_t r1);

#if defined(__x86_64__)
#include <immintrin.h>

#define SG_TCHUNK 64
#define SG_BODY 1

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define SG_512 0
#include "sgemm.c"
#undef SG_512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f")
#define SG_512 1
#include "sgemm.c"
#undef SG_512
#pragma GCC pop_options
#endif

enum { SG_REF = 0, SG_AVX2 = 1, SG_AVX512 = 2 };

static int sgemm_best(void) {
#if defined(__x86_64__)
    if (aotx_cpu_has(AOTX_CPU_AVX2_FMA | AOTX_CPU_AVX512F)) return SG_AVX512;
    if (aotx_cpu_has(AOTX_CPU_AVX2_FMA)) return SG_AVX2;
#endif
    return SG_REF;
}

static sgemm_fn sgemm_fast = aotx_sgemm_rows_ref;
static const char *sgemm_name = "ref";
static pthread_once_t sgemm_once = PTHREAD_ONCE_INIT;

static void sgemm_set(int level) {
    sgemm_fast = aotx_sgemm_rows_ref;
    sgemm_name = "ref";
#if defined(__x86_64__)
    if (level >= SG_AVX512) {
        sgemm_fast = sgemm_512;
        sgemm_name = "avx512";
    } else if (level >= SG_AVX2) {
        sgemm_fast = sgemm_256;
        sgemm_name = "avx2";
    }
#endif
}

static void sgemm_pick(void) {
    int cap = aotx_cpu_kernel_cap(), level = sgemm_best();
    if (cap == AOTX_KERNELS_REF) level = SG_REF;
    else if (cap == AOTX_KERNELS_AVX2 && level > SG_AVX2) level = SG_AVX2;
    sgemm_set(level);
}

void aotx_sgemm_rows(const float *w, int64_t cols, const float *x, int64_t ldx, int64_t n_tok,
                     float *y, int64_t ldy, int64_t r0, int64_t r1) {
    pthread_once(&sgemm_once, sgemm_pick);
    if (n_tok <= 0 || r1 <= r0) return;
    sgemm_fast(w, cols, x, ldx, n_tok, y, ldy, r0, r1);
}

const char *aotx_sgemm_impl(void) {
    pthread_once(&sgemm_once, sgemm_pick);
    return sgemm_name;
}

int aotx_sgemm_force(const char *impl) {
    pthread_once(&sgemm_once, sgemm_pick);
    if (!impl) return AOTX_E_INVALID_ARGUMENT;
    int level;
    if (strcmp(impl, "ref") == 0) level = SG_REF;
    else if (strcmp(impl, "avx2") == 0) level = SG_AVX2;
    else if (strcmp(impl, "avx512") == 0 || strcmp(impl, "avx512vnni") == 0) level = SG_AVX512;
    else if (strcmp(impl, "auto") == 0) level = sgemm_best();
    else return AOTX_E_INVALID_ARGUMENT;
    if (level > sgemm_best()) return AOTX_E_UNSUPPORTED;
    sgemm_set(level);
    return AOTX_OK;
}

#else /* ------------------------------------------------- SG_BODY: kernels */

#if SG_512
#define SGV 16
#define VT __m512
#define SG(name) name##_512
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VHSUM(v) _mm512_reduce_add_ps(v)
#define VMASK __mmask16
#define VMLOAD(p, m) _mm512_maskz_loadu_ps((m), (p))
#else
#define SGV 8
#define VT __m256
#define SG(name) name##_256
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VHSUM(v) SG(hsum)(v)
#define VMASK __m256i
#define VMLOAD(p, m) _mm256_maskload_ps((p), (m))
#endif

#define SG_AI static inline __attribute__((always_inline))

#if !SG_512
SG_AI float SG(hsum)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

SG_AI VMASK SG(tail_mask)(int64_t n) {  /* the first n (0 < n < SGV) lanes */
#if SG_512
    return (__mmask16)((1u << n) - 1u);
#else
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), idx);
#endif
}

/* Y[t][r] for NR rows x NT tokens (both <= 4), over all k. */
SG_AI void SG(tile)(int NR, int NT, const float *w, int64_t cols, const float *x, int64_t ldx,
                    float *y, int64_t ldy) {
    VT acc[4][4];
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = VZERO();
    int64_t k = 0;
    for (; k + SGV <= cols; k += SGV) {
        VT wv[4], xv[4];
        for (int r = 0; r < NR; r++) wv[r] = VLOAD(w + r * cols + k);
        for (int t = 0; t < NT; t++) xv[t] = VLOAD(x + t * ldx + k);
        for (int r = 0; r < NR; r++)
            for (int t = 0; t < NT; t++) acc[r][t] = VFMA(wv[r], xv[t], acc[r][t]);
    }
    if (k < cols) {
        VMASK m = SG(tail_mask)(cols - k);
        VT wv[4], xv[4];
        for (int r = 0; r < NR; r++) wv[r] = VMLOAD(w + r * cols + k, m);
        for (int t = 0; t < NT; t++) xv[t] = VMLOAD(x + t * ldx + k, m);
        for (int r = 0; r < NR; r++)
            for (int t = 0; t < NT; t++) acc[r][t] = VFMA(wv[r], xv[t], acc[r][t]);
    }
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < NR; r++) y[t * ldy + r] = VHSUM(acc[r][t]);
}

#define SG_TILE_NT(NR, nt, ...)                         \
    switch (nt) {                                       \
    case 4: SG(tile)(NR, 4, __VA_ARGS__); break;        \
    case 3: SG(tile)(NR, 3, __VA_ARGS__); break;        \
    case 2: SG(tile)(NR, 2, __VA_ARGS__); break;        \
    default: SG(tile)(NR, 1, __VA_ARGS__); break;       \
    }

static void SG(sgemm)(const float *w, int64_t cols, const float *x, int64_t ldx, int64_t n_tok,
                      float *y, int64_t ldy, int64_t r0, int64_t r1) {
    for (int64_t tc = 0; tc < n_tok; tc += SG_TCHUNK) {
        int64_t te = tc + SG_TCHUNK < n_tok ? tc + SG_TCHUNK : n_tok;
        for (int64_t r = r0; r < r1; r += 4) {
            int64_t nr = r1 - r < 4 ? r1 - r : 4;
            const float *wr = w + r * cols;
            for (int64_t t = tc; t < te; t += 4) {
                int64_t nt = te - t < 4 ? te - t : 4;
                const float *xt = x + t * ldx;
                float *yt = y + t * ldy + r;
                switch (nr) {
                case 4: SG_TILE_NT(4, nt, wr, cols, xt, ldx, yt, ldy); break;
                case 3: SG_TILE_NT(3, nt, wr, cols, xt, ldx, yt, ldy); break;
                case 2: SG_TILE_NT(2, nt, wr, cols, xt, ldx, yt, ldy); break;
                default: SG_TILE_NT(1, nt, wr, cols, xt, ldx, yt, ldy); break;
                }
            }
        }
    }
}

#undef SGV
#undef VT
#undef SG
#undef VZERO
#undef VLOAD
#undef VFMA
#undef VHSUM
#undef VMASK
#undef VMLOAD
#undef SG_AI
#undef SG_TILE_NT

#endif /* SG_BODY */
