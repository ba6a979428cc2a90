/* sample.c -- greedy / temperature / top-p sampling with a per-sequence PRNG. */
#include "aotx_sample.h"
#include "vecmath_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void aotx_rng_seed(aotx_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t aotx_rng_next(aotx_rng *r) {   /* xoshiro256** */
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double aotx_rng_uniform(aotx_rng *r) { return (double)(aotx_rng_next(r) >> 11) * 0x1.0p-53; }

/* max over x ignoring NaN (-inf if all NaN); vectorizable (16 lanes). */
AOTX_CLONES static float max_no_nan(const float *x, int32_t n) {
    float acc[16];
    for (int j = 0; j < 16; j++) acc[j] = -INFINITY;
    int32_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    float m = -INFINITY;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int j = 0; j < 16; j++) m = acc[j] > m ? acc[j] : m;
    return m;
}

int32_t aotx_argmax(const float *x, int32_t n) {
    float m = max_no_nan(x, n);
    for (int32_t i = 0; i < n; i++)
        if (x[i] == m) return i;
    for (int32_t i = 0; i < n; i++)   /* every value NaN or -inf: the first non-NaN */
        if (!isnan(x[i])) return i;
    return 0;
}

/* probs[i] = exp((logits[i] - mx) * inv_t) (NaN -> 0); returns the sum. */
AOTX_CLONES static double softmax_unnorm(const float *logits, float *probs, int32_t n, float mx,
                                           float inv_t) {
    float acc[16] = {0};
    int32_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) {
            float v = logits[i + j];
            float e = v == v ? aotx_exp_approx((v - mx) * inv_t) : 0.0f;
            probs[i + j] = e;
            acc[j] += e;
        }
    double sum = 0;
    for (; i < n; i++) {
        float v = logits[i];
        probs[i] = v == v ? aotx_exp_approx((v - mx) * inv_t) : 0.0f;
        sum += probs[i];
    }
    for (int j = 0; j < 16; j++) sum += acc[j];
    return sum;
}

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The nucleus without sorting: the probabilities' bit patterns order them
 * (all are >= 0), so three histogram passes over 12, 12 and 8 bits find the
 * value v of the last token in (p desc, id asc) order whose cumulative mass
 * reaches top_p, and the id of the last token with p == v that is kept.
 * idx: scratch for the shrinking candidate list. */
typedef struct nucleus_cut { float v; int32_t last_tie; double kept; } nucleus_cut;

static nucleus_cut nucleus(const float *probs, int32_t n, double top_p, int32_t *idx) {
    static const int shift[3] = {20, 8, 0}, width[3] = {12, 12, 8};
    double hist[4096];
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if (probs[i] > 0) idx[m++] = i;
    double need = top_p, above = 0;
    for (int lv = 0; lv < 3 && m > 0; lv++) {
        uint32_t mask = (1u << width[lv]) - 1;
        memset(hist, 0, sizeof(double) * ((size_t)mask + 1));
        for (int32_t c = 0; c < m; c++) {
            float p = probs[idx[c]];
            hist[(fbits(p) >> shift[lv]) & mask] += p;
        }
        double acc = 0;
        int64_t chosen = -1, lowest = -1;
        for (int64_t k = mask; k >= 0; k--) {
            if (hist[k] <= 0) continue;
            lowest = k;
            if (acc + hist[k] >= need) { chosen = k; break; }
            acc += hist[k];
        }
        if (chosen < 0) { chosen = lowest; acc -= hist[lowest]; }   /* rounding: keep all */
        need -= acc;
        above += acc;
        int32_t w = 0;
        for (int32_t c = 0; c < m; c++)
            if (((fbits(probs[idx[c]]) >> shift[lv]) & mask) == (uint32_t)chosen) idx[w++] = idx[c];
        m = w;
    }
    /* idx[0..m) now hold equal values, in id order: keep them until need is met */
    nucleus_cut cut = {probs[idx[0]], idx[0], above};
    for (int32_t c = 0; c < m; c++) {
        cut.last_tie = idx[c];
        cut.kept += probs[idx[c]];
        need -= probs[idx[c]];
        if (need <= 0) break;
    }
    return cut;
}

int32_t aotx_sample(const float *logits, int32_t n, const aotx_sample_params *p, aotx_rng *r,
                    float *probs, int32_t *idx) {
    if (!logits || n <= 0 || !p || !r) return AOTX_E_INVALID_ARGUMENT;
    if (!(p->temperature > 0.0f)) return aotx_argmax(logits, n);
    if (!probs) return AOTX_E_INVALID_ARGUMENT;
    int32_t am = aotx_argmax(logits, n);
    float mx = logits[am];
    if (isnan(mx) || isinf(mx)) return am;
    if (!(p->top_p > 0.0f)) return am;
    double sum = softmax_unnorm(logits, probs, n, mx, 1.0f / p->temperature);
    float inv = (float)(1.0 / sum);
    for (int32_t i = 0; i < n; i++) probs[i] *= inv;
    double u = aotx_rng_uniform(r);
    if (p->top_p < 1.0f) {
        if (!idx) return AOTX_E_INVALID_ARGUMENT;
        nucleus_cut cut = nucleus(probs, n, p->top_p, idx);
        double target = u * cut.kept, c = 0;
        int32_t last = am;
        for (int32_t i = 0; i < n; i++) {
            float q = probs[i];
            if (!(q > cut.v || (q == cut.v && i <= cut.last_tie))) continue;
            c += q;
            last = i;
            if (target < c) return i;
        }
        return last;
    }
    double target = u, c = 0;
    int32_t last = am;
    for (int32_t i = 0; i < n; i++) {
        if (probs[i] <= 0) continue;
        c += probs[i];
        last = i;
        if (target < c) return i;
    }
    return last;
}
