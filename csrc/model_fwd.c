/* model_fwd.c -- the forward pass of one step, split into parallel sections.
 *
 * Per layer: norm -> prepare -> q,k,v (one section) -> bias/qk-norm/rope/KV
 * write -> attention over pages -> prepare -> o -> residual(+post-norm) and
 * next norm -> prepare -> gate,up -> GLU -> prepare -> down -> residual.
 * Element-wise work on few tokens runs on the caller without a section.
 */
#include "model_internal.h"
#include "vecmath_internal.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AOTX_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define AOTX_CLONES
#endif

#define ROW_ALIGN 16
#define SMALL_T 4   /* up to this many tokens, element-wise ops stay on the caller */

/* ---------- matmul sections ---------- */

typedef struct mm_item {
    const mtensor *w;
    float *y;
    int64_t ldy;
} mm_item;

typedef struct mm_job {
    aotx_model *m;
    mm_item it[3];
    int n;
    int64_t n_tok;
    int64_t total;            /* rows of all items */
    int64_t chunk;
    _Atomic int64_t next;     /* next chunk start (dynamic scheduling) */
} mm_job;

static void mm_rows(mm_job *j, int64_t r0, int64_t r1) {
    int64_t base = 0;
    for (int i = 0; i < j->n; i++) {
        const mtensor *w = j->it[i].w;
        int64_t a = r0 > base ? r0 - base : 0, b = r1 - base;
        if (b > w->rows) b = w->rows;
        if (a < b)
            aotx_matmul_rows(w->type, w->w, w->cols, j->m->act[model_act_class(w->type)], j->n_tok,
                             j->it[i].y, j->it[i].ldy, a, b);
        base += w->rows;
    }
}

static void mm_fn(void *ctx, int32_t ith, int32_t nth) {
    mm_job *j = ctx;
    (void)ith; (void)nth;
    for (;;) {
        int64_t r0 = atomic_fetch_add(&j->next, j->chunk);
        if (r0 >= j->total) break;
        int64_t r1 = r0 + j->chunk < j->total ? r0 + j->chunk : j->total;
        mm_rows(j, r0, r1);
    }
}

typedef struct prep_job {
    aotx_model *m;
    const float *x;
    int64_t ldx, n_tok, cols;
    int32_t type[MODEL_ACT_CLASSES];   /* a representative type per class, -1 = unused */
} prep_job;

static void prep_fn(void *ctx, int32_t ith, int32_t nth) {
    prep_job *p = ctx;
    int64_t t0 = p->n_tok * ith / nth, t1 = p->n_tok * (ith + 1) / nth;
    if (t0 >= t1) return;
    for (int c = 0; c < MODEL_ACT_CLASSES; c++) {
        if (p->type[c] < 0) continue;
        int64_t rb = aotx_act_bytes(p->type[c], p->cols, 1);
        aotx_act_prepare(p->type[c], p->x + t0 * p->ldx, p->ldx, t1 - t0, p->cols,
                         (uint8_t *)p->m->act[model_act_class(p->type[c])] + t0 * rb);
    }
}

/* y_i = W_i x for up to three matrices sharing the input x[n_tok][cols]. */
static void matmul(aotx_model *m, const float *x, int64_t ldx, int64_t n_tok, int n,
                   const mtensor *w0, float *y0, int64_t ld0, const mtensor *w1, float *y1,
                   int64_t ld1, const mtensor *w2, float *y2, int64_t ld2) {
    prep_job p = {m, x, ldx, n_tok, w0->cols, {-1, -1, -1}};
    const mtensor *ws[3] = {w0, w1, w2};
    for (int i = 0; i < n; i++) p.type[model_act_class(ws[i]->type)] = ws[i]->type;
    if (n_tok <= SMALL_T) prep_fn(&p, 0, 1);
    else aotx_pool_run(m->pool, prep_fn, &p);

    mm_job j = {.m = m, .n = n, .n_tok = n_tok};
    j.it[0] = (mm_item){w0, y0, ld0};
    j.it[1] = (mm_item){w1, y1, ld1};
    j.it[2] = (mm_item){w2, y2, ld2};
    for (int i = 0; i < n; i++) j.total += ws[i]->rows;
    int32_t nth = aotx_pool_size(m->pool);
    /* many small chunks taken dynamically: a slow (descheduled) thread delays
     * the section by at most one chunk */
    int64_t pieces = nth == 1 ? 1 : (int64_t)nth * 16;
    j.chunk = (j.total + pieces - 1) / pieces;
    j.chunk = (j.chunk + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
    if (nth > 1 && j.chunk < 2 * ROW_ALIGN) j.chunk = 2 * ROW_ALIGN;
    atomic_init(&j.next, 0);
    aotx_pool_run(m->pool, mm_fn, &j);
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

typedef struct ew_job {
    aotx_model *m;
    const mlayer *ly;
    int32_t T;
    int op;   /* 0 = norm x->xn with w; 1 = residual (+post norm) from o, then norm; 2 = GLU */
    const float *w;          /* op 0/1: the next norm weight */
    const float *post;       /* op 1: post norm weight or NULL */
} ew_job;

static void ew_token(ew_job *e, int32_t t) {
    aotx_model *m = e->m;
    int64_t d = m->info.d_model, ff = m->info.d_ff;
    float *x = m->x + t * d, *xn = m->xn + t * d;
    if (e->op == 2) {
        float *g = m->gate + t * ff, *u = m->up + t * ff;
        if (m->info.arch == AOTX_ARCH_GEMMA3) glu_gelu(g, u, ff);
        else glu_silu(g, u, ff);
        return;
    }
    if (e->op == 1) {
        float *o = m->o + t * d;
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
                cs[2 * i] = cosf(a);
                cs[2 * i + 1] = sinf(a);
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
        memcpy(aotx_kv_at(m->kv, m->tok_seq[t], r->layer, m->tok_pos[t], h, 0), kh,
               sizeof(float) * (size_t)hd);
        memcpy(aotx_kv_at(m->kv, m->tok_seq[t], r->layer, m->tok_pos[t], h, 1), v + h * vd,
               sizeof(float) * (size_t)vd);
    }
}

static void rope_fn(void *ctx, int32_t ith, int32_t nth) {
    rope_job *r = ctx;
    int32_t t0 = (int32_t)((int64_t)r->T * ith / nth), t1 = (int32_t)((int64_t)r->T * (ith + 1) / nth);
    for (int32_t t = t0; t < t1; t++) rope_token(r, t);
}

/* ---------- attention over pages ---------- */

typedef struct att_job {
    aotx_model *m;
    const mlayer *ly;
    int32_t layer, T;
    _Atomic int64_t next;
} att_job;

#define LANES 16
/* Pairwise sum of a LANES-wide accumulator (vector adds at every level). */
#define TREE_SUM(acc)                                                     \
    for (int w_ = LANES / 2; w_ > 0; w_ >>= 1)                            \
        for (int j_ = 0; j_ < w_; j_++) (acc)[j_] += (acc)[j_ + w_];

AOTX_CLONES static float vdot(const float *a, const float *b, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (; i < n; i++) s += a[i] * b[i];
    TREE_SUM(acc);
    return s + acc[0];
}

AOTX_CLONES static void vaxpy(float *y, float c, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += c * x[i];
}

/* out[j] = dot(q[j], k) for four queries at once (k loaded once). */
AOTX_CLONES static void vdot4(const float *const *q, const float *k, int64_t n, float *out) {
    float a0[LANES] = {0}, a1[LANES] = {0}, a2[LANES] = {0}, a3[LANES] = {0};
    const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) {
            float x = k[i + j];
            a0[j] += q0[i + j] * x;
            a1[j] += q1[i + j] * x;
            a2[j] += q2[i + j] * x;
            a3[j] += q3[i + j] * x;
        }
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (; i < n; i++) {
        s0 += q0[i] * k[i]; s1 += q1[i] * k[i]; s2 += q2[i] * k[i]; s3 += q3[i] * k[i];
    }
    TREE_SUM(a0);
    TREE_SUM(a1);
    TREE_SUM(a2);
    TREE_SUM(a3);
    out[0] = s0 + a0[0]; out[1] = s1 + a1[0]; out[2] = s2 + a2[0]; out[3] = s3 + a3[0];
}

/* out[i][0..vd) = sum_s w[i*stride + s] * rows[s][0..vd) for four outputs,
 * 16 columns at a time so the four accumulators stay in registers. */
AOTX_CLONES static void vacc4(float *const *out, const float *w, int64_t stride,
                              const float *const *rows, int32_t n_rows, int64_t vd) {
    int64_t d0 = 0;
    for (; d0 + LANES <= vd; d0 += LANES) {
        float a0[LANES] = {0}, a1[LANES] = {0}, a2[LANES] = {0}, a3[LANES] = {0};
        for (int32_t s = 0; s < n_rows; s++) {
            const float *v = rows[s] + d0;
            float w0 = w[s], w1 = w[stride + s], w2 = w[2 * stride + s], w3 = w[3 * stride + s];
            for (int j = 0; j < LANES; j++) {
                a0[j] += w0 * v[j]; a1[j] += w1 * v[j]; a2[j] += w2 * v[j]; a3[j] += w3 * v[j];
            }
        }
        for (int j = 0; j < LANES; j++) {
            out[0][d0 + j] = a0[j]; out[1][d0 + j] = a1[j];
            out[2][d0 + j] = a2[j]; out[3][d0 + j] = a3[j];
        }
    }
    for (; d0 < vd; d0++) {
        float a[4] = {0};
        for (int32_t s = 0; s < n_rows; s++)
            for (int i = 0; i < 4; i++) a[i] += w[i * stride + s] * rows[s][d0];
        for (int i = 0; i < 4; i++) out[i][d0] = a[i];
    }
}

/* sc[i] = exp(sc[i] - mx); returns the sum */
AOTX_CLONES static float vexp_sum(float *sc, int64_t n, float mx) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) {
            float e = aotx_exp_approx(sc[i + j] - mx);
            sc[i + j] = e;
            acc[j] += e;
        }
    float s = 0;
    for (; i < n; i++) { sc[i] = aotx_exp_approx(sc[i] - mx); s += sc[i]; }
    TREE_SUM(acc);
    return s + acc[0];
}

static void attend(att_job *a, int32_t t, int32_t h, float *sc) {
    aotx_model *m = a->m;
    const aotx_model_info *in = &m->info;
    int64_t hd = in->head_dim, vd = in->v_dim;
    int32_t kvh = h / (in->n_heads / in->n_kv_heads);
    int32_t p = m->tok_pos[t];
    int32_t lo = a->ly->sliding ? p - in->window + 1 : 0;
    if (lo < 0) lo = 0;
    aotx_kv_view w;
    aotx_kv_view_get(m->kv, m->tok_seq[t], a->layer, &w);
    const float *q = m->q + ((int64_t)t * in->n_heads + h) * hd;
    float mx = -INFINITY;
    for (int32_t s = lo; s <= p; s++) {
        const float *page = w.base + (int64_t)w.table[s / w.page_tokens] * w.page_floats;
        const float *k = page + w.k_off + (s % w.page_tokens) * w.k_tok + kvh * hd;
        float v = vdot(q, k, hd) * in->attn_scale;
        sc[s - lo] = v;
        if (v > mx) mx = v;
    }
    float inv = 1.0f / vexp_sum(sc, p - lo + 1, mx);
    float *out = m->att + ((int64_t)t * in->n_heads + h) * vd;
    memset(out, 0, sizeof(float) * (size_t)vd);
    for (int32_t s = lo; s <= p; s++) {
        const float *page = w.base + (int64_t)w.table[s / w.page_tokens] * w.page_floats;
        const float *v = page + w.v_off + (s % w.page_tokens) * w.v_tok + kvh * vd;
        vaxpy(out, sc[s - lo] * inv, v, vd);
    }
}

/* Up to ATT_BLOCK consecutive tokens of one sequence (positions p0..p0+nb-1)
 * against one head: every key is loaded once for all of them.  Missing block
 * members repeat the last query; out-of-range scores get weight 0. */
#define ATT_BLOCK 4
static void attend_block(att_job *a, int32_t t0, int32_t nb, int32_t h, float *sc,
                         const float **vr) {
    aotx_model *m = a->m;
    const aotx_model_info *in = &m->info;
    int64_t hd = in->head_dim, vd = in->v_dim;
    int32_t kvh = h / (in->n_heads / in->n_kv_heads);
    int32_t p0 = m->tok_pos[t0], plast = p0 + nb - 1, lo[ATT_BLOCK], hi[ATT_BLOCK];
    int64_t stride = in->max_tokens + ATT_BLOCK;
    const float *q[ATT_BLOCK];
    float *out[ATT_BLOCK], mx[ATT_BLOCK], d[ATT_BLOCK];
    for (int i = 0; i < ATT_BLOCK; i++) {
        int j = i < nb ? i : nb - 1;
        q[i] = m->q + ((int64_t)(t0 + j) * in->n_heads + h) * hd;
        hi[i] = p0 + j;
        lo[i] = a->ly->sliding ? hi[i] - in->window + 1 : 0;
        if (lo[i] < 0) lo[i] = 0;
        mx[i] = -INFINITY;
    }
    int32_t base = lo[0];
    aotx_kv_view w;
    aotx_kv_view_get(m->kv, m->tok_seq[t0], a->layer, &w);
    for (int32_t s = base; s <= plast; s++) {
        const float *page = w.base + (int64_t)w.table[s / w.page_tokens] * w.page_floats;
        vdot4(q, page + w.k_off + (s % w.page_tokens) * w.k_tok + kvh * hd, hd, d);
        for (int i = 0; i < ATT_BLOCK; i++) {
            float v = d[i] * in->attn_scale;
            sc[i * stride + (s - base)] = v;
            if (s >= lo[i] && s <= hi[i] && v > mx[i]) mx[i] = v;
        }
    }
    for (int i = 0; i < ATT_BLOCK; i++) {
        float *r = sc + i * stride;
        int32_t a0 = lo[i] - base, a1 = hi[i] - base;
        float inv = 1.0f / vexp_sum(r + a0, a1 - a0 + 1, mx[i]);
        for (int32_t k = 0; k < a0; k++) r[k] = 0.0f;
        for (int32_t k = a0; k <= a1; k++) r[k] *= inv;
        for (int32_t k = a1 + 1; k <= plast - base; k++) r[k] = 0.0f;
    }
    float dummy[ATT_BLOCK - 1][512];
    for (int i = 0; i < ATT_BLOCK; i++)
        out[i] = i < nb ? m->att + ((int64_t)(t0 + i) * in->n_heads + h) * vd
                        : dummy[i - 1];   /* vd <= 512 checked by the caller */
    for (int32_t s = base; s <= plast; s++) {
        const float *page = w.base + (int64_t)w.table[s / w.page_tokens] * w.page_floats;
        vr[s - base] = page + w.v_off + (s % w.page_tokens) * w.v_tok + kvh * vd;
    }
    vacc4(out, sc, stride, vr, plast - base + 1, vd);
}

static void att_fn(void *ctx, int32_t ith, int32_t nth) {
    att_job *a = ctx;
    aotx_model *m = a->m;
    float *sc = m->scores + (int64_t)ith * ATT_BLOCK * (m->info.max_tokens + ATT_BLOCK);
    const float **vr = m->vrows + (int64_t)ith * (m->info.max_tokens + ATT_BLOCK);
    int64_t n = (int64_t)m->n_blocks * m->info.n_heads;
    (void)nth;
    for (;;) {
        int64_t i = atomic_fetch_add(&a->next, 1);
        if (i >= n) break;
        int32_t b = (int32_t)(i / m->info.n_heads), h = (int32_t)(i % m->info.n_heads);
        int32_t t0 = m->blk_start[b], nb = m->blk_start[b + 1] - t0;
        if (nb == 1 || m->info.v_dim > 512) {
            for (int32_t t = t0; t < t0 + nb; t++) attend(a, t, h, sc);
        } else {
            attend_block(a, t0, nb, h, sc, vr);
        }
    }
}

/* Blocks of up to ATT_BLOCK consecutive tokens of the same sequence. */
static void make_blocks(aotx_model *m, int32_t T) {
    int32_t nb = 0;
    for (int32_t t = 0; t < T; t++) {
        if (nb == 0 || t - m->blk_start[nb - 1] >= ATT_BLOCK || m->tok_seq[t] != m->tok_seq[t - 1])
            m->blk_start[nb++] = t;
    }
    m->blk_start[nb] = T;
    m->n_blocks = nb;
}

/* ---------- the layers ---------- */

static void layer_forward(aotx_model *m, int32_t l, int32_t T) {
    const aotx_model_info *in = &m->info;
    const mlayer *ly = &m->layers[l];
    int64_t d = in->d_model, hd = in->head_dim;
    /* xn = attn_norm(x) was computed by the previous step of the loop */
    matmul(m, m->xn, d, T, 3, &ly->q, m->q, in->n_heads * hd, &ly->k, m->k, in->n_kv_heads * hd,
           &ly->v, m->v, in->n_kv_heads * in->v_dim);
    rope_job r = {m, ly, l, T};
    if (T <= SMALL_T) rope_fn(&r, 0, 1);
    else aotx_pool_run(m->pool, rope_fn, &r);
    att_job a = {.m = m, .ly = ly, .layer = l, .T = T};
    atomic_init(&a.next, 0);
    aotx_pool_run(m->pool, att_fn, &a);
    int64_t od = (int64_t)in->n_heads * in->v_dim;
    matmul(m, m->att, od, T, 1, &ly->o, m->o, d, NULL, NULL, 0, NULL, NULL, 0);
    ew_job e = {m, ly, T, 1, ly->ffn_norm, ly->post_attn_norm};
    elementwise(m, &e);
    matmul(m, m->xn, d, T, 2, &ly->gate, m->gate, in->d_ff, &ly->up, m->up, in->d_ff, NULL, NULL,
           0);
    e = (ew_job){m, ly, T, 2, NULL, NULL};
    elementwise(m, &e);
    matmul(m, m->gate, in->d_ff, T, 1, &ly->down, m->o, d, NULL, NULL, 0, NULL, NULL, 0);
    const float *next = l + 1 < in->n_layers ? m->layers[l + 1].attn_norm : NULL;
    e = (ew_job){m, ly, T, 1, next, ly->post_ffn_norm};
    elementwise(m, &e);
}

void model_forward(aotx_model *m, int32_t T, int32_t n_logits, float *logits) {
    const aotx_model_info *in = &m->info;
    int64_t d = in->d_model;
    rope_tables(m, T);
    make_blocks(m, T);
    ew_job e = {m, NULL, T, 0, m->layers[0].attn_norm, NULL};
    elementwise(m, &e);
    for (int32_t l = 0; l < in->n_layers; l++) layer_forward(m, l, T);
    if (n_logits <= 0) return;
    for (int32_t r = 0; r < n_logits; r++)
        rmsnorm(m->xn + r * d, m->x + (int64_t)m->logit_tok[r] * d, m->out_norm, d, in->eps);
    matmul(m, m->xn, d, n_logits, 1, &m->output, logits, in->n_vocab, NULL, NULL, 0, NULL, NULL, 0);
}
