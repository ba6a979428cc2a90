/* tokenizer.c -- the vocabulary: building a tokenizer from GGUF arrays, the
 * piece hash table, the special-piece index, and per-token bytes.
 * Encoding is in tokenizer_encode.c, the detokenizer in tokenizer_detok.c,
 * the byte-level BPE's merge table in tokenizer_bpe.c. */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

const aotx_code_entry aotx_tokenizer_codes[] = {
    {AOTX_E_TOKENIZER_VOCAB, "tokenizer_vocab_corrupt",
     "the vocabulary is malformed (a missing piece, or a byte token not spelled <0xNN>)"},
    {AOTX_E_TOKENIZER_TOKEN, "token_id_invalid", "the token id is outside the vocabulary"},
    {AOTX_E_TOKENIZER_TYPE, "token_type_invalid", "a token_type value is outside 0..6"},
    {AOTX_E_TOKENIZER_SPECIAL, "special_token_id_invalid",
     "a bos/eos/unk/pad token id is outside the vocabulary"},
    {AOTX_E_TOKENIZER_NO_BOS, "bos_token_invalid",
     "a beginning-of-sequence token was asked for but the vocabulary has none"},
    {AOTX_E_TOKENIZER_NO_FALLBACK, "byte_fallback_invalid",
     "a byte has no <0xNN> token and the vocabulary has no unknown token"},
    {AOTX_E_TOKENIZER_MODEL, "tokenizer_model_unsupported",
     "tokenizer.ggml.model is neither \"llama\" nor \"gpt2\""},
    {AOTX_E_TOKENIZER_PRE, "tokenizer_pre_unsupported",
     "tokenizer.ggml.pre names a pre-tokenizer that is not supported"},
    {AOTX_E_TOKENIZER_MERGES, "tokenizer_merges_invalid",
     "a merge is not \"left right\" with both halves and their join in the vocabulary"},
    {0, NULL, NULL},
};

/* FNV-1a, 32 bit. */
uint32_t aotx_tok_hash(const uint8_t *s, int64_t n) {
    uint32_t h = 2166136261u;
    for (int64_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h;
}

int32_t aotx_tok_lookup(const aotx_tokenizer *t, const uint8_t *s, int64_t n, uint32_t h) {
    for (uint32_t i = h & t->table_mask;; i = (i + 1) & t->table_mask) {
        int32_t id = t->table[i].id;
        if (id < 0) return -1;
        const tok_entry *e = &t->tok[id];
        if (t->table[i].hash == h && e->piece_len == n &&
            memcmp(t->pieces + e->piece_off, s, (size_t)n) == 0)
            return id;
    }
}

static int hex_digit(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The byte of a piece spelled <0xNN>, or -1. */
static int byte_piece_value(const uint8_t *s, int32_t n) {
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

/* Bytes of a normal/user-defined/unused piece: U+2581 becomes a space. */
static int32_t unescape_piece(const uint8_t *s, int32_t n, uint8_t *out) {
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        if (i + 2 < n && s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) {
            out[k++] = ' ';
            i += 2;
        } else {
            out[k++] = s[i];
        }
    }
    return k;
}

static int bpe_producible(int32_t type) {
    return type == AOTX_TOK_NORMAL || type == AOTX_TOK_USER_DEFINED;
}

static int matched_whole(int32_t type) {
    return type == AOTX_TOK_USER_DEFINED || type == AOTX_TOK_CONTROL || type == AOTX_TOK_UNKNOWN;
}

void aotx_tokenizer_free(aotx_tokenizer *t) {
    if (!t) return;
    free(t->tok);
    free(t->pieces);
    free(t->bytes);
    free(t->table);
    free(t->special);
    free(t->merges);
    free(t);
}

static int check_params(const aotx_tokenizer_params *p, int32_t n_vocab) {
    const int32_t ids[4] = {p->bos_id, p->eos_id, p->unk_id, p->pad_id};
    for (int i = 0; i < 4; i++)
        if (ids[i] < -1 || ids[i] >= n_vocab) return AOTX_E_TOKENIZER_SPECIAL;
    return AOTX_OK;
}

/* Bytes of a byte-level piece: each character on GPT-2's map becomes its byte,
 * any other character stays as its UTF-8 bytes (never longer than the piece). */
static int32_t unmap_piece(const int16_t *cp_byte, const uint8_t *s, int32_t n, uint8_t *out) {
    int32_t k = 0;
    for (int32_t i = 0; i < n;) {
        int len = aotx_tok_utf8_len(s + i, n - i);
        uint32_t cp = UINT32_MAX;
        if (len == 1 && s[i] < 0x80) cp = s[i];
        if (len == 2) cp = ((uint32_t)(s[i] & 0x1F) << 6) | (s[i + 1] & 0x3Fu);
        if (cp < AOTX_BYTE_CP_END && cp_byte[cp] >= 0) {
            out[k++] = (uint8_t)cp_byte[cp];
        } else {
            memcpy(out + k, s + i, (size_t)len);
            k += len;
        }
        i += len;
    }
    return k;
}

/* Copy the pieces and derive types and decoded bytes. */
static int load_pieces(aotx_tokenizer *t, const char *const *tokens, const int32_t *lens,
                       const float *scores, const int32_t *types) {
    int64_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (!tokens[i]) return AOTX_E_TOKENIZER_VOCAB;
        int64_t n = lens ? lens[i] : (int64_t)strlen(tokens[i]);
        if (n < 0 || n > INT32_MAX / 2) return AOTX_E_TOKENIZER_VOCAB;
        if (types && (types[i] < 0 || types[i] > AOTX_TOK_BYTE)) return AOTX_E_TOKENIZER_TYPE;
        total += n;
    }
    t->tok = calloc((size_t)t->n_vocab, sizeof *t->tok);
    t->pieces = malloc((size_t)total + 1);
    t->bytes = malloc((size_t)total + 1);
    if (!t->tok || !t->pieces || !t->bytes) return AOTX_E_NOMEM;
    uint16_t byte_cp[256];
    int16_t cp_byte[AOTX_BYTE_CP_END];
    aotx_tok_byte_map(byte_cp, cp_byte);
    int bpe = t->model == AOTX_TOK_MODEL_BPE;
    int64_t po = 0, bo = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        tok_entry *e = &t->tok[i];
        int32_t n = lens ? lens[i] : (int32_t)strlen(tokens[i]);
        const uint8_t *s = (const uint8_t *)tokens[i];
        memcpy(t->pieces + po, s, (size_t)n);
        e->piece_off = po;
        e->piece_len = n;
        e->score = scores ? scores[i] : 0.0f;
        int bv = byte_piece_value(s, n);
        e->type = types ? types[i] : (bv >= 0 && !bpe ? AOTX_TOK_BYTE : AOTX_TOK_NORMAL);
        if (e->type == 0) e->type = AOTX_TOK_NORMAL;
        e->bytes_off = bo;
        if (e->type == AOTX_TOK_BYTE) {
            if (bv < 0) return AOTX_E_TOKENIZER_VOCAB;
            t->bytes[bo] = (uint8_t)bv;
            e->bytes_len = 1;
            if (t->byte_id[bv] < 0) t->byte_id[bv] = i;
        } else if (e->type == AOTX_TOK_CONTROL) {
            e->bytes_len = 0;
        } else if (e->type == AOTX_TOK_UNKNOWN || (bpe && e->type == AOTX_TOK_USER_DEFINED)) {
            memcpy(t->bytes + bo, s, (size_t)n);
            e->bytes_len = n;
        } else if (bpe) {
            e->bytes_len = unmap_piece(cp_byte, s, n, t->bytes + bo);
        } else {
            e->bytes_len = unescape_piece(s, n, t->bytes + bo);
        }
        if (e->bytes_len > t->max_bytes) t->max_bytes = e->bytes_len;
        po += n;
        bo += e->bytes_len;
    }
    return AOTX_OK;
}

/* Hash table of BPE-producible pieces (the first of duplicate spellings wins). */
static int build_table(aotx_tokenizer *t) {
    uint32_t cap = 16;
    while (cap < (uint32_t)t->n_vocab * 2u) cap <<= 1;
    t->table = malloc((size_t)cap * sizeof *t->table);
    if (!t->table) return AOTX_E_NOMEM;
    memset(t->table, 0xff, (size_t)cap * sizeof *t->table);
    t->table_mask = cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const tok_entry *e = &t->tok[id];
        if (!bpe_producible(e->type) || e->piece_len == 0) continue;
        const uint8_t *s = t->pieces + e->piece_off;
        uint32_t h = aotx_tok_hash(s, e->piece_len);
        if (aotx_tok_lookup(t, s, e->piece_len, h) >= 0) continue;
        for (int32_t k = 1; k + 2 < e->piece_len; k++)
            if (s[k] == 0xE2 && s[k + 1] == 0x96 && s[k + 2] == 0x81) t->glue[s[k - 1]] = 1;
        uint32_t i = h & t->table_mask;
        while (t->table[i].id >= 0) i = (i + 1) & t->table_mask;
        t->table[i] = (tok_slot){id, h};
    }
    return AOTX_OK;
}

/* Index of pieces matched whole before BPE: grouped by first byte (counting
 * sort), longest first within a group, then lowest id (insertion sort; the
 * groups are small). */
static int build_special(aotx_tokenizer *t) {
    int32_t count[256] = {0};
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (matched_whole(t->tok[id].type) && t->tok[id].piece_len > 0)
            count[t->pieces[t->tok[id].piece_off]]++;
    t->special_start[0] = 0;
    for (int b = 0; b < 256; b++) t->special_start[b + 1] = t->special_start[b] + count[b];
    int32_t n = t->special_start[256];
    t->special = malloc((size_t)(n ? n : 1) * sizeof *t->special);
    if (!t->special) return AOTX_E_NOMEM;
    int32_t fill[256];
    memcpy(fill, t->special_start, sizeof fill);
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (matched_whole(t->tok[id].type) && t->tok[id].piece_len > 0)
            t->special[fill[t->pieces[t->tok[id].piece_off]]++].id = id;
    tok_special *g = t->special;
    for (int32_t k = 0; k < n; k++) {
        const tok_entry *e = &t->tok[g[k].id];
        g[k] = (tok_special){t->pieces + e->piece_off, e->piece_len, g[k].id, e->type};
    }
    for (int b = 0; b < 256; b++) {
        int32_t lo = t->special_start[b], hi = t->special_start[b + 1];
        for (int32_t i = lo + 1; i < hi; i++) {
            tok_special cur = g[i];
            int32_t j = i;
            while (j > lo && g[j - 1].len < cur.len) {
                g[j] = g[j - 1];
                j--;
            }
            g[j] = cur;
        }
    }
    return AOTX_OK;
}

/* Both modes: the vocabulary, its tables, and (BPE) the merges. */
static int tokenizer_build(const aotx_tokenizer_params *p, int32_t model, int32_t pre,
                           int32_t n_vocab, const char *const *tokens, const int32_t *token_lens,
                           const float *scores, const int32_t *types, int32_t n_merges,
                           const char *const *merges, const int32_t *merge_lens,
                           aotx_tokenizer **out) {
    if (!p || !tokens || !out || n_vocab <= 0 || n_vocab > (INT32_MAX / 4))
        return AOTX_E_INVALID_ARGUMENT;
    if (model == AOTX_TOK_MODEL_BPE && (pre < AOTX_TOK_PRE_GPT2 || pre > AOTX_TOK_PRE_SMOLLM))
        return AOTX_E_TOKENIZER_PRE;
    int rc = check_params(p, n_vocab);
    if (rc) return rc;
    aotx_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return AOTX_E_NOMEM;
    t->p = *p;
    t->model = model;
    t->pre = model == AOTX_TOK_MODEL_BPE ? pre : 0;
    t->ignore_merges = model == AOTX_TOK_MODEL_BPE && pre == AOTX_TOK_PRE_LLAMA3;
    t->n_vocab = n_vocab;
    memset(t->byte_id, 0xff, sizeof t->byte_id);
    rc = load_pieces(t, tokens, token_lens, scores, types);
    if (!rc) rc = build_table(t);
    if (!rc) rc = build_special(t);
    if (!rc && model == AOTX_TOK_MODEL_BPE) rc = aotx_tok_bpe_init(t, n_merges, merges, merge_lens);
    if (rc) {
        aotx_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return AOTX_OK;
}

int aotx_tokenizer_new(const aotx_tokenizer_params *p, int32_t n_vocab, const char *const *tokens,
                       const int32_t *token_lens, const float *scores, const int32_t *types,
                       aotx_tokenizer **out) {
    return tokenizer_build(p, AOTX_TOK_MODEL_SPM, 0, n_vocab, tokens, token_lens, scores, types,
                           0, NULL, NULL, out);
}

int aotx_tokenizer_new_bpe(const aotx_tokenizer_params *p, int32_t pre, int32_t n_vocab,
                           const char *const *tokens, const int32_t *token_lens,
                           const int32_t *types, int32_t n_merges, const char *const *merges,
                           const int32_t *merge_lens, aotx_tokenizer **out) {
    if (n_merges < 0 || (n_merges > 0 && !merges)) return AOTX_E_INVALID_ARGUMENT;
    return tokenizer_build(p, AOTX_TOK_MODEL_BPE, pre, n_vocab, tokens, token_lens, NULL, types,
                           n_merges, merges, merge_lens, out);
}

int32_t aotx_tokenizer_model(const aotx_tokenizer *t) { return t ? t->model : 0; }

int32_t aotx_tokenizer_pre(const aotx_tokenizer *t) { return t ? t->pre : 0; }

int aotx_tokenizer_new_packed(const aotx_tokenizer_params *p, int32_t n_vocab,
                              const uint8_t *blob, const int64_t *offsets, const float *scores,
                              const int32_t *types, aotx_tokenizer **out) {
    if (!blob || !offsets || n_vocab <= 0 || n_vocab > (INT32_MAX / 4))
        return AOTX_E_INVALID_ARGUMENT;
    for (int32_t i = 0; i < n_vocab; i++)
        if (offsets[i] < 0 || offsets[i + 1] < offsets[i] ||
            offsets[i + 1] - offsets[i] > INT32_MAX / 2)
            return AOTX_E_TOKENIZER_VOCAB;
    const char **ptrs = malloc((size_t)n_vocab * sizeof *ptrs);
    int32_t *lens = malloc((size_t)n_vocab * sizeof *lens);
    int rc = AOTX_E_NOMEM;
    if (ptrs && lens) {
        for (int32_t i = 0; i < n_vocab; i++) {
            ptrs[i] = (const char *)blob + offsets[i];
            lens[i] = (int32_t)(offsets[i + 1] - offsets[i]);
        }
        rc = aotx_tokenizer_new(p, n_vocab, ptrs, lens, scores, types, out);
    }
    free(ptrs);
    free(lens);
    return rc;
}

int32_t aotx_tokenizer_n_vocab(const aotx_tokenizer *t) { return t ? t->n_vocab : 0; }

void aotx_tokenizer_params_get(const aotx_tokenizer *t, aotx_tokenizer_params *out) {
    if (t && out) *out = t->p;
}

int32_t aotx_tokenizer_max_token_bytes(const aotx_tokenizer *t) { return t ? t->max_bytes : 0; }

int aotx_token_type(const aotx_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_vocab) return AOTX_E_TOKENIZER_TOKEN;
    return t->tok[id].type;
}

int aotx_token_bytes_ref(const aotx_tokenizer *t, int32_t id, const uint8_t **bytes, int32_t *len) {
    if (!t || id < 0 || id >= t->n_vocab || !bytes || !len) return AOTX_E_TOKENIZER_TOKEN;
    *bytes = t->bytes + t->tok[id].bytes_off;
    *len = t->tok[id].bytes_len;
    return AOTX_OK;
}

int aotx_token_piece(const aotx_tokenizer *t, int32_t id, const uint8_t **bytes, int32_t *len) {
    if (!t || id < 0 || id >= t->n_vocab || !bytes || !len) return AOTX_E_TOKENIZER_TOKEN;
    *bytes = t->pieces + t->tok[id].piece_off;
    *len = t->tok[id].piece_len;
    return AOTX_OK;
}

int64_t aotx_token_bytes(const aotx_tokenizer *t, int32_t id, uint8_t *out, int64_t cap) {
    const uint8_t *b;
    int32_t n;
    if (aotx_token_bytes_ref(t, id, &b, &n)) return AOTX_TOK_FAILED;
    if (n > cap) return -(int64_t)n;
    if (n) memcpy(out, b, (size_t)n);
    return n;
}
