/* tokenizer_encode.c -- text to token ids: whole-piece matches of special
 * pieces, then per fragment either SentencePiece-style BPE by piece score with
 * byte fallback, or (byte-level mode) pre-tokenization and BPE by merge rank
 * over the bytes of each pre-token.  docs/tokenizer.md describes both. */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

/* One symbol of a fragment: a run of esc[] bytes. Merged-away symbols have len 0. */
typedef struct bpe_sym {
    int32_t start, len;
    int32_t prev, next;   /* neighbours in the fragment, -1 at the ends */
    int32_t id;           /* byte-level mode: the symbol's token */
} bpe_sym;

/* A possible merge of symbols left and right (adjacent when pushed). */
typedef struct bpe_cand {
    float score;
    int32_t left, right;
    int32_t len;          /* len(left) + len(right) when pushed; stale if it differs */
    int32_t id;           /* the joined piece */
} bpe_cand;

/* Working memory of one aotx_tokenize call, sized from the text length. */
typedef struct bpe_work {
    uint8_t *esc;         /* [3 * len + 3] the fragment with spaces as U+2581 (byte-level:
                           * the fragment, then room for one pre-token's mapped text) */
    bpe_sym *sym;         /* [len + 1] */
    bpe_cand *heap;       /* [3 * (len + 1)] max-heap */
    int32_t *ids;         /* [3 * len + 4] the output being built */
    tok_cp *cps;          /* [len + 2] byte-level mode: the fragment's code points */
    int64_t n_ids;
    int32_t n_heap;
} bpe_work;

/* Length of the valid UTF-8 character at s (RFC 3629), or 1 for a byte that
 * does not start one (it becomes a symbol of its own and falls back to a byte). */
int aotx_tok_utf8_len(const uint8_t *s, int64_t n) {
    uint8_t c = s[0], lo = 0x80, hi = 0xBF;
    int need;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) need = 2;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else return 1;
    if (n <= need || s[1] < lo || s[1] > hi) return 1;
    for (int i = 2; i <= need; i++)
        if ((s[i] & 0xC0) != 0x80) return 1;
    return need + 1;
}

/* Higher score first; on a tie the leftmost pair. */
static int cand_before(const bpe_cand *a, const bpe_cand *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(bpe_work *w, bpe_cand c) {
    int32_t i = w->n_heap++;
    while (i > 0) {
        int32_t parent = (i - 1) / 2;
        if (!cand_before(&c, &w->heap[parent])) break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = c;
}

static bpe_cand heap_pop(bpe_work *w) {
    bpe_cand top = w->heap[0], last = w->heap[--w->n_heap];
    int32_t i = 0, n = w->n_heap;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_before(&w->heap[c + 1], &w->heap[c])) c++;
        if (!cand_before(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n > 0) w->heap[i] = last;
    return top;
}

static void try_pair(const aotx_tokenizer *t, bpe_work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint8_t *s = w->esc + w->sym[left].start;
    int32_t n = w->sym[left].len + w->sym[right].len;
    int32_t id = aotx_tok_lookup(t, s, n, aotx_tok_hash(s, n));
    if (id < 0) return;
    heap_push(w, (bpe_cand){t->tok[id].score, left, right, n, id});
}

/* Escape spaces and split into characters; returns the symbol count. */
static int32_t split_fragment(bpe_work *w, const uint8_t *s, int64_t n, int prefix) {
    int64_t m = 0;
    if (prefix) memcpy(w->esc, "\xE2\x96\x81", 3), m = 3;
    for (int64_t i = 0; i < n; i++) {
        if (s[i] == ' ') memcpy(w->esc + m, "\xE2\x96\x81", 3), m += 3;
        else w->esc[m++] = s[i];
    }
    int32_t k = 0;
    for (int64_t i = 0; i < m;) {
        int len = aotx_tok_utf8_len(w->esc + i, m - i);
        w->sym[k] = (bpe_sym){(int32_t)i, len, k - 1, -1, -1};
        if (k > 0) w->sym[k - 1].next = k;
        k++;
        i += len;
    }
    return k;
}

static int emit_symbol(const aotx_tokenizer *t, bpe_work *w, const bpe_sym *sym) {
    const uint8_t *s = w->esc + sym->start;
    int32_t id = aotx_tok_lookup(t, s, sym->len, aotx_tok_hash(s, sym->len));
    if (id >= 0) {
        w->ids[w->n_ids++] = id;
        return AOTX_OK;
    }
    for (int32_t i = 0; i < sym->len; i++) {
        id = t->byte_id[s[i]] >= 0 ? t->byte_id[s[i]] : t->p.unk_id;
        if (id < 0) return AOTX_E_TOKENIZER_NO_FALLBACK;
        w->ids[w->n_ids++] = id;
    }
    return AOTX_OK;
}

/* BPE over the symbols [a, b) of a fragment, which no piece crosses. */
static void bpe_segment(const aotx_tokenizer *t, bpe_work *w, int32_t a, int32_t b) {
    w->sym[a].prev = -1;
    w->sym[b - 1].next = -1;
    w->n_heap = 0;
    for (int32_t i = a; i + 1 < b; i++) try_pair(t, w, i, i + 1);
    while (w->n_heap > 0) {
        bpe_cand c = heap_pop(w);
        bpe_sym *l = &w->sym[c.left], *r = &w->sym[c.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != c.len) continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (l->next >= 0) w->sym[l->next].prev = c.left;
        try_pair(t, w, l->prev, c.left);
        try_pair(t, w, c.left, l->next);
    }
}

/* Whether symbol i starts a word: a space marker no piece joins to what precedes it. */
static int word_start(const aotx_tokenizer *t, const bpe_work *w, int32_t i) {
    const bpe_sym *y = &w->sym[i];
    const uint8_t *s = w->esc + y->start;
    return y->len == 3 && s[0] == 0xE2 && s[1] == 0x96 && s[2] == 0x81 && !t->glue[s[-1]];
}

/* BPE over one fragment of text (no special pieces in it), word by word:
 * merges never cross a word start, so this equals BPE over the whole
 * fragment (merges in different words do not interact), with small heaps. */
static int encode_fragment(const aotx_tokenizer *t, bpe_work *w, const uint8_t *s, int64_t n,
                           int prefix) {
    int32_t k = split_fragment(w, s, n, prefix);
    for (int32_t a = 0; a < k;) {
        int32_t b = a + 1;
        while (b < k && !word_start(t, w, b)) b++;
        bpe_segment(t, w, a, b);
        for (int32_t i = a; i >= 0; i = w->sym[i].next) {
            int rc = emit_symbol(t, w, &w->sym[i]);
            if (rc) return rc;
        }
        a = b;
    }
    return AOTX_OK;
}

/* Byte-level mode: a possible merge of symbols left and right, by rank
 * (score -rank: exact below 2^24 merges, so the lowest rank pops first). */
static void try_merge(const aotx_tokenizer *t, bpe_work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    int32_t rank;
    int32_t id = aotx_tok_merge_find(t, w->sym[left].id, w->sym[right].id, &rank);
    if (id < 0) return;
    heap_push(w, (bpe_cand){-(float)rank, left, right, w->sym[left].len + w->sym[right].len, id});
}

/* The piece a pre-token's bytes spell on GPT-2's map, or -1 (ignore_merges). */
static int32_t whole_piece(const aotx_tokenizer *t, bpe_work *w, int64_t a, int64_t b,
                           uint8_t *scratch) {
    int64_t m = 0;
    for (int64_t i = a; i < b; i++) {
        uint16_t c = t->byte_cp[w->esc[i]];
        if (c < 0x80) scratch[m++] = (uint8_t)c;
        else scratch[m++] = (uint8_t)(0xC0 | c >> 6), scratch[m++] = (uint8_t)(0x80 | (c & 0x3F));
    }
    int32_t id = aotx_tok_lookup(t, scratch, m, aotx_tok_hash(scratch, m));
    return (id >= 0 && t->tok[id].type == AOTX_TOK_NORMAL) ? id : -1;
}

/* BPE by merge rank over the bytes esc[a, b) of one pre-token. */
static int bpe_word(const aotx_tokenizer *t, bpe_work *w, int32_t a, int32_t b, uint8_t *scratch) {
    if (t->ignore_merges) {
        int32_t id = whole_piece(t, w, a, b, scratch);
        if (id >= 0) {
            w->ids[w->n_ids++] = id;
            return AOTX_OK;
        }
    }
    for (int32_t i = a; i < b; i++) {
        int32_t id = t->byte_id[w->esc[i]] >= 0 ? t->byte_id[w->esc[i]] : t->p.unk_id;
        if (id < 0) return AOTX_E_TOKENIZER_NO_FALLBACK;
        w->sym[i] = (bpe_sym){i, 1, i - 1, i + 1, id};
    }
    w->sym[a].prev = -1;
    w->sym[b - 1].next = -1;
    w->n_heap = 0;
    for (int32_t i = a; i + 1 < b; i++) try_merge(t, w, i, i + 1);
    while (w->n_heap > 0) {
        bpe_cand c = heap_pop(w);
        bpe_sym *l = &w->sym[c.left], *r = &w->sym[c.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != c.len) continue;
        l->len += r->len;
        l->id = c.id;
        r->len = 0;
        l->next = r->next;
        if (l->next >= 0) w->sym[l->next].prev = c.left;
        try_merge(t, w, l->prev, c.left);
        try_merge(t, w, c.left, l->next);
    }
    for (int32_t i = a; i >= 0; i = w->sym[i].next) w->ids[w->n_ids++] = w->sym[i].id;
    return AOTX_OK;
}

/* Byte-level mode: one fragment, pre-token by pre-token. */
static int encode_fragment_bpe(const aotx_tokenizer *t, bpe_work *w, const uint8_t *s, int64_t n,
                               int prefix) {
    int64_t m = 0;
    if (prefix) w->esc[m++] = ' ';
    memcpy(w->esc + m, s, (size_t)n);
    m += n;
    uint8_t *scratch = w->esc + m;   /* 2 bytes per byte of a pre-token */
    int32_t n_cp = aotx_pretok_decode(w->esc, m, w->cps);
    for (int32_t k = 0; k < n_cp;) {
        int32_t e = aotx_pretok_next(t->pre, w->cps, k, n_cp);
        int rc = bpe_word(t, w, w->cps[k].off, w->cps[e].off, scratch);
        if (rc) return rc;
        k = e;
    }
    return AOTX_OK;
}

/* The longest special piece (allowed by parse_special) that starts at s, or -1. */
static int32_t match_special(const aotx_tokenizer *t, const uint8_t *s, int64_t n,
                             int parse_special) {
    int32_t lo = t->special_start[s[0]], hi = t->special_start[s[0] + 1];
    for (int32_t k = lo; k < hi; k++) {
        const tok_special *e = &t->special[k];
        if (e->len > n || (!parse_special && e->type != AOTX_TOK_USER_DEFINED)) continue;
        if (e->len > 1 && e->s[1] != s[1]) continue;
        if (memcmp(e->s, s, (size_t)e->len) == 0) return e->id;
    }
    return -1;
}

static int encode_all(const aotx_tokenizer *t, bpe_work *w, const uint8_t *s, int64_t n,
                      int parse_special) {
    int64_t frag = 0;
    for (int64_t i = 0; i <= n;) {
        int32_t id = i < n ? match_special(t, s + i, n - i, parse_special) : -1;
        if (id < 0 && i < n) {
            i++;
            continue;
        }
        if (i > frag) {
            int prefix = t->p.add_space_prefix && frag == 0;
            int rc = t->model == AOTX_TOK_MODEL_BPE
                         ? encode_fragment_bpe(t, w, s + frag, i - frag, prefix)
                         : encode_fragment(t, w, s + frag, i - frag, prefix);
            if (rc) return rc;
        }
        if (id < 0) break;
        w->ids[w->n_ids++] = id;
        i += t->tok[id].piece_len;
        frag = i;
    }
    return AOTX_OK;
}

int aotx_tokenize_ex(const aotx_tokenizer *t, const char *text, int64_t len, int add_bos,
                     int parse_special, int32_t *out, int64_t cap, int64_t *n_out) {
    if (!t || !n_out || len < 0 || len > INT32_MAX / 8 || (!text && len > 0) || cap < 0 ||
        (!out && cap > 0))
        return AOTX_E_INVALID_ARGUMENT;
    if (add_bos && t->p.bos_id < 0) return AOTX_E_TOKENIZER_NO_BOS;
    size_t n = (size_t)len;
    size_t esc_sz = 3 * n + 3, sym_sz = (n + 1) * sizeof(bpe_sym);
    size_t heap_sz = 3 * (n + 1) * sizeof(bpe_cand), ids_sz = (3 * n + 4) * sizeof(int32_t);
    size_t a1 = (esc_sz + 15) & ~(size_t)15, a2 = (sym_sz + 15) & ~(size_t)15;
    size_t a3 = (heap_sz + 15) & ~(size_t)15, a4 = (ids_sz + 15) & ~(size_t)15;
    size_t cps_sz = t->model == AOTX_TOK_MODEL_BPE ? (n + 2) * sizeof(tok_cp) : 0;
    uint8_t *mem = malloc(a1 + a2 + a3 + a4 + cps_sz);
    if (!mem) return AOTX_E_NOMEM;
    bpe_work w = {mem, (bpe_sym *)(mem + a1), (bpe_cand *)(mem + a1 + a2),
                  (int32_t *)(mem + a1 + a2 + a3), (tok_cp *)(mem + a1 + a2 + a3 + a4), 0, 0};
    if (add_bos) w.ids[w.n_ids++] = t->p.bos_id;
    int rc = encode_all(t, &w, (const uint8_t *)text, len, parse_special);
    if (!rc) {
        *n_out = w.n_ids;
        if (w.n_ids > cap) rc = AOTX_E_BUFFER_TOO_SMALL;
        else if (w.n_ids) memcpy(out, w.ids, (size_t)w.n_ids * sizeof(int32_t));
    }
    free(mem);
    return rc;
}

int64_t aotx_tokenize(const aotx_tokenizer *t, const char *text, int64_t len, int add_bos,
                      int parse_special, int32_t *out, int64_t cap) {
    int64_t n = 0;
    int rc = aotx_tokenize_ex(t, text, len, add_bos, parse_special, out, cap, &n);
    if (rc == AOTX_E_BUFFER_TOO_SMALL) return -n;
    return rc ? AOTX_TOK_FAILED : n;
}
