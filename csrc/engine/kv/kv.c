/* kv.c -- KV page accounting (see aotx_kv.h for the page layout): page ids,
 * refcounts, reservations, page tables.  No K/V memory: that is the backend's
 * storage (aotx_backend_ops.kv_alloc_pages), addressed by the ids and offsets here. */
#include "aotx_kv.h"

#include <stdlib.h>
#include <string.h>

const aotx_code_entry aotx_kv_codes[] = {
    {AOTX_R_KV_PAGES_EXHAUSTED, "kv_pages_exhausted", "no free KV page is left; retry later"},
    {AOTX_R_KV_SEQS_EXHAUSTED, "kv_seqs_exhausted", "every KV sequence slot is in use"},
    {AOTX_R_KV_PREFIX_RELEASED, "kv_prefix_released",
     "the fork source no longer holds the sliding-window pages the prefix needs"},
    {AOTX_E_KV_SEQ, "kv_seq_not_found", "the KV sequence id is unknown or not in use"},
    {AOTX_E_KV_CONTEXT, "kv_context_invalid", "the sequence would exceed its maximum length"},
    {AOTX_E_KV_PARAMS, "kv_params_invalid", "KV pool parameters are malformed"},
    {0, NULL, NULL},
};

struct aotx_kv_pool {
    aotx_kv_params p;
    int32_t n_groups, lpg;          /* groups, layers per group */
    int32_t max_pp;                 /* page-table entries per sequence per group */
    int32_t *layer_group;           /* [n_layers] */
    int32_t *layer_slot;            /* [n_layers] index inside its group */
    uint8_t *group_sliding;         /* [n_groups] */
    int64_t k_tok, v_tok;           /* floats per position per layer */
    int64_t page_floats;            /* storage floats per page (the backend holds them) */
    int32_t *refcnt;                /* [n_pages] */
    int32_t *free_stack;            /* [n_pages] */
    int32_t n_free;
    int32_t reserved_total;
    uint8_t *in_use;                /* [max_seqs] */
    int32_t *len;                   /* [max_seqs] */
    int32_t *reserved;              /* [max_seqs] */
    int32_t *last_from_res;         /* [max_seqs] reservation used by the last grow */
    int32_t *dropped;               /* [max_seqs] leading sliding pages released */
    int32_t *tables;                /* [max_seqs][n_groups][max_pp] */
    uint8_t *mark;                  /* [n_pages] scratch for stats */
};

static int32_t gcd(int32_t a, int32_t b) {
    while (b) { int32_t t = a % b; a = b; b = t; }
    return a;
}

static int32_t *table(const aotx_kv_pool *kv, uint32_t seq, int32_t grp) {
    return kv->tables + ((int64_t)seq * kv->n_groups + grp) * kv->max_pp;
}

static int32_t pages_for(const aotx_kv_pool *kv, int64_t n) {
    return (int32_t)((n + kv->p.page_tokens - 1) / kv->p.page_tokens);
}

static int valid_params(const aotx_kv_params *p) {
    if (!(p->n_pages > 0 && p->page_tokens > 0 && p->max_seqs > 0 && p->max_tokens > 0 &&
          p->n_layers > 0 && p->n_kv_heads > 0 && p->k_dim > 0 && p->v_dim > 0 &&
          p->window >= 0 && p->n_pages < (1 << 30) && p->max_seqs < (1 << 20) &&
          (p->kv_f16 == 0 || p->kv_f16 == 1)))
        return 0;
    /* the storage geometry must fit int64 bytes: layers x tokens x heads x (k + v) x 4 */
    int64_t f = (int64_t)p->k_dim + p->v_dim;
    return !__builtin_mul_overflow(f, (int64_t)p->n_kv_heads, &f) &&
           !__builtin_mul_overflow(f, (int64_t)p->page_tokens, &f) &&
           !__builtin_mul_overflow(f, (int64_t)p->n_layers * 4, &f);
}

static void assign_groups(aotx_kv_pool *kv) {
    int32_t n_sl = 0, L = kv->p.n_layers;
    for (int32_t l = 0; l < L; l++) n_sl += kv->p.sliding && kv->p.sliding[l] ? 1 : 0;
    int32_t n_gl = L - n_sl;
    kv->lpg = (n_sl && n_gl) ? gcd(n_sl, n_gl) : L;
    kv->n_groups = L / kv->lpg;
    int32_t si = 0, gi = 0, sl_groups = n_sl / kv->lpg;
    for (int32_t l = 0; l < L; l++) {
        int s = kv->p.sliding && kv->p.sliding[l];
        int32_t idx = s ? si++ : gi++;
        kv->layer_group[l] = (s ? 0 : sl_groups) + idx / kv->lpg;
        kv->layer_slot[l] = idx % kv->lpg;
        kv->group_sliding[kv->layer_group[l]] = (uint8_t)(s && kv->p.window > 0);
    }
}

int aotx_kv_new(const aotx_kv_params *p, aotx_kv_pool **out) {
    if (!p || !out) return AOTX_E_INVALID_ARGUMENT;
    *out = NULL;
    if (!valid_params(p)) return AOTX_E_KV_PARAMS;
    aotx_kv_pool *kv = calloc(1, sizeof *kv);
    if (!kv) return AOTX_E_NOMEM;
    kv->p = *p;
    kv->p.sliding = NULL;
    int32_t L = p->n_layers, S = p->max_seqs;
    kv->layer_group = calloc((size_t)L, sizeof(int32_t));
    kv->layer_slot = calloc((size_t)L, sizeof(int32_t));
    kv->group_sliding = calloc((size_t)L, 1);
    if (!kv->layer_group || !kv->layer_slot || !kv->group_sliding) goto nomem;
    kv->p.sliding = p->sliding;
    assign_groups(kv);
    kv->p.sliding = NULL;   /* not kept: the caller owns it */
    kv->max_pp = pages_for(kv, p->max_tokens);
    kv->k_tok = (int64_t)p->n_kv_heads * p->k_dim;
    kv->v_tok = (int64_t)p->n_kv_heads * p->v_dim;
    kv->page_floats = (int64_t)kv->lpg * p->page_tokens * (kv->k_tok + kv->v_tok);
    kv->refcnt = calloc((size_t)p->n_pages, sizeof(int32_t));
    kv->free_stack = malloc((size_t)p->n_pages * sizeof(int32_t));
    kv->mark = calloc((size_t)p->n_pages, 1);
    kv->in_use = calloc((size_t)S, 1);
    kv->len = calloc((size_t)S, sizeof(int32_t));
    kv->reserved = calloc((size_t)S, sizeof(int32_t));
    kv->last_from_res = calloc((size_t)S, sizeof(int32_t));
    kv->dropped = calloc((size_t)S, sizeof(int32_t));
    kv->tables = malloc((size_t)S * (size_t)kv->n_groups * (size_t)kv->max_pp * sizeof(int32_t));
    if (!kv->refcnt || !kv->free_stack || !kv->mark || !kv->in_use || !kv->len ||
        !kv->reserved || !kv->last_from_res || !kv->dropped || !kv->tables)
        goto nomem;
    for (int32_t i = 0; i < p->n_pages; i++) kv->free_stack[i] = p->n_pages - 1 - i;
    kv->n_free = p->n_pages;
    *out = kv;
    return 0;
nomem:
    aotx_kv_free(kv);
    return AOTX_E_NOMEM;
}

void aotx_kv_free(aotx_kv_pool *kv) {
    if (!kv) return;
    free(kv->layer_group); free(kv->layer_slot); free(kv->group_sliding);
    free(kv->refcnt); free(kv->free_stack); free(kv->mark);
    free(kv->in_use); free(kv->len); free(kv->reserved); free(kv->last_from_res);
    free(kv->dropped); free(kv->tables);
    free(kv);
}

int32_t aotx_kv_page_tokens(const aotx_kv_pool *kv) { return kv->p.page_tokens; }

int32_t aotx_kv_pages_needed(const aotx_kv_pool *kv, int32_t length, int32_t n) {
    if (length < 0 || n < 0) return 0;
    return kv->n_groups * (pages_for(kv, (int64_t)length + n) - pages_for(kv, length));
}

static int seq_ok(const aotx_kv_pool *kv, uint32_t seq) {
    return seq < (uint32_t)kv->p.max_seqs && kv->in_use[seq];
}

static void page_unref(aotx_kv_pool *kv, int32_t pg) {
    if (pg < 0) return;
    if (--kv->refcnt[pg] == 0) kv->free_stack[kv->n_free++] = pg;
}

static int32_t page_take(aotx_kv_pool *kv) {
    int32_t pg = kv->free_stack[--kv->n_free];
    kv->refcnt[pg] = 1;
    return pg;
}

int aotx_kv_seq_new(aotx_kv_pool *kv, uint32_t *seq) {
    if (!kv || !seq) return AOTX_E_INVALID_ARGUMENT;
    for (int32_t s = 0; s < kv->p.max_seqs; s++) {
        if (kv->in_use[s]) continue;
        kv->in_use[s] = 1;
        kv->len[s] = kv->reserved[s] = kv->last_from_res[s] = kv->dropped[s] = 0;
        for (int32_t gi = 0; gi < kv->n_groups; gi++)
            memset(table(kv, (uint32_t)s, gi), 0xff, (size_t)kv->max_pp * sizeof(int32_t));
        *seq = (uint32_t)s;
        return 0;
    }
    return AOTX_R_KV_SEQS_EXHAUSTED;
}

int aotx_kv_seq_free(aotx_kv_pool *kv, uint32_t seq) {
    if (!kv || !seq_ok(kv, seq)) return AOTX_E_KV_SEQ;
    int32_t np = pages_for(kv, kv->len[seq]);
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        int32_t *t = table(kv, seq, gi);
        for (int32_t j = 0; j < np; j++) { page_unref(kv, t[j]); t[j] = -1; }
    }
    kv->reserved_total -= kv->reserved[seq];
    kv->reserved[seq] = 0;
    kv->in_use[seq] = 0;
    kv->len[seq] = 0;
    return 0;
}

int aotx_kv_seq_info_get(const aotx_kv_pool *kv, uint32_t seq, aotx_kv_seq_info *out) {
    if (!kv || !out || !seq_ok(kv, seq)) return AOTX_E_KV_SEQ;
    int32_t held = 0, rel = 0, np = pages_for(kv, kv->len[seq]);
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        const int32_t *t = table(kv, seq, gi);
        for (int32_t j = 0; j < np; j++) {
            if (t[j] >= 0) held++;
            else rel++;
        }
    }
    *out = (aotx_kv_seq_info){kv->len[seq], held, kv->reserved[seq], rel};
    return 0;
}

int aotx_kv_seq_reserve(aotx_kv_pool *kv, uint32_t seq, int32_t n) {
    if (!kv || !seq_ok(kv, seq)) return AOTX_E_KV_SEQ;
    if (n < 0 || (int64_t)kv->len[seq] + n > kv->p.max_tokens) return AOTX_E_KV_CONTEXT;
    int32_t target = aotx_kv_pages_needed(kv, kv->len[seq], n);
    if (target <= kv->reserved[seq]) return 0;
    int32_t extra = target - kv->reserved[seq];
    if (kv->n_free - kv->reserved_total < extra) return AOTX_R_KV_PAGES_EXHAUSTED;
    kv->reserved_total += extra;
    kv->reserved[seq] = target;
    return 0;
}

int aotx_kv_seq_grow(aotx_kv_pool *kv, uint32_t seq, int32_t n) {
    if (!kv || !seq_ok(kv, seq)) return AOTX_E_KV_SEQ;
    if (n < 0 || (int64_t)kv->len[seq] + n > kv->p.max_tokens) return AOTX_E_KV_CONTEXT;
    int32_t need = aotx_kv_pages_needed(kv, kv->len[seq], n);
    int32_t from_res = need < kv->reserved[seq] ? need : kv->reserved[seq];
    if (need - from_res > kv->n_free - kv->reserved_total) return AOTX_R_KV_PAGES_EXHAUSTED;
    kv->reserved[seq] -= from_res;
    kv->reserved_total -= from_res;
    kv->last_from_res[seq] = from_res;
    int32_t j0 = pages_for(kv, kv->len[seq]), j1 = pages_for(kv, (int64_t)kv->len[seq] + n);
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        int32_t *t = table(kv, seq, gi);
        for (int32_t j = j0; j < j1; j++) t[j] = page_take(kv);
    }
    kv->len[seq] += n;
    return 0;
}

int aotx_kv_seq_shrink(aotx_kv_pool *kv, uint32_t seq, int32_t n) {
    if (!kv || !seq_ok(kv, seq)) return AOTX_E_KV_SEQ;
    if (n < 0 || n > kv->len[seq]) return AOTX_E_INVALID_ARGUMENT;
    int32_t j0 = pages_for(kv, kv->len[seq] - n), j1 = pages_for(kv, kv->len[seq]);
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        int32_t *t = table(kv, seq, gi);
        for (int32_t j = j0; j < j1; j++) { page_unref(kv, t[j]); t[j] = -1; }
    }
    kv->len[seq] -= n;
    kv->reserved[seq] += kv->last_from_res[seq];
    kv->reserved_total += kv->last_from_res[seq];
    kv->last_from_res[seq] = 0;
    return 0;
}

/* First page index a future query at position >= len may read on sliding layers. */
static int32_t first_visible_page(const aotx_kv_pool *kv, int32_t len) {
    int64_t lo = (int64_t)len - kv->p.window + 1;
    return lo <= 0 ? 0 : (int32_t)(lo / kv->p.page_tokens);
}

int aotx_kv_seq_trim(aotx_kv_pool *kv, uint32_t seq) {
    if (!kv || !seq_ok(kv, seq)) return AOTX_E_KV_SEQ;
    if (kv->p.window <= 0) return 0;
    int32_t upto = first_visible_page(kv, kv->len[seq]);
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        if (!kv->group_sliding[gi]) continue;
        int32_t *t = table(kv, seq, gi);
        for (int32_t j = kv->dropped[seq]; j < upto; j++) { page_unref(kv, t[j]); t[j] = -1; }
    }
    if (upto > kv->dropped[seq]) kv->dropped[seq] = upto;
    return 0;
}

int aotx_kv_seq_fork(aotx_kv_pool *kv, uint32_t src, int32_t n_tokens, uint32_t *dst,
                     int32_t *shared) {
    if (!kv || !dst || !shared || !seq_ok(kv, src)) return AOTX_E_KV_SEQ;
    if (n_tokens < 0) return AOTX_E_INVALID_ARGUMENT;
    int32_t n = n_tokens < kv->len[src] ? n_tokens : kv->len[src];
    int32_t full = n / kv->p.page_tokens;
    int32_t lo = kv->p.window > 0 ? first_visible_page(kv, full * kv->p.page_tokens) : 0;
    if (lo > full) lo = full;
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        const int32_t *t = table(kv, src, gi);
        int32_t from = kv->group_sliding[gi] ? lo : 0;
        for (int32_t j = from; j < full; j++)
            if (t[j] < 0) return AOTX_R_KV_PREFIX_RELEASED;
    }
    uint32_t d;
    int rc = aotx_kv_seq_new(kv, &d);
    if (rc) return rc;
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        const int32_t *t = table(kv, src, gi);
        int32_t *u = table(kv, d, gi);
        int32_t from = kv->group_sliding[gi] ? lo : 0;
        for (int32_t j = from; j < full; j++) { u[j] = t[j]; kv->refcnt[t[j]]++; }
    }
    kv->len[d] = full * kv->p.page_tokens;
    kv->dropped[d] = kv->p.window > 0 ? lo : 0;
    *dst = d;
    *shared = kv->len[d];
    return 0;
}

void aotx_kv_stats_get(const aotx_kv_pool *kv, aotx_kv_stats *out) {
    aotx_kv_stats s = {0};
    s.n_pages = kv->p.n_pages;
    s.free_pages = kv->n_free - kv->reserved_total;
    s.reserved_pages = kv->reserved_total;
    s.used_pages = kv->p.n_pages - kv->n_free;
    s.page_tokens = kv->p.page_tokens;
    s.n_groups = kv->n_groups;
    s.layers_per_group = kv->lpg;
    s.elem_bytes = kv->p.kv_f16 ? 2 : 4;
    s.page_bytes = kv->page_floats * s.elem_bytes;
    s.slots_held = (int64_t)s.used_pages * kv->p.page_tokens;
    uint8_t *mark = kv->mark;   /* scratch owned by the pool */
    memset(mark, 0, (size_t)kv->p.n_pages);
    for (int32_t q = 0; q < kv->p.max_seqs; q++) {
        if (!kv->in_use[q]) continue;
        s.n_seqs++;
        s.tokens_held += kv->len[q];
        int32_t np = pages_for(kv, kv->len[q]);
        for (int32_t gi = 0; gi < kv->n_groups; gi++) {
            const int32_t *t = table(kv, (uint32_t)q, gi);
            for (int32_t j = 0; j < np; j++) {
                if (t[j] < 0 || mark[t[j]]) continue;
                mark[t[j]] = 1;
                int64_t filled = (int64_t)kv->len[q] - (int64_t)j * kv->p.page_tokens;
                s.slots_live += filled < kv->p.page_tokens ? filled : kv->p.page_tokens;
                if (kv->refcnt[t[j]] > 1) s.shared_pages++;
            }
        }
    }
    *out = s;
}

int aotx_kv_view_get(const aotx_kv_pool *kv, uint32_t seq, int32_t layer, aotx_kv_view *out) {
    if (!kv || !seq_ok(kv, seq)) return AOTX_E_KV_SEQ;
    if (layer < 0 || layer >= kv->p.n_layers) return AOTX_E_INVALID_ARGUMENT;
    int32_t lg = kv->layer_slot[layer], PT = kv->p.page_tokens;
    out->table = table(kv, seq, kv->layer_group[layer]);
    out->page_floats = kv->page_floats;
    out->k_tok = kv->k_tok;
    out->v_tok = kv->v_tok;
    out->k_off = (int64_t)lg * PT * kv->k_tok;
    out->v_off = (int64_t)kv->lpg * PT * kv->k_tok + (int64_t)lg * PT * kv->v_tok;
    out->page_tokens = PT;
    out->elem_bytes = kv->p.kv_f16 ? 2 : 4;
    return 0;
}

int aotx_kv_locate(const aotx_kv_pool *kv, uint32_t seq, int32_t layer, int32_t pos, int32_t head,
                   int v, int32_t *page, int64_t *offset) {
    aotx_kv_view w;
    if (!page || !offset) return AOTX_E_INVALID_ARGUMENT;
    int rc = aotx_kv_view_get(kv, seq, layer, &w);
    if (rc) return rc;
    if (pos < 0 || pos >= kv->len[seq] || head < 0 || head >= kv->p.n_kv_heads)
        return AOTX_E_INVALID_ARGUMENT;
    int32_t pg = w.table[pos / w.page_tokens];
    if (pg < 0) return AOTX_E_INVALID_ARGUMENT;   /* released sliding-window page */
    int64_t tok = pos % w.page_tokens;
    *page = pg;
    *offset = v ? w.v_off + tok * w.v_tok + (int64_t)head * kv->p.v_dim
                : w.k_off + tok * w.k_tok + (int64_t)head * kv->p.k_dim;
    return 0;
}
