/* tokenizer_internal.h -- the tokenizer's private layout, shared by
 * tokenizer.c (vocabulary, lookups) and tokenizer_encode.c (BPE). */
#ifndef AOTX_TOKENIZER_INTERNAL_H
#define AOTX_TOKENIZER_INTERNAL_H

#include "aotx_tokenizer.h"

/* One token's place in the two byte arenas. */
typedef struct tok_entry {
    int64_t piece_off;   /* into pieces[] */
    int64_t bytes_off;   /* into bytes[] */
    int32_t piece_len;
    int32_t bytes_len;
    float score;
    int32_t type;        /* AOTX_TOK_* (0 read as NORMAL) */
} tok_entry;

/* A hash table slot: the id and its piece's hash side by side (one cache line). */
typedef struct tok_slot {
    int32_t id;          /* -1: empty */
    uint32_t hash;
} tok_slot;

/* A piece matched whole before BPE, with its text at hand for the scan. */
typedef struct tok_special {
    const uint8_t *s;    /* into pieces[] */
    int32_t len;
    int32_t id;
    int32_t type;
} tok_special;

struct aotx_tokenizer {
    aotx_tokenizer_params p;
    int32_t n_vocab;
    int32_t max_bytes;          /* largest bytes_len */
    tok_entry *tok;             /* [n_vocab] */
    uint8_t *pieces;            /* [sum piece_len] the vocabulary text, as given */
    uint8_t *bytes;             /* [sum bytes_len] what each token decodes to */
    /* Piece -> id for pieces BPE may produce (normal, user-defined);
     * open addressing, linear probing, -1 empty. */
    tok_slot *table;            /* [table_mask + 1] */
    uint32_t table_mask;
    int32_t byte_id[256];       /* <0xNN> token of each byte, -1 if none */
    /* glue[b]: some BPE-producible piece has byte b right before an inner
     * U+2581, so BPE may merge across a space marker that follows byte b.
     * Everywhere else a space marker starts a word BPE can treat alone. */
    uint8_t glue[256];
    /* Whole-piece matches before BPE (user-defined, control, unknown-type):
     * ids grouped by first byte, longest first within a group. */
    tok_special *special;       /* [n_special] */
    int32_t special_start[257]; /* group of byte b: special[special_start[b] .. special_start[b+1]) */
};

uint32_t aotx_tok_hash(const uint8_t *s, int64_t n);
/* Id of a BPE-producible piece spelled s[0..n), or -1. */
int32_t aotx_tok_lookup(const aotx_tokenizer *t, const uint8_t *s, int64_t n, uint32_t h);

#endif
