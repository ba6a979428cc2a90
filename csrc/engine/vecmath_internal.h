/* vecmath_internal.h -- small float helpers shared by the decoder and the
 * sampler (one definition; static inline so every caller's loop vectorizes). */
#ifndef AOTX_VECMATH_INTERNAL_H
#define AOTX_VECMATH_INTERNAL_H

#include <stdint.h>

/* Vector helpers compiled three times (x86-64-v4, v3, baseline), picked at load. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AOTX_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define AOTX_CLONES
#endif

/* exp(x) to ~2e-7 relative, written so loops over it vectorize:
 * 2^k * p(r), r = x - k ln2, p the degree-6 Taylor polynomial; x clamped to [-87, 88]. */
static inline float aotx_exp_approx(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float magic = 12582912.0f;   /* 1.5 * 2^23: adding it rounds to an integer */
    float kf = (x * 1.4426950408889634f + magic) - magic;
    float r = x - kf * 0.693145751953125f - kf * 1.428606765330187e-06f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
                                                                                r * (1.0f / 720))))));
    int32_t bits = ((int32_t)kf + 127) << 23;
    float sc;
    __builtin_memcpy(&sc, &bits, 4);
    return p * sc;
}

#endif
