/* backend_cpu.c -- the CPU compute backend (aotx.h, "engine" section): the
 * reference every other backend is measured against.
 *
 *   matmul     activations prepared once per input class (aotx_act_prepare), then
 *              the rows of up to three weights split over the thread pool in
 *              dynamic 16-row-multiple chunks (aotx_matmul_rows);
 *   attention  items = (block of up to 4 consecutive tokens of a sequence) x head,
 *              taken dynamically; keys and values read in place from the pages;
 *   weights    at init, re-blocked copies of the weights whose kernels use one
 *              (aotx_pack; AOTX_HEAD_PACK / AOTX_BODY_PACK, read here only);
 *   KV storage one 64-byte-aligned host array of n_pages pages (touched lazily),
 *              float32 or, when the pool says elem_bytes 2 (kv_f16), binary16 rows
 *              (kv_f16.c converts on write and widens on read; sums stay float).
 */
#include "aotx.h"
#include "aotx_kernels.h"
#include "aotx_kv.h"
#include "aotx_pool.h"
#include "aotx_sgemm.h"
#include "kv_f16_internal.h"
#include "vecmath_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ACT_CLASSES 3   /* F32-like, Q8_K (k-quants), Q8_0 (legacy quants) */
#define ROW_ALIGN 16
#define SMALL_T 4       /* up to this many tokens, preparation stays on the caller */
#define ATT_BLOCK 4     /* queries of one sequence sharing each key load */
#define ATT_MAX_VD 512  /* blocked attention keeps V rows of up to this many floats */
#define ATT_PF 8        /* K / V rows ahead to prefetch (rows of one page are contiguous, pages
                         * are not: the hardware's stream prefetch stops at each page) */

struct aotx_backend {
    aotx_backend_params p;
    int32_t n_threads;
    void *act[ACT_CLASSES];          /* prepared activations, act_bytes[c] each */
    int64_t act_bytes[ACT_CLASSES];
    float *scores;                   /* [n_threads][ATT_BLOCK][max_ctx + ATT_BLOCK] */
    const float **vrows;             /* [n_threads][max_ctx + ATT_BLOCK] V row pointers */
    int32_t *blk_start;              /* [max_batch_tokens + 1] first token of each block */
    void *pack_arena;                /* the weights' re-blocked copies, or NULL */
    float *dense;                    /* [n_threads][dense_stride] dense_attention's K_h, V_h^T,
                                        scores; NULL without params.dense_head_dim */
    int64_t dense_stride;            /* 2 * max_ctx * dense_head_dim + max_ctx^2 */
};

struct aotx_kv_store {
    char *data;                      /* [n_pages][page_bytes] */
    int64_t page_bytes;
    int32_t n_pages;
};

static int act_class(int32_t type) {
    switch (type) {
    case AOTX_T_Q2_K: case AOTX_T_Q3_K: case AOTX_T_Q4_K: case AOTX_T_Q5_K: case AOTX_T_Q6_K:
    case AOTX_T_IQ4_XS:
        return 1;
    case AOTX_T_Q4_0: case AOTX_T_Q4_1: case AOTX_T_Q5_0: case AOTX_T_Q5_1: case AOTX_T_Q8_0:
    case AOTX_T_IQ4_NL:
        return 2;
    default: return 0;
    }
}

static void *alloc64(int64_t bytes) {
    return aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
}

static void cpu_free(aotx_backend *be) {
    if (!be) return;
    for (int c = 0; c < ACT_CLASSES; c++) free(be->act[c]);
    free(be->scores);
    free((void *)be->vrows);
    free(be->blk_start);
    free(be->pack_arena);
    free(be->dense);
    free(be);
}

/* ---------- prepared weights ----------
 *
 * Re-blocked copies of the weights whose kernels picked at init use one (the AVX2 tiles:
 * aotx_packed_bytes for Q8_0, Q5_0, Q4_0, Q4_K and Q6_K; each group of 8 rows one
 * sequential stream, no transposes or scale gathers per call, the same bits): the head
 * (AOTX_HEAD_PACK=0 keeps it on the mapping) and the layers' projections
 * (AOTX_BODY_PACK=0), all in one arena of transparent huge pages.  A copy replaces the
 * mapping's pages of its tensor in the resident set (the whole pages inside the tensor
 * are dropped from it once read; only the token embedding's rows read later come back),
 * so RSS does not grow by the copies.  No arena (out of memory) runs the mapping as
 * before.  Caveat: if packing fails half way (it cannot with valid shapes), some of the
 * mapping's pages are already dropped, which only costs page faults. */
#define PACK_SLICE 8192   /* rows (a multiple of 8) packed between two drops of source pages */
#define PACK_ALIGN 4096

/* The CPU backend's configuration, read at every init (the one place these switches are
 * read): AOTX_HEAD_PACK=0 / AOTX_BODY_PACK=0 keep the head / the body on the mapping. */
typedef struct cpu_config {
    int pack_head, pack_body;
} cpu_config;

static int env_off(const char *var) {
    const char *e = getenv(var);
    return e && strcmp(e, "0") == 0;
}

static cpu_config cpu_config_read(void) {
    return (cpu_config){.pack_head = !env_off("AOTX_HEAD_PACK"),
                        .pack_body = !env_off("AOTX_BODY_PACK")};
}

static size_t pack_size(const aotx_weight *o) {
    int64_t n = aotx_packed_bytes(o->type, o->rows, o->cols);
    return n > 0 ? ((size_t)n + PACK_ALIGN - 1) / PACK_ALIGN * PACK_ALIGN : 0;
}

static void pack_one(aotx_weight *o, uint8_t *p) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)o->w;
    const uintptr_t rb = (uintptr_t)aotx_type_row_bytes(o->type, o->cols);
    uintptr_t done = (a + pg - 1) / pg * pg;
    for (int64_t r0 = 0; r0 < o->rows; r0 += PACK_SLICE) {
        int64_t r1 = o->rows - r0 < PACK_SLICE ? o->rows : r0 + PACK_SLICE;
        if (aotx_pack(o->type, o->w, o->rows, o->cols, r0, r1, p)) return;
        uintptr_t hi = (a + (uintptr_t)r1 * rb) / pg * pg;
        if (hi > done) {
            (void)madvise((void *)done, hi - done, MADV_DONTNEED);
            done = hi;
        }
    }
    o->packed = p;
}

/* One walk over the weights that get copies: their bytes in the arena; with an arena,
 * each one packed at its offset. */
static size_t pack_walk(const aotx_backend_params *p, cpu_config c, uint8_t *arena) {
    size_t at = 0, n;
    if (c.pack_head && p->head && (n = pack_size(p->head))) {
        if (arena) pack_one(p->head, arena + at);
        at += n;
    }
    for (int32_t i = 0; c.pack_body && i < p->n_body; i++)
        if ((n = pack_size(p->body[i]))) {
            if (arena) pack_one(p->body[i], arena + at);
            at += n;
        }
    return at;
}

static void pack_weights(aotx_backend *be, const aotx_backend_params *p) {
    const cpu_config c = cpu_config_read();
    size_t total = pack_walk(p, c, NULL);
    if (!total) return;
    const size_t huge = (size_t)2 << 20;  /* 2 MiB aligned: transparent huge pages */
    total = (total + huge - 1) / huge * huge;
    uint8_t *arena = aligned_alloc(huge, total);
    if (!arena) return;
    (void)madvise(arena, total, MADV_HUGEPAGE);
    be->pack_arena = arena;
    pack_walk(p, c, arena);
}

static int cpu_init(const aotx_backend_params *p, aotx_backend **out) {
    *out = NULL;
    if (!p || !p->pool || p->max_batch_tokens <= 0 || p->max_ctx <= 0)
        return AOTX_E_INVALID_ARGUMENT;
    aotx_backend *be = calloc(1, sizeof *be);
    if (!be) return AOTX_E_NOMEM;
    be->p = *p;
    be->n_threads = aotx_pool_size(p->pool);
    int64_t span = (int64_t)p->max_ctx + ATT_BLOCK;
    be->scores = alloc64((int64_t)be->n_threads * ATT_BLOCK * span * 4);
    be->vrows = malloc(sizeof(float *) * (size_t)be->n_threads * (size_t)span);
    be->blk_start = malloc(sizeof(int32_t) * (size_t)(p->max_batch_tokens + 1));
    if (p->dense_head_dim > 0) {
        be->dense_stride = 2 * (int64_t)p->max_ctx * p->dense_head_dim
                           + (int64_t)p->max_ctx * p->max_ctx;
        be->dense = alloc64((int64_t)be->n_threads * be->dense_stride * 4);
    }
    if (!be->scores || !be->vrows || !be->blk_start || (p->dense_head_dim > 0 && !be->dense)) {
        cpu_free(be);
        return AOTX_E_NOMEM;
    }
    pack_weights(be, p);
    *out = be;
    return 0;
}

static int cpu_reserve(aotx_backend *be, int32_t type, int64_t cols, int64_t n_tok) {
    int64_t b = aotx_act_bytes(type, cols, n_tok);
    if (b < 0) return (int)b;
    int c = act_class(type);
    if (b <= be->act_bytes[c]) return 0;
    void *a = alloc64(b);
    if (!a) return AOTX_E_NOMEM;
    free(be->act[c]);
    be->act[c] = a;
    be->act_bytes[c] = b;
    return 0;
}

/* ---------- KV storage ---------- */

static int cpu_kv_alloc(aotx_backend *be, int32_t n_pages, int64_t page_bytes, aotx_kv_store **out) {
    (void)be;
    *out = NULL;
    if (n_pages <= 0 || page_bytes <= 0 || page_bytes % 2) return AOTX_E_INVALID_ARGUMENT;
    int64_t total;
    if (__builtin_mul_overflow((int64_t)n_pages, page_bytes, &total) || total > INT64_MAX - 64)
        return AOTX_E_NOMEM;
    aotx_kv_store *st = calloc(1, sizeof *st);
    if (!st) return AOTX_E_NOMEM;
    st->data = alloc64(total);
    if (!st->data) { free(st); return AOTX_E_NOMEM; }
    st->page_bytes = page_bytes;
    st->n_pages = n_pages;
    *out = st;
    return 0;
}

static void cpu_kv_free(aotx_backend *be, aotx_kv_store *st) {
    (void)be;
    if (!st) return;
    free(st->data);
    free(st);
}

static float *cpu_kv_page_ptr(aotx_kv_store *st, int32_t page) {
    if (!st || page < 0 || page >= st->n_pages) return NULL;
    return (float *)(st->data + (int64_t)page * st->page_bytes);
}

static void cpu_kv_write(aotx_backend *be, const aotx_kv_pool *kv, aotx_kv_store *st,
                         const aotx_kv_rows *r) {
    (void)be;
    aotx_kv_view w;
    for (int32_t t = 0; t < r->T; t++) {
        if (aotx_kv_view_get(kv, r->seq[t], r->layer, &w)) continue;   /* validated by the step */
        int32_t p = r->pos[t];
        char *page = st->data + (int64_t)w.table[p / w.page_tokens] * st->page_bytes;
        int64_t tok = p % w.page_tokens;
        /* a position's heads are contiguous: k_tok = n_kv_heads * k_dim */
        if (w.elem_bytes == 2) {
            const aotx_kvh_ops *h = aotx_kvh();
            h->store((uint16_t *)page + w.k_off + tok * w.k_tok, r->k + t * r->ldk, w.k_tok);
            h->store((uint16_t *)page + w.v_off + tok * w.v_tok, r->v + t * r->ldv, w.v_tok);
            continue;
        }
        memcpy((float *)page + w.k_off + tok * w.k_tok, r->k + t * r->ldk,
               sizeof(float) * (size_t)w.k_tok);
        memcpy((float *)page + w.v_off + tok * w.v_tok, r->v + t * r->ldv,
               sizeof(float) * (size_t)w.v_tok);
    }
}

/* ---------- matmul ---------- */

typedef struct mm_job {
    aotx_backend *be;
    const aotx_mm_out *out;
    int n;
    int64_t n_tok;
    int64_t total;            /* rows of all outputs */
    int64_t chunk;
    _Atomic int64_t next;     /* next chunk start (dynamic scheduling) */
} mm_job;

static void mm_rows(mm_job *j, int64_t r0, int64_t r1) {
    int64_t base = 0;
    for (int i = 0; i < j->n; i++) {
        const aotx_weight *w = j->out[i].w;
        int64_t a = r0 > base ? r0 - base : 0, b = r1 - base;
        if (b > w->rows) b = w->rows;
        const void *act = j->be->act[act_class(w->type)];
        /* the re-blocked copy while the kernels it serves are picked (the same bits) */
        if (a < b && (!w->packed || aotx_matmul_packed(w->type, w->packed, w->cols, act, j->n_tok,
                                                       j->out[i].y, j->out[i].ldy, a, b)))
            aotx_matmul_rows(w->type, w->w, w->cols, act, j->n_tok, j->out[i].y, j->out[i].ldy,
                             a, b);
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
    aotx_backend *be;
    const float *x;
    int64_t ldx, n_tok, cols;
    int32_t type[ACT_CLASSES];   /* a representative type per class, -1 = unused */
} prep_job;

static void prep_fn(void *ctx, int32_t ith, int32_t nth) {
    prep_job *p = ctx;
    int64_t t0 = p->n_tok * ith / nth, t1 = p->n_tok * (ith + 1) / nth;
    if (t0 >= t1) return;
    for (int c = 0; c < ACT_CLASSES; c++) {
        if (p->type[c] < 0) continue;
        int64_t rb = aotx_act_bytes(p->type[c], p->cols, 1);
        aotx_act_prepare(p->type[c], p->x + t0 * p->ldx, p->ldx, t1 - t0, p->cols,
                         (uint8_t *)p->be->act[c] + t0 * rb);
    }
}

static void cpu_matmul(aotx_backend *be, const float *x, int64_t ldx, int64_t n_tok, int n,
                       const aotx_mm_out *out) {
    prep_job p = {be, x, ldx, n_tok, out[0].w->cols, {-1, -1, -1}};
    for (int i = 0; i < n; i++) p.type[act_class(out[i].w->type)] = out[i].w->type;
    if (n_tok <= SMALL_T) prep_fn(&p, 0, 1);
    else aotx_pool_run(be->p.pool, prep_fn, &p);

    mm_job j = {.be = be, .out = out, .n = n, .n_tok = n_tok};
    for (int i = 0; i < n; i++) j.total += out[i].w->rows;
    int32_t nth = be->n_threads;
    /* many small chunks taken dynamically: a slow (descheduled) thread delays
     * the section by at most one chunk */
    int64_t pieces = nth == 1 ? 1 : (int64_t)nth * 16;
    j.chunk = (j.total + pieces - 1) / pieces;
    j.chunk = (j.chunk + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
    if (nth > 1 && j.chunk < 2 * ROW_ALIGN) j.chunk = 2 * ROW_ALIGN;
    atomic_init(&j.next, 0);
    aotx_pool_run(be->p.pool, mm_fn, &j);
}

/* ---------- attention over pages ---------- */

typedef struct att_job {
    aotx_backend *be;
    const aotx_kv_pool *kv;
    const aotx_kv_store *st;
    const aotx_attn_batch *b;
    const aotx_kvh_ops *h;           /* binary16 pages: its helpers; NULL: float32 */
    int32_t n_blocks;
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

/* out[i][0..vd) = sum_s w[i*stride + s] * rows[s][0..vd) for four outputs.  Rows taken
 * four at a time, each read whole while it is in cache (the outputs, 4 x vd floats, stay
 * in L1): per element the additions are vaxpy's, in the order of s, so the same bits;
 * passes of 16 columns over all rows (the former order) took one cache line of each row
 * per pass, a miss each time once the rows passed L1. */
AOTX_CLONES static void vacc4(float *const *out, const float *w, int64_t stride,
                              const float *const *rows, int32_t n_rows, int64_t vd) {
    for (int i = 0; i < 4; i++) memset(out[i], 0, sizeof(float) * (size_t)vd);
    int32_t s = 0;
    for (; s + 4 <= n_rows; s += 4) {
        const float *v0 = rows[s], *v1 = rows[s + 1], *v2 = rows[s + 2], *v3 = rows[s + 3];
        for (int32_t r = s + ATT_PF; r < s + ATT_PF + 4 && r < n_rows; r++)
            for (int64_t o = 0; o < vd; o += 16) __builtin_prefetch(rows[r] + o);
        for (int i = 0; i < 4; i++) {
            float *y = out[i];
            const float c0 = w[i * stride + s], c1 = w[i * stride + s + 1];
            const float c2 = w[i * stride + s + 2], c3 = w[i * stride + s + 3];
            for (int64_t d = 0; d < vd; d++) {
                float t = y[d];
                t += c0 * v0[d];
                t += c1 * v1[d];
                t += c2 * v2[d];
                t += c3 * v3[d];
                y[d] = t;
            }
        }
    }
    for (; s < n_rows; s++)
        for (int i = 0; i < 4; i++) {
            float *y = out[i];
            const float c = w[i * stride + s], *v = rows[s];
            for (int64_t d = 0; d < vd; d++) y[d] += c * v[d];
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

/* Address of position s's K (v = 0) or V row of head kvh (elements of w->elem_bytes). */
static const void *row_of(const aotx_kv_store *st, const aotx_kv_view *w, int32_t s, int v,
                          int64_t kvh, int64_t dim) {
    const char *page = st->data + (int64_t)w->table[s / w->page_tokens] * st->page_bytes;
    int64_t el = (v ? w->v_off + (s % w->page_tokens) * w->v_tok
                    : w->k_off + (s % w->page_tokens) * w->k_tok) + kvh * dim;
    return page + el * w->elem_bytes;
}

static inline void prefetch_row(const void *p, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o);
}

static void dot4_any(const att_job *a, const float *const *q, const void *k, int64_t n,
                     float *out) {
    if (a->h) a->h->dot4(q, k, n, out);
    else vdot4(q, k, n, out);
}

static void acc4_any(const att_job *a, float *const *out, const float *w, int64_t stride,
                     const float **rows, int32_t n_rows, int64_t vd) {
    if (a->h) a->h->acc4(out, w, stride, (const uint16_t *const *)(const void *)rows, n_rows, vd);
    else vacc4(out, w, stride, rows, n_rows, vd);
}

/* A query-key score: scaled, then soft-capped when the model asks (the same float
 * operations on every path, so attend / attend_block / attend_heads agree bitwise). */
static inline float score(const aotx_attn_batch *b, float dot) {
    float v = dot * b->scale;
    return b->softcap > 0 ? b->softcap * tanhf(v / b->softcap) : v;
}

static void attend(att_job *a, int32_t t, int32_t h, float *sc) {
    const aotx_attn_batch *b = a->b;
    int64_t hd = b->head_dim, vd = b->v_dim;
    int32_t kvh = h / (b->n_heads / b->n_kv_heads);
    int32_t p = b->pos[t];
    int32_t lo = b->window > 0 ? p - b->window + 1 : 0;
    if (lo < 0) lo = 0;
    aotx_kv_view w;
    aotx_kv_view_get(a->kv, b->seq[t], b->layer, &w);
    const float *q = b->q + ((int64_t)t * b->n_heads + h) * hd;
    float mx = -INFINITY;
    for (int32_t s = lo; s <= p; s++) {
        const void *k = row_of(a->st, &w, s, 0, kvh, hd);
        float v = score(b, a->h ? a->h->dot(q, k, hd) : vdot(q, k, hd));
        sc[s - lo] = v;
        if (v > mx) mx = v;
    }
    float inv = 1.0f / vexp_sum(sc, p - lo + 1, mx);
    float *out = b->out + ((int64_t)t * b->n_heads + h) * vd;
    memset(out, 0, sizeof(float) * (size_t)vd);
    for (int32_t s = lo; s <= p; s++) {
        const void *v = row_of(a->st, &w, s, 1, kvh, vd);
        if (a->h) a->h->axpy(out, sc[s - lo] * inv, v, vd);
        else vaxpy(out, sc[s - lo] * inv, v, vd);
    }
}

/* Up to ATT_BLOCK consecutive tokens of one sequence (positions p0..p0+nb-1)
 * against one head: every key is loaded once for all of them.  Missing block
 * members repeat the last query; out-of-range scores get weight 0. */
static void attend_block(att_job *a, int32_t t0, int32_t nb, int32_t h, float *sc,
                         const float **vr) {
    const aotx_attn_batch *b = a->b;
    int64_t hd = b->head_dim, vd = b->v_dim;
    int32_t kvh = h / (b->n_heads / b->n_kv_heads);
    int32_t p0 = b->pos[t0], plast = p0 + nb - 1, lo[ATT_BLOCK], hi[ATT_BLOCK];
    int64_t stride = (int64_t)a->be->p.max_ctx + ATT_BLOCK;
    const float *q[ATT_BLOCK];
    float *out[ATT_BLOCK], mx[ATT_BLOCK], d[ATT_BLOCK];
    for (int i = 0; i < ATT_BLOCK; i++) {
        int j = i < nb ? i : nb - 1;
        q[i] = b->q + ((int64_t)(t0 + j) * b->n_heads + h) * hd;
        hi[i] = p0 + j;
        lo[i] = b->window > 0 ? hi[i] - b->window + 1 : 0;
        if (lo[i] < 0) lo[i] = 0;
        mx[i] = -INFINITY;
    }
    int32_t base = lo[0];
    aotx_kv_view w;
    aotx_kv_view_get(a->kv, b->seq[t0], b->layer, &w);
    for (int32_t s = base; s <= plast; s++) {
        if (s + ATT_PF <= plast)
            prefetch_row(row_of(a->st, &w, s + ATT_PF, 0, kvh, hd), hd * w.elem_bytes);
        dot4_any(a, q, row_of(a->st, &w, s, 0, kvh, hd), hd, d);
        for (int i = 0; i < ATT_BLOCK; i++) {
            float v = score(b, d[i]);
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
    float dummy[ATT_BLOCK - 1][ATT_MAX_VD];
    for (int i = 0; i < ATT_BLOCK; i++)
        out[i] = i < nb ? b->out + ((int64_t)(t0 + i) * b->n_heads + h) * vd
                        : dummy[i - 1];   /* vd <= ATT_MAX_VD checked by the caller */
    for (int32_t s = base; s <= plast; s++) vr[s - base] = row_of(a->st, &w, s, 1, kvh, vd);
    acc4_any(a, out, sc, stride, vr, plast - base + 1, vd);
}

/* One token (decode) against the ATT_BLOCK query heads h0.. that share one KV head
 * (GQA): every key and value row is read once for all of them, not once per head.
 * Per head the arithmetic is attend()'s (vdot4 / vacc4 sum each query like vdot /
 * vaxpy), so the results are the same bits whichever path a token takes. */
static void attend_heads(att_job *a, int32_t t, int32_t h0, float *sc, const float **vr) {
    const aotx_attn_batch *b = a->b;
    int64_t hd = b->head_dim, vd = b->v_dim;
    int32_t kvh = h0 / (b->n_heads / b->n_kv_heads);
    int32_t p = b->pos[t];
    int32_t lo = b->window > 0 ? p - b->window + 1 : 0;
    if (lo < 0) lo = 0;
    int64_t stride = (int64_t)a->be->p.max_ctx + ATT_BLOCK;
    const float *q[ATT_BLOCK];
    float *out[ATT_BLOCK], mx[ATT_BLOCK], d[ATT_BLOCK];
    for (int i = 0; i < ATT_BLOCK; i++) {
        q[i] = b->q + ((int64_t)t * b->n_heads + h0 + i) * hd;
        out[i] = b->out + ((int64_t)t * b->n_heads + h0 + i) * vd;
        mx[i] = -INFINITY;
    }
    aotx_kv_view w;
    aotx_kv_view_get(a->kv, b->seq[t], b->layer, &w);
    for (int32_t s = lo; s <= p; s++) {
        if (s + ATT_PF <= p) prefetch_row(row_of(a->st, &w, s + ATT_PF, 0, kvh, hd), hd * w.elem_bytes);
        dot4_any(a, q, row_of(a->st, &w, s, 0, kvh, hd), hd, d);
        for (int i = 0; i < ATT_BLOCK; i++) {
            float v = score(b, d[i]);
            sc[i * stride + (s - lo)] = v;
            if (v > mx[i]) mx[i] = v;
        }
    }
    for (int i = 0; i < ATT_BLOCK; i++) {
        float *r = sc + i * stride;
        float inv = 1.0f / vexp_sum(r, p - lo + 1, mx[i]);
        for (int32_t k = 0; k <= p - lo; k++) r[k] *= inv;
    }
    for (int32_t s = lo; s <= p; s++) vr[s - lo] = row_of(a->st, &w, s, 1, kvh, vd);
    acc4_any(a, out, sc, stride, vr, p - lo + 1, vd);
}

static void att_fn(void *ctx, int32_t ith, int32_t nth) {
    att_job *a = ctx;
    aotx_backend *be = a->be;
    const aotx_attn_batch *b = a->b;
    int64_t span = (int64_t)be->p.max_ctx + ATT_BLOCK;
    float *sc = be->scores + (int64_t)ith * ATT_BLOCK * span;
    const float **vr = be->vrows + (int64_t)ith * span;
    int64_t n = (int64_t)a->n_blocks * b->n_heads;
    (void)nth;
    for (;;) {
        int64_t i = atomic_fetch_add(&a->next, 1);
        if (i >= n) break;
        int32_t k = (int32_t)(i / b->n_heads), h = (int32_t)(i % b->n_heads);
        int32_t t0 = be->blk_start[k], nb = be->blk_start[k + 1] - t0;
        const int32_t group = b->n_heads / b->n_kv_heads;
        if (nb == 1 && group % ATT_BLOCK == 0) {
            /* a lone token: heads h .. h + ATT_BLOCK - 1 of one KV head in one pass (the
             * other heads' items of this group are left empty) */
            if (h % ATT_BLOCK == 0) attend_heads(a, t0, h, sc, vr);
        } else if (nb == 1 || b->v_dim > ATT_MAX_VD) {
            for (int32_t t = t0; t < t0 + nb; t++) attend(a, t, h, sc);
        } else {
            attend_block(a, t0, nb, h, sc, vr);
        }
    }
}

/* Blocks of up to ATT_BLOCK consecutive tokens of the same sequence. */
static int32_t make_blocks(aotx_backend *be, const aotx_attn_batch *b) {
    int32_t nb = 0;
    for (int32_t t = 0; t < b->T; t++) {
        if (nb == 0 || t - be->blk_start[nb - 1] >= ATT_BLOCK || b->seq[t] != b->seq[t - 1])
            be->blk_start[nb++] = t;
    }
    be->blk_start[nb] = b->T;
    return nb;
}

static void cpu_attention(aotx_backend *be, const aotx_kv_pool *kv, const aotx_kv_store *st,
                          const aotx_attn_batch *b) {
    att_job a = {.be = be, .kv = kv, .st = st, .b = b};
    aotx_kv_view w;
    if (b->T <= 0 || aotx_kv_view_get(kv, b->seq[0], b->layer, &w)) return;   /* validated */
    if (w.elem_bytes == 2) a.h = aotx_kvh();
    a.n_blocks = make_blocks(be, b);
    atomic_init(&a.next, 0);
    aotx_pool_run(be->p.pool, att_fn, &a);
}

/* ---- dense attention (encoders): one (sequence, head) pair per item, the pool's
 * workers taking items ith, ith + nth, ...; each item's products are sgemm rows on
 * the worker's copies of K_h and V_h^T. */

typedef struct dense_job {
    aotx_backend *be;
    const aotx_dense_attn *b;
} dense_job;

/* Each row of p[n][n] = softmax(scale * row), in place. */
static void dense_softmax(float *p, int32_t n, float scale) {
    for (int32_t t = 0; t < n; t++) {
        float *row = p + (int64_t)t * n;
        float m = row[0];
        for (int32_t r = 1; r < n; r++) m = row[r] > m ? row[r] : m;
        float sum = 0.0f;
        for (int32_t r = 0; r < n; r++) {
            row[r] = expf((row[r] - m) * scale);
            sum += row[r];
        }
        float inv = 1.0f / sum;
        for (int32_t r = 0; r < n; r++) row[r] *= inv;
    }
}

static void dense_item(const aotx_dense_attn *b, int32_t seq, int32_t head, float *kh,
                       float *vt, float *p) {
    const int32_t dh = b->head_dim, off = b->seq_off[seq], n = b->seq_off[seq + 1] - off;
    const int64_t col = (int64_t)head * dh, ld = b->ld;
    for (int32_t i = 0; i < n; i++) {          /* kh [n][dh], vt [dh][n] */
        const float *kr = b->k + (int64_t)(off + i) * ld + col;
        const float *vr = b->v + (int64_t)(off + i) * ld + col;
        memcpy(kh + (int64_t)i * dh, kr, (size_t)dh * sizeof(float));
        for (int32_t d = 0; d < dh; d++) vt[(int64_t)d * n + i] = vr[d];
    }
    /* p[t][r] = q_t . k_r */
    aotx_sgemm_rows(kh, dh, b->q + (int64_t)off * ld + col, ld, n, p, n, 0, n);
    dense_softmax(p, n, b->scale);
    /* out[t][d] = sum_r p[t][r] v_r[d] */
    aotx_sgemm_rows(vt, n, p, n, n, b->out + (int64_t)off * ld + col, ld, 0, dh);
}

static void dense_fn(void *ctx, int32_t ith, int32_t nth) {
    dense_job *j = ctx;
    const aotx_dense_attn *b = j->b;
    const int64_t mc = j->be->p.max_ctx, dh = b->head_dim;
    float *kh = j->be->dense + (int64_t)ith * j->be->dense_stride;
    float *vt = kh + mc * dh, *p = vt + mc * dh;
    const int64_t items = (int64_t)b->n_seq * b->n_heads;
    for (int64_t i = ith; i < items; i += nth)
        dense_item(b, (int32_t)(i / b->n_heads), (int32_t)(i % b->n_heads), kh, vt, p);
}

static void cpu_dense_attention(aotx_backend *be, const aotx_dense_attn *b) {
    dense_job j = {be, b};
    aotx_pool_run(be->p.pool, dense_fn, &j);
}

const aotx_backend_ops aotx_backend_cpu = {
    .name = "cpu",
    .init = cpu_init,
    .free = cpu_free,
    .reserve = cpu_reserve,
    .kv_alloc_pages = cpu_kv_alloc,
    .kv_free_pages = cpu_kv_free,
    .kv_page_ptr = cpu_kv_page_ptr,
    .matmul = cpu_matmul,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .dense_attention = cpu_dense_attention,
};
