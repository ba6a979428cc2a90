/* tokenizer_bpe.c -- the byte-level BPE ("gpt2") side of the vocabulary:
 * GPT-2's bytes-to-unicode map, mode and pre-tokenizer names, the merge
 * table (pair of ids -> rank and result), and the packed constructor.
 * docs/tokenizer.md describes the mode. */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

void aotx_tok_byte_map(uint16_t byte_cp[256], int16_t cp_byte[AOTX_BYTE_CP_END]) {
    for (int c = 0; c < AOTX_BYTE_CP_END; c++) cp_byte[c] = -1;
    int k = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        byte_cp[b] = (uint16_t)(printable ? b : 0x100 + k++);
        cp_byte[byte_cp[b]] = (int16_t)b;
    }
}

static int name_is(const char *name, int64_t len, const char *want) {
    return (int64_t)strlen(want) == len && memcmp(name, want, (size_t)len) == 0;
}

int aotx_tokenizer_model_parse(const char *name, int64_t len, int32_t *model) {
    if (!model || len < 0) return AOTX_E_INVALID_ARGUMENT;
    if (!name || name_is(name, len, "llama")) *model = AOTX_TOK_MODEL_SPM;
    else if (name_is(name, len, "gpt2")) *model = AOTX_TOK_MODEL_BPE;
    else return AOTX_E_TOKENIZER_MODEL;
    return AOTX_OK;
}

int aotx_tokenizer_pre_parse(const char *name, int64_t len, int32_t *pre) {
    if (!pre || len < 0) return AOTX_E_INVALID_ARGUMENT;
    if (!name || name_is(name, len, "default") || name_is(name, len, "gpt2"))
        *pre = AOTX_TOK_PRE_GPT2;
    else if (name_is(name, len, "llama-bpe") || name_is(name, len, "llama3"))
        *pre = AOTX_TOK_PRE_LLAMA3;
    else if (name_is(name, len, "qwen2"))
        *pre = AOTX_TOK_PRE_QWEN2;
    else if (name_is(name, len, "smollm"))
        *pre = AOTX_TOK_PRE_SMOLLM;
    else
        return AOTX_E_TOKENIZER_PRE;
    return AOTX_OK;
}

static uint32_t merge_hash(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (uint32_t)key;
}

int32_t aotx_tok_merge_find(const aotx_tokenizer *t, int32_t left, int32_t right, int32_t *rank) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint32_t i = merge_hash(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        const tok_merge *m = &t->merges[i];
        if (m->id < 0) return -1;
        if (m->key == key) {
            *rank = m->rank;
            return m->id;
        }
    }
}

/* Add merge j (s[0..n), "left right"); the first of two equal pairs keeps its rank. */
static int add_merge(aotx_tokenizer *t, int32_t j, const uint8_t *s, int32_t n) {
    const uint8_t *sp = n > 0 ? memchr(s, ' ', (size_t)n) : NULL;
    if (!sp || sp == s || sp == s + n - 1) return AOTX_E_TOKENIZER_MERGES;
    int32_t nl = (int32_t)(sp - s), nr = n - nl - 1;
    int32_t l = aotx_tok_lookup(t, s, nl, aotx_tok_hash(s, nl));
    int32_t r = aotx_tok_lookup(t, sp + 1, nr, aotx_tok_hash(sp + 1, nr));
    /* The join: s without the space, hashed in two parts (FNV-1a is sequential). */
    uint32_t h = aotx_tok_hash(s, nl);
    for (int32_t i = 0; i < nr; i++) h = (h ^ sp[1 + i]) * 16777619u;
    int32_t id = -1;
    for (uint32_t i = h & t->table_mask; t->table[i].id >= 0; i = (i + 1) & t->table_mask) {
        const tok_entry *e = &t->tok[t->table[i].id];
        const uint8_t *q = t->pieces + e->piece_off;
        if (t->table[i].hash == h && e->piece_len == nl + nr && memcmp(q, s, (size_t)nl) == 0 &&
            memcmp(q + nl, sp + 1, (size_t)nr) == 0) {
            id = t->table[i].id;
            break;
        }
    }
    if (l < 0 || r < 0 || id < 0) return AOTX_E_TOKENIZER_MERGES;
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    uint32_t i = merge_hash(key) & t->merge_mask;
    while (t->merges[i].id >= 0) {
        if (t->merges[i].key == key) return AOTX_OK;
        i = (i + 1) & t->merge_mask;
    }
    t->merges[i] = (tok_merge){key, j, id};
    t->n_merges++;
    return AOTX_OK;
}

int aotx_tok_bpe_init(aotx_tokenizer *t, int32_t n_merges, const char *const *merges,
                      const int32_t *merge_lens) {
    uint16_t *byte_cp = t->byte_cp;
    int16_t cp_byte[AOTX_BYTE_CP_END];
    aotx_tok_byte_map(byte_cp, cp_byte);
    for (int b = 0; b < 256; b++) {
        uint8_t ch[2];
        int n = 1;
        if (byte_cp[b] < 0x80) ch[0] = (uint8_t)byte_cp[b];
        else ch[0] = (uint8_t)(0xC0 | byte_cp[b] >> 6), ch[1] = (uint8_t)(0x80 | (byte_cp[b] & 0x3F)), n = 2;
        int32_t id = aotx_tok_lookup(t, ch, n, aotx_tok_hash(ch, n));
        if (id >= 0) t->byte_id[b] = id;
    }
    uint32_t cap = 16;
    while (cap < (uint32_t)n_merges * 2u) cap <<= 1;
    t->merges = malloc((size_t)cap * sizeof *t->merges);
    if (!t->merges) return AOTX_E_NOMEM;
    for (uint32_t i = 0; i < cap; i++) t->merges[i] = (tok_merge){0, 0, -1};
    t->merge_mask = cap - 1;
    for (int32_t j = 0; j < n_merges; j++) {
        if (!merges[j]) return AOTX_E_TOKENIZER_MERGES;
        int64_t n = merge_lens ? merge_lens[j] : (int64_t)strlen(merges[j]);
        if (n < 0 || n > INT32_MAX / 2) return AOTX_E_TOKENIZER_MERGES;
        int rc = add_merge(t, j, (const uint8_t *)merges[j], (int32_t)n);
        if (rc) return rc;
    }
    return AOTX_OK;
}

/* Pointer arrays over a blob (offsets[0..n]), as aotx_tokenizer_new_packed does. */
static int unpack(int32_t n, const uint8_t *blob, const int64_t *offsets, const char ***ptrs,
                  int32_t **lens, int bad) {
    *ptrs = NULL, *lens = NULL;
    for (int32_t i = 0; i < n; i++)
        if (offsets[i] < 0 || offsets[i + 1] < offsets[i] ||
            offsets[i + 1] - offsets[i] > INT32_MAX / 2)
            return bad;
    *ptrs = malloc((size_t)(n ? n : 1) * sizeof **ptrs);
    *lens = malloc((size_t)(n ? n : 1) * sizeof **lens);
    if (!*ptrs || !*lens) return AOTX_E_NOMEM;
    for (int32_t i = 0; i < n; i++) {
        (*ptrs)[i] = (const char *)blob + offsets[i];
        (*lens)[i] = (int32_t)(offsets[i + 1] - offsets[i]);
    }
    return AOTX_OK;
}

int aotx_tokenizer_new_bpe_packed(const aotx_tokenizer_params *p, int32_t pre, int32_t n_vocab,
                                  const uint8_t *blob, const int64_t *offsets,
                                  const int32_t *types, int32_t n_merges,
                                  const uint8_t *merge_blob, const int64_t *merge_offsets,
                                  aotx_tokenizer **out) {
    if (!blob || !offsets || n_vocab <= 0 || n_vocab > (INT32_MAX / 4) || n_merges < 0 ||
        (n_merges > 0 && (!merge_blob || !merge_offsets)))
        return AOTX_E_INVALID_ARGUMENT;
    const char **tp, **mp;
    int32_t *tl, *ml;
    int rc = unpack(n_vocab, blob, offsets, &tp, &tl, AOTX_E_TOKENIZER_VOCAB);
    int rc2 = unpack(n_merges, merge_blob, merge_offsets, &mp, &ml, AOTX_E_TOKENIZER_MERGES);
    if (!rc) rc = rc2;
    if (!rc) rc = aotx_tokenizer_new_bpe(p, pre, n_vocab, tp, tl, types, n_merges, mp, ml, out);
    free(tp), free(tl), free(mp), free(ml);
    return rc;
}
