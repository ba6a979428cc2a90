/* tokenizer_detok.c -- the incremental detokenizer: token ids in, exact bytes
 * out, never splitting a UTF-8 character across two outputs. */
#include "tokenizer_internal.h"

#include <string.h>

/* Bytes a lead byte needs in all (2..4), with the range of its second byte;
 * 0 for a byte that cannot start a multi-byte character. */
static int utf8_need(uint8_t c, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80, *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c == 0xE0) return *lo = 0xA0, 3;
    if (c == 0xED) return *hi = 0x9F, 3;
    if (c >= 0xE1 && c <= 0xEF) return 3;
    if (c == 0xF0) return *lo = 0x90, 4;
    if (c == 0xF4) return *hi = 0x8F, 4;
    if (c >= 0xF1 && c <= 0xF3) return 4;
    return 0;
}

/* Whether s[0..n) is a proper prefix of a valid UTF-8 character (n >= 1). */
static int utf8_pending(const uint8_t *s, int n) {
    uint8_t lo, hi;
    int need = utf8_need(s[0], &lo, &hi);
    if (need == 0 || n >= need) return 0;
    if (n >= 2 && (s[1] < lo || s[1] > hi)) return 0;
    for (int i = 2; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return 1;
}

void aotx_detok_init(aotx_detok *d) {
    if (d) memset(d, 0, sizeof *d);
}

/* The held bytes followed by the token's bytes, as one sequence. */
typedef struct detok_seq {
    const uint8_t *held;
    int32_t n_held;
    const uint8_t *tok;
    int64_t n_tok;
} detok_seq;

static uint8_t seq_at(const detok_seq *q, int64_t k) {
    return k < q->n_held ? q->held[k] : q->tok[k - q->n_held];
}

/* How many trailing bytes of q to hold back: the incomplete character at the
 * end, if the stream may still complete it (at most 3). */
static int held_tail(const detok_seq *q) {
    int64_t total = q->n_held + q->n_tok;
    for (int back = 1; back <= 3 && back <= total; back++) {
        uint8_t c = seq_at(q, total - back);
        if ((c & 0xC0) == 0x80) continue;   /* a continuation byte: look further back */
        uint8_t tail[4];
        for (int i = 0; i < back; i++) tail[i] = seq_at(q, total - back + i);
        return utf8_pending(tail, back) ? back : 0;
    }
    return 0;
}

int aotx_detok_push_ex(const aotx_tokenizer *t, aotx_detok *d, int32_t id, uint8_t *out,
                       int64_t cap, int64_t *n_out) {
    if (!t || !d || !n_out || cap < 0 || (!out && cap > 0) || d->n_held < 0 || d->n_held > 3)
        return AOTX_E_INVALID_ARGUMENT;
    const uint8_t *b;
    int32_t n;
    int rc = aotx_token_bytes_ref(t, id, &b, &n);
    if (rc) return rc;
    int started = d->started;
    if (n > 0 && !started) {
        started = 1;
        /* add_space_prefix put a space before the text: take it off again. */
        if (t->p.add_space_prefix && b[0] == ' ' && t->tok[id].type != AOTX_TOK_BYTE) b++, n--;
    }
    detok_seq q = {d->held, d->n_held, b, n};
    int keep = held_tail(&q);
    int64_t emit = d->n_held + (int64_t)n - keep;
    *n_out = emit;
    if (emit > cap) return AOTX_E_BUFFER_TOO_SMALL;
    uint8_t tail[4];
    for (int i = 0; i < keep; i++) tail[i] = seq_at(&q, emit + i);
    for (int64_t k = 0; k < emit && k < d->n_held; k++) out[k] = d->held[k];
    if (emit > d->n_held) memcpy(out + d->n_held, b, (size_t)(emit - d->n_held));
    memcpy(d->held, tail, (size_t)keep);
    d->n_held = keep;
    d->started = started;
    return AOTX_OK;
}

int64_t aotx_detok_push(const aotx_tokenizer *t, aotx_detok *d, int32_t id, uint8_t *out,
                        int64_t cap) {
    int64_t n = 0;
    int rc = aotx_detok_push_ex(t, d, id, out, cap, &n);
    if (rc == AOTX_E_BUFFER_TOO_SMALL) return -n;
    return rc ? AOTX_TOK_FAILED : n;
}

int64_t aotx_detok_flush(aotx_detok *d, uint8_t *out, int64_t cap) {
    if (!d || d->n_held < 0 || d->n_held > 3 || (!out && cap > 0)) return AOTX_TOK_FAILED;
    int64_t n = d->n_held;
    if (n > cap) return -n;
    if (n) memcpy(out, d->held, (size_t)n);
    aotx_detok_init(d);
    return n;
}
