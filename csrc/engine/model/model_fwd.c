/* model_fwd.c -- the forward pass of one step.
 *
 * Per layer: norm -> q,k,v (backend matmul) -> bias/qk-norm/rope -> KV write
 * and attention over pages (backend) -> o (backend) -> residual(+post-norm)
 * and next norm -> gate,up (backend) -> GLU -> down (backend) -> residual.
 * Matmuls, KV storage and attention go through m->be_ops (aotx.h, engine
 * section); the element-wise sections here run on the thread pool, or on the
 * caller for few tokens.
 */
#include "model_internal.h"
#include "vecmath_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SMALL_T 4   /* up to this many tokens, element-wise ops stay on the caller */

/* ---------- matmul (the backend's) ---------- */

/* y_i = W_i x for up to three matrices sharing the input x[n_tok][cols]. */
static void matmul(aotx_model *m, const float *x, int64_t ldx, int64_t n_tok, int n,
                   const mtensor *w0, float *y0, int64_t ld0, const mtensor *w1, float *y1,
                   int64_t ld1, const mtensor *w2, float *y2, int64_t ld2) {
    const aotx_mm_out out[3] = {{w0, y0, ld0}, {w1, y1, ld1}, {w2, y2, ld2}};
    m->be_ops->matmul(m->be, x, ldx, n_tok, n, out);
}

/* ---------- element-wise helpers ---------- */

static void rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

/* g = act(g) * u; gelu_tanh(x) = 0.5x(1 + tanh(v)) = x / (1 + exp(-2v)),
 * v = sqrt(2/pi)(x + 0.044715x^3); silu(x) = x / (1 + exp(-x)). */
AOTX_CLONES static void glu_gelu(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = g[i], v = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        g[i] = x / (1.0f + aotx_exp_approx(-2.0f * v)) * u[i];
    }
}

AOTX_CLONES static void glu_silu(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + aotx_exp_approx(-g[i])) * u[i];
}

/* ---------- the activation residual of ffn_down ----------
 *
 * The kernels multiply quantized weights with Q8 activations: per block of 32 values
 * (Q8_K32 before k-quant weights, Q8_0 pairs before the Q8_0 family) d = max|x| / 127
 * and q = round-half-even(x / d) (quant.c, quant_group; the fast preparations are
 * byte-equal).  Measured against the float64 model (scripts/bench_engine_fidelity.py),
 * the largest error of the whole forward was that rounding on the input of ffn_down:
 * gelu(gate) * up has outliers, which coarsened the step of the 256-blocks that k-quant
 * products used before Q8_K32 (one scale per 32 values: now the default, and most of
 * the gain).  Opt-in: ffn_down also runs on the residual r = x - d*q (itself quantized:
 * steps ~254x finer) and the two products are added: W(x) ~ W Q(x) + W Q(r). */

/* AOTX_ACT_RESIDUAL in the environment (read once): unset or 0, none (the default);
 * 1, every quantized ffn_down; 6, only those whose weights have 6 bits or more (Q6_K,
 * Q8_0: the layers a Q4_K_M file marks as the sensitive ones).  With Q8_K32 the residual
 * product takes the KL to the exact model from 0.0026-0.0027 to 0.0019 on Gemma 3 270M but
 * costs ~15-25 % of a prefill's CPU (docs/benchmarks.md, "Engine fidelity round 3"). */
static int residual_mode = 0;
static pthread_once_t residual_once = PTHREAD_ONCE_INIT;

static void residual_read(void) {
    const char *e = getenv("AOTX_ACT_RESIDUAL");
    residual_mode = !e ? 0 : strcmp(e, "1") == 0 ? 1 : strcmp(e, "6") == 0 ? 6 : 0;
}

/* Values per activation block of ffn_down's input with weights of `type` when it also
 * runs on the residual; 0: no residual product (float activations, or not selected). */
static int act_block(int type) {
    pthread_once(&residual_once, residual_read);
    if (residual_mode == 0) return 0;
    if (residual_mode == 6 && type != AOTX_T_Q6_K && type != AOTX_T_Q8_0) return 0;
    switch (type) {
    case AOTX_T_Q2_K: case AOTX_T_Q3_K: case AOTX_T_Q4_K: case AOTX_T_Q5_K: case AOTX_T_Q6_K:
    case AOTX_T_IQ4_XS:
    case AOTX_T_Q4_0: case AOTX_T_Q4_1: case AOTX_T_Q5_0: case AOTX_T_Q5_1: case AOTX_T_Q8_0:
    case AOTX_T_IQ4_NL:
        return AOTX_QK;
    default: return 0;
    }
}

/* r = x - d*q, d and q as quant.c's quant_group computes them (same float operations;
 * the clamp between the multiply and the rounding add keeps them apart). */
AOTX_CLONES static void act_residual(const float *x, float *r, int64_t n, int blk) {
    const float magic = 12582912.0f;   /* 1.5 * 2^23: adding it rounds to an integer */
    for (int64_t b = 0; b < n; b += blk) {
        float amax = 0.0f;
        for (int j = 0; j < blk; j++) {
            float a = fabsf(x[b + j]);
            amax = a > amax ? a : amax;
        }
        float d = amax / 127.0f;
        float id = d > 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < blk; j++) {
            float v = x[b + j] * id;
            v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
            float q = (v + magic) - magic;
            r[b + j] = x[b + j] - d * q;
        }
    }
}

typedef struct ew_job {
    aotx_model *m;
    const mlayer *ly;
    int32_t T;
    int op;   /* 0 = norm x->xn with w; 1 = residual (+post norm) from o, then norm; 2 = GLU */
    const float *w;          /* op 0/1: the next norm weight */
    const float *post;       /* op 1: post norm weight or NULL */
    int res;                 /* op 1: o += xn (ffn_down on the residual) first;
                                op 2: the residual's block size (0: none) into up */
} ew_job;

static void ew_token(ew_job *e, int32_t t) {
    aotx_model *m = e->m;
    int64_t d = m->info.d_model, ff = m->info.d_ff;
    float *x = m->x + t * d, *xn = m->xn + t * d;
    if (e->op == 2) {
        float *g = m->gate + t * ff, *u = m->up + t * ff;
        if (m->gelu) glu_gelu(g, u, ff);
        else glu_silu(g, u, ff);
        if (e->res) act_residual(g, u, ff, e->res);
        return;
    }
    if (e->op == 1) {
        float *o = m->o + t * d;
        if (e->res)
            for (int64_t i = 0; i < d; i++) o[i] += xn[i];
        if (e->post) rmsnorm(o, o, e->post, d, m->info.eps);
        for (int64_t i = 0; i < d; i++) x[i] += o[i];
    }
    if (e->w) rmsnorm(xn, x, e->w, d, m->info.eps);
}

static void ew_fn(void *ctx, int32_t ith, int32_t nth) {
    ew_job *e = ctx;
    int32_t t0 = (int32_t)((int64_t)e->T * ith / nth), t1 = (int32_t)((int64_t)e->T * (ith + 1) / nth);
    for (int32_t t = t0; t < t1; t++) ew_token(e, t);
}

static void elementwise(aotx_model *m, ew_job *e) {
    if (e->T <= SMALL_T) ew_fn(e, 0, 1);
    else aotx_pool_run(m->pool, ew_fn, e);
}

/* ---------- rope, qk-norm, KV write ---------- */

static void rope_tables(aotx_model *m, int32_t T) {
    int32_t h = m->n_rot / 2;
    for (int32_t t = 0; t < T; t++)
        for (int c = 0; c < 2; c++) {
            float *cs = m->rope_cs + ((int64_t)t * 2 + c) * h * 2;
            float p = (float)m->tok_pos[t] * m->rope_pos_scale[c];
            for (int32_t i = 0; i < h; i++) {
                float a = p * m->inv_freq[c * h + i];
                cs[2 * i] = cosf(a) * m->rope_mscale;
                cs[2 * i + 1] = sinf(a) * m->rope_mscale;
            }
        }
}

static void rope_apply(const aotx_model *m, float *v, const float *cs) {
    int32_t h = m->n_rot / 2;
    if (m->rope_neox) {
        for (int32_t i = 0; i < h; i++) {
            float a = v[i], b = v[i + h], c = cs[2 * i], s = cs[2 * i + 1];
            v[i] = a * c - b * s;
            v[i + h] = a * s + b * c;
        }
    } else {
        for (int32_t i = 0; i < h; i++) {
            float a = v[2 * i], b = v[2 * i + 1], c = cs[2 * i], s = cs[2 * i + 1];
            v[2 * i] = a * c - b * s;
            v[2 * i + 1] = a * s + b * c;
        }
    }
}

typedef struct rope_job {
    aotx_model *m;
    const mlayer *ly;
    int32_t layer, T;
} rope_job;

static void add_bias(float *y, const float *b, int64_t n) {
    if (b)
        for (int64_t i = 0; i < n; i++) y[i] += b[i];
}

static void rope_token(rope_job *r, int32_t t) {
    aotx_model *m = r->m;
    const aotx_model_info *in = &m->info;
    const mlayer *ly = r->ly;
    int64_t hd = in->head_dim, vd = in->v_dim;
    float *q = m->q + t * in->n_heads * hd, *k = m->k + t * in->n_kv_heads * hd;
    float *v = m->v + t * in->n_kv_heads * vd;
    add_bias(q, ly->bq, in->n_heads * hd);
    add_bias(k, ly->bk, in->n_kv_heads * hd);
    add_bias(v, ly->bv, in->n_kv_heads * vd);
    const float *cs = m->rope_cs + ((int64_t)t * 2 + ly->rope_class) * m->n_rot;
    for (int32_t h = 0; h < in->n_heads; h++) {
        float *qh = q + h * hd;
        if (ly->q_norm) rmsnorm(qh, qh, ly->q_norm, hd, in->eps);
        rope_apply(m, qh, cs);
    }
    for (int32_t h = 0; h < in->n_kv_heads; h++) {
        float *kh = k + h * hd;
        if (ly->k_norm) rmsnorm(kh, kh, ly->k_norm, hd, in->eps);
        rope_apply(m, kh, cs);
    }
}

static void rope_fn(void *ctx, int32_t ith, int32_t nth) {
    rope_job *r = ctx;
    int32_t t0 = (int32_t)((int64_t)r->T * ith / nth), t1 = (int32_t)((int64_t)r->T * (ith + 1) / nth);
    for (int32_t t = t0; t < t1; t++) rope_token(r, t);
}

/* ---------- the layers ---------- */

/* Layer l for T tokens.  keep >= 0 (the last layer): only the first `keep` entries of
 * logit_tok need the layer's output, so after the attention (whose K/V every token
 * writes) their rows of att and x move to rows 0..keep-1 and the rest of the layer runs
 * on those alone (the kernels are batch invariant: the kept rows come out the same). */
static void layer_forward(aotx_model *m, int32_t l, int32_t T, int32_t keep) {
    const aotx_model_info *in = &m->info;
    const mlayer *ly = &m->layers[l];
    int64_t d = in->d_model, hd = in->head_dim;
    /* xn = attn_norm(x) was computed by the previous step of the loop */
    matmul(m, m->xn, d, T, 3, &ly->q, m->q, in->n_heads * hd, &ly->k, m->k, in->n_kv_heads * hd,
           &ly->v, m->v, in->n_kv_heads * in->v_dim);
    rope_job r = {m, ly, l, T};
    if (T <= SMALL_T) rope_fn(&r, 0, 1);
    else aotx_pool_run(m->pool, rope_fn, &r);
    aotx_kv_rows kr = {T, l, m->tok_seq, m->tok_pos, m->k, m->v, in->n_kv_heads * hd,
                       (int64_t)in->n_kv_heads * in->v_dim};
    m->be_ops->kv_write(m->be, m->kv, m->kv_store, &kr);
    aotx_attn_batch ab = {T, l, m->tok_seq, m->tok_pos, in->n_heads, in->n_kv_heads, hd,
                          in->v_dim, ly->sliding ? in->window : 0, in->attn_scale,
                          m->attn_softcap, m->q, m->att};
    m->be_ops->attention(m->be, m->kv, m->kv_store, &ab);
    int64_t od = (int64_t)in->n_heads * in->v_dim;
    if (keep >= 0) {
        for (int32_t i = 0; i < keep; i++) {   /* logit_tok ascends: row i <= logit_tok[i] */
            int32_t t = m->logit_tok[i];
            if (t == i) continue;
            memcpy(m->att + i * od, m->att + (int64_t)t * od, sizeof(float) * (size_t)od);
            memcpy(m->x + i * d, m->x + (int64_t)t * d, sizeof(float) * (size_t)d);
        }
        T = keep;
        if (T == 0) return;
    }
    matmul(m, m->att, od, T, 1, &ly->o, m->o, d, NULL, NULL, 0, NULL, NULL, 0);
    ew_job e = {m, ly, T, 1, ly->ffn_norm, ly->post_attn_norm, 0};
    elementwise(m, &e);
    matmul(m, m->xn, d, T, 2, &ly->gate, m->gate, in->d_ff, &ly->up, m->up, in->d_ff, NULL, NULL,
           0);
    int blk = act_block(ly->down.type);
    e = (ew_job){m, ly, T, 2, NULL, NULL, blk};
    elementwise(m, &e);
    /* xn (the ffn input) is free now: W Q(r) goes there, added to o below */
    if (blk) matmul(m, m->up, in->d_ff, T, 1, &ly->down, m->xn, d, NULL, NULL, 0, NULL, NULL, 0);
    matmul(m, m->gate, in->d_ff, T, 1, &ly->down, m->o, d, NULL, NULL, 0, NULL, NULL, 0);
    const float *next = l + 1 < in->n_layers ? m->layers[l + 1].attn_norm : NULL;
    e = (ew_job){m, ly, T, 1, next, ly->post_ffn_norm, blk != 0};
    elementwise(m, &e);
}

void model_forward(aotx_model *m, int32_t T, int32_t n_logits, float *logits) {
    const aotx_model_info *in = &m->info;
    int64_t d = in->d_model;
    rope_tables(m, T);
    ew_job e = {m, NULL, T, 0, m->layers[0].attn_norm, NULL, 0};
    elementwise(m, &e);
    int32_t keep = n_logits > 0 ? n_logits : 0;
    for (int32_t l = 0; l < in->n_layers; l++)
        layer_forward(m, l, T, l + 1 == in->n_layers && keep < T ? keep : -1);
    if (n_logits <= 0) return;
    /* x row r is logit_tok[r]'s (moved there by the last layer when it kept fewer rows) */
    for (int32_t r = 0; r < n_logits; r++)
        rmsnorm(m->xn + r * d, m->x + (int64_t)(keep < T ? r : m->logit_tok[r]) * d, m->out_norm,
                d, in->eps);
    matmul(m, m->xn, d, n_logits, 1, &m->output, logits, in->n_vocab, NULL, NULL, 0, NULL, NULL, 0);
    if (m->final_softcap > 0) {   /* gemma2: logits = cap * tanh(logits / cap) */
        float c = m->final_softcap, ic = 1.0f / c;
        for (int64_t i = 0; i < (int64_t)n_logits * in->n_vocab; i++)
            logits[i] = c * tanhf(logits[i] * ic);
    }
}
