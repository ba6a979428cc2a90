/* tokenizer_wordpiece.c -- BERT WordPiece (see aotx_wordpiece.h). */
#include "aotx_wordpiece.h"
#include "wordpiece_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct wp_entry {
    uint32_t off, len;     /* bytes in the blob */
    int32_t id;
} wp_entry;

struct aotx_wordpiece {
    aotx_wordpiece_params p;   /* flags and sizes; pointers below are ours */
    char *blob;                /* vocab pieces, then added tokens, then the prefix */
    wp_entry *vocab;           /* [n_vocab] */
    int32_t *slots;            /* [n_slots] index into vocab or -1 (open addressing) */
    uint32_t mask;
    wp_entry *added;           /* [n_added], longest first */
    uint32_t prefix_off;
};

static uint64_t hash_bytes(const char *s, size_t n) {   /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static int32_t lookup(const aotx_wordpiece *wp, const char *s, size_t n) {
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & wp->mask;; i = (i + 1) & wp->mask) {
        int32_t e = wp->slots[i];
        if (e < 0) return -1;
        const wp_entry *v = &wp->vocab[e];
        if (v->len == n && memcmp(wp->blob + v->off, s, n) == 0) return v->id;
    }
}

static int cmp_added(const void *a, const void *b) {   /* longest first, then input order */
    const wp_entry *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? 1 : -1;
    return x->off < y->off ? -1 : x->off > y->off;
}

void aotx_wordpiece_free(aotx_wordpiece *wp) {
    if (!wp) return;
    free(wp->blob); free(wp->vocab); free(wp->slots); free(wp->added);
    free(wp);
}

int aotx_wordpiece_new(const aotx_wordpiece_params *p, aotx_wordpiece **out) {
    if (!p || !out) return AOTX_E_INVALID_ARGUMENT;
    *out = NULL;
    if (p->n_vocab <= 0 || p->n_vocab > (1 << 24) || !p->tokens || !p->token_lens || !p->ids ||
        p->prefix_len < 0 || (p->prefix_len && !p->prefix) || p->max_chars < 0 || p->unk_id < 0 ||
        p->n_added < 0 || (p->n_added && (!p->added || !p->added_lens || !p->added_ids)))
        return AOTX_E_INVALID_ARGUMENT;
    uint64_t bytes = (uint64_t)p->prefix_len;
    for (int32_t i = 0; i < p->n_vocab; i++) {
        if (p->token_lens[i] < 0 || p->ids[i] < 0 || (p->token_lens[i] && !p->tokens[i]))
            return AOTX_E_INVALID_ARGUMENT;
        bytes += (uint64_t)p->token_lens[i];
    }
    for (int32_t i = 0; i < p->n_added; i++) {
        if (p->added_lens[i] <= 0 || !p->added[i] || p->added_ids[i] < 0)
            return AOTX_E_INVALID_ARGUMENT;
        bytes += (uint64_t)p->added_lens[i];
    }
    if (bytes >= UINT32_MAX) return AOTX_E_INVALID_ARGUMENT;
    aotx_wordpiece *wp = calloc(1, sizeof *wp);
    if (!wp) return AOTX_E_NOMEM;
    wp->p = *p;
    uint32_t n_slots = 16;
    while (n_slots < 2u * (uint32_t)p->n_vocab) n_slots <<= 1;
    wp->mask = n_slots - 1;
    wp->blob = malloc(bytes ? bytes : 1);
    wp->vocab = malloc(sizeof(wp_entry) * (size_t)p->n_vocab);
    wp->slots = malloc(sizeof(int32_t) * n_slots);
    wp->added = malloc(sizeof(wp_entry) * (size_t)(p->n_added ? p->n_added : 1));
    if (!wp->blob || !wp->vocab || !wp->slots || !wp->added) {
        aotx_wordpiece_free(wp);
        return AOTX_E_NOMEM;
    }
    memset(wp->slots, 0xff, sizeof(int32_t) * n_slots);
    uint32_t off = 0;
    for (int32_t i = 0; i < p->n_vocab; i++) {
        uint32_t n = (uint32_t)p->token_lens[i];
        if (n) memcpy(wp->blob + off, p->tokens[i], n);
        wp->vocab[i] = (wp_entry){off, n, p->ids[i]};
        uint32_t s = (uint32_t)hash_bytes(wp->blob + off, n) & wp->mask;
        int dup = 0;
        for (; wp->slots[s] >= 0; s = (s + 1) & wp->mask) {
            const wp_entry *v = &wp->vocab[wp->slots[s]];
            if (v->len == n && memcmp(wp->blob + v->off, wp->blob + off, n) == 0) { dup = 1; break; }
        }
        if (!dup) wp->slots[s] = i;   /* a repeated piece keeps its first id, like a dict */
        off += n;
    }
    for (int32_t i = 0; i < p->n_added; i++) {
        uint32_t n = (uint32_t)p->added_lens[i];
        memcpy(wp->blob + off, p->added[i], n);
        wp->added[i] = (wp_entry){off, n, p->added_ids[i]};
        off += n;
    }
    qsort(wp->added, (size_t)p->n_added, sizeof(wp_entry), cmp_added);
    if (p->prefix_len) memcpy(wp->blob + off, p->prefix, (size_t)p->prefix_len);
    wp->prefix_off = off;
    wp->p.tokens = NULL; wp->p.token_lens = NULL; wp->p.ids = NULL; wp->p.prefix = NULL;
    wp->p.added = NULL; wp->p.added_lens = NULL; wp->p.added_ids = NULL;
    *out = wp;
    return 0;
}

/* ---------- UTF-8 ---------- */

/* One code point from s[0..n) (n >= 1); *used = bytes read.  Not UTF-8: U+FFFD, 1 byte.
 * Encoded surrogates (Python's surrogatepass) are read as such. */
static uint32_t utf8_next(const uint8_t *s, int64_t n, int *used) {
    uint8_t c = s[0];
    int k = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    *used = 1;
    if (k == 0) return c;
    if (k < 0 || n <= k) return 0xFFFD;
    uint32_t cp = c & (0x3F >> k);
    for (int i = 1; i <= k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0xFFFD;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    static const uint32_t least[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < least[k] || cp > 0x10FFFF) return 0xFFFD;
    *used = k + 1;
    return cp;
}

static int utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---------- character classes ---------- */

static int is_ws(uint32_t c) {   /* Unicode White_Space */
    switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
        return 1;
    default:
        return c >= 0x2000 && c <= 0x200A;
    }
}

static int is_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* Index of the last row of rows[n][stride] whose first column is <= cp, or -1. */
static int32_t last_le(const uint32_t *rows, int32_t n, int32_t stride, uint32_t cp) {
    int32_t lo = 0, hi = n;              /* answer in [lo - 1, hi - 1] */
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (rows[(int64_t)mid * stride] <= cp) lo = mid + 1;
        else hi = mid;
    }
    return lo - 1;
}

static int in_ranges(const uint32_t (*r)[2], int32_t n, uint32_t cp) {
    int32_t i = last_le(&r[0][0], n, 2, cp);
    return i >= 0 && cp <= r[i][1];
}

static int is_control(uint32_t c) { return in_ranges(wp_control, wp_control_n, c); }
static int is_mn(uint32_t c) { return c >= 0x300 && in_ranges(wp_mn, wp_mn_n, c); }

static int is_punct(uint32_t c) {
    if (c < 0x80)
        return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
               (c >= 0x7B && c <= 0x7E);
    return in_ranges(wp_punct, wp_punct_n, c);
}

static int ccc(uint32_t c) {
    if (c < 0x300) return 0;
    int32_t i = last_le(&wp_ccc[0][0], wp_ccc_n, 3, c);
    return i >= 0 && c <= wp_ccc[i][1] ? (int)wp_ccc[i][2] : 0;
}

/* The mapping of cp in a {cp, offset, length} table into out; returns the count (1: cp). */
static int mapped(const uint32_t (*key)[3], int32_t n, const uint32_t *data, uint32_t cp,
                  uint32_t *out) {
    int32_t i = last_le(&key[0][0], n, 3, cp);
    if (i < 0 || key[i][0] != cp) { out[0] = cp; return 1; }
    for (uint32_t j = 0; j < key[i][2]; j++) out[j] = data[key[i][1] + j];
    return (int)key[i][2];
}

/* NFD of one code point into out[AOTX_WP_DECOMP_MAX]. */
static int decompose(uint32_t cp, uint32_t *out) {
    if (cp >= 0xAC00 && cp <= 0xD7A3) {   /* Hangul syllable: L V (T) */
        uint32_t s = cp - 0xAC00, t = s % 28;
        out[0] = 0x1100 + s / (21 * 28);
        out[1] = 0x1161 + (s % (21 * 28)) / 28;
        if (!t) return 2;
        out[2] = 0x11A7 + t;
        return 3;
    }
    if (cp < 0xC0) { out[0] = cp; return 1; }
    return mapped(wp_decomp_key, wp_decomp_n, wp_decomp_data, cp, out);
}

/* Python's str.lower of one code point into out[AOTX_WP_LOWER_MAX]. */
static int lower(uint32_t cp, uint32_t *out) {
    if (cp < 0x80) { out[0] = cp >= 'A' && cp <= 'Z' ? cp + 32 : cp; return 1; }
    return mapped(wp_lower_key, wp_lower_n, wp_lower_data, cp, out);
}

/* ---------- one encode call ---------- */

typedef struct enc {
    const aotx_wordpiece *wp;
    uint32_t *a, *b;          /* code point buffers, cap each */
    int64_t cap;
    char *key;                /* word scratch, key_cap bytes (see word()) */
    int64_t key_cap;
    int32_t *ids;
    int64_t ids_cap, n, limit;
} enc;

static int full(const enc *e) { return e->limit >= 0 && e->n >= e->limit; }

static void emit(enc *e, int32_t id) {
    if (full(e)) return;
    if (e->n < e->ids_cap) e->ids[e->n] = id;
    e->n++;
}

/* The pieces of one pre-tokenized word w[0..n). */
static int word(enc *e, const uint32_t *w, int64_t n) {
    const aotx_wordpiece *wp = e->wp;
    if (n > wp->p.max_chars) { emit(e, wp->p.unk_id); return 0; }
    int64_t pl = wp->p.prefix_len, at = (2 * (pl + 4 * n) + 3) & ~(int64_t)3;
    int64_t need = at + 4 * (n + 1);
    if (need > e->key_cap) {   /* [UTF-8 of w][prefix + a piece][char offsets] */
        char *k = realloc(e->key, (size_t)need);
        if (!k) return AOTX_E_NOMEM;
        e->key = k;
        e->key_cap = need;
    }
    char *wb = e->key, *key = e->key + pl + 4 * n;
    int32_t *offs = (int32_t *)(void *)(e->key + at);   /* realloc'd: aligned for int32 */
    int32_t bytes = 0;
    for (int64_t i = 0; i < n; i++) {
        offs[i] = bytes;
        bytes += utf8_put(w[i], wb + bytes);
    }
    offs[n] = bytes;
    memcpy(key, wp->blob + wp->prefix_off, (size_t)pl);
    int64_t first = e->n, start = 0;
    while (start < n) {
        int32_t found = -1;
        int64_t end = n;
        for (; end > start && found < 0; end--) {
            size_t len = (size_t)(offs[end] - offs[start]);
            if (start == 0) {
                found = lookup(wp, wb, len);
            } else {            /* continuation: prefix + piece */
                memcpy(key + pl, wb + offs[start], len);
                found = lookup(wp, key, (size_t)pl + len);
            }
        }
        if (found < 0) {        /* an unmatchable rest makes the whole word one unk */
            e->n = first;
            emit(e, wp->p.unk_id);
            return 0;
        }
        emit(e, found);
        start = end + 1;        /* the loop stepped once past the match */
    }
    return 0;
}

static int grow(enc *e, int64_t need) {
    if (need <= e->cap) return 0;
    int64_t c = e->cap * 2 > need ? e->cap * 2 : need;
    uint32_t *a = realloc(e->a, sizeof(uint32_t) * (size_t)c);
    if (!a) return AOTX_E_NOMEM;
    e->a = a;
    uint32_t *b = realloc(e->b, sizeof(uint32_t) * (size_t)c);
    if (!b) return AOTX_E_NOMEM;
    e->b = b;
    e->cap = c;
    return 0;
}

/* Normalize, pre-tokenize and split the raw part s[0..n) (no added token inside). */
static int part(enc *e, const uint8_t *s, int64_t n) {
    const aotx_wordpiece_params *p = &e->wp->p;
    int rc;
    /* 1. decode + clean_text + CJK spacing, into a (at most 3 code points per byte) */
    if ((rc = grow(e, 3 * n + 1))) return rc;
    int64_t m = 0;
    for (int64_t i = 0; i < n;) {
        int used;
        uint32_t c = utf8_next(s + i, n - i, &used);
        i += used;
        if (p->clean_text) {
            if (!(c == 9 || c == 10 || c == 13) && (c == 0xFFFD || is_control(c))) continue;
            if (is_ws(c)) c = ' ';
        }
        if (p->chinese && is_cjk(c)) {
            e->a[m++] = ' '; e->a[m++] = c; e->a[m++] = ' ';
        } else {
            e->a[m++] = c;
        }
    }
    /* 2. strip_accents: NFD (decompose, then order each run of combining marks by
     *    class, stably), then drop the nonspacing marks */
    if (p->strip_accents) {
        if ((rc = grow(e, AOTX_WP_DECOMP_MAX * m + 1))) return rc;
        int64_t k = 0;
        for (int64_t i = 0; i < m; i++) k += decompose(e->a[i], e->b + k);
        for (int64_t i = 1; i < k; i++) {   /* insertion sort inside runs of ccc > 0 */
            int ci = ccc(e->b[i]);
            if (!ci) continue;
            uint32_t c = e->b[i];
            int64_t j = i;
            while (j > 0) {
                int cj = ccc(e->b[j - 1]);
                if (cj <= ci) break;
                e->b[j] = e->b[j - 1];
                j--;
            }
            e->b[j] = c;
        }
        m = 0;
        for (int64_t i = 0; i < k; i++)
            if (!is_mn(e->b[i])) e->a[m++] = e->b[i];
    }
    /* 3. lowercase, per character */
    if (p->lowercase) {
        if ((rc = grow(e, AOTX_WP_LOWER_MAX * m + 1))) return rc;
        int64_t k = 0;
        for (int64_t i = 0; i < m; i++) k += lower(e->a[i], e->b + k);
        memcpy(e->a, e->b, sizeof(uint32_t) * (size_t)k);
        m = k;
    }
    /* 4. words: split on whitespace; each punctuation character is a word */
    int64_t w0 = 0;
    for (int64_t i = 0; i <= m && !full(e); i++) {
        uint32_t c = i < m ? e->a[i] : ' ';
        int sep = is_ws(c), pun = !sep && is_punct(c);
        if (!sep && !pun) continue;
        if (i > w0 && (rc = word(e, e->a + w0, i - w0))) return rc;
        if (pun && !full(e) && (rc = word(e, e->a + i, 1))) return rc;
        w0 = i + 1;
    }
    return 0;
}

int aotx_wordpiece_encode(const aotx_wordpiece *wp, const char *text, int64_t len, int64_t limit,
                          int32_t *ids, int64_t cap, int64_t *n_ids) {
    if (!wp || !n_ids || len < 0 || (len && !text) || cap < 0 || (cap && !ids))
        return AOTX_E_INVALID_ARGUMENT;
    *n_ids = 0;
    enc e = {.wp = wp, .ids = ids, .ids_cap = cap, .limit = limit};
    const uint8_t *s = (const uint8_t *)text;
    int64_t start = 0, i = 0;
    int rc = 0;
    while (i < len && !full(&e)) {
        const wp_entry *hit = NULL;
        for (int32_t t = 0; t < wp->p.n_added; t++) {
            const wp_entry *a = &wp->added[t];
            if (a->len <= (uint64_t)(len - i) && memcmp(s + i, wp->blob + a->off, a->len) == 0) {
                hit = a;
                break;
            }
        }
        if (!hit) {
            int used;
            utf8_next(s + i, len - i, &used);
            i += used;
            continue;
        }
        if (i > start && (rc = part(&e, s + start, i - start))) break;
        emit(&e, hit->id);
        i += hit->len;
        start = i;
    }
    if (!rc && start < len && !full(&e)) rc = part(&e, s + start, len - start);
    free(e.a); free(e.b); free(e.key);
    if (rc) return rc;
    *n_ids = e.n;
    return e.n <= cap ? AOTX_OK : AOTX_E_BUFFER_TOO_SMALL;
}
