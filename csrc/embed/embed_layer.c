/* embed_layer.c -- the compute sections of the BERT forward pass.
 *
 * The linears' products go through the backend table (e->be_ops->matmul, as the
 * decoder's do); their bias / GELU is a section splitting the output rows.  Each
 * section is a pool function (ctx, ith, nth): token-wise steps split tokens.  The
 * attention is the backend's dense_attention (every token over its own sequence's
 * tokens, no KV pages).  Everything works on
 * the packed batch of struct aotx_embed (no padding anywhere).
 */
#include "embed_internal.h"

#include <math.h>
#include <string.h>

typedef struct linear_job {
    aotx_weight w;    /* [rows][cols] float32 */
    const float *b;   /* [rows] */
    const float *x;   /* [n_tok][cols] */
    float *y;         /* [n_tok][rows] */
    int64_t rows;
    int64_t cols;
    int gelu;         /* apply GELU(erf) after the bias */
} linear_job;

typedef struct section {
    aotx_embed *e;
    int32_t n_tok;
    int32_t n_seq;
    int32_t n_lin;
    linear_job lin[3];
    const float *ln_w;  /* [hidden] LayerNorm of the residual sections */
    const float *ln_b;  /* [hidden] */
} section;

static void span(int64_t n, int32_t ith, int32_t nth, int64_t align, int64_t *a, int64_t *b) {
    int64_t chunk = (n + nth - 1) / nth;
    chunk = (chunk + align - 1) / align * align;
    int64_t lo = (int64_t)ith * chunk, hi = lo + chunk;
    *a = lo < n ? lo : n;
    *b = hi < n ? hi : n;
}

/* erf(x) ~ x P(x^2) / Q(x^2) on [-4, 4]: our own weighted least-squares fit
 * (|error| < 2.2e-8 in exact arithmetic, < 4e-7 evaluated in float, against
 * erff's ~1e-7); beyond |x| = 4, erf is +-1 to within 1.6e-8.  Branch-free, so
 * the GELU loop below vectorises, unlike calls to erff. */
static inline float erf_rational(float x) {
    x = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
    const float z = x * x;
    float p = 1.974858665e-06f;
    p = p * z + 2.880469797e-04f;
    p = p * z + 4.003730312e-03f;
    p = p * z + 5.346772289e-02f;
    p = p * z + 1.962503014e-01f;
    p = p * z + 1.128378977e+00f;
    float q = 3.748147194e-05f;
    q = q * z + 1.216387966e-03f;
    q = q * z + 1.544457873e-02f;
    q = q * z + 1.164770356e-01f;
    q = q * z + 5.072534603e-01f;
    q = q * z + 1.0f;
    return x * p / q;
}

/* y[r] = GELU(y[r] + b[r]) with the exact (erf) GELU, r in [0, n). */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void gelu_bias(float *restrict y, const float *restrict b, int64_t n) {
    for (int64_t r = 0; r < n; r++) {
        float v = y[r] + b[r];
        y[r] = 0.5f * v * (1.0f + erf_rational(v * 0.70710678118654752f));
    }
}

/* x = (x - mean) / sqrt(var + eps) * w + b over one row of n. */
static void layer_norm(float *x, const float *w, const float *b, int32_t n, float eps) {
    double mean = 0.0, var = 0.0;
    for (int32_t j = 0; j < n; j++) mean += x[j];
    mean /= n;
    for (int32_t j = 0; j < n; j++) {
        double d = x[j] - mean;
        var += d * d;
    }
    var /= n;
    float inv = (float)(1.0 / sqrt(var + (double)eps)), m = (float)mean;
    for (int32_t j = 0; j < n; j++) x[j] = (x[j] - m) * inv * w[j] + b[j];
}

static void sec_embeddings(void *ctx, int32_t ith, int32_t nth) {
    section *s = ctx;
    aotx_embed *e = s->e;
    const int32_t h = e->cfg.hidden;
    int64_t a, b;
    span(s->n_tok, ith, nth, 1, &a, &b);
    for (int64_t t = a; t < b; t++) {
        float *x = e->x + t * h;
        const float *we = e->w.word_emb + (int64_t)e->tok[t] * h;
        const float *pe = e->w.pos_emb + (int64_t)e->pos[t] * h;
        const float *te = e->w.type_emb; /* token type 0 */
        for (int32_t j = 0; j < h; j++) x[j] = we[j] + pe[j] + te[j];
        layer_norm(x, e->w.emb_ln_w, e->w.emb_ln_b, h, e->cfg.layer_norm_eps);
    }
}

/* y += b, then GELU where asked, on the products in place. */
static void sec_bias(void *ctx, int32_t ith, int32_t nth) {
    section *s = ctx;
    for (int32_t i = 0; i < s->n_lin; i++) {
        const linear_job *j = &s->lin[i];
        int64_t a, b;
        span(j->rows, ith, nth, 16, &a, &b);
        if (a >= b) continue;
        for (int64_t t = 0; t < s->n_tok; t++) {
            float *y = j->y + t * j->rows;
            if (j->gelu)
                gelu_bias(y + a, j->b + a, b - a);
            else
                for (int64_t r = a; r < b; r++) y[r] += j->b[r];
        }
    }
}

/* The n_lin products of one input (the backend's matmul), then their bias sections. */
static void linears(aotx_embed *e, section *s) {
    aotx_mm_out out[3];
    for (int32_t i = 0; i < s->n_lin; i++)
        out[i] = (aotx_mm_out){&s->lin[i].w, s->lin[i].y, s->lin[i].rows};
    e->be_ops->matmul(e->be, s->lin[0].x, s->lin[0].cols, s->n_tok, s->n_lin, out);
    aotx_embed_internal_parallel(e, sec_bias, s);
}

/* x = LayerNorm(tmp + x) per token. */
static void sec_residual_ln(void *ctx, int32_t ith, int32_t nth) {
    section *s = ctx;
    aotx_embed *e = s->e;
    const int32_t h = e->cfg.hidden;
    int64_t a, b;
    span(s->n_tok, ith, nth, 1, &a, &b);
    for (int64_t t = a; t < b; t++) {
        float *x = e->x + t * h;
        const float *r = e->tmp + t * h;
        for (int32_t j = 0; j < h; j++) x[j] += r[j];
        layer_norm(x, s->ln_w, s->ln_b, h, e->cfg.layer_norm_eps);
    }
}

static linear_job job(const float *w, const float *b, int64_t rows, int64_t cols, const float *x,
                      float *y, int gelu) {
    linear_job j = {{w, AOTX_T_F32, rows, cols, NULL}, b, x, y, rows, cols, gelu};
    return j;
}

static void run_layer(aotx_embed *e, section *s, const aotx_bert_layer *l) {
    const int64_t h = e->cfg.hidden, im = e->cfg.intermediate;
    s->n_lin = 3;
    s->lin[0] = job(l->q_w, l->q_b, h, h, e->x, e->q, 0);
    s->lin[1] = job(l->k_w, l->k_b, h, h, e->x, e->k, 0);
    s->lin[2] = job(l->v_w, l->v_b, h, h, e->x, e->v, 0);
    linears(e, s);
    const aotx_dense_attn att = {.n_seq = s->n_seq, .seq_off = e->seq_off,
                                 .n_heads = e->cfg.n_heads, .head_dim = e->head_dim,
                                 .scale = 1.0f / sqrtf((float)e->head_dim),
                                 .q = e->q, .k = e->k, .v = e->v, .out = e->ctx, .ld = h};
    e->be_ops->dense_attention(e->be, &att);
    s->n_lin = 1;
    s->lin[0] = job(l->ao_w, l->ao_b, h, h, e->ctx, e->tmp, 0);
    linears(e, s);
    s->ln_w = l->ln1_w;
    s->ln_b = l->ln1_b;
    aotx_embed_internal_parallel(e, sec_residual_ln, s);
    s->lin[0] = job(l->i_w, l->i_b, im, h, e->x, e->inter, 1);
    linears(e, s);
    s->lin[0] = job(l->o_w, l->o_b, h, im, e->inter, e->tmp, 0);
    linears(e, s);
    s->ln_w = l->ln2_w;
    s->ln_b = l->ln2_b;
    aotx_embed_internal_parallel(e, sec_residual_ln, s);
}

void aotx_embed_internal_forward(aotx_embed *e, int32_t n_tok, int32_t n_seq) {
    section s;
    memset(&s, 0, sizeof s);
    s.e = e;
    s.n_tok = n_tok;
    s.n_seq = n_seq;
    aotx_embed_internal_parallel(e, sec_embeddings, &s);
    for (int32_t i = 0; i < e->cfg.n_layers; i++) run_layer(e, &s, &e->layers[i]);
}
