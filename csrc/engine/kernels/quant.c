/* quant.c -- tensor types, GGUF block dequantization, activation quantization
 * (Q8_0 / Q8_K), reference quantized dot products and the run-time dispatch to
 * the fast kernels of quant_x86.c.
 *
 * Reference products: per block, an exact integer dot product of the weight
 * quants with the activation quants (int32), scaled once by the float block
 * scales (k-quants: per 32-value sub-block, by its own activation scale; the
 * float steps of aotx_block_q8_k32).  The fast kernels compute the same integers.
 */
#include "aotx_kernels.h"
#include "aotx_kv.h"
#include "aotx_sgemm.h"
#include "cpu_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

const aotx_code_entry aotx_kernel_codes[] = {
    {AOTX_E_KERNEL_TYPE, "kernel_type_unsupported", "the tensor type has no kernel"},
    {AOTX_E_KERNEL_SHAPE, "kernel_shape_invalid",
     "the column count is not a multiple of the type's block size"},
    {0, NULL, NULL},
};

/* ------------------------------------------------------------------ types */

/* ggml's type names (public GGUF facts), by number */
static const char *const type_names[] = {
    "F32", "F16", "Q4_0", "Q4_1", NULL, NULL, "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K",
    "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S",
    "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16", NULL, NULL, NULL,
    "TQ1_0", "TQ2_0", NULL, NULL, NULL, "MXFP4", "NVFP4", "Q1_0",
};

const char *aotx_type_name(int type) {
    if (type < 0 || type >= (int)(sizeof type_names / sizeof type_names[0])) return NULL;
    return type_names[type];
}

const char *aotx_kernel_types(void) {
    return "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, "
           "IQ4_XS";
}

int64_t aotx_type_block_elems(int type) {
    switch (type) {
    case AOTX_T_F32: case AOTX_T_F16: case AOTX_T_BF16: return 1;
    case AOTX_T_Q4_0: case AOTX_T_Q4_1: case AOTX_T_Q5_0: case AOTX_T_Q5_1: case AOTX_T_Q8_0:
    case AOTX_T_IQ4_NL:
        return AOTX_QK;
    case AOTX_T_Q2_K: case AOTX_T_Q3_K: case AOTX_T_Q4_K: case AOTX_T_Q5_K: case AOTX_T_Q6_K:
    case AOTX_T_Q8_K: case AOTX_T_IQ4_XS:
        return AOTX_QK_K;
    default: return 0;
    }
}

int64_t aotx_type_block_bytes(int type) {
    switch (type) {
    case AOTX_T_F32: return 4;
    case AOTX_T_F16: case AOTX_T_BF16: return 2;
    case AOTX_T_Q4_0: return sizeof(aotx_block_q4_0);
    case AOTX_T_Q4_1: return sizeof(aotx_block_q4_1);
    case AOTX_T_Q5_0: return sizeof(aotx_block_q5_0);
    case AOTX_T_Q5_1: return sizeof(aotx_block_q5_1);
    case AOTX_T_Q8_0: return sizeof(aotx_block_q8_0);
    case AOTX_T_IQ4_NL: return sizeof(aotx_block_iq4_nl);
    case AOTX_T_Q2_K: return sizeof(aotx_block_q2_k);
    case AOTX_T_Q3_K: return sizeof(aotx_block_q3_k);
    case AOTX_T_IQ4_XS: return sizeof(aotx_block_iq4_xs);
    case AOTX_T_Q4_K: return sizeof(aotx_block_q4_k);
    case AOTX_T_Q5_K: return sizeof(aotx_block_q5_k);
    case AOTX_T_Q6_K: return sizeof(aotx_block_q6_k);
    case AOTX_T_Q8_K: return sizeof(aotx_block_q8_k);
    default: return 0;
    }
}

int64_t aotx_type_row_bytes(int type, int64_t cols) {
    int64_t be = aotx_type_block_elems(type);
    if (be == 0) return AOTX_E_KERNEL_TYPE;
    if (cols < 0) return AOTX_E_INVALID_ARGUMENT;
    if (cols % be) return AOTX_E_KERNEL_SHAPE;
    return cols / be * aotx_type_block_bytes(type);
}

/* -------------------------------------------------------- dequantization */

static void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* A dequantizer / reference product of one type from a shared one taking its kind first. */
#define DQ_BIND(name, fn, kind) \
    static void name(const uint8_t *src, float *dst, int64_t nb) { fn(kind, src, dst, nb); }
#define DOT_BIND(name, fn, kind) \
    static float name(const uint8_t *w, const uint8_t *a, int64_t nb) { return fn(kind, w, a, nb); }

static void dq_f32(const uint8_t *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }

static void dq_f16(const uint8_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = aotx_fp16_to_f32(rd16(src + 2 * i));
}

static void dq_bf16(const uint8_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = aotx_bf16_to_f32(rd16(src + 2 * i));
}

static void dq_q4_0(const uint8_t *src, float *dst, int64_t nb) {
    const aotx_block_q4_0 *b = (const aotx_block_q4_0 *)src;
    for (int64_t i = 0; i < nb; i++, b++, dst += 32) {
        float d = aotx_fp16_to_f32(b->d);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)((b->qs[j] & 0x0f) - 8);
            dst[j + 16] = d * (float)((b->qs[j] >> 4) - 8);
        }
    }
}

static void dq_q5_0(const uint8_t *src, float *dst, int64_t nb) {
    const aotx_block_q5_0 *b = (const aotx_block_q5_0 *)src;
    for (int64_t i = 0; i < nb; i++, b++, dst += 32) {
        float d = aotx_fp16_to_f32(b->d);
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        for (int j = 0; j < 16; j++) {
            int lo = (b->qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
            int hi = (b->qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            dst[j] = d * (float)(lo - 16);
            dst[j + 16] = d * (float)(hi - 16);
        }
    }
}

/* Q4_1 / Q5_1: value = d * q + m, the product rounded before the add (no FMA here) */
static void dq_q41_51(int has_qh, const uint8_t *src, float *dst, int64_t nb) {
    const size_t bb = has_qh ? sizeof(aotx_block_q5_1) : sizeof(aotx_block_q4_1);
    for (int64_t i = 0; i < nb; i++, dst += 32) {
        const uint8_t *b = src + (size_t)i * bb, *qs = b + (has_qh ? 8 : 4);
        float d = aotx_fp16_to_f32(rd16(b)), m = aotx_fp16_to_f32(rd16(b + 2));
        uint32_t qh = 0;
        if (has_qh) memcpy(&qh, b + 4, 4);
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
            int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            volatile float plo = d * (float)lo, phi = d * (float)hi;
            dst[j] = plo + m;
            dst[j + 16] = phi + m;
        }
    }
}

DQ_BIND(dq_q4_1, dq_q41_51, 0)
DQ_BIND(dq_q5_1, dq_q41_51, 1)

static void dq_iq4_nl(const uint8_t *src, float *dst, int64_t nb) {
    const aotx_block_iq4_nl *b = (const aotx_block_iq4_nl *)src;
    for (int64_t i = 0; i < nb; i++, b++, dst += 32) {
        float d = aotx_fp16_to_f32(b->d);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)aotx_iq4nl_values[b->qs[j] & 0x0f];
            dst[j + 16] = d * (float)aotx_iq4nl_values[b->qs[j] >> 4];
        }
    }
}

static void dq_q8_0(const uint8_t *src, float *dst, int64_t nb) {
    const aotx_block_q8_0 *b = (const aotx_block_q8_0 *)src;
    for (int64_t i = 0; i < nb; i++, b++, dst += 32) {
        float d = aotx_fp16_to_f32(b->d);
        for (int j = 0; j < 32; j++) dst[j] = d * (float)b->qs[j];
    }
}

/* Q4_K / Q5_K: value = (d*sc) * q - (dmin*m), each product rounded to float
 * (no fused multiply-add: this file is built without FMA code generation). */
static void dq_q4_k(const uint8_t *src, float *dst, int64_t nb) {
    const aotx_block_q4_k *b = (const aotx_block_q4_k *)src;
    for (int64_t i = 0; i < nb; i++, b++, dst += 256) {
        float d = aotx_fp16_to_f32(b->d), dmin = aotx_fp16_to_f32(b->dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            scale_min_k4(j, b->scales, &sc, &m);
            float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = b->qs + 32 * (j / 2);
            int sh = (j & 1) * 4;
            for (int l = 0; l < 32; l++) {
                volatile float p = dl * (float)((q[l] >> sh) & 0x0f);
                dst[32 * j + l] = p - ml;
            }
        }
    }
}

static void dq_q5_k(const uint8_t *src, float *dst, int64_t nb) {
    const aotx_block_q5_k *b = (const aotx_block_q5_k *)src;
    for (int64_t i = 0; i < nb; i++, b++, dst += 256) {
        float d = aotx_fp16_to_f32(b->d), dmin = aotx_fp16_to_f32(b->dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            scale_min_k4(j, b->scales, &sc, &m);
            float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = b->qs + 32 * (j / 2);
            int sh = (j & 1) * 4;
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> sh) & 0x0f) | ((b->qh[l] >> j) & 1) << 4;
                volatile float p = dl * (float)v;
                dst[32 * j + l] = p - ml;
            }
        }
    }
}

/* Q6_K element e = 128h + 32k + l (half h, quarter k, lane l). */
static inline int q6_value(const aotx_block_q6_k *b, int h, int k, int l) {
    const uint8_t *ql = b->ql + 64 * h + 32 * (k & 1);
    int lo = (k < 2) ? (ql[l] & 0x0f) : (ql[l] >> 4);
    int hi = (b->qh[32 * h + l] >> (2 * k)) & 3;
    return (lo | hi << 4) - 32;
}

static void dq_q6_k(const uint8_t *src, float *dst, int64_t nb) {
    const aotx_block_q6_k *b = (const aotx_block_q6_k *)src;
    for (int64_t i = 0; i < nb; i++, b++, dst += 256) {
        float d = aotx_fp16_to_f32(b->d);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 32; l++) {
                    int e = 128 * h + 32 * k + l;
                    float dl = d * (float)b->scales[e / 16];
                    dst[e] = dl * (float)q6_value(b, h, k, l);
                }
    }
}

/* Q2_K / Q3_K / IQ4_XS as 256 signed quants, 16 per-group scales and (Q2_K) mins: the
 * form the reference products and the dequantizers share; value = d*sc_g*q - dmin*m_g. */
typedef struct {
    int8_t q[256];
    int8_t sc[16], m[16];
    float d, dmin;
} kx_unpacked;

static void kx_unpack(int type, const uint8_t *wb, kx_unpacked *u) {
    memset(u->m, 0, sizeof u->m);
    u->dmin = 0.0f;
    if (type == AOTX_T_IQ4_XS) {
        const aotx_block_iq4_xs *b = (const aotx_block_iq4_xs *)wb;
        u->d = aotx_fp16_to_f32(b->d);
        for (int j = 0; j < 8; j++) {
            u->sc[2 * j] = u->sc[2 * j + 1] = (int8_t)aotx_iq4xs_scale(b, j);
            for (int l = 0; l < 16; l++) {
                u->q[32 * j + l] = aotx_iq4nl_values[b->qs[16 * j + l] & 0x0f];
                u->q[32 * j + 16 + l] = aotx_iq4nl_values[b->qs[16 * j + l] >> 4];
            }
        }
        return;
    }
    const uint8_t *qs = type == AOTX_T_Q2_K ? wb + 16 : wb + 32;
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++) {
                const int e = 128 * h + 32 * k + l;
                int q = (qs[32 * h + l] >> (2 * k)) & 3;
                if (type == AOTX_T_Q3_K && !((wb[l] >> (4 * h + k)) & 1)) q -= 4;
                u->q[e] = (int8_t)q;
            }
    if (type == AOTX_T_Q2_K) {
        const aotx_block_q2_k *b = (const aotx_block_q2_k *)wb;
        u->d = aotx_fp16_to_f32(b->d);
        u->dmin = aotx_fp16_to_f32(b->dmin);
        for (int g = 0; g < 16; g++) {
            u->sc[g] = (int8_t)(b->scales[g] & 0x0f);
            u->m[g] = (int8_t)(b->scales[g] >> 4);
        }
        return;
    }
    const aotx_block_q3_k *b = (const aotx_block_q3_k *)wb;
    u->d = aotx_fp16_to_f32(b->d);
    for (int g = 0; g < 16; g++) u->sc[g] = (int8_t)aotx_q3k_scale(b->scales, g);
}

/* gguf-py's steps: dl = d * sc, ml = dmin * m (each rounded), value = dl * q (- ml) */
static void dq_kx(int type, const uint8_t *src, float *dst, int64_t nb) {
    const size_t bb = (size_t)aotx_type_block_bytes(type);
    for (int64_t i = 0; i < nb; i++, dst += 256) {
        kx_unpacked u;
        kx_unpack(type, src + (size_t)i * bb, &u);
        for (int g = 0; g < 16; g++) {
            float dl = u.d * (float)u.sc[g], ml = u.dmin * (float)u.m[g];
            for (int l = 0; l < 16; l++) {
                volatile float p = dl * (float)u.q[16 * g + l];
                dst[16 * g + l] = type == AOTX_T_Q2_K ? p - ml : p;
            }
        }
    }
}

DQ_BIND(dq_q2_k, dq_kx, AOTX_T_Q2_K)
DQ_BIND(dq_q3_k, dq_kx, AOTX_T_Q3_K)
DQ_BIND(dq_iq4_xs, dq_kx, AOTX_T_IQ4_XS)

static void dq_q8_k(const uint8_t *src, float *dst, int64_t nb) {
    const aotx_block_q8_k *b = (const aotx_block_q8_k *)src;
    for (int64_t i = 0; i < nb; i++, b++, dst += 256)
        for (int j = 0; j < 256; j++) dst[j] = b->d * (float)b->qs[j];
}

static aotx_dq_fn dq_ref_fn(int type) {
    switch (type) {
    case AOTX_T_F32: return dq_f32;
    case AOTX_T_F16: return dq_f16;
    case AOTX_T_BF16: return dq_bf16;
    case AOTX_T_Q4_0: return dq_q4_0;
    case AOTX_T_Q4_1: return dq_q4_1;
    case AOTX_T_Q5_0: return dq_q5_0;
    case AOTX_T_Q5_1: return dq_q5_1;
    case AOTX_T_Q8_0: return dq_q8_0;
    case AOTX_T_IQ4_NL: return dq_iq4_nl;
    case AOTX_T_Q2_K: return dq_q2_k;
    case AOTX_T_Q3_K: return dq_q3_k;
    case AOTX_T_IQ4_XS: return dq_iq4_xs;
    case AOTX_T_Q4_K: return dq_q4_k;
    case AOTX_T_Q5_K: return dq_q5_k;
    case AOTX_T_Q6_K: return dq_q6_k;
    case AOTX_T_Q8_K: return dq_q8_k;
    default: return NULL;
    }
}

/* ------------------------------------------------------------- dispatch */

enum { N_TYPES = 31 };
static aotx_mm_fn mm_fast[N_TYPES];
static const char *mm_name[N_TYPES];
static aotx_dq_fn dq_fast[N_TYPES];
static const char *dq_name[N_TYPES];
static aotx_act8_fn act8_fast;
static aotx_act8k_fn act8k_fast;
static pthread_once_t pick_once = PTHREAD_ONCE_INIT;
static int cur_level;     /* the level pick_level last ran */
static int invariant;     /* AOTX_INVARIANT=1 / aotx_kernel_invariant */

static void pick_level(int max_level) {
    cur_level = max_level;
    act8_fast = NULL;
    act8k_fast = NULL;
#if defined(__x86_64__)
    aotx_x86_pick_act(max_level, &act8_fast, &act8k_fast);
#endif
    for (int t = 0; t < N_TYPES; t++) {
        mm_fast[t] = NULL;
        dq_fast[t] = NULL;
        mm_name[t] = "ref";
        dq_name[t] = "ref";
        if (max_level <= AOTX_LEVEL_REF || aotx_type_block_elems(t) == 0) continue;
#if defined(__x86_64__)
        aotx_mm_fn mm = NULL;
        aotx_dq_fn dq = NULL;
        const char *mn = NULL, *dn = NULL;
        aotx_x86_pick(t, max_level, invariant, &mm, &mn, &dq, &dn);
        if (mm) { mm_fast[t] = mm; mm_name[t] = mn; }
        if (dq) { dq_fast[t] = dq; dq_name[t] = dn; }
#endif
    }
}

static int best_level(void) {
#if defined(__x86_64__)
    return aotx_x86_level();
#else
    return AOTX_LEVEL_REF;
#endif
}

static void pick_kernels(void) {
    const char *inv = getenv("AOTX_INVARIANT");
    invariant = inv && strcmp(inv, "1") == 0;
    int cap = aotx_cpu_kernel_cap(), level = best_level();
    if (cap == AOTX_KERNELS_REF) level = AOTX_LEVEL_REF;
    else if (cap == AOTX_KERNELS_AVX2 && level > AOTX_LEVEL_AVX2) level = AOTX_LEVEL_AVX2;
    pick_level(level);
}

int aotx_kernel_force(const char *impl) {
    pthread_once(&pick_once, pick_kernels);
    if (!impl) return AOTX_E_INVALID_ARGUMENT;
    int level;
    if (strcmp(impl, "ref") == 0) level = AOTX_LEVEL_REF;
    else if (strcmp(impl, "avx2") == 0) level = AOTX_LEVEL_AVX2;
    else if (strcmp(impl, "avx512vnni") == 0) level = AOTX_LEVEL_AVX512VNNI;
    else if (strcmp(impl, "auto") == 0) level = best_level();
    else return AOTX_E_INVALID_ARGUMENT;
    if (level > best_level()) return AOTX_E_UNSUPPORTED;
    int rc = aotx_sgemm_force(level == AOTX_LEVEL_REF ? "ref"
                              : level == AOTX_LEVEL_AVX2 ? "avx2" : "auto");
    if (rc != AOTX_OK) return rc;
    /* the half-precision K/V helpers follow: ref with ref, else their best (F16C) */
    if ((rc = aotx_kv_f16_force(level == AOTX_LEVEL_REF ? "ref" : "auto")) != AOTX_OK) return rc;
    pick_level(level);
    return AOTX_OK;
}

int aotx_kernel_invariant(int on) {
    pthread_once(&pick_once, pick_kernels);
    invariant = on != 0;
    pick_level(cur_level);
    return AOTX_OK;
}

int aotx_kernel_is_invariant(void) {
    pthread_once(&pick_once, pick_kernels);
    return cur_level < AOTX_LEVEL_AVX512VNNI || invariant;
}

static inline int type_ok(int type) {
    return type >= 0 && type < N_TYPES && aotx_type_block_elems(type) != 0;
}

const char *aotx_kernel_impl(int type) {
    pthread_once(&pick_once, pick_kernels);
    if (!type_ok(type) || type == AOTX_T_Q8_K) return "none";
    return type == AOTX_T_F32 ? aotx_sgemm_impl() : mm_name[type];
}

const char *aotx_dequant_impl(int type) {
    pthread_once(&pick_once, pick_kernels);
    return type_ok(type) ? dq_name[type] : "none";
}

static int dequant(int type, const void *src, float *dst, int64_t n, int fast) {
    if (!type_ok(type)) return AOTX_E_KERNEL_TYPE;
    int64_t be = aotx_type_block_elems(type);
    if (n < 0 || (n > 0 && (!src || !dst))) return AOTX_E_INVALID_ARGUMENT;
    if (n % be) return AOTX_E_KERNEL_SHAPE;
    aotx_dq_fn fn = dq_ref_fn(type);
    if (fast) {
        pthread_once(&pick_once, pick_kernels);
        if (dq_fast[type]) fn = dq_fast[type];
    }
    fn((const uint8_t *)src, dst, n / be);
    return AOTX_OK;
}

int aotx_dequant_row(int type, const void *src, float *dst, int64_t n) {
    return dequant(type, src, dst, n, 1);
}

int aotx_dequant_row_ref(int type, const void *src, float *dst, int64_t n) {
    return dequant(type, src, dst, n, 0);
}

/* ------------------------------------------------- activation quantization */

/* Which activation form a weight type multiplies against. */
static int act_type(int type) {
    switch (type) {
    case AOTX_T_Q4_0: case AOTX_T_Q4_1: case AOTX_T_Q5_0: case AOTX_T_Q5_1: case AOTX_T_Q8_0:
    case AOTX_T_IQ4_NL:
        return AOTX_T_Q8_0;
    case AOTX_T_Q2_K: case AOTX_T_Q3_K: case AOTX_T_Q4_K: case AOTX_T_Q5_K: case AOTX_T_Q6_K:
    case AOTX_T_IQ4_XS:
        return AOTX_T_Q8_K;
    case AOTX_T_F32: case AOTX_T_F16: case AOTX_T_BF16: return AOTX_T_F32;
    default: return -1;
    }
}

static size_t act_row_bytes(int type, int64_t cols) {
    switch (act_type(type)) {
    case AOTX_T_Q8_0: return (size_t)((cols / AOTX_QK + 1) / 2) * AOTX_ACT8_PAIR_BYTES;
    case AOTX_T_Q8_K: return (size_t)(cols / AOTX_QK_K) * sizeof(aotx_block_q8_k32);
    default: return (size_t)cols * sizeof(float);
    }
}

int64_t aotx_act_bytes(int type, int64_t cols, int64_t n_tok) {
    if (act_type(type) < 0) return AOTX_E_KERNEL_TYPE;
    if (cols < 0 || n_tok < 0) return AOTX_E_INVALID_ARGUMENT;
    if (cols % aotx_type_block_elems(type)) return AOTX_E_KERNEL_SHAPE;
    return (int64_t)act_row_bytes(type, cols) * n_tok;
}

/* Round to nearest (ties to even) for |v| < 2^22 without a libm call. */
static inline int round_i(float v) {
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    float t = v + magic;
    return (int)(t - magic);
}

/* x ~= d * q with d = max|x| / 127, q in [-127, 127]. Returns d. */
static float quant_group(const float *x, int n, int8_t *q) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) {
        float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    float d = amax / 127.0f;
    float id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < n; j++) {
        float v = x[j] * id;
        v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
        q[j] = (int8_t)round_i(v);
    }
    return d;
}

static void act_q8_0_row(const float *x, int64_t cols, uint8_t *out) {
    int64_t nb = cols / AOTX_QK;
    for (int64_t b = 0; b < (nb + 1) / 2 * 2; b++) {
        uint8_t *xu = out + (b >> 1) * AOTX_ACT8_PAIR_BYTES + (b & 1) * 32;
        float *dx = (float *)(out + (b >> 1) * AOTX_ACT8_PAIR_BYTES + 64 + (b & 1) * 32);
        int8_t q[AOTX_QK] = {0};
        float d = b < nb ? quant_group(x + b * AOTX_QK, AOTX_QK, q) : 0.0f;
        for (int j = 0; j < AOTX_QK; j++) xu[j] = (uint8_t)(q[j] + 128);
        for (int j = 0; j < 8; j++) dx[j] = d;
    }
}

/* Q8_K32: each 32 values quantized as a Q8_0-family block, plus the 16-sums and the
 * mins' term d[j] * (sum of the 32 quants). */
static void act_q8_k_row(const float *x, int64_t cols, aotx_block_q8_k32 *out) {
    for (int64_t b = 0; b < cols / AOTX_QK_K; b++, out++) {
        for (int j = 0; j < 8; j++)
            out->d[j] = quant_group(x + b * AOTX_QK_K + 32 * j, 32, out->qs + 32 * j);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += out->qs[16 * g + j];
            out->bsums[g] = (int16_t)s;
        }
        for (int j = 0; j < 8; j++)
            out->dm[j] = out->d[j] * (float)(out->bsums[2 * j] + out->bsums[2 * j + 1]);
    }
}

int aotx_act_prepare(int type, const float *x, int64_t ldx, int64_t n_tok, int64_t cols,
                     void *act) {
    int64_t total = aotx_act_bytes(type, cols, n_tok);
    if (total < 0) return (int)total;
    if (n_tok > 0 && (!x || !act || ldx < cols)) return AOTX_E_INVALID_ARGUMENT;
    size_t stride = act_row_bytes(type, cols);
    pthread_once(&pick_once, pick_kernels);
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xt = x + t * ldx;
        uint8_t *at = (uint8_t *)act + (size_t)t * stride;
        switch (act_type(type)) {
        case AOTX_T_Q8_0: (act8_fast ? act8_fast : act_q8_0_row)(xt, cols, at); break;
        case AOTX_T_Q8_K:
            (act8k_fast ? act8k_fast : act_q8_k_row)(xt, cols, (aotx_block_q8_k32 *)at);
            break;
        default: memcpy(at, xt, stride); break;
        }
    }
    return AOTX_OK;
}

/* ---------------------------------------------------- reference products */

/* Activation block i of a Q8_0-family row: quants as int8 and the scale. */
static inline float act8_block(const uint8_t *a, int64_t i, int *xq) {
    const uint8_t *xu = aotx_act8_xu(a, i);
    for (int j = 0; j < 32; j++) xq[j] = (int)xu[j] - 128;
    return *aotx_act8_dx(a, i);
}

/* Q4_0 / IQ4_NL (the same block layout): nibble n is the value n - 8 / the codebook's level */
static inline int nib_value(int iq4, int n) { return iq4 ? aotx_iq4nl_values[n] : n - 8; }

static float dot_nib(int iq4, const uint8_t *w, const uint8_t *a, int64_t nb) {
    const aotx_block_q4_0 *b = (const aotx_block_q4_0 *)w;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int xq[32];
        float dx = act8_block(a, i, xq);
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += nib_value(iq4, b[i].qs[j] & 0x0f) * xq[j] + nib_value(iq4, b[i].qs[j] >> 4) * xq[j + 16];
        sum += aotx_fp16_to_f32(b[i].d) * dx * (float)s;
    }
    return sum;
}

DOT_BIND(dot_q4_0, dot_nib, 0)
DOT_BIND(dot_iq4_nl, dot_nib, 1)

static float dot_q5_0(const uint8_t *w, const uint8_t *a, int64_t nb) {
    const aotx_block_q5_0 *b = (const aotx_block_q5_0 *)w;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int xq[32];
        float dx = act8_block(a, i, xq);
        uint32_t qh;
        memcpy(&qh, b[i].qh, 4);
        int32_t s = 0;
        for (int j = 0; j < 16; j++) {
            int lo = ((b[i].qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4) - 16;
            int hi = ((b[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4) - 16;
            s += lo * xq[j] + hi * xq[j + 16];
        }
        sum += aotx_fp16_to_f32(b[i].d) * dx * (float)s;
    }
    return sum;
}

/* Q4_1 / Q5_1: S = sum q * x_q, X = sum x_q; y += d * dx * S + m * dx * X */
static float dot_q41_51(int has_qh, const uint8_t *w, const uint8_t *a, int64_t nb) {
    const size_t bb = has_qh ? sizeof(aotx_block_q5_1) : sizeof(aotx_block_q4_1);
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = w + (size_t)i * bb, *qs = b + (has_qh ? 8 : 4);
        int xq[32];
        float dx = act8_block(a, i, xq);
        uint32_t qh = 0;
        if (has_qh) memcpy(&qh, b + 4, 4);
        int32_t s = 0, sx = 0;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
            int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            s += lo * xq[j] + hi * xq[j + 16];
            sx += xq[j] + xq[j + 16];
        }
        float d = aotx_fp16_to_f32(rd16(b)), m = aotx_fp16_to_f32(rd16(b + 2));
        sum += d * dx * (float)s + m * dx * (float)sx;
    }
    return sum;
}

DOT_BIND(dot_q4_1, dot_q41_51, 0)
DOT_BIND(dot_q5_1, dot_q41_51, 1)

static float dot_q8_0(const uint8_t *w, const uint8_t *a, int64_t nb) {
    const aotx_block_q8_0 *b = (const aotx_block_q8_0 *)w;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int xq[32];
        float dx = act8_block(a, i, xq);
        int32_t s = 0;
        for (int j = 0; j < 32; j++) s += b[i].qs[j] * xq[j];
        sum += aotx_fp16_to_f32(b[i].d) * dx * (float)s;
    }
    return sum;
}

/* k-quants x Q8_K32: the float steps of aotx_block_q8_k32 (aotx_kernels.h), which the
 * batch-invariant fast kernels repeat; fmaf: one rounding (this file is built without
 * FMA code generation, so nothing else is fused). */
static float dot_k45(int has_qh, const uint8_t *w, const uint8_t *a, int64_t nb) {
    const size_t bbytes = has_qh ? sizeof(aotx_block_q5_k) : sizeof(aotx_block_q4_k);
    const aotx_block_q8_k32 *x = (const aotx_block_q8_k32 *)a;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *wb = w + (size_t)i * bbytes;
        const uint8_t *scales = wb + 4, *qh = wb + 16, *qs = wb + (has_qh ? 48 : 16);
        float f = 0.0f, g = 0.0f;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            scale_min_k4(j, scales, &sc, &m);
            const uint8_t *q = qs + 32 * (j / 2);
            int sh = (j & 1) * 4;
            int32_t s = 0;
            for (int l = 0; l < 32; l++) {
                int v = (q[l] >> sh) & 0x0f;
                if (has_qh) v |= ((qh[l] >> j) & 1) << 4;
                s += v * x[i].qs[32 * j + l];
            }
            f = fmaf((float)(sc * s), x[i].d[j], f);
            g = fmaf((float)m, x[i].dm[j], g);
        }
        float r = fmaf(f, aotx_fp16_to_f32(rd16(wb)), -(g * aotx_fp16_to_f32(rd16(wb + 2))));
        sum = i > 0 ? sum + r : r;
    }
    return sum;
}

DOT_BIND(dot_q4_k, dot_k45, 0)
DOT_BIND(dot_q5_k, dot_k45, 1)

static float dot_q6_k(const uint8_t *w, const uint8_t *a, int64_t nb) {
    const aotx_block_q6_k *b = (const aotx_block_q6_k *)w;
    const aotx_block_q8_k32 *x = (const aotx_block_q8_k32 *)a;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        float f = 0.0f;
        for (int j = 0; j < 8; j++) {  /* 32 values: groups 2j, 2j + 1 */
            int32_t t = 0;
            for (int g = 2 * j; g < 2 * j + 2; g++) {
                int h = g / 8, k = (g / 2) % 4, l0 = (g % 2) * 16, s = 0;
                for (int l = l0; l < l0 + 16; l++)
                    s += q6_value(&b[i], h, k, l) * x[i].qs[16 * g + l - l0];
                t += b[i].scales[g] * s;
            }
            f = fmaf((float)t, x[i].d[j], f);
        }
        float d = aotx_fp16_to_f32(b[i].d);
        sum = i > 0 ? fmaf(f, d, sum) : f * d;
    }
    return sum;
}

/* Q2_K / Q3_K / IQ4_XS x Q8_K32: the float steps of aotx_block_q8_k32 */
static float dot_kx(int type, const uint8_t *w, const uint8_t *a, int64_t nb) {
    const size_t bb = (size_t)aotx_type_block_bytes(type);
    const aotx_block_q8_k32 *x = (const aotx_block_q8_k32 *)a;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        kx_unpacked u;
        kx_unpack(type, w + (size_t)i * bb, &u);
        float f = 0.0f, g = 0.0f;
        for (int j = 0; j < 8; j++) {
            int32_t t = 0, mj = 0;
            for (int gi = 2 * j; gi < 2 * j + 2; gi++) {
                int32_t s = 0;
                for (int l = 0; l < 16; l++) s += u.q[16 * gi + l] * x[i].qs[16 * gi + l];
                t += u.sc[gi] * s;
                mj += u.m[gi] * x[i].bsums[gi];
            }
            f = fmaf((float)t, x[i].d[j], f);
            g = fmaf((float)mj, x[i].d[j], g);
        }
        float r = type == AOTX_T_Q2_K ? fmaf(f, u.d, -(g * u.dmin)) : f * u.d;
        sum = i > 0 ? sum + r : r;
    }
    return sum;
}

DOT_BIND(dot_q2_k, dot_kx, AOTX_T_Q2_K)
DOT_BIND(dot_q3_k, dot_kx, AOTX_T_Q3_K)
DOT_BIND(dot_iq4_xs, dot_kx, AOTX_T_IQ4_XS)

static float dot_f16(const uint8_t *w, const uint8_t *a, int64_t n) {
    const float *x = (const float *)a;
    double s = 0.0;
    for (int64_t k = 0; k < n; k++) s += (double)aotx_fp16_to_f32(rd16(w + 2 * k)) * x[k];
    return (float)s;
}

static float dot_bf16(const uint8_t *w, const uint8_t *a, int64_t n) {
    const float *x = (const float *)a;
    double s = 0.0;
    for (int64_t k = 0; k < n; k++) s += (double)aotx_bf16_to_f32(rd16(w + 2 * k)) * x[k];
    return (float)s;
}

typedef float (*dot_fn)(const uint8_t *w, const uint8_t *a, int64_t nb);

static dot_fn dot_ref_fn(int type) {
    switch (type) {
    case AOTX_T_F16: return dot_f16;
    case AOTX_T_BF16: return dot_bf16;
    case AOTX_T_Q4_0: return dot_q4_0;
    case AOTX_T_Q4_1: return dot_q4_1;
    case AOTX_T_Q5_0: return dot_q5_0;
    case AOTX_T_Q5_1: return dot_q5_1;
    case AOTX_T_Q8_0: return dot_q8_0;
    case AOTX_T_IQ4_NL: return dot_iq4_nl;
    case AOTX_T_Q2_K: return dot_q2_k;
    case AOTX_T_Q3_K: return dot_q3_k;
    case AOTX_T_IQ4_XS: return dot_iq4_xs;
    case AOTX_T_Q4_K: return dot_q4_k;
    case AOTX_T_Q5_K: return dot_q5_k;
    case AOTX_T_Q6_K: return dot_q6_k;
    default: return NULL;
    }
}

static int matmul(int type, const void *w, int64_t cols, const void *act, int64_t n_tok, float *y,
                  int64_t ldy, int64_t r0, int64_t r1, int fast) {
    if (!type_ok(type) || type == AOTX_T_Q8_K) return AOTX_E_KERNEL_TYPE;
    int64_t rb = aotx_type_row_bytes(type, cols);
    if (rb < 0) return (int)rb;
    if (n_tok < 0 || r0 < 0 || r1 < r0 || (n_tok > 1 && ldy < r1)) return AOTX_E_INVALID_ARGUMENT;
    if (n_tok == 0 || r1 == r0) return AOTX_OK;
    if (!w || !act || !y) return AOTX_E_INVALID_ARGUMENT;
    int64_t nb = cols / aotx_type_block_elems(type);
    size_t astride = act_row_bytes(type, cols);
    if (type == AOTX_T_F32) {
        (fast ? aotx_sgemm_rows : aotx_sgemm_rows_ref)((const float *)w, cols, (const float *)act,
                                                      cols, n_tok, y, ldy, r0, r1);
        return AOTX_OK;
    }
    if (fast) {
        pthread_once(&pick_once, pick_kernels);
        if (mm_fast[type]) {
            mm_fast[type]((const uint8_t *)w, (size_t)rb, nb, (const uint8_t *)act, astride, n_tok,
                          y, ldy, r0, r1);
            return AOTX_OK;
        }
    }
    dot_fn dot = dot_ref_fn(type);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * (size_t)rb;
        for (int64_t t = 0; t < n_tok; t++)
            y[t * ldy + r] = dot(wr, (const uint8_t *)act + (size_t)t * astride, nb);
    }
    return AOTX_OK;
}

int aotx_matmul_rows(int type, const void *w, int64_t cols, const void *act, int64_t n_tok,
                     float *y, int64_t ldy, int64_t r0, int64_t r1) {
    return matmul(type, w, cols, act, n_tok, y, ldy, r0, r1, 1);
}

int aotx_matmul_rows_ref(int type, const void *w, int64_t cols, const void *act, int64_t n_tok,
                         float *y, int64_t ldy, int64_t r0, int64_t r1) {
    return matmul(type, w, cols, act, n_tok, y, ldy, r0, r1, 0);
}
